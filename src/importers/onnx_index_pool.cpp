// A pool over H and W written as a gather of constant spatial indices and a mean over the gathered
// windows, as torch.export decomposes adaptive_avg_pool2d when the input size is no multiple of the
// output size (AlexNet's AdaptiveAvgPool2d((6, 6)) on a 1x1 map): the IR op it is (resize nearest
// or avgpool), or a refusal naming the node (docs/onnx.md, "torch 2.x's default exporter").
#include <algorithm>
#include <cmath>
#include <optional>

#include "importers/onnx_mapper.h"
#include "importers/onnx_patterns.h"

namespace gp::importers::onnx_detail {
namespace {

// Each of `n` outputs reads `k` input positions: starts[a] + j when uniform, read[a * k + j] in general.
struct Axis {
  int64_t n = 0, k = 0;
  std::vector<int64_t> read;
};

// PyTorch's nearest source of output `a` (upsample_nearest2d given a size: the scale in/out as a float).
int64_t nearest_source(int64_t a, int64_t in, int64_t out) {
  const float scale = static_cast<float>(in) / static_cast<float>(out);
  return std::min(static_cast<int64_t>(std::floor(static_cast<float>(a) * scale)), in - 1);
}

// Windows of k consecutive positions starting every `stride` from 0 (an avgpool without padding).
std::optional<int64_t> uniform_stride(const Axis& ax, int64_t in) {
  const int64_t stride = ax.n > 1 ? ax.read[static_cast<size_t>(ax.k)] - ax.read[0] : 1;
  if (stride < 1 || ax.read[0] != 0 || (in - ax.k) / stride + 1 != ax.n) return std::nullopt;
  for (int64_t a = 0; a < ax.n; ++a)
    for (int64_t j = 0; j < ax.k; ++j)
      if (ax.read[static_cast<size_t>(a * ax.k + j)] != a * stride + j) return std::nullopt;
  return stride;
}

}  // namespace

// Transpose(x [B, C, H, W], perm [2, 3, 0, 1]) -> GatherND(constant indices [oh, kh, ow, kw, 2]) ->
// Transpose(perm [4, 5, 0, 1, 2, 3]) -> ReduceMean over the kh and kw axes: output (a, b) is the mean of
// x over rows r(a, i) and columns c(b, j). When every window is one cell at PyTorch's nearest source
// (replication: 1x1 -> 6x6) it is resize nearest to [oh, ow]; when the windows are kh x kw cells every
// stride from 0, avgpool. Anything else is refused naming the GatherND.
bool match_index_pool(Mapper& mp, const Matcher& m, int i, std::vector<bool>& claimed) {
  const Net& net = mp.net;
  const auto& g = net.nodes[static_cast<size_t>(i)];
  if (g.op_type() != "GatherND" || g.input_size() != 2 || attr_i(g, "batch_dims", 0) != 0) return false;
  const int t0 = m.producer(g.input(0));
  if (t0 < 0 || claimed[static_cast<size_t>(t0)] || m.node(t0).op_type() != "Transpose" ||
      net.at(g.input(0)).consumers.size() != 1 || attr_ints(m.node(t0), "perm") != std::vector<int64_t>{2, 3, 0, 1})
    return false;
  const int t1 = m.sole(g.output(0), "Transpose");
  const int r = t1 < 0 ? -1 : m.sole(m.node(t1).output(0), "ReduceMean");
  std::vector<int> nodes{t0, i};
  for (int k : {t1, r})
    if (k >= 0) nodes.push_back(k);
  auto refuse = [&](const std::string& why) {
    claim(claimed, nodes);
    mp.reasons.push_back(
        fmt::format("{}: a pool over H and W written as a gather of constant indices and a mean (torch.export's "
                    "adaptive_avg_pool2d): {}",
                    node_label(g), why));
    return true;
  };
  if (r < 0 || attr_ints(m.node(t1), "perm") != std::vector<int64_t>{4, 5, 0, 1, 2, 3})
    return refuse(
        "the gathered windows are not moved back and averaged by one ReduceMean (windows of varying length, "
        "masked by Where and divided by their sizes, are no IR op)");
  const std::string& x = m.node(t0).input(0);
  const std::string& y = m.node(r).output(0);
  const auto& idx = net.at(g.input(1));
  if (!net.at(x).activation || !net.at(x).shape || net.shape(x).size() != 4 || !mp.batch_first(x))
    return refuse("the input is not a batch-first [B, C, H, W] activation");
  std::vector<int64_t> axes = attr_ints(m.node(r), "axes");
  for (int64_t& a : axes) a = a < 0 ? a + 6 : a;
  std::sort(axes.begin(), axes.end());
  if (axes != std::vector<int64_t>{3, 5} || attr_i(m.node(r), "keepdims", 1) != 0)
    return refuse("the mean is not over the two gathered window axes");
  if (idx.activation || !idx.ints || idx.value_shape.size() != 5 || idx.value_shape[4] != 2)
    return refuse("the indices are not a constant [oh, kh, ow, kw, 2] (constants over 4096 values are not read)");
  const int64_t in_h = net.shape(x)[2], in_w = net.shape(x)[3];
  Axis rows{idx.value_shape[0], idx.value_shape[1], {}}, cols{idx.value_shape[2], idx.value_shape[3], {}};
  rows.read.assign(static_cast<size_t>(rows.n * rows.k), -1);
  cols.read.assign(static_cast<size_t>(cols.n * cols.k), -1);
  // Row indices may depend on (a, i) only and column indices on (b, j) only.
  const std::vector<int64_t>& v = *idx.ints;
  for (int64_t a = 0; a < rows.n; ++a)
    for (int64_t ki = 0; ki < rows.k; ++ki)
      for (int64_t b = 0; b < cols.n; ++b)
        for (int64_t kj = 0; kj < cols.k; ++kj) {
          const size_t at = static_cast<size_t>((((a * rows.k + ki) * cols.n + b) * cols.k + kj) * 2);
          int64_t hr = v[at], wc = v[at + 1];
          hr = hr < 0 ? hr + in_h : hr;
          wc = wc < 0 ? wc + in_w : wc;
          if (hr < 0 || hr >= in_h || wc < 0 || wc >= in_w) return refuse("an index outside the input");
          int64_t& rr = rows.read[static_cast<size_t>(a * rows.k + ki)];
          int64_t& cc = cols.read[static_cast<size_t>(b * cols.k + kj)];
          if ((rr >= 0 && rr != hr) || (cc >= 0 && cc != wc))
            return refuse("the windows are not a product of row and column windows");
          rr = hr;
          cc = wc;
        }
  claim(claimed, nodes);
  if (rows.k == 1 && cols.k == 1) {
    for (int64_t a = 0; a < rows.n; ++a)
      if (rows.read[static_cast<size_t>(a)] != nearest_source(a, in_h, rows.n))
        return refuse(fmt::format("output row {} reads row {}, not the nearest source {}", a,
                                  rows.read[static_cast<size_t>(a)], nearest_source(a, in_h, rows.n)));
    for (int64_t b = 0; b < cols.n; ++b)
      if (cols.read[static_cast<size_t>(b)] != nearest_source(b, in_w, cols.n))
        return refuse(fmt::format("output column {} reads column {}, not the nearest source {}", b,
                                  cols.read[static_cast<size_t>(b)], nearest_source(b, in_w, cols.n)));
    mp.emit(fused_name(net, {t0, i, t1, r}, "resize"), ir::OpKind::resize, {x}, y,
            Json{{"size", std::vector<int64_t>{rows.n, cols.n}}, {"mode", "nearest"}});
    return true;
  }
  const std::optional<int64_t> sh = uniform_stride(rows, in_h), sw = uniform_stride(cols, in_w);
  if (!sh || !sw)
    return refuse(fmt::format(
        "windows of {}x{} cells that are neither one cell each (resize nearest) nor every stride from 0 (avgpool)",
        rows.k, cols.k));
  mp.emit(fused_name(net, {t0, i, t1, r}, "avgpool"), ir::OpKind::avgpool, {x}, y,
          Json{{"kernel", std::vector<int64_t>{rows.k, cols.k}}, {"stride", std::vector<int64_t>{*sh, *sw}}});
  return true;
}

}  // namespace gp::importers::onnx_detail
