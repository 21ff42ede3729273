// Measured vs predicted memory of training ranks (torch-free): the per-rank record every worker
// (and `train --single`) produces, the planner's prediction for the same stage, the table `train`
// prints and the `graphpipe.train/1` summary of `train --json`. See docs/cost-model.md ("Memory").
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "ir/model.h"
#include "plan/plan.h"
#include "support/json.h"

namespace gp::runtime {

/// Bytes of one rank by part. Measured: parameters, gradients and optimizer state are the model's
/// tensors; activations are what the rank held at the start of the action that reached the peak
/// beyond them (saved activations of in-flight micro-batches, messages, gradient accumulators);
/// transient is the rise within that action. Predicted: cost::stage_memory_parts.
struct MemoryBreakdown {
  double parameters = 0, gradients = 0, optimizer_state = 0, activations = 0, transient = 0;
  double total() const { return parameters + gradients + optimizer_state + activations + transient; }
  Json to_json() const;
  static MemoryBreakdown from_json(const Json& j);
  /// "params 1.200 MB, grads 1.200 MB, optimizer 2.400 MB, activations 3.000 MB, transient 0.500 MB"
  std::string describe() const;
};

/// One rank's memory over a run.
struct RankMemory {
  int rank = 0, stage = -1;
  double peak_bytes = 0;       // the most live tensor bytes measured (counting CPU allocator)
  int64_t peak_step = -1;      // the step that reached it
  MemoryBreakdown measured;    // at the peak
  double predicted_bytes = 0;  // the cost model's per-device peak for this stage (predicted.total())
  MemoryBreakdown predicted;
  int in_flight = 0;               // micro-batches the schedule holds at once (the prediction's)
  double resident_peak_bytes = 0;  // the process's resident high-water mark (VmHWM)
  Json to_json() const;
  static RankMemory from_json(const Json& j);
};

/// The cost model's peak for one replica of `stage` of `p` (on the cluster the plan records, else
/// its cluster spec) with `in_flight` micro-batches held.
MemoryBreakdown predicted_stage_memory(const plan::Plan& p, const ir::Graph& g, int stage, const std::string& optimizer,
                                       int in_flight);
/// The same for `train --single`: the whole model as one stage on one device, micro-batch = batch.
MemoryBreakdown predicted_single_memory(const ir::Graph& g, int64_t batch, const std::string& optimizer);

/// "memory: rank R stage S: measured peak X MB (step K), predicted Y MB (+d%); ..." lines.
void print_memory_report(const std::vector<RankMemory>& ranks);

/// The rank whose measured peak exceeds `limit_bytes`, as the failure message naming rank, stage,
/// step, action and the breakdown; "" when within.
std::string memory_limit_failure(int rank, int stage, int64_t step, const std::string& action, double peak,
                                 const MemoryBreakdown& at_peak, double limit_bytes);

/// `train --json`: {"format": "graphpipe.train/1", "steps", "losses", "final_loss",
/// "iteration_time_s", "predicted_iteration_time_s", "ranks": [RankMemory...]}.
Json train_summary_json(const std::vector<double>& losses, double iteration_time_s, double predicted_time_s,
                        const std::vector<RankMemory>& ranks);

/// Rough bytes a training process needs for `ops` of `g` with activations of `samples` samples held
/// at once: parameters, gradients and optimizer state (Adam: 2 more copies, SGD: 1) plus each op's
/// output and saved activations per sample. For the guard against absurd requests
/// (gp::check_fits_in_memory), not for planning.
double training_bytes_estimate(const ir::Graph& g, const std::vector<OpId>& ops, double samples,
                               const std::string& optimizer);

}  // namespace gp::runtime
