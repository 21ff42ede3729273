// Zero-bubble split of one micro-batch's backward into B (gradients w.r.t. the stage's received
// inputs, sent upstream at once) and W (the parameters' gradients, which only the optimizer step
// waits on), as torch.distributed.pipelining's stage_backward_input / stage_backward_weight do.
// Include only from runtime .cpp files (it pulls in <torch/torch.h>).
//
// How: after forward, the autograd graph below the stage's outputs is split in two regions:
//  - D: the nodes with a path to a received input (they are on the input-gradient path);
//  - the rest: nodes that lead only to parameters (e.g. the transpose of a linear's weight).
// A *joining* node is a D node with a next edge into the parameter-only region (for a linear,
// AddmmBackward: its input edge is in D, its weight edge is not). B runs the engine from the stage's
// outputs to the received inputs only: LibTorch's engine computes only the edges on a path to the
// requested inputs, so the joining nodes produce their input gradients and skip their weight
// gradients (the X^T dY GEMMs). A pre-hook on each joining node keeps the gradient it received. W
// runs the joining nodes again from those kept gradients with the parameters as the only targets:
// now only their parameter edges and the parameter-only nodes below them run. Outputs that do not
// depend on a received input at all (the first stage, a loss of parameters only) are all of W.
//
// After B the joining nodes' edges into D are cut (B is done with them): W, one engine pass from
// every joining node and every input-free output to the parameters, cannot reach the input path
// again, so it runs none of B's work twice and counts nothing twice (also for a weight used by two
// ops in sequence, shared parameters, parameters used by several ops), and the input path's saved
// tensors are freed at the end of B. The parameters' gradients accumulate into .grad as one full
// backward's would.
#pragma once
#include <torch/torch.h>

#include <memory>
#include <vector>

namespace gp::runtime::detail {

class SplitBackward {
 public:
  /// B: gradients of `roots` (with `grads`) w.r.t. the floating leaves `inputs` accumulate into their
  /// .grad; keeps (with the graph) what backward_weight needs. `params`: the stage's parameters
  /// (requires_grad leaves). Call once per micro-batch, before backward_weight.
  void backward_input(const std::vector<torch::Tensor>& roots, const std::vector<torch::Tensor>& grads,
                      const std::vector<torch::Tensor>& inputs, const std::vector<torch::Tensor>& params);
  /// W: accumulates the parameters' gradients into their .grad, then releases the micro-batch's graph.
  void backward_weight();
  /// Between backward_input and backward_weight.
  bool pending() const { return pending_; }

  /// Of the last backward_input: the joining nodes W runs again, and the outputs that depend on no
  /// input (W runs from them).
  int joining_nodes() const { return static_cast<int>(joins_.size()); }
  int free_roots() const { return static_cast<int>(free_roots_.size()); }

 private:
  void clear();
  struct Join {
    std::shared_ptr<torch::autograd::Node> node;
    std::shared_ptr<std::vector<torch::Tensor>> grads;  // what it received in B (its pre-hook keeps it)
  };
  std::vector<Join> joins_;
  std::vector<torch::autograd::Edge> free_roots_;
  std::vector<torch::Tensor> free_grads_;
  std::vector<torch::autograd::Edge> w_targets_;  // gradient edges of the parameters W reaches
  bool pending_ = false;
};

}  // namespace gp::runtime::detail
