// Public, torch-free entry points of the training runtime: `graphpipe train --single` (run_single,
// one process, whole model) and `graphpipe train --plan` (run_pipeline / run_worker, see dist's files).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "ir/model.h"

namespace gp::runtime {

/// The most intra-op threads a worker may ask for (--threads), and the longest --timeout (a week).
inline constexpr int kMaxThreads = 1024;
inline constexpr double kMaxTimeoutS = 7 * 24 * 3600;

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
  std::string schedule;  // 1f1b | gpipe | zb; "": the plan's own (its "schedule" field)
  int threads = 1;
  bool single = false;
  bool seeded_weights = false;   // ignore the model file's weights (ONNX initializers): every parameter seeded
  bool allow_nonfinite = false;  // train on through a nan/inf loss or gradient (no divergence check)
  bool json = false;             // print a graphpipe.train/1 summary instead of the human lines
  double memory_limit_gb = 0;    // > 0: a rank whose measured tensor bytes exceed it stops (exit 1)
  std::string data_dir;          // --data: one <input>.npy per graph input (runtime/data/dataset.h); "" = synthetic
  bool shuffle = false;          // --shuffle: a seeded permutation of the samples per epoch
  std::string eval_data_dir;     // --eval-data: held-out samples, forward-only loss (+ accuracy)
  int eval_every = 0;            // --eval-every K: evaluate after every K-th step
  std::string device = "cpu";    // --device cpu|cuda: where parameters, optimizer state and activations live
  std::string comm = "auto";     // --comm auto|gloo|nccl|gloo-pairs (runtime/comm/comm_select.h)
};

/// UserError (exit 2) unless `kind` is "cpu", or "cuda" with CUDA available in this LibTorch build and
/// on this machine ("--device cuda: CUDA is not available in this build or on this machine ...").
void check_device_available(const std::string& kind);

/// Rough bytes a training process needs for `ops` of `g` with activations of `samples` samples held
/// at once: parameters, gradients and optimizer state (Adam: 2 more copies, SGD: 1) plus each op's
/// output and saved activations per sample. For the guard against absurd requests
/// (gp::check_fits_in_memory), not for planning.
double training_bytes_estimate(const ir::Graph& g, const std::vector<OpId>& ops, double samples,
                               const std::string& optimizer);

/// The single-process reference: the whole model as one stage, one micro-batch = the mini-batch.
/// Prints "step K loss L time T s" per step; returns the exit code (0). Bad input throws UserError;
/// a non-finite loss or gradient (unless allow_nonfinite) or a failed checkpoint save throws
/// RuntimeFailure.
int run_single(const TrainOptions& opt);

/// Pipelined training of a plan: spawns (or, under a launcher, becomes) one worker per device.
int run_pipeline(const TrainOptions& opt);

}  // namespace gp::runtime
