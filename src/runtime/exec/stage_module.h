// Internal (LibTorch): a StageModule holds the parameters of a set of ops (a stage, or the whole model
// for run_single and the profiler) and runs their forward for one micro-batch. Include only from
// runtime .cpp files (it pulls in <torch/torch.h>).
//
// Determinism / partition independence (see runtime_common design):
//  - a parameter's initial value is the model file's (an ONNX initializer, importers/weights.h) when
//    the map given to StageModule has it, else depends only on (seed, op name, parameter name);
//  - sample i of graph input X depends only on (seed, X, global sample index i, step);
//  - a dropout mask row depends only on (seed, op name, global sample index, step).
// So any plan and the single-process reference see identical weights, data and masks.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "importers/weights.h"
#include "ir/model.h"
#include "runtime/exec/ops.h"

namespace gp::runtime {

/// The parameters + forward of a set of ops (a stage), built from an ir::Graph.
class StageModule {
 public:
  /// `ops` may be in any order; they are executed in the graph's topological order. A parameter
  /// "op/param" present in `initial` starts from that value (UserError naming the parameter when its
  /// shape differs from param_specs), every other one from init_parameter(seed). The parameters live
  /// on `device` (initialised on the CPU, then copied there: the same values on every device).
  StageModule(const ir::Graph& g, std::vector<OpId> ops, uint64_t seed,
              const importers::ParamValues& initial = importers::ParamValues{}, torch::Device device = torch::kCPU);

  const ir::Graph& graph() const { return *g_; }
  const std::vector<OpId>& ops() const { return ops_; }
  uint64_t seed() const { return seed_; }
  /// Where the parameters live; forward() wants its inputs there (stage_inputs and
  /// synthetic_external_inputs put them there).
  const torch::Device& device() const { return device_; }

  /// requires_grad leaves in a deterministic order (ops in topological order, params in spec order).
  /// A shared parameter (ir::SharedParam) is one tensor for all its users in the stage, listed once
  /// where its first user in the stage lists it.
  std::vector<torch::Tensor> parameters() const;
  /// Same order, named "op/param" (e.g. "enc.l0.attn/wq"); a shared parameter by its canonical
  /// use (its first "op/param"), whichever of its users the stage holds.
  std::vector<std::pair<std::string, torch::Tensor>> named_parameters() const;
  /// The shared parameters this stage holds (indices into model().shared_params) and their tensors.
  const std::vector<std::pair<int, torch::Tensor>>& shared() const { return shared_; }

  /// Names of tensors this stage reads from outside: graph inputs and other stages' op outputs,
  /// sorted by name.
  const std::vector<std::string>& external_inputs() const { return external_; }
  /// Names of the loss ops (the model's outputs) inside this stage.
  const std::vector<std::string>& loss_ops() const { return losses_; }

  /// Runs forward for one micro-batch. `external` maps every name in external_inputs() to a tensor
  /// (batch dim = info.count); returns every op output of the stage by op name (autograd attached).
  TensorMap forward(const TensorMap& external, const MicroBatchInfo& info) const;

  /// The sum over this stage's loss ops of loss * (info.count / info.mini_batch): the quantity to
  /// backpropagate so that accumulated gradients equal those of the mini-batch mean loss. A
  /// cross_entropy with ignore_index is the mean over the labels it counts, so its weight is the
  /// micro-batch's counted labels over the mini-batch's (info.counted_labels; the labels read from
  /// `external`). An undefined tensor when the stage has no loss op.
  torch::Tensor scaled_loss(const TensorMap& outputs, const MicroBatchInfo& info,
                            const TensorMap& external = TensorMap{}) const;

  /// The label inputs of this stage's cross_entropy ops with ignore_index, and the value ignored.
  std::vector<std::pair<std::string, int64_t>> ignoring_labels() const;

 private:
  const ir::Graph* g_;
  std::vector<OpId> ops_;
  uint64_t seed_;
  torch::Device device_;
  std::vector<std::vector<torch::Tensor>> params_;            // per op (ops_ order)
  std::vector<std::vector<std::string>> param_names_;         // per op
  std::vector<std::pair<std::string, torch::Tensor>> named_;  // each tensor once (canonical names)
  std::vector<std::pair<int, torch::Tensor>> shared_;         // shared parameter index -> its tensor

  torch::Tensor make_parameter(OpId id, const std::string& name, const std::vector<int64_t>& shape,
                               const importers::ParamValues& initial,
                               const std::unordered_map<std::string, int>& shared_index);
  std::vector<std::string> external_;
  std::vector<std::string> losses_;
};

}  // namespace gp::runtime
