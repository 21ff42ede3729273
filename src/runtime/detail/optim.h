// Optimizers (SGD with momentum, Adam) and atomic checkpoints of a stage's parameters + optimizer
// state, shared by run_single and the pipeline workers.
// Checkpoint files: `<dir>/stage<S>-rank<R>.pt` for pipeline worker R holding stage S, and
// `<dir>/single.pt` for `train --single` (checkpoint_path with stage < 0). Each file holds the
// parameter names (to detect a mismatched stage), the parameters, the optimizer state and the
// number of completed steps; it is written to `<file>.tmp` and renamed into place.
#pragma once
#include <torch/torch.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/detail/executor.h"

namespace gp::runtime {

/// "sgd" (momentum, no dampening) or "adam" (betas 0.9/0.999, eps 1e-8); UserError otherwise.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& name, std::vector<torch::Tensor> params,
                                                        double lr, double momentum);

std::string checkpoint_path(const std::string& dir, int stage, int rank);

/// Saves atomically; `steps_done` is the number of optimizer steps completed so far.
void save_checkpoint(const std::string& path, const StageModule& m, torch::optim::Optimizer& opt,
                     int64_t steps_done);

/// What a checkpoint file holds besides the optimizer state.
struct CheckpointContents {
  int64_t steps_done = 0;
  std::vector<std::pair<std::string, torch::Tensor>> params;  // "op/param" names, in file order
};

/// Reads a checkpoint's parameters and step count without a model (`graphpipe checkpoint`).
/// UserError when the file is unreadable or not a graphpipe checkpoint.
CheckpointContents read_checkpoint(const std::string& path);

/// Loads into `m`'s parameters (in place) and `opt`; returns steps_done. UserError when the file is
/// missing, unreadable, or holds different parameters (names or shapes) than `m`.
int64_t load_checkpoint(const std::string& path, StageModule& m, torch::optim::Optimizer& opt);

}  // namespace gp::runtime
