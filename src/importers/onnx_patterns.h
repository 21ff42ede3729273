// Internal to the ONNX importer: what the multi-node pattern matchers share (onnx_patterns.cpp,
// onnx_window_attention.cpp).
#pragma once
#include <algorithm>
#include <cmath>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "importers/onnx_mapper.h"

namespace gp::importers::onnx_detail {

struct Matcher {
  const Net& net;
  const std::vector<bool>& claimed;

  bool is_output(const std::string& t) const {
    return std::find(net.outputs.begin(), net.outputs.end(), t) != net.outputs.end();
  }
  // The node that is the only reader of `t`, when it has type `op` and is unclaimed; else -1.
  int sole(const std::string& t, const char* op) const {
    const auto& c = net.at(t).consumers;
    if (c.size() != 1 || is_output(t) || claimed[c[0]] || net.nodes[c[0]].op_type() != op) return -1;
    return c[0];
  }
  const onnx::NodeProto& node(int i) const { return net.nodes[i]; }
  std::string other(int i, const std::string& t) const {
    const auto& n = node(i);
    return n.input_size() == 2 ? (n.input(0) == t ? n.input(1) : n.input(0)) : "";
  }
  std::optional<double> scalar(const std::string& t) const {
    if (t.empty()) return std::nullopt;
    const auto& ti = net.at(t);
    if (ti.activation) return std::nullopt;
    if (ti.reals && ti.reals->size() == 1) return (*ti.reals)[0];
    if (ti.ints && ti.ints->size() == 1) return static_cast<double>((*ti.ints)[0]);
    return std::nullopt;
  }
  bool near(const std::optional<double>& v, double want) const {
    return v && std::abs(*v - want) < 1e-4 * std::abs(want);
  }
  // A parameter vector of `len` elements (a per-feature weight or bias).
  bool param_vec(const std::string& t, int64_t len) const {
    const auto& ti = net.at(t);
    return !ti.activation && ti.param && ti.shape && ti.shape->size() == 1 && (*ti.shape)[0] == len;
  }
  int producer(const std::string& t) const { return t.empty() ? -1 : net.at(t).producer; }
};

/// One projection of an attention region: weight, bias, output tensor, layout.
struct Proj {
  std::string w, b, out;
  bool transpose = false;
  int64_t rows = 0;
  bool after_softmax = false;
};
/// MatMul(x, W) [+ Add b] or Gemm(x, W, b) with a parameter W at node `i` (not in `inside`), or nothing.
std::optional<Proj> projection_at(const Net& net, int i, const std::set<int>& inside);

/// Longest common "/"-separated prefix of the node names plus "/suffix" (torch names nodes by module).
std::string fused_name(const Net& net, const std::vector<int>& nodes, const char* suffix);
/// Parameter tensors behind `t`, walking back through static (shape/weight preprocessing) nodes.
void param_roots(const Net& net, const std::string& t, std::set<std::string>& out);
/// Marks the nodes as matched.
void claim(std::vector<bool>& claimed, const std::vector<int>& nodes);

/// Swin's (shifted) window attention blocks as window_attention ops (onnx_window_attention.cpp).
void map_window_attention(Mapper& mp, const Matcher& m, std::vector<bool>& claimed);

/// A region whose tensors keep the batch as a dimension of its own but not always dim 0 (DLRM's
/// interaction gathered as [F, F, B]), mapped node by node onto batch-first IR ops
/// (onnx_batch_axis.cpp): "" when every node maps, else why the first that does not (naming it).
std::string map_batch_axis_region(Mapper& mp, const std::vector<int>& nodes);

/// A scalar graph output that is the model's own loss, SoftmaxCrossEntropyLoss (mean) over logits
/// and an int64 label input, possibly reshaped [B, ..., C] -> [B*N, C] (onnx_losses.cpp): an IR
/// cross_entropy recorded in Mapper::own_losses, or a refusal naming the node. False when node i is
/// not such a loss.
bool match_own_loss(Mapper& mp, const Matcher& m, int i, std::vector<bool>& claimed);

/// A pool written as Transpose -> GatherND of constant spatial indices -> Transpose -> ReduceMean
/// (torch.export's adaptive_avg_pool2d) at GatherND node i: resize nearest or avgpool, or a refusal
/// naming the node (onnx_index_pool.cpp). False when node i is not that.
bool match_index_pool(Mapper& mp, const Matcher& m, int i, std::vector<bool>& claimed);

}  // namespace gp::importers::onnx_detail
