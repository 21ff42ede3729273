// A GPP strategy: the stage DAG with devices, micro-batch sizes and in-flight counts. The planning
// side and the runtime side meet only through this type and its file format, graphpipe.plan/1.
#pragma once
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "cost/optimizer.h"
#include "graph/dag.h"
#include "ir/model.h"
#include "support/json.h"

namespace gp::cost {
class CostModel;
}  // namespace gp::cost

namespace gp::plan {

struct Stage {
  int id = 0;                    // equals its index in Plan::stages
  std::vector<std::string> ops;  // model op names (a convex set)
  std::vector<int> devices;      // size = data-parallel degree inside the stage
  int micro_batch_size = 1;      // samples per micro-batch over all replicas of the stage;
                                 // each replica takes micro_batch_size / devices.size()
  int in_flight = 1;             // micro-batches whose activations are held at once (1F1B warm-up)
  std::vector<int> inputs_from;  // predecessor stage ids (sorted)
  std::vector<int> outputs_to;   // successor stage ids (sorted)
  // Planner's per-stage estimate (optional in files; 0 when unknown).
  double tps_s = 0;         // time per sample
  double memory_bytes = 0;  // per device
  // Planner's pass times of one replica for one micro-batch of the stage's own size (optional in
  // files; written for plans made for the zb schedule, which orders passes by them; 0: unknown).
  double fwd_s = 0, bwd_input_s = 0, bwd_weight_s = 0;
  bool operator==(const Stage&) const = default;
};

struct Predicted {
  double iteration_time_s = 0;
  double throughput_samples_per_s = 0;
  double bottleneck_tps_s = 0;
  std::vector<double> peak_memory_bytes;  // per device
  bool operator==(const Predicted&) const = default;
};

/// How a planner found its plan: GraphPipe keeps two candidates, its series-parallel DP's best
/// plan ("sp") and the best sequential pipeline found by the same search ("chain"), and returns the
/// one with the smaller simulated iteration time (each kind's best few plans by the estimate are
/// simulated). Informational (optional in files).
struct SearchCandidate {
  std::string name;  // "sp" | "chain"
  int micro_batch_size = 0;
  int num_stages = 0;
  int depth = 0;  // stages on the longest path of the stage DAG
  double iteration_time_s = 0;
  double throughput_samples_per_s = 0;
  double bottleneck_tps_s = 0;
  double simulated_iteration_time_s = 0;  // sim::simulate's, by which the planner ranks (0: unknown)
  bool operator==(const SearchCandidate&) const = default;
};

struct Search {
  std::string winner;  // empty: not recorded
  std::vector<SearchCandidate> candidates;
  bool operator==(const Search&) const = default;
};

/// How Piper's baseline coarsened the op graph before its DP over downsets (`"piper"` in files,
/// written by the piper planner only; informational). Within each branch, series runs of at most
/// `max_ops_per_node` ops become one node (1: the op graph); only when one node per branch is
/// still too large a space are parallel branches grouped, into at most `branch_groups` nodes per
/// parallel block (0: never).
struct PiperCoarsening {
  int ops = 0;    // ops of the model
  int nodes = 0;  // nodes of the graph the DP saw
  int max_ops_per_node = 0;
  int branch_groups = 0;
  int64_t downsets = 0;      // of the coarse graph
  int64_t splits = 0;        // (downset, first stage) pairs the DP weighs
  int64_t split_budget = 0;  // the most splits allowed by the time limit
  std::string graph;         // in words: "op graph", "series runs of <= 4 ops", ...
  bool recorded() const { return nodes > 0; }
  bool operator==(const PiperCoarsening&) const = default;
};

/// The costs the plan was made with (`"costs"` in files; absent in plans written before it was
/// recorded), so that `simulate` and `train` use the same costs without being given them again.
/// plan/costs.h records them (`record_costs`) and rebuilds a cost model's inputs from them
/// (`plan_costs`). Stored in canonical form: what cost::cluster_to_json / profile_to_json write.
struct Costs {
  Json cluster;                // graphpipe.cluster/1 of the cluster planned on; null: not recorded
  Json profile;                // graphpipe.profile/1, embedded; null: none, or too large to embed
  std::string profile_path;    // as given to `plan --profile`; "" without a profile
  std::string profile_sha256;  // of profile_to_json(profile).dump() (compact); "" without a profile
  bool recorded() const { return !cluster.is_null(); }
  bool has_profile() const { return !profile_sha256.empty(); }
  bool operator==(const Costs&) const = default;
};

struct Plan {
  std::string planner;  // graphpipe | pipedream | piper | manual
  std::string model_name;
  int num_ops = 0;
  std::string model_spec;  // how to rebuild the model ("mmt:branches=2" or a file path)
  std::string cluster_name;
  int num_devices = 0;
  std::string cluster_spec;  // preset name or file path
  int mini_batch_size = 0;
  std::string schedule = "1f1b";  // the schedule the plan was made for: 1f1b | gpipe | zb (files: absent = 1f1b)
  cost::Optimizer optimizer = cost::Optimizer::adam;
  std::vector<Stage> stages;
  Predicted predicted;
  double search_time_s = 0;
  Search search;
  PiperCoarsening piper;
  Costs costs;
  bool operator==(const Plan&) const = default;
};

Json plan_to_json(const Plan& p);
/// Strict parse; errors name the file and JSON path.
Plan plan_from_json(const Json& j, const std::string& file);
Plan load_plan(const std::string& path);
void save_plan(const std::string& path, const Plan& p);

/// Checks the plan against the model: C1 (every op in exactly one stage, convex stages),
/// C2 (op edges across stages are declared stage edges; inputs_from/outputs_to agree; acyclic),
/// C3 (disjoint devices in [0, num_devices), none empty), micro-batch sizes dividing the
/// mini-batch and divisible by the replica count, in-flight >= 1 + max over successors (with
/// uniform micro-batch sizes; in samples otherwise). Throws UserError "FILE: C1: ..." naming the
/// violated rule and the ops or stages involved.
void validate_plan(const Plan& p, const ir::Graph& g, const std::string& where = "plan");

/// What a plan computes differently from one device taking the whole mini-batch, because a stage sees
/// fewer samples at once (a micro-batch divided by the stage's replicas) than the mini-batch: batch
/// normalization's statistics are the micro-batch's. One warning per cause, naming the stages, ops
/// and sizes and how to avoid it; empty when the plan is exact. (A cross_entropy with ignore_index is
/// exact: the runtime weighs each micro-batch by the labels it counts, StageModule::scaled_loss.)
std::vector<std::string> micro_batch_warnings(const Plan& p, const ir::Graph& g);

/// Stages on the longest path of the stage DAG (1 for a one-stage plan).
int pipeline_depth(const Plan& p);

/// Stage index of every op (by OpId), for a plan already validated against g.
std::vector<int> stage_of_ops(const Plan& p, const ir::Graph& g);
/// The op outputs that cross each stage edge: cut[{u, v}] lists, ascending and once each, the ops
/// of stage u read by an op of stage v (u != v). `stage_of` is stage_of_ops(); ops without a stage
/// (-1) are left out. The one answer to "which ops cross stage u -> v" (plan, sim, runtime).
using CutEdges = std::map<std::pair<int, int>, std::vector<OpId>>;
CutEdges cut_edges(const ir::Graph& g, const std::vector<int>& stage_of);
/// Bytes per sample on each of stage s's out-edges (outputs_to order): the op outputs `cut` lists
/// for that edge, sized by the cost model (the gradient coming back has the same size). What the
/// planner's estimate and the simulator both send.
std::vector<double> out_bytes_per_sample(const Stage& s, const CutEdges& cut, const cost::CostModel& cm);
/// Stage ids in a topological order of the stage DAG.
std::vector<int> stage_topo_order(const Plan& p);

/// The op graph as a graph::Dag: node i is OpId(i), edges are op-to-op edges.
graph::Dag op_dag(const ir::Graph& g);

/// The in-flight rule: a stage with micro-batch size `mbs` whose successors hold
/// `succ_in_flight_samples` samples at most (max over successors of in_flight x micro-batch size;
/// 0 for a sink) needs 1 + ceil(succ_in_flight_samples / mbs) micro-batches in flight.
/// With one micro-batch size everywhere this is 1 + max over successors of their in-flight counts.
int required_in_flight(int mbs, int64_t succ_in_flight_samples);

/// Sets every stage's in_flight to the minimum the in-flight rule allows (sinks get 1).
void assign_min_in_flight(Plan& p);

/// Sets inputs_from/outputs_to from the op edges between stages (sorted, deduplicated).
void derive_stage_edges(Plan& p, const ir::Graph& g);

}  // namespace gp::plan
