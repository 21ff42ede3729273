// Discrete-event simulation of one training iteration of a plan under a schedule: per-device
// timelines, iteration time, throughput, peak memory and bubbles; Chrome traces and SVG timelines.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "cost/cost_model.h"
#include "plan/plan.h"
#include "schedule/schedule.h"
#include "support/json.h"

namespace gp::sim {

/// What one replica (device) of a stage costs. Times are per micro-batch at the stage's
/// per-device micro-batch (micro_batch_size / devices.size()).
struct StageTimes {
  double fwd_s = 0;
  double bwd_s = 0;
  /// The zero-bubble split of bwd_s (cost::StageCost's analytic fraction): backward_input (input
  /// gradients) and backward_weight (parameter gradients). sim_costs fills both so that they add
  /// up to bwd_s; a hand-filled SimCosts that leaves both 0 times BI and W as 0.
  double bwd_input_s = 0;
  double bwd_weight_s = 0;
  double allreduce_s = 0;       // gradient all-reduce among the replicas, once per iteration
  double optimizer_s = 0;       // the optimizer step, once per iteration (with, before it, the sum
                                // of shared parameters' gradients over their holding stages)
  double state_bytes = 0;       // weights + gradients + optimizer state, per device
  double act_bytes_per_mb = 0;  // activations saved for backward per held micro-batch, per device
  /// The rest of the peak, per device, while micro-batches run: transient buffers of one
  /// micro-batch and the gradients sent upstream that a step holds (cost::stage_memory_parts).
  double other_bytes = 0;
  /// The rest of the peak at the end of the step, when no activations are held: the sent
  /// gradients and the all-reduce / optimizer temporaries (StageCost::step_transient_bytes). A
  /// device's peak is state_bytes + max(peak held x act_bytes_per_mb + other_bytes, step_bytes),
  /// the planner's cost::stage_memory at the peak held count.
  double step_bytes = 0;
  /// Per successor (in the stage's outputs_to order): bytes per sample sent on that edge. The
  /// gradient flowing back has the same size.
  std::vector<double> out_bytes_per_sample;
};

/// Everything the simulator needs: per-stage costs and the links. Tests fill this with round
/// numbers; sim_costs() derives it from the cost model.
struct SimCosts {
  std::vector<StageTimes> stages;  // index = stage id
  /// devices_per_node and node_injection_Bps drive the contention model; intra/inter links give
  /// transfer times when p2p_time is empty (latency + bytes / bandwidth).
  cost::Cluster cluster;
  std::function<double(int dev_a, int dev_b, double bytes)> p2p_time;
};

/// Per-stage costs from the cost model through cost::stage_cost (the planner's numbers), with the
/// compute split into forward and backward by op_time. The returned p2p_time refers to `cm`.
SimCosts sim_costs(const plan::Plan& p, const cost::CostModel& cm);

/// The pass times (F, BI, W per stage, one replica) of these costs: what the zb builder orders
/// passes by when it schedules for this simulator (schedule::build_schedule(p, "zb", ...)).
schedule::PassTimes pass_times(const SimCosts& c);

/// One timed piece of work. Device slices (track 0) are compute, waits for receives, all-reduce
/// and optimizer steps; send slices (track 1) are the time a transfer occupies its links.
struct Event {
  int device = 0;
  int stage = 0;
  int action = 0;    // index in the stage's action list
  int track = 0;     // 0: device, 1: sends
  std::string name;  // "s2 F mb3", "s1 send_act ->s2 [0,8)", "s0 allreduce"
  schedule::ActionKind kind = schedule::ActionKind::forward;
  int micro_batch = -1;
  double start_s = 0;
  double end_s = 0;
};

struct SimResult {
  double iteration_time_s = 0;
  double throughput_samples_per_s = 0;
  std::vector<double> peak_memory_bytes;  // per device of the plan (0 for unused devices)
  double bubble_fraction = 0;             // idle / (iteration time x devices in use)
  std::vector<double> busy_s;             // per device: forward, backward, all-reduce, step
  std::vector<int> peak_in_flight;        // per stage
  std::vector<Event> events;              // in start order per device
};

/// What simulate() records besides the iteration's figures.
struct SimOptions {
  bool events = true;  // SimResult::events (traces, timelines); the planner's ranking needs none
};

/// Simulates one iteration. Execution model (the runtime's): each device runs its stage's action
/// list in order; compute blocks the device; a send is non-blocking (the device moves on while
/// the transfer occupies the sender's port, one transfer at a time, and both nodes' shared
/// network interfaces when it leaves the node); a receive blocks until its data arrived; all-reduce waits for all
/// replicas of the stage. The iteration ends at the last optimizer step.
SimResult simulate(const plan::Plan& p, const schedule::Schedule& s, const SimCosts& costs, const SimOptions& opt = {});
SimResult simulate(const plan::Plan& p, const schedule::Schedule& s, const cost::CostModel& cm,
                   const SimOptions& opt = {});

/// graphpipe.sim/1 (CONTRACT.md fields plus busy_s and peak_in_flight).
Json sim_result_to_json(const SimResult& r);
/// Chrome trace-event JSON: one process per device (named "device D: stage S"), thread 0 for
/// the device's own work and thread 1 for its sends; one complete ("X") slice per action.
Json chrome_trace(const plan::Plan& p, const SimResult& r);
/// A timeline picture: one row per device, stages coloured (forward light, backward dark,
/// backward_input medium, backward_weight light and hatched), sends as thin bars under the row, a
/// time axis and a legend.
std::string svg_timeline(const plan::Plan& p, const SimResult& r, const std::string& title = "");

}  // namespace gp::sim
