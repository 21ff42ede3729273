// Public, torch-free entry points of the training runtime: `graphpipe train --single` (run_single,
// one process, whole model) and `graphpipe train --plan` (run_pipeline / run_worker, see dist's files).
#pragma once
#include <cstdint>
#include <string>

namespace gp::runtime {

struct TrainOptions {
  std::string plan_path, model_spec;
  int batch = 0, steps = 0;
  uint64_t seed = 1;
  std::string optimizer = "adam";  // "adam" or "sgd" (with momentum)
  double lr = 1e-3, momentum = 0.9;
  std::string log_path, trace_path, checkpoint_dir;
  int checkpoint_every = 0;  // save after every K-th step (0 = only at the end when a dir is given)
  bool resume = false;
  double timeout_s = 60;
  std::string schedule = "1f1b";
  int threads = 1;
  bool single = false;
  bool seeded_weights = false;  // ignore the model file's weights (ONNX initializers): every parameter seeded
  bool allow_nonfinite = false;  // train on through a nan/inf loss or gradient (no divergence check)
};

/// The single-process reference: the whole model as one stage, one micro-batch = the mini-batch.
/// Prints "step K loss L time T s" per step; returns the exit code (0). Bad input throws UserError;
/// a non-finite loss or gradient (unless allow_nonfinite) or a failed checkpoint save throws
/// RuntimeFailure.
int run_single(const TrainOptions& opt);

/// Pipelined training of a plan: spawns (or, under a launcher, becomes) one worker per device.
int run_pipeline(const TrainOptions& opt);

}  // namespace gp::runtime
