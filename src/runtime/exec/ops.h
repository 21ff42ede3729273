// Internal (LibTorch): one op of the graph run on tensors (run_op; semantics in ir/model.h), and the
// micro-batch it runs for. Include only from runtime .cpp files (it pulls in <torch/torch.h>).
#pragma once
#include <map>
#include <memory>
#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

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
  // Per label input of a cross_entropy with ignore_index: the labels it counts in the whole
  // mini-batch (set where a micro-batch is less than the mini-batch; see StageModule::scaled_loss).
  std::shared_ptr<const std::map<std::string, int64_t>> counted_labels;
};

/// Runs op `op` on `inputs` with `params` (in param_specs order). `info` is used by dropout.
torch::Tensor run_op(const ir::Graph& g, OpId op, const std::vector<torch::Tensor>& inputs,
                     const std::vector<torch::Tensor>& params, const MicroBatchInfo& info, uint64_t seed);

}  // namespace gp::runtime
