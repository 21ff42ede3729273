// Tied parameters in an ONNX file: one initializer read by the weight slots of several IR ops
// (directly or behind Transpose / Identity / Cast, e.g. GPT-2's LM head MatMul(x, Transpose(wte))
// and the embedding's Gather(wte, ids)) becomes one ir::SharedParam, so the parameter is counted,
// held and trained once as PyTorch does. Names and shapes only: no values are read.
#include <map>
#include <numeric>

#include "importers/onnx_mapper.h"

namespace gp::importers::onnx_detail {
namespace {

/// The parameter tensor behind a weight slot and the permutation from its layout to the IR
/// parameter's: IR value = permute(root value, perm). Empty root when the slot is computed otherwise.
struct Root {
  std::string tensor;
  std::vector<int64_t> perm;
};

Root root_of(const Net& net, const ParamSource& ps) {
  std::string t = ps.tensor;
  const size_t rank = net.at(t).shape ? net.at(t).shape->size() : ps.shape.size();
  std::vector<int64_t> perm(rank);
  std::iota(perm.begin(), perm.end(), int64_t{0});
  for (;;) {
    const TensorInfo& ti = net.at(t);
    if (ti.producer < 0) break;
    const onnx::NodeProto& n = net.nodes[static_cast<size_t>(ti.producer)];
    if (n.op_type() == "Transpose") {
      std::vector<int64_t> p = attr_ints(n, "perm");
      if (p.empty())
        for (size_t d = perm.size(); d-- > 0;) p.push_back(static_cast<int64_t>(d));
      if (p.size() != perm.size()) return {};
      for (auto& c : perm) c = p[static_cast<size_t>(c)];
    } else if (n.op_type() != "Identity" && n.op_type() != "Cast") {
      return {};
    }
    t = n.input(0);
  }
  if (!net.at(t).param) return {};
  if (ps.transpose && perm.size() == 2) std::swap(perm[0], perm[1]);
  return {t, perm};
}

}  // namespace

void tie_shared_params(const Net& net, const std::vector<ParamSource>& sources, ir::Model& model) {
  std::map<std::string, std::vector<const ParamSource*>> users;  // root tensor -> its slots
  std::map<std::string, Root> roots;
  for (const ParamSource& ps : sources) {
    if (!ps.error.empty() || ps.tensor.empty()) continue;
    Root r = root_of(net, ps);
    if (r.tensor.empty()) continue;
    users[r.tensor].push_back(&ps);
    roots[ps.op + "/" + ps.param] = r;
  }
  for (const auto& [tensor, slots] : users) {
    std::vector<std::string> ops;
    for (const ParamSource* ps : slots)
      if (std::find(ops.begin(), ops.end(), ps->op) == ops.end()) ops.push_back(ps->op);
    if (ops.size() < 2) continue;  // one op's packed Q/K/V parts, or an ordinary parameter
    ir::SharedParam sp{tensor, slots.front()->shape, {}};
    const std::vector<int64_t>& first = roots.at(slots.front()->op + "/" + slots.front()->param).perm;
    for (const ParamSource* ps : slots) {
      const std::string use = ps->op + "/" + ps->param;
      // Equal when every slot reads the root through the same permutation (and takes all of it).
      GP_CHECK(ps->parts == 1 && ps->shape == sp.shape && roots.at(use).perm == first,
               "{}: initializer \"{}\" is shared by ops \"{}\" and \"{}\" in different layouts (as [{}] and [{}]{}); "
               "only a parameter used with the same shape and element order by every op can be tied",
               net.path, tensor, slots.front()->op, ps->op, fmt::join(sp.shape, ", "), fmt::join(ps->shape, ", "),
               ps->parts > 1 ? ", a part of it" : "");
      sp.uses.push_back(use);
    }
    model.shared_params.push_back(std::move(sp));
  }
  ir::validate_shared_params(model, net.path);
}

}  // namespace gp::importers::onnx_detail
