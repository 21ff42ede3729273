// Internal (LibTorch): synthetic training data, partition-independent: sample i of graph input X
// depends only on (seed, X, global sample index i, step), so every plan and the single-process
// reference see the same data. Include only from runtime .cpp files.
#pragma once
#include <optional>
#include <torch/torch.h>

#include <cstdint>

#include "ir/model.h"
#include "runtime/exec/ops.h"
#include "runtime/exec/stage_module.h"

namespace gp::runtime {

/// For an i64 graph input: the exclusive upper bound of its values (embedding(_bag) rows,
/// cross_entropy classes); the minimum over its consumers. UserError when nothing bounds it.
int64_t index_range(const ir::Graph& g, int input_index);
/// The label value a cross_entropy reading graph input `input_index` ignores (its attrs.ignore_index),
/// if any: allowed in the data beside [0, index_range).
std::optional<int64_t> ignored_label(const ir::Graph& g, int input_index);

/// The graph input the synthetic targets are computed from: the first f32 input that is not itself
/// a target, else the first such i64 input (token indices); -1 when there is none (targets are then
/// random).
int teacher_source(const ir::Graph& g);

/// Samples [sample_begin, sample_begin + count) of graph input `input_index` at `step`.
/// Features: f32 normal(0, 1); i64 (embedding indices) uniform integers in [0, index_range).
/// Targets (input 1 of a cross_entropy or mse_loss) are a learnable function of the same samples'
/// features (teacher_source): the argmax class of a fixed random linear map of a summary of them
/// (sequences averaged over positions, images over space, at most 256 values; token indices are
/// summarised as the mean of a fixed random 16-value vector per token), or tanh of such a map (64
/// values, tiled to the target's size). Each sample depends only on
/// (seed, input, sample index, step), so every partition of the mini-batch sees the same data.
/// `pinned`: feature rows are written into page-locked host memory (CUDA's host allocator), which a
/// GPU copies from asynchronously; needs a CUDA build with a GPU.
torch::Tensor synthetic_input(const ir::Graph& g, int input_index, int64_t sample_begin, int64_t count, uint64_t seed,
                              int64_t step, bool pinned = false);

/// Graph inputs needed by a micro-batch of the given stage, generated synthetically on the CPU (as
/// on every device). `on_host`: left there (pinned where the module is on a GPU, for a DeviceUpload);
/// else copied to the module's device.
TensorMap synthetic_external_inputs(const StageModule& m, const MicroBatchInfo& info, bool on_host = false);

}  // namespace gp::runtime
