// Losses a model computes itself (onnx_patterns.h, match_own_loss): a module whose forward returns
// F.cross_entropy(logits.view(-1, V), targets.view(-1)) (how GPTs are trained) is exported by both of
// torch's exporters as Reshape(logits [B, ..., V] -> [B*N, V]), Reshape(targets [B, ...] -> [B*N]),
// SoftmaxCrossEntropyLoss -> a scalar graph output. The IR's cross_entropy reads the same mean over
// every position with the classes on dim 1, so the logits are transposed there, the targets are the
// data input as it is, and the output is the model's loss (no loss is appended for it).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "importers/onnx_patterns.h"

namespace gp::importers::onnx_detail {
namespace {

// The tensor a chain of Reshape / Identity / Squeeze / Flatten nodes (each read only by the next)
// starts from, and those nodes.
std::string before_reshapes(const Net& net, std::string t, std::vector<int>& nodes) {
  for (int guard = 0; guard < 8; ++guard) {
    const int p = net.at(t).producer;
    if (p < 0 || net.at(t).consumers.size() != 1) return t;
    const auto& nd = net.nodes[static_cast<size_t>(p)];
    const std::string& op = nd.op_type();
    if (op != "Reshape" && op != "Identity" && op != "Flatten" && op != "Squeeze") return t;
    nodes.push_back(p);
    t = nd.input(0);
  }
  return t;
}

}  // namespace

bool match_own_loss(Mapper& mp, const Matcher& m, int i, std::vector<bool>& claimed) {
  const Net& net = mp.net;
  const auto& nd = net.nodes[static_cast<size_t>(i)];
  if (nd.op_type() != "SoftmaxCrossEntropyLoss" || !m.is_output(nd.output(0))) return false;
  std::vector<int> nodes{i};
  auto refuse = [&](const std::string& why) {
    claim(claimed, nodes);
    mp.reasons.push_back(fmt::format("{}: the model's own loss: {}", node_label(nd), why));
    return true;
  };
  const std::string reduction = find_attr(nd, "reduction") ? find_attr(nd, "reduction")->s() : "mean";
  if (reduction != "mean")
    return refuse(
        fmt::format("reduction \"{}\" (the runtime averages the loss over the mini-batch; return "
                    "F.cross_entropy's default mean)",
                    reduction));
  if (nd.input_size() > 2 && !nd.input(2).empty()) return refuse("class weights are not supported");
  if (nd.output_size() > 1 && !nd.output(1).empty() && !net.at(nd.output(1)).consumers.empty())
    return refuse("its log-probabilities output is used");
  const std::string logits = before_reshapes(net, nd.input(0), nodes);
  const std::string labels = before_reshapes(net, nd.input(1), nodes);
  if (!mp.batch_first(logits) || !mp.batch_first(labels))
    return refuse(fmt::format("logits \"{}\" and labels \"{}\" are not both batch-first tensors", logits, labels));
  const bool is_input = std::find(net.data_inputs.begin(), net.data_inputs.end(), labels) != net.data_inputs.end();
  const int et = net.at(labels).elem_type;
  if (!is_input || (et != onnx::TensorProto::INT64 && et != onnx::TensorProto::INT32))
    return refuse(fmt::format("the labels \"{}\" are not an int64 (or int32) input of the model", labels));
  const auto &ls = net.shape(logits), &ys = net.shape(labels);
  // Classes on dim 1 as the scores read them ([N, C, d...] unreshaped), or last ([B, ..., C] reshaped).
  const bool reshaped = logits != nd.input(0);
  std::vector<int64_t> want = ls;
  want.erase(want.begin() + (reshaped ? static_cast<std::ptrdiff_t>(ls.size()) - 1 : 1));
  if (ls.size() < 2 || ys != want)
    return refuse(fmt::format("labels [{}] do not fit logits [{}] ({})", fmt::join(ys, ", "), fmt::join(ls, ", "),
                              reshaped ? "classes last" : "classes on dim 1"));
  claim(claimed, nodes);
  Json attrs = Json::object();
  if (const auto* ii = find_attr(nd, "ignore_index")) attrs["ignore_index"] = ii->i();
  std::string scores = logits;
  if (reshaped && ls.size() > 2) {  // [B, d..., C] -> [B, C, d...]
    std::vector<int64_t> perm{0, static_cast<int64_t>(ls.size()) - 1};
    for (int64_t d = 1; d + 1 < static_cast<int64_t>(ls.size()); ++d) perm.push_back(d);
    ir::Shape moved{ir::kBatch, ls.back()};
    moved.insert(moved.end(), ls.begin() + 1, ls.end() - 1);
    const std::string t = mp.emit(nd.name() + "/classes", ir::OpKind::transpose, {logits}, "", Json{{"perm", perm}},
                                  &moved);
    mp.producer_of["\x01" + t] = t;
    scores = "\x01" + t;
  }
  const ir::Shape scalar{};
  mp.own_losses[nd.output(0)] = mp.emit(nd.name(), ir::OpKind::cross_entropy, {scores, labels}, nd.output(0), attrs,
                                        &scalar);
  return true;
}

}  // namespace gp::importers::onnx_detail
