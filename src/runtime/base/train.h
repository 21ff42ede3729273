// The options of `graphpipe train` (TrainOptions), read by every layer of the runtime. Torch-free.
// The entry points that take them, run_single and run_pipeline, are in launch/launcher.h.
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
  int trace_steps = 1;         // --trace covers the last this many steps
  bool record_events = false;  // the last trace_steps steps' actions in WorkerResult::events without --trace
  int checkpoint_every = 0;    // save after every K-th step (0 = only at the end when a dir is given)
  bool resume = false;
  double timeout_s = 60;
  std::string schedule;  // 1f1b | gpipe | zb; "": the plan's own (its "schedule" field)
  int threads = 1;
  bool single = false;
  bool seeded_weights = false;     // ignore the model file's weights (ONNX initializers): every parameter seeded
  bool allow_nonfinite = false;    // train on through a nan/inf loss or gradient (no divergence check)
  bool json = false;               // print a graphpipe.train/1 summary instead of the human lines
  double memory_limit_gb = 0;      // > 0: a rank whose measured tensor bytes exceed it stops (exit 1)
  std::string data_dir;            // --data: one <input>.npy per graph input (runtime/data/dataset.h); "" = synthetic
  bool shuffle = false;            // --shuffle: a seeded permutation of the samples per epoch
  std::string eval_data_dir;       // --eval-data: held-out samples, forward-only loss (+ accuracy)
  int eval_every = 0;              // --eval-every K: evaluate after every K-th step
  std::string device = "cpu";      // --device cpu|cuda: where parameters, optimizer state and activations live
  std::string pin_cores = "auto";  // --pin-cores auto|off: pin CPU workers where every core has one
  std::string comm = "auto";       // --comm auto|gloo|nccl|gloo-pairs (runtime/comm/comm_select.h)
  std::string local_all_reduce = "shm";  // --local-all-reduce shm|gloo (runtime/comm/shm_reduce.h)
};

}  // namespace gp::runtime
