// Internal: the planner's iteration-time estimate as a per-stage recurrence over micro-batches --
// the 1F1B schedule the simulator runs, one replica per stage, without network contention.
#pragma once
#include <vector>

#include "cost/cost_model.h"
#include "plan/plan.h"

namespace gp::planner::detail {

/// What one replica of each stage costs (index = stage id), from cost::stage_cost.
struct TimelineCosts {
  std::vector<double> fwd_s, bwd_s;  // per micro-batch of the stage's own size
  std::vector<double> tail_s;        // after its last backward: gradient all-reduce + optimizer step
  /// Per stage, per successor (outputs_to order): bytes per sample crossing that edge (the
  /// gradient coming back has the same size).
  std::vector<std::vector<double>> out_bytes_per_sample;
};

/// One iteration of `p` (placed: devices, micro-batch sizes and in-flight counts set) under the
/// 1F1B schedule of schedule::build_schedule: each stage runs its forwards and backwards in that
/// order; a pass starts when the stage is free and its inputs (activations from every
/// predecessor, gradients from every successor) have arrived; after a pass the stage's sends
/// queue on its port one at a time (sends overlap compute); a replica sends its share of the
/// samples to the replicas of the peer that hold them (one transfer per overlapping pair, as
/// sim::simulate splits them; each on the link between the two stages' first devices); between stages of different sizes a micro-batch waits for every
/// piece of it. The iteration ends at the last stage's tail. Differs from sim::simulate in that
/// node network interfaces are not shared (no contention) and all replicas of a stage are taken
/// to run in step. O(sum over stages of micro-batches x edges); beyond 1,024 micro-batches of the
/// smallest size, runs of 256 and 512 are extrapolated linearly (1F1B's periodic steady state).
double timeline_iteration_s(const plan::Plan& p, const cost::CostModel& cm, const TimelineCosts& c);

/// A lower bound on timeline_iteration_s: each stage runs all its passes one after another, then
/// its tail, so the iteration takes at least max over stages of (mini-batch / its size) x (fwd +
/// bwd) + tail. The planner's per-size bound (engine.h, size_may_beat) uses the compute part.
double timeline_floor_s(const plan::Plan& p, const TimelineCosts& c);

}  // namespace gp::planner::detail
