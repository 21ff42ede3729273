// Shared (tied) parameters: checks of Model::shared_params, and the Graph's view of them (which ops
// use each, how many elements it has, which a stage holds). See docs/graph.md ("Shared parameters").
#include <set>
#include <unordered_map>

#include "ir/model.h"

namespace gp::ir {

std::pair<std::string, std::string> split_use(const std::string& use) {
  auto slash = use.rfind('/');
  if (slash == std::string::npos) return {use, ""};
  return {use.substr(0, slash), use.substr(slash + 1)};
}

void validate_shared_params(const Model& m, const std::string& where) {
  std::unordered_map<std::string, int> op_index;
  for (size_t i = 0; i < m.ops.size(); ++i) op_index.emplace(m.ops[i].name, static_cast<int>(i));
  std::set<std::string> names, uses_seen;
  for (size_t k = 0; k < m.shared_params.size(); ++k) {
    const SharedParam& sp = m.shared_params[k];
    const std::string at = fmt::format("{}: shared_params[{}]", where, k);
    GP_CHECK(!sp.name.empty(), "{}: empty name", at);
    GP_CHECK(names.insert(sp.name).second, "{} (\"{}\"): duplicate name", at, sp.name);
    GP_CHECK(!sp.shape.empty(), "{} (\"{}\"): empty shape", at, sp.name);
    double n = 1;
    for (int64_t d : sp.shape) {
      GP_CHECK(d > 0, "{} (\"{}\"): shape {} has a non-positive dimension", at, sp.name, shape_str(sp.shape));
      n *= static_cast<double>(d);
    }
    GP_CHECK(n <= kMaxParamsPerOp, "{} (\"{}\"): shape {} has more than 2^44 elements", at, sp.name,
             shape_str(sp.shape));
    GP_CHECK(sp.uses.size() >= 2, "{} (\"{}\"): {} use{}, a shared parameter needs at least 2", at, sp.name,
             sp.uses.size(), sp.uses.size() == 1 ? "" : "s");
    std::set<std::string> ops;
    for (size_t u = 0; u < sp.uses.size(); ++u) {
      auto [op, param] = split_use(sp.uses[u]);
      GP_CHECK(!op.empty() && !param.empty(), "{} (\"{}\"): uses[{}] \"{}\" is not \"op/param\"", at, sp.name, u,
               sp.uses[u]);
      GP_CHECK(op_index.count(op), "{} (\"{}\"): uses[{}]: unknown op \"{}\"", at, sp.name, u, op);
      GP_CHECK(ops.insert(op).second, "{} (\"{}\"): op \"{}\" is used twice (uses are distinct ops)", at, sp.name, op);
      GP_CHECK(uses_seen.insert(sp.uses[u]).second, "{} (\"{}\"): \"{}\" already belongs to another shared parameter",
               at, sp.name, sp.uses[u]);
    }
  }
}

void Graph::link_shared_params(const std::string& where) {
  shared_users_.assign(model_.shared_params.size(), {});
  for (size_t k = 0; k < model_.shared_params.size(); ++k) {
    const SharedParam& sp = model_.shared_params[k];
    const int64_t n = shared_numel(k);
    for (size_t u = 0; u < sp.uses.size(); ++u) {
      OpId id = find(split_use(sp.uses[u]).first);
      OpCosts& c = costs_[id.v];
      GP_CHECK(c.params >= n, "{}: shared parameter \"{}\" ({} elements): op \"{}\" ({}) has only {} parameters", where,
               sp.name, n, op(id).name, to_string(op(id).kind), c.params);
      shared_users_[k].push_back(id);
      if (u == 0) continue;
      // Counted once, with the canonical user: the other users hold no parameter of their own.
      const int64_t bytes_each = c.params > 0 ? c.param_bytes / c.params : 0;
      c.params -= n;
      c.param_bytes -= n * bytes_each;
      c.param_tensors -= 1;
    }
  }
}

std::vector<int> Graph::shared_held(const std::vector<char>& in_stage) const {
  std::vector<int> out;
  for (size_t k = 0; k < shared_users_.size(); ++k)
    for (OpId id : shared_users_[k])
      if (in_stage[id.v]) {
        out.push_back(static_cast<int>(k));
        break;
      }
  return out;
}

int64_t Graph::shared_numel(size_t k) const {
  int64_t n = 1;
  for (int64_t d : model_.shared_params[k].shape) n *= d;
  return n;
}

}  // namespace gp::ir
