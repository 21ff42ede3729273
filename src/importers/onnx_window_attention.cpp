// Swin's (shifted) window attention as one IR op window_attention (docs/onnx.md, "Swin"): split from
// onnx_patterns.cpp, whose matchers it shares (onnx_patterns.h).
#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>

#include "importers/onnx_attention.h"
#include "importers/onnx_mapper.h"
#include "importers/onnx_patterns.h"
#include "support/error.h"

namespace gp::importers::onnx_detail {
namespace {

// 0. Swin's (shifted) window attention, torchvision's shifted_window_attention (ir/model.h
// window_attention). From a Pad of a batch-first [B, H, W, C] activation x: every later node of the
// kinds that block uses whose activation inputs all come from x through such nodes (so the residual
// Add, which also reads the block's input, ends it). When those nodes hold a Softmax, they must be
// one whole block: one output [B, H, W, C], zero padding to multiples of the window, a roll by -shift
// (Slice + Concat per axis) and back, the window partition Reshape [B, H/wh, wh, W/ww, ww, C], one
// packed QKV projection [3C, C] and an output projection [C, C] with biases, scores scaled by
// 1/sqrt(C/heads) plus the relative-position table [(2wh-1)(2ww-1), heads] gathered by a constant
// index, a constant mask exactly when shifted, two activation MatMuls, dropouts of ratio 0.
// Anything else is refused naming the nodes.
struct Roll {
  std::string out;
  int64_t axis = 0, start = 0;  // cat(x[start:], x[:start]) along axis
  std::vector<int> nodes;
};

// The nodes reading t that were not folded away.
std::vector<int> live_consumers(const Net& net, const std::string& t) {
  std::vector<int> out;
  for (int c : net.at(t).consumers)
    if (!net.folded[static_cast<size_t>(c)]) out.push_back(c);
  return out;
}

// torch.roll along one axis as the TorchScript exporter writes it: two Slices of t concatenated.
std::optional<Roll> roll_at(const Net& net, const Matcher& m, const std::string& t) {
  const std::vector<int> slices = live_consumers(net, t);
  if (slices.size() != 2) return std::nullopt;
  Roll r;
  int concat = -1;
  std::array<std::array<int64_t, 3>, 2> sl{};  // axis, start, end
  for (int k = 0; k < 2; ++k) {
    const auto& nd = net.nodes[static_cast<size_t>(slices[static_cast<size_t>(k)])];
    if (nd.op_type() != "Slice" || nd.input_size() < 4) return std::nullopt;
    const auto &st = net.at(nd.input(1)).ints, &en = net.at(nd.input(2)).ints, &ax = net.at(nd.input(3)).ints;
    if (!st || !en || !ax || st->size() != 1 || en->size() != 1 || ax->size() != 1) return std::nullopt;
    if (nd.input_size() > 4 && (!net.at(nd.input(4)).ints || (*net.at(nd.input(4)).ints)[0] != 1)) return std::nullopt;
    const auto& xs = net.shape(t);
    const int64_t axis = (*ax)[0] < 0 ? (*ax)[0] + static_cast<int64_t>(xs.size()) : (*ax)[0];
    if (axis < 1 || axis >= static_cast<int64_t>(xs.size())) return std::nullopt;
    const int64_t d = xs[static_cast<size_t>(axis)];
    auto norm = [d](int64_t v) { return std::clamp(v < 0 ? v + d : v, int64_t{0}, d); };
    sl[static_cast<size_t>(k)] = {axis, norm((*st)[0]), norm((*en)[0])};
    const int c = m.sole(nd.output(0), "Concat");
    if (c < 0 || (concat >= 0 && c != concat)) return std::nullopt;
    concat = c;
  }
  const auto& cn = net.nodes[static_cast<size_t>(concat)];
  if (cn.input_size() != 2) return std::nullopt;
  const int first = cn.input(0) == net.nodes[static_cast<size_t>(slices[0])].output(0) ? 0 : 1;
  const auto &a = sl[static_cast<size_t>(first)], &b = sl[static_cast<size_t>(1 - first)];
  const int64_t d = net.shape(t)[static_cast<size_t>(a[0])];
  const int64_t cat_axis = attr_i(cn, "axis", 0) < 0 ? attr_i(cn, "axis", 0) + static_cast<int64_t>(net.shape(t).size())
                                                     : attr_i(cn, "axis", 0);
  if (a[0] != b[0] || cat_axis != a[0] || a[2] != d || b[1] != 0 || b[2] != a[1] || a[1] <= 0 || a[1] >= d)
    return std::nullopt;
  r.out = cn.output(0);
  r.axis = a[0];
  r.start = a[1];
  r.nodes = {slices[0], slices[1], concat};
  return r;
}

// torch.roll by 0 along an axis as the dynamo exporter writes it (torchvision's shift [0, s] for a window
// 1 x n, or a map no taller than the window): t's only consumer a Slice of the whole axis, which is t.
std::optional<std::string> whole_slice_at(const Net& net, const std::string& t) {
  const std::vector<int> users = live_consumers(net, t);
  if (users.size() != 1) return std::nullopt;
  const auto& nd = net.nodes[static_cast<size_t>(users[0])];
  if (nd.op_type() != "Slice" || nd.input_size() < 4 || nd.input(0) != t) return std::nullopt;
  const auto &st = net.at(nd.input(1)).ints, &en = net.at(nd.input(2)).ints, &ax = net.at(nd.input(3)).ints;
  if (!st || !en || !ax || st->size() != 1 || en->size() != 1 || ax->size() != 1) return std::nullopt;
  if (nd.input_size() > 4 && (!net.at(nd.input(4)).ints || *net.at(nd.input(4)).ints != std::vector<int64_t>{1}))
    return std::nullopt;
  const auto& xs = net.shape(t);
  const int64_t axis = (*ax)[0] < 0 ? (*ax)[0] + static_cast<int64_t>(xs.size()) : (*ax)[0];
  if (axis < 1 || axis >= static_cast<int64_t>(xs.size())) return std::nullopt;
  const int64_t d = xs[static_cast<size_t>(axis)];
  if (((*st)[0] != 0 && (*st)[0] != -d) || ((*en)[0] < d)) return std::nullopt;
  return nd.output(0);
}

// The rolls applied one after another to t (at most one per axis); `t` becomes their result.
std::map<int64_t, int64_t> read_rolls(const Net& net, const Matcher& m, std::string& t, std::string& why) {
  std::map<int64_t, int64_t> starts;
  for (;;) {
    if (std::optional<Roll> r = roll_at(net, m, t)) {
      if (!starts.emplace(r->axis, r->start).second) why = fmt::format("two rolls along axis {}", r->axis);
      t = r->out;
    } else if (std::optional<std::string> same = whole_slice_at(net, t)) {
      t = *same;
    } else {
      return starts;
    }
  }
}

// Why the nodes are not a Swin window-attention block ("" when they are); fills attrs and the sources.
std::string window_mismatch(Mapper& mp, const Matcher& m, int pad, const std::set<int>& f, const std::string& y,
                            Json& attrs, std::array<std::string, 5>& params, bool& transposed) {
  const Net& net = mp.net;
  const std::string& x = net.nodes[static_cast<size_t>(pad)].input(0);
  const auto& xs = net.shape(x);
  if (net.shape(y) != xs || !mp.batch_first(y))
    return fmt::format("output [{}] is not the input's shape [{}]", fmt::join(net.shape(y), ","), fmt::join(xs, ","));
  const int64_t c = xs[3];
  int softmax = -1, act_mm = 0, mask_adds = 0, scale_muls = 0;
  int64_t wh = 0, ww = 0;
  std::set<std::string> roots;
  std::vector<Proj> projs;
  std::optional<double> scale;
  for (int i : f) {
    const auto& nd = net.nodes[static_cast<size_t>(i)];
    const std::string& op = nd.op_type();
    auto act = [&](int k) { return k < nd.input_size() && !nd.input(k).empty() && net.at(nd.input(k)).activation; };
    if (op == "Softmax") softmax = softmax < 0 ? i : -2;
    if (op == "MatMul" && act(0) && act(1)) ++act_mm;
    if (op == "Dropout" && nd.input_size() > 1 && !nd.input(1).empty()) {
      const auto& r = net.at(nd.input(1));
      if (!r.reals || r.reals->size() != 1 || (*r.reals)[0] != 0)
        return fmt::format("dropout {} with a ratio that is not 0 (the op has no dropout)", node_label(nd));
    }
    if ((op == "Mul" || op == "Div") && act(0) != act(1)) {
      const std::string& k = nd.input(act(0) ? 1 : 0);
      const std::optional<double> v = m.scalar(k) ? m.scalar(k) : constant_value(net, k);
      if (!v || *v == 0) return fmt::format("{} by a non-constant or non-scalar", node_label(nd));
      scale = (scale ? *scale : 1.0) * (op == "Mul" ? *v : 1.0 / *v);
      ++scale_muls;
    }
    if (op == "Add" && act(0) != act(1)) {
      const std::string& o = nd.input(act(0) ? 1 : 0);
      std::set<std::string> behind;
      param_roots(net, o, behind);
      bool learned = false;  // a bias or the relative-position table; else a constant: the shift's mask
      for (const std::string& p : behind) learned = learned || net.at(p).elem_type == onnx::TensorProto::FLOAT;
      if (!learned) ++mask_adds;
    }
    if (op == "Reshape" && net.at(nd.input(0)).shape && net.at(nd.output(0)).shape) {
      const auto &in = *net.at(nd.input(0)).shape, &out = *net.at(nd.output(0)).shape;
      if (in.size() == 4 && out.size() == 6 && mp.batch_first(nd.input(0)) && mp.batch_first(nd.output(0)) &&
          out[1] * out[2] == in[1] && out[3] * out[4] == in[2] && out[5] == in[3] && wh == 0) {
        wh = out[2];
        ww = out[4];
      }
    }
    if (std::optional<Proj> p = projection_at(net, i, f)) projs.push_back(*p);
    for (const auto& in : nd.input())
      if (!in.empty()) param_roots(net, in, roots);
  }
  if (softmax < 0 || act_mm != 2)
    return fmt::format("{} Softmax and {} activation MatMuls, expected 1 and 2",
                       softmax == -2 ? 2
                       : softmax < 0 ? 0
                                     : 1,
                       act_mm);
  if (wh == 0) return "no window partition Reshape [B, H, W, C] -> [B, H/wh, wh, W/ww, ww, C]";
  const auto& scores = *net.at(net.nodes[static_cast<size_t>(softmax)].input(0)).shape;
  if (scores.size() != 4 || scores[2] != wh * ww || scores[3] != wh * ww)
    return fmt::format("Softmax over [{}], expected [B * windows, heads, {}, {}]", fmt::join(scores, ","), wh * ww,
                       wh * ww);
  const int64_t heads = scores[1];
  if (heads <= 0 || c % heads != 0) return fmt::format("{} heads do not divide {} channels", heads, c);
  // Parameters: QKV [3C, C] + [3C], output [C, C] + [C], the relative-position table.
  const Proj *qkv = nullptr, *out = nullptr;
  for (const Proj& p : projs) (p.rows == 3 * c ? qkv : p.rows == c ? out : qkv) = &p;
  if (projs.size() != 2 || !qkv || !out || qkv->rows != 3 * c || out->rows != c || qkv->b.empty() || out->b.empty())
    return fmt::format("{} projections, expected a QKV [{}, {}] and an output [{}, {}] projection, both with biases",
                       projs.size(), 3 * c, c, c, c);
  if (qkv->transpose != out->transpose) return "the two projections' weights are in different layouts";
  const int64_t rows = (2 * wh - 1) * (2 * ww - 1);
  std::string table;
  for (const std::string& p : roots) {
    if (net.at(p).elem_type != onnx::TensorProto::FLOAT) continue;  // the relative-position index (int64)
    std::set<std::string> proj_roots;
    for (const std::string& t : {qkv->w, qkv->b, out->w, out->b}) param_roots(net, t, proj_roots);
    if (proj_roots.count(p)) continue;
    if (!table.empty() || net.shape(p) != std::vector<int64_t>{rows, heads})
      return fmt::format("parameter \"{}\" [{}] is neither a projection nor the relative-position table [{}, {}]", p,
                         fmt::join(net.shape(p), ","), rows, heads);
    table = p;
  }
  if (table.empty()) return fmt::format("no relative-position table [{}, {}]", rows, heads);
  const double want = 1.0 / std::sqrt(static_cast<double>(c / heads));
  if (scale_muls != 1 || !scale || std::abs(*scale - want) > 1e-5 * want)
    return fmt::format("the scores are scaled by {}, expected 1/sqrt({}) = {:.6g}",
                       scale ? fmt::format("{:.6g}", *scale) : std::string("something unreadable"), c / heads, want);
  // Padding to multiples of the window, then the roll.
  const auto& pn = net.nodes[static_cast<size_t>(pad)];
  const std::vector<int64_t>* pads = pn.input_size() > 1 && net.at(pn.input(1)).ints ? &*net.at(pn.input(1)).ints
                                                                                     : nullptr;
  const std::optional<double> value = pn.input_size() > 2 && !pn.input(2).empty() ? m.scalar(pn.input(2))
                                                                                  : std::optional<double>(0.0);
  const int64_t pad_b = (wh - xs[1] % wh) % wh, pad_r = (ww - xs[2] % ww) % ww;
  if (!pads || *pads != std::vector<int64_t>{0, 0, 0, 0, 0, pad_b, pad_r, 0} || value != 0.0 ||
      (find_attr(pn, "mode") && find_attr(pn, "mode")->s() != "constant"))
    return fmt::format("{} is not zero padding of H, W to multiples of the window {}x{}", node_label(pn), wh, ww);
  std::string t = pn.output(0), why;
  std::map<int64_t, int64_t> roll = read_rolls(net, m, t, why);
  if (!why.empty()) return why;
  const int64_t sh = roll.count(1) ? roll[1] : 0, sw = roll.count(2) ? roll[2] : 0;
  if (roll.size() != static_cast<size_t>((sh > 0) + (sw > 0)) || sh >= wh || sw >= ww)
    return fmt::format("a roll by [{}, {}] that is not a shift within the window {}x{}", sh, sw, wh, ww);
  if ((sh + sw > 0) != (mask_adds == 1) || mask_adds > 1)
    return fmt::format("shift [{}, {}] with {} constant mask(s) added to the scores, expected {}", sh, sw, mask_adds,
                       sh + sw > 0 ? 1 : 0);
  attrs = Json{{"heads", heads}, {"window", {wh, ww}}};
  if (sh + sw > 0) attrs["shift"] = {sh, sw};
  params = {qkv->w, qkv->b, out->w, out->b, table};
  transposed = qkv->transpose;
  return "";
}

}  // namespace

void map_window_attention(Mapper& mp, const Matcher& m, std::vector<bool>& claimed) {
  const Net& net = mp.net;
  static const std::set<std::string> kBlock = {"Pad",     "Slice",   "Concat", "Reshape",  "Transpose", "MatMul",
                                               "Add",     "Mul",     "Div",    "Gather",   "Squeeze",   "Unsqueeze",
                                               "Softmax", "Dropout", "Cast",   "Identity", "Split"};
  const int n = static_cast<int>(net.nodes.size());
  for (int pad = 0; pad < n; ++pad) {
    const auto& pn = net.nodes[static_cast<size_t>(pad)];
    if (claimed[static_cast<size_t>(pad)] || pn.op_type() != "Pad" || !net.at(pn.input(0)).activation ||
        !net.at(pn.input(0)).shape || net.at(pn.input(0)).shape->size() != 4 || !mp.batch_first(pn.input(0)))
      continue;
    std::set<std::string> from{pn.input(0)};
    std::set<int> f;
    bool softmax = false;
    for (int i = pad; i < n; ++i) {
      const auto& nd = net.nodes[static_cast<size_t>(i)];
      if (net.folded[static_cast<size_t>(i)] || claimed[static_cast<size_t>(i)] || !kBlock.count(nd.op_type()))
        continue;
      bool any = false, all = true;
      for (const auto& in : nd.input())
        if (!in.empty() && net.at(in).activation) (from.count(in) ? any : all) = from.count(in) > 0;
      if (!any || !all) continue;
      f.insert(i);
      softmax = softmax || nd.op_type() == "Softmax";
      for (const auto& o : nd.output())
        if (!o.empty()) from.insert(o);
    }
    if (!softmax) continue;  // not attention (PatchMerging's pad, a plain F.pad)
    std::set<std::string> outs;
    for (int i : f)
      for (const auto& o : net.nodes[static_cast<size_t>(i)].output()) {
        if (o.empty()) continue;
        if (m.is_output(o)) outs.insert(o);
        for (int c : net.at(o).consumers)
          if (!f.count(c) && !net.folded[static_cast<size_t>(c)]) outs.insert(o);
      }
    const std::vector<int> nodes(f.begin(), f.end());
    Json attrs;
    std::array<std::string, 5> params;
    bool transposed = false;
    std::string why = outs.size() == 1 ? window_mismatch(mp, m, pad, f, *outs.begin(), attrs, params, transposed)
                                       : fmt::format("{} outputs, expected 1", outs.size());
    claim(claimed, nodes);
    if (!why.empty()) {
      mp.reasons.push_back(fmt::format("nodes {} .. {} are not a Swin window-attention block ({})",
                                       node_label(net.nodes[static_cast<size_t>(nodes.front())]),
                                       node_label(net.nodes[static_cast<size_t>(nodes.back())]), why));
      continue;
    }
    const int64_t c = net.shape(pn.input(0))[3];
    const std::string op = mp.emit(fused_name(net, nodes, "window_attention"), ir::OpKind::window_attention,
                                   {pn.input(0)}, *outs.begin(), attrs);
    const auto& w = attrs.at("window");
    const int64_t rows = (2 * w[0].get<int64_t>() - 1) * (2 * w[1].get<int64_t>() - 1);
    mp.add_param(op, "wqkv", params[0], {3 * c, c}, transposed);
    mp.add_param(op, "bqkv", params[1], {3 * c});
    mp.add_param(op, "wo", params[2], {c, c}, transposed);
    mp.add_param(op, "bo", params[3], {c});
    mp.add_param(op, "rel_bias", params[4], {rows, attrs.at("heads").get<int64_t>()});
  }
}

}  // namespace gp::importers::onnx_detail
