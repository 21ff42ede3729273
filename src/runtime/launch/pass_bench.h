// Measuring what a stage's forward and backward pass cost the runtime beyond their ops, for
// `graphpipe calibrate`: a small model trained in this process as a one-stage plan. Torch-free.
#pragma once
#include <cstdint>

#include "ir/model.h"

namespace gp::runtime {

/// The median CPU time of the worker thread per forward (F) and per backward (B) action of a stage.
struct PassTiming {
  double fwd_s = 0, bwd_s = 0;
};

/// Trains `g` (which must end in a loss) for `steps` steps in this process, as the pipeline runtime
/// trains a one-stage plan on one device (execute_worker: 1F1B, Adam, synthetic inputs made on the
/// spot), at `micro_batch` samples per micro-batch and `mini_batch` per step, and returns the medians
/// over the last `timed` steps' actions of the thread CPU time of each F and each B. What the runtime
/// does around a stage's ops (its input feed, the loss read back, the memory meter, starting the
/// autograd engine) and what the first op of each kind in a pass pays for its code and data coming
/// back into the caches after the other pass are in them, once per action.
PassTiming time_stage_passes(const ir::Graph& g, int64_t micro_batch, int64_t mini_batch, int steps, int timed);

}  // namespace gp::runtime
