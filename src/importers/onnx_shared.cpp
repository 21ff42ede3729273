// Tied parameters in an ONNX file: one initializer read by the weight slots of several IR ops
// (directly or behind Transpose / Identity / Cast, e.g. GPT-2's LM head MatMul(x, Transpose(wte))
// and the embedding's Gather(wte, ids)) becomes one ir::SharedParam, so the parameter is counted,
// held and trained once as PyTorch does. Names and shapes only: no values are read.
//
// Except where the exporter merged them: torch.onnx.export's constant folding (on by default) keeps
// one initializer of each set of equal value and shape and gives the others' names to Identity nodes
// reading it (two LayerNorms' all-ones weights, zero biases). Those are separate parameters in
// PyTorch, which a tie would train as one. A real tie is one tensor in PyTorch and reaches the file as
// one initializer without Identity. So an Identity over an initializer names a parameter of its own
// (GRAPHPIPE_ONNX_TIES=keep: trained as one with the initializer, as before), with one warning.
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <numeric>
#include <set>

#include "importers/onnx_mapper.h"

namespace gp::importers::onnx_detail {
namespace {

/// The parameter tensor behind a weight slot and the permutation from its layout to the IR
/// parameter's: IR value = permute(root value, perm). Empty root when the slot is computed otherwise.
struct Root {
  std::string tensor;
  std::vector<int64_t> perm;
  std::string merged_as;  // the Identity output (a PyTorch parameter's name) the slot read it through
};

Root root_of(const Net& net, const ParamSource& ps) {
  std::string t = ps.tensor;
  const size_t rank = net.at(t).shape ? net.at(t).shape->size() : ps.shape.size();
  std::vector<int64_t> perm(rank);
  std::iota(perm.begin(), perm.end(), int64_t{0});
  std::string merged_as;
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
    } else if (n.op_type() == "Identity") {
      if (net.at(n.input(0)).param && net.at(n.input(0)).producer < 0) merged_as = n.output(0);
    } else if (n.op_type() != "Cast") {
      return {};
    }
    t = n.input(0);
  }
  if (!net.at(t).param) return {};
  if (ps.transpose && perm.size() == 2) std::swap(perm[0], perm[1]);
  return {t, perm, merged_as};
}

bool keep_merged_ties() {
  const char* v = std::getenv("GRAPHPIPE_ONNX_TIES");
  const std::string mode = v ? v : "auto";
  GP_CHECK(mode == "auto" || mode == "keep",
           "GRAPHPIPE_ONNX_TIES: expected auto (initializers the exporter merged are separate parameters) or keep "
           "(trained as one), found \"{}\"",
           mode);
  return mode == "keep";
}

// One line per file and process (a model is loaded several times), from rank 0 only under a launcher.
void warn_merged(const std::string& path, const std::map<std::string, std::set<std::string>>& merged, bool keep) {
  static std::mutex mu;
  static std::set<std::string> warned;
  std::lock_guard<std::mutex> lock(mu);
  const char* rank = std::getenv("RANK");
  if (!warned.insert(path).second || (rank && std::string(rank) != "0")) return;
  std::string list;
  for (const auto& [init, names] : merged)
    list += fmt::format("{}{} also stands for {}", list.empty() ? "" : "; ", init, fmt::join(names, ", "));
  std::fprintf(stderr,
               "graphpipe: warning: %s: the exporter merged initializers of equal value into one (torch.onnx.export's "
               "constant folding, on by default): %s. %s Export with do_constant_folding=False and "
               "training=torch.onnx.TrainingMode.TRAINING to keep them apart in the file.\n",
               path.c_str(), list.c_str(),
               keep ? "GRAPHPIPE_ONNX_TIES=keep: each set is trained as ONE parameter, unlike PyTorch."
                    : "Each is imported as the separate parameter PyTorch has (GRAPHPIPE_ONNX_TIES=keep trains each "
                      "set as one).");
}

}  // namespace

void tie_shared_params(const Net& net, const std::vector<ParamSource>& sources, ir::Model& model) {
  const bool keep = keep_merged_ties();
  std::map<std::string, std::vector<const ParamSource*>> users;  // root tensor -> its slots
  std::map<std::string, Root> roots;
  std::map<std::string, std::set<std::string>> merged;  // initializer -> the parameter names merged into it
  for (const ParamSource& ps : sources) {
    if (!ps.error.empty() || ps.tensor.empty()) continue;
    Root r = root_of(net, ps);
    if (r.tensor.empty()) continue;
    if (!r.merged_as.empty()) {
      merged[r.tensor].insert(r.merged_as);
      if (!keep) r.tensor = r.merged_as;  // a parameter of its own, its value read through the Identity
    }
    users[r.tensor].push_back(&ps);
    roots[ps.op + "/" + ps.param] = r;
  }
  if (!merged.empty()) warn_merged(net.path, merged, keep);
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
