// Internal (LibTorch) pipeline worker: prepares a run (plan + model + checked schedule) and executes
// one rank's stage schedule for every step. Used by run_worker (one process per rank) and by tests
// that run all ranks as threads in one process over a HashStore.
#pragma once
#include <torch/torch.h>

#include <atomic>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "importers/weights.h"
#include "ir/model.h"
#include "plan/plan.h"
#include "runtime/exec/memory_meter.h"
#include "runtime/exec/memory_report.h"
#include "runtime/data/data_feed.h"
#include "runtime/base/train.h"
#include "schedule/schedule.h"

namespace c10d {
class Store;
}

namespace gp::runtime {

/// Limits of the runtime's message tags: sample indices of a step, tensors on one stage edge.
inline constexpr int64_t kMaxMiniBatchSamples = int64_t{1} << 22;
inline constexpr size_t kMaxTensorsPerEdge = 64;

/// Everything every rank derives identically from the inputs; bad input throws UserError.
struct PreparedRun {
  plan::Plan plan;
  ir::Graph graph;
  schedule::Schedule schedule;
  importers::ParamValues weights;  // initial values from the model file (ONNX initializers); may be empty
  std::shared_ptr<const Dataset> data, eval_data;  // --data / --eval-data (null: synthetic / none)
};

/// Loads the plan (opt.plan_path), the model from plan.model_spec (or opt.model_spec when given),
/// with the file's weights (importers::load_graph(spec, weights)), validates the plan against it and
/// builds + checks the schedule (opt.schedule, else the plan's own), and opens --data / --eval-data
/// (scanning index and label values when `check_data_values`: once per run, by whoever starts the workers).
PreparedRun prepare_run(const TrainOptions& opt, bool check_data_values = true);
PreparedRun prepare_run(plan::Plan p, const std::string& schedule_kind, const std::string& model_spec = "");

/// Rough bytes one replica of `stage` needs (training_bytes_estimate over its ops, with its
/// in-flight micro-batch shares of activations).
double stage_bytes_estimate(const PreparedRun& run, int stage, const std::string& optimizer);

/// The rank's place in the plan: stage -1 for a device no stage uses.
struct RankRole {
  int stage = -1;
  int replica = 0;
};
RankRole role_of_rank(const plan::Plan& p, int rank);

/// One measured slice of work (seconds since the run's common epoch).
struct MeasuredEvent {
  int64_t step = 0;
  int action = 0;
  int track = 0;  // schedule::kComputeTrack (the device's own work) or kSendTrack (its sends)
  std::string name;
  std::string category;  // schedule::trace_category of the action
  double start_s = 0, end_s = 0;
  /// CPU time during the action: the worker's thread (less than end_s - start_s when it waited or
  /// another thread took its core) and the whole process (every thread: Gloo's, the autograd engine's).
  double thread_cpu_s = 0, process_cpu_s = 0;
};

struct WorkerIo {
  int rank = 0, world = 1;
  int local_rank = 0;   // on this host: picks the GPU with --device cuda (local_rank % GPUs)
  int local_world = 0;  // ranks on this host (0: unknown): NCCL needs a GPU for each (comm_select.h)
  c10::intrusive_ptr<c10d::Store> store;
  /// Called before each action (step, index in the stage's list, action); for status + faults.
  std::function<void(int64_t, int, const schedule::Action&)> on_action;
  bool print = true;  // rank 0 prints "step k loss L time T s"
};

struct WorkerResult {
  std::vector<double> step_losses;                  // every rank gets the global per-step losses
  std::vector<double> step_times_s;                 // measured iteration times (max end - min start over ranks)
  std::vector<double> step_data_s;                  // seconds spent reading --data per step (max over ranks)
  std::vector<std::pair<int64_t, EvalSums>> evals;  // --eval-data: (step, sums over the world)
  std::vector<std::pair<std::string, torch::Tensor>> final_params;  // this rank's stage
  std::vector<MeasuredEvent> events;  // with opt.trace_path or opt.record_events (this rank's, last steps)
  std::vector<RankMemory> memory;     // rank 0: every rank's, by rank; other ranks: their own
};

/// Runs steps [first, opt.steps) of this rank's stage (first from --resume), writing checkpoints,
/// and on rank 0 the --log and --trace files. Communication failures throw CommError.
WorkerResult execute_worker(const TrainOptions& opt, const PreparedRun& run, const WorkerIo& io);

/// Fault injection (GP_FAULT kind=nan): when set, the next action of this process first sets one
/// value of its stage's first parameter gradient to NaN. Reset by that action.
std::atomic<bool>& poison_next_action();

/// Chrome trace of measured events, in the simulator's format (one process per device named
/// "device D: stage S", thread 0 for its work, thread 1 for its sends), with a counter track
/// "tensor memory (MB)" per device from `memory` (live bytes after each action, peak within it).
std::string measured_trace_json(const plan::Plan& p, const std::vector<std::vector<MeasuredEvent>>& per_rank,
                                const std::vector<std::vector<detail::MemorySample>>& memory = {});

}  // namespace gp::runtime
