// Internal (LibTorch) executor API shared by run_single, the pipeline workers and the profiler:
// a StageModule holds the parameters of a set of ops and runs their forward for one micro-batch.
// Include only from runtime .cpp files (it pulls in <torch/torch.h>).
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
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "importers/weights.h"
#include "ir/model.h"

namespace gp::runtime {

using TensorMap = std::unordered_map<std::string, torch::Tensor>;

/// Which samples of which step a micro-batch holds (global sample indices within the mini-batch).
struct MicroBatchInfo {
  int64_t sample_begin = 0;  // global index of the first sample in the mini-batch
  int64_t count = 0;         // samples in this micro-batch (or in this replica's share of it)
  int64_t mini_batch = 0;    // samples in the whole mini-batch (loss scaling: count / mini_batch)
  int64_t step = 0;          // optimizer step (0-based); data and dropout masks depend on it
  bool train = true;         // false for evaluation: dropout passes its input through
};

/// A stable 64-bit hash (FNV-1a over the parts, then a splitmix64 finaliser); identical across
/// builds and platforms, unlike std::hash.
uint64_t stable_hash(std::initializer_list<std::string_view> parts, uint64_t seed);
uint64_t stable_hash_ints(uint64_t h, std::initializer_list<int64_t> values);

/// The parameters of one op kind: names in a fixed order and their shapes given the op's input
/// shapes (per-sample dims with the batch dim). Empty for parameter-free ops.
std::vector<std::pair<std::string, std::vector<int64_t>>> param_specs(const ir::Graph& g, OpId op);

/// The deterministic initial value of parameter `param` of op `op` (depends on seed, op name,
/// param name only). Linear/conv/attention weights: uniform(+-1/sqrt(fan_in)); biases likewise;
/// norm weights 1 and biases 0; embedding rows uniform(+-1/sqrt(dim)).
torch::Tensor init_parameter(const ir::Graph& g, OpId op, const std::string& param, const std::vector<int64_t>& shape,
                             uint64_t seed);

/// Runs op `op` on `inputs` with `params` (in param_specs order). `info` is used by dropout.
torch::Tensor run_op(const ir::Graph& g, OpId op, const std::vector<torch::Tensor>& inputs,
                     const std::vector<torch::Tensor>& params, const MicroBatchInfo& info, uint64_t seed);

/// For an i64 graph input: the exclusive upper bound of its values (embedding(_bag) rows,
/// cross_entropy classes); the minimum over its consumers. UserError when nothing bounds it.
int64_t index_range(const ir::Graph& g, int input_index);

/// Samples [sample_begin, sample_begin + count) of graph input `input_index` at `step`.
/// Features: f32 normal(0, 1); i64 (embedding indices) uniform integers in [0, index_range).
/// Targets (input 1 of a cross_entropy or mse_loss) are a learnable function of the same samples'
/// features (teacher_source): the argmax class of a fixed random linear map of a summary of them
/// (sequences averaged over positions, images over space, at most 256 values; token indices are
/// summarised as the mean of a fixed random 16-value vector per token), or tanh of such a map (64
/// values, tiled to the target's size). Each sample depends only on
/// (seed, input, sample index, step), so every partition of the mini-batch sees the same data.
/// The graph input the synthetic targets are computed from: the first f32 input that is not itself
/// a target, else the first such i64 input (token indices); -1 when there is none (targets are then
/// random).
int teacher_source(const ir::Graph& g);

torch::Tensor synthetic_input(const ir::Graph& g, int input_index, int64_t sample_begin, int64_t count, uint64_t seed,
                              int64_t step);

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
  /// backpropagate so that accumulated gradients equal those of the mini-batch mean loss.
  /// An undefined tensor when the stage has no loss op.
  torch::Tensor scaled_loss(const TensorMap& outputs, const MicroBatchInfo& info) const;

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

/// UserError when a key of `initial` names no parameter of the graph (e.g. values for another model).
void check_initial_values(const ir::Graph& g, const importers::ParamValues& initial);

/// Graph inputs needed by a micro-batch of the given stage, generated synthetically (on the CPU, as
/// on every device, then copied to the module's device).
TensorMap synthetic_external_inputs(const StageModule& m, const MicroBatchInfo& info);

}  // namespace gp::runtime
