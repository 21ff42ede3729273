// Strategy search: GraphPipe's series-parallel DP (the paper's partitioner, section 5) and the
// PipeDream and Piper baselines, all over the same cost model (cost::stage_cost) and plan type.
#pragma once
#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cost/cost_model.h"
#include "plan/plan.h"

namespace gp::planner {

/// Input limits (checked first by run_planner; beyond them the search's tables do not fit its
/// 16-bit indices, or the time limit would overflow the clock).
inline constexpr int kMaxDevices = 65535;
inline constexpr size_t kMaxOps = 65535;
inline constexpr int kMaxMiniBatch = 1 << 30;
inline constexpr double kMaxTimeLimitS = 1e6;

struct PlannerOptions {
  int mini_batch = 0;
  int micro_batch = 0;                // 0: search every power of two dividing mini_batch
  std::string planner = "graphpipe";  // graphpipe | pipedream | piper
  // The schedule the plan is made for (1f1b | gpipe | zb): the estimate times it, the shortlist is
  // simulated under it, the plan records it (zb: with every stage's pass times).
  std::string schedule = "1f1b";
  double memory_limit_bytes = 0;  // per device; 0 = the cluster's device memory
  double time_limit_s = 600;      // piper only: give up after this long
  bool explain = false;           // fill PlanReport::explain
  bool progress = false;          // report progress on stderr when the search is slow
  // Skip a size's search (per candidate kind) once no plan of it can enter that kind's shortlist
  // (the returned plan is the same either way); false: search every size, so that per_micro_batch
  // holds every size's DP optimum (tests that compare it with an exhaustive search).
  bool bound_sizes = true;
  // Offer every size's whole model as one stage on p devices (data parallelism; p = 1: no pipeline)
  // beside the DPs' plans; false: pipelines only, as the planners before 2026-12-03 (`plan
  // --no-data-parallel`: a pipeline to study even where one stage is predicted faster).
  bool whole_model = true;
};

/// What the search found besides the plan: why, and what it tried.
struct PlanReport {
  plan::Plan plan;
  std::vector<std::string> explain;  // one line per stage + alternatives (when asked)
  struct Candidate {                 // best plan per micro-batch size tried (placed, re-costed)
    int micro_batch = 0;
    double bottleneck_tps_s = 0;  // 0 when no plan fits memory at this micro-batch size
    double iteration_time_s = 0;  // predicted; the planner picks the smallest over sizes
    int num_stages = 0;
    double search_tps_s = 0;       // the DP's optimal bottleneck at this size (before placement)
    bool pruned = false;           // not searched: no plan at this size can beat the best
    std::vector<std::string> cut;  // the candidate kinds not searched at this size ("sp", "chain"
                                   // or the baseline's name): none of their plans could enter
                                   // that kind's shortlist
  };
  std::vector<Candidate> per_micro_batch;
  std::string sp_note;  // how the graph was made series-parallel (graphpipe)
  int over_memory = 0;  // plans the DP found whose placed peak (with transients) did not fit
  /// GraphPipe: the best plan of each kind, in plan.search.candidates order ("sp", "chain").
  std::vector<plan::Plan> candidate_plans;
};

/// Searches a strategy. Throws UserError for impossible requests, with the numbers that prove it.
plan::Plan run_planner(const cost::CostModel& cm, const PlannerOptions& opt);
PlanReport run_planner_report(const cost::CostModel& cm, const PlannerOptions& opt);

/// The planners (issue 39 item 3): one table read by --help, by check_options and by dispatch.
enum class PlannerKind { graphpipe, pipedream, piper };
struct PlannerKindInfo {
  PlannerKind kind;
  const char* name;  // as in plan files ("planner") and on the command line
  const char* help;  // one line
};
inline constexpr std::array<PlannerKindInfo, 3> kPlannerKinds = {{
    {PlannerKind::graphpipe, "graphpipe",
     "GraphPipe: a DAG of stages by the series-parallel DP (with its best chain as a candidate)"},
    {PlannerKind::pipedream, "pipedream", "PipeDream's planner: a chain of stages (sequential pipeline)"},
    {PlannerKind::piper, "piper", "Piper's DP over downsets of a coarsened graph: a chain of stages"},
}};
/// The planner named `name`, or nullopt.
std::optional<PlannerKind> find_planner_kind(std::string_view name);
/// Every planner's name, in the table's order.
std::vector<std::string> planner_names();
/// The names joined by `sep`: "graphpipe, pipedream, piper".
std::string planner_kind_names(std::string_view sep);
/// An option's help text: "<what>: graphpipe | pipedream | piper" and one line per planner.
std::string planner_kind_help(std::string_view what);

/// The instance msr-fiddle/piper's algo.cpp reads (its README's input format) for one micro-batch
/// size (opt.micro_batch, required): the coarse graph that `plan --planner piper --micro-batch M
/// --time-limit S` runs on, one node per coarse node with its ops' costs at that micro-batch (ms per
/// micro-batch, the optimizer step spread over the micro-batches; activation bytes per in-flight
/// micro-batch as memoryUsageA, weights + gradients + optimizer state as memoryUsageB), one edge per
/// pair of coarse nodes with the bytes per micro-batch crossing it, the link the planner assumes
/// (intra-node when all devices fit one node), and parameterSize scaled so that Piper's
/// data-parallel resync of two replicas costs our all-reduce. A "graphpipe" field says what it is.
Json piper_instance(const cost::CostModel& cm, const PlannerOptions& opt);

}  // namespace gp::planner
