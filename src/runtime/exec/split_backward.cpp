// Zero-bubble split backward (split_backward.h): graph regions, joining nodes, B and W.
#include "runtime/exec/split_backward.h"

#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <cstdint>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "support/error.h"

namespace gp::runtime::detail {
namespace {

using torch::autograd::Edge;
using torch::autograd::Node;

/// A set of parameter indices.
class ParamSet {
 public:
  explicit ParamSet(size_t n = 0) : w_((n + 63) / 64, 0) {}
  void add(size_t i) { w_[i / 64] |= uint64_t{1} << (i % 64); }
  bool has(size_t i) const { return (w_[i / 64] >> (i % 64)) & 1; }
  void merge(const ParamSet& o) {
    for (size_t k = 0; k < w_.size(); ++k) w_[k] |= o.w_[k];
  }
  bool empty() const {
    for (uint64_t x : w_)
      if (x) return false;
    return true;
  }

 private:
  std::vector<uint64_t> w_;
};

/// The autograd graph below some roots: nodes in post-order (each after every node its next edges
/// reach) and each node's successors by index.
struct GraphView {
  std::vector<std::shared_ptr<Node>> order;
  std::vector<std::vector<size_t>> next;
};

GraphView walk(const std::vector<std::shared_ptr<Node>>& roots) {
  GraphView g;
  std::unordered_map<Node*, size_t> index;
  std::unordered_set<Node*> seen;
  std::vector<std::pair<std::shared_ptr<Node>, size_t>> stack;  // node, next edge to visit
  for (const auto& r : roots) {
    if (!r || !seen.insert(r.get()).second) continue;
    stack.emplace_back(r, 0);
    while (!stack.empty()) {
      const size_t top = stack.size() - 1;
      Node* n = stack[top].first.get();
      if (stack[top].second < n->next_edges().size()) {
        const std::shared_ptr<Node>& c = n->next_edges()[stack[top].second++].function;
        if (c && seen.insert(c.get()).second) stack.emplace_back(c, 0);
        continue;
      }
      index.emplace(n, g.order.size());
      g.order.push_back(std::move(stack[top].first));
      stack.pop_back();
    }
  }
  g.next.resize(g.order.size());
  for (size_t i = 0; i < g.order.size(); ++i)
    for (const Edge& e : g.order[i]->next_edges())
      if (e.function) g.next[i].push_back(index.at(e.function.get()));
  return g;
}

/// Keeps the gradients a joining node receives in B (the first time it runs) for W.
struct KeepGrads final : torch::autograd::FunctionPreHook {
  explicit KeepGrads(std::shared_ptr<std::vector<torch::Tensor>> s) : slot(std::move(s)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override {
    if (slot->empty()) *slot = grads;
    return grads;
  }
  std::shared_ptr<std::vector<torch::Tensor>> slot;
};

}  // namespace

void SplitBackward::backward_input(const std::vector<torch::Tensor>& roots, const std::vector<torch::Tensor>& grads,
                                   const std::vector<torch::Tensor>& inputs, const std::vector<torch::Tensor>& params) {
  GP_ASSERT(!pending_, "backward_input twice without backward_weight");
  GP_ASSERT(roots.size() == grads.size(), "{} roots, {} gradients", roots.size(), grads.size());
  clear();
  pending_ = true;
  if (roots.empty()) return;

  std::unordered_map<const Node*, size_t> param_of;
  std::vector<Edge> param_edges;
  for (size_t i = 0; i < params.size(); ++i) {
    param_edges.push_back(torch::autograd::impl::gradient_edge(params[i]));
    param_of.emplace(param_edges.back().function.get(), i);
  }
  std::unordered_set<const Node*> input_nodes;
  for (const auto& x : inputs) input_nodes.insert(torch::autograd::impl::gradient_edge(x).function.get());
  std::vector<Edge> root_edges;
  std::vector<std::shared_ptr<Node>> root_nodes;
  for (const auto& r : roots) {
    root_edges.push_back(torch::autograd::impl::gradient_edge(r));
    root_nodes.push_back(root_edges.back().function);
  }

  // D (a path to a received input) and, for the others, the parameters below; for a D node, the
  // parameters below its edges into the parameter-only region (non-empty: a joining node).
  const GraphView g = walk(root_nodes);
  const size_t n = g.order.size();
  std::vector<char> in_d(n, 0);
  std::vector<ParamSet> below(n, ParamSet(params.size()));
  std::unordered_map<const Node*, size_t> index;
  for (size_t i = 0; i < n; ++i) {
    const Node* node = g.order[i].get();
    index.emplace(node, i);
    in_d[i] = input_nodes.count(node) ? 1 : 0;
    if (auto it = param_of.find(node); it != param_of.end()) below[i].add(it->second);
    for (size_t c : g.next[i]) in_d[i] = in_d[i] || in_d[c];
    for (size_t c : g.next[i])
      if (!in_d[c]) below[i].merge(below[c]);
  }
  std::vector<size_t> joins;
  for (size_t i = 0; i < n; ++i)
    if (in_d[i] && !below[i].empty()) joins.push_back(i);
  ParamSet w_params(params.size());
  for (size_t j : joins) {
    Join jn;
    jn.node = g.order[j];
    jn.grads = std::make_shared<std::vector<torch::Tensor>>();
    jn.node->add_pre_hook(std::make_unique<KeepGrads>(jn.grads));
    joins_.push_back(std::move(jn));
    w_params.merge(below[j]);
  }
  // Outputs that do not depend on the inputs: W runs from them as they are.
  for (size_t k = 0; k < root_edges.size(); ++k) {
    size_t i = index.at(root_edges[k].function.get());
    if (!in_d[i] && !below[i].empty()) {
      free_roots_.push_back(root_edges[k]);
      free_grads_.push_back(grads[k]);
      w_params.merge(below[i]);
    }
  }
  for (size_t p = 0; p < params.size(); ++p)
    if (w_params.has(p)) w_targets_.push_back(param_edges[p]);

  // Only the paths to the inputs run (LibTorch computes only the edges that lead to requested inputs).
  if (!inputs.empty()) torch::autograd::backward(roots, grads, /*retain_graph=*/true, false, inputs);
  // The joining nodes' edges into D have done their work: cut them, so W cannot run any of B's work
  // again (from one joining node down the input path to another), and D's saved tensors are freed.
  for (size_t j : joins)
    for (Edge& e : g.order[j]->next_edges())
      if (e.function && in_d[index.at(e.function.get())]) e = Edge();
}

void SplitBackward::backward_weight() {
  GP_ASSERT(pending_, "backward_weight without backward_input");
  std::vector<Edge> roots = free_roots_;
  std::vector<torch::Tensor> gs = free_grads_;
  for (const Join& j : joins_)
    for (size_t k = 0; k < j.grads->size(); ++k)
      if ((*j.grads)[k].defined()) {
        roots.emplace_back(j.node, static_cast<uint32_t>(k));
        gs.push_back((*j.grads)[k]);
      }
  // One pass from every joining node (its edges into D cut) and every free output to the parameters.
  if (!roots.empty() && !w_targets_.empty())
    torch::autograd::Engine::get_default_engine().execute(roots, gs, /*keep_graph=*/false, /*create_graph=*/false,
                                                          /*accumulate_grad=*/true, w_targets_);
  clear();
}

void SplitBackward::clear() {
  joins_.clear();  // releases the micro-batch's graph
  free_roots_.clear();
  free_grads_.clear();
  w_targets_.clear();
  pending_ = false;
}

}  // namespace gp::runtime::detail
