// Internal: the planner's iteration-time estimate as a per-stage recurrence over micro-batches --
// the schedule the simulator runs (1F1B, GPipe or zero-bubble: the plan's `schedule`), one replica
// per stage, without network contention.
#pragma once
#include <vector>

#include "cost/cost_model.h"
#include "plan/plan.h"
#include "schedule/schedule.h"

namespace gp::planner::detail {

/// What one replica of each stage costs (index = stage id), from cost::stage_cost.
struct TimelineCosts {
  std::vector<double> fwd_s, bwd_s;  // per micro-batch of the stage's own size
  /// The zero-bubble split of bwd_s (B: input gradients, W: weight gradients); read only for the
  /// schedules that run them (empty otherwise).
  std::vector<double> bwd_input_s, bwd_weight_s;
  std::vector<double> tail_s;  // after its last backward: gradient all-reduce + optimizer step
  /// Per stage, per successor (outputs_to order): bytes per sample crossing that edge (the
  /// gradient coming back has the same size).
  std::vector<std::vector<double>> out_bytes_per_sample;
};

using schedule::Pass;

/// The schedule the plan records (p.schedule), built for it: zero-bubble from the stages' pass
/// times (fwd_s, bwd_input_s, bwd_weight_s). What the planner's estimate times and what its
/// shortlist is simulated under.
schedule::Schedule plan_schedule(const plan::Plan& p);

/// Per stage, the compute passes of `s` in list order (its transfers, all-reduce and step left out).
std::vector<std::vector<Pass>> schedule_passes(const schedule::Schedule& s);

/// One iteration of `p` (placed: devices, micro-batch sizes and in-flight counts set) under the
/// schedule the plan records (p.schedule; for "zb" built from the stages' fwd_s / bwd_input_s /
/// bwd_weight_s): each stage runs its compute passes in the schedule's order; a forward starts
/// when the stage is free and its activations from every predecessor have arrived, a backward
/// (or zero-bubble B) when its gradients from every successor have, a W when the stage is free;
/// a forward sends activations, a backward or B gradients; after a pass the stage's sends
/// queue on its port one at a time (sends overlap compute); a replica sends its share of the
/// samples to the replicas of the peer that hold them (one transfer per overlapping pair, as
/// sim::simulate splits them; each on the link between the two stages' first devices); between stages of different sizes a micro-batch waits for every
/// piece of it. The iteration ends at the last stage's tail. Differs from sim::simulate in that
/// node network interfaces are not shared (no contention) and all replicas of a stage are taken
/// to run in step. O(sum over stages of micro-batches x edges); beyond 1,024 micro-batches of the
/// smallest size, runs of 256 and 512 are extrapolated linearly (the schedule's periodic steady
/// state). 1F1B's order comes from schedule::one_f_one_b_order (no schedule is built); the others' from
/// schedule::build_schedule.
double timeline_iteration_s(const plan::Plan& p, const cost::CostModel& cm, const TimelineCosts& c);

/// A lower bound on timeline_iteration_s: each stage runs all its passes one after another, then
/// its tail, so the iteration takes at least max over stages of (mini-batch / its size) x (fwd +
/// bwd) + tail. The planner's per-size bound (engine.h, size_may_beat) uses the compute part.
double timeline_floor_s(const plan::Plan& p, const TimelineCosts& c);

}  // namespace gp::planner::detail
