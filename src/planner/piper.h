// Internal: the Piper baseline (Tarnawski et al., NeurIPS 2021, without tensor parallelism), a DP
// over the downsets of a coarsened op graph (piper.cpp). Replaces the PiperSpace declarations of
// engine.h, which are no longer defined.
#pragma once
#include <chrono>
#include <cstdint>
#include <vector>

#include "cost/cost_model.h"
#include "plan/plan.h"
#include "planner/engine.h"

namespace gp::planner::detail {

/// The graph Piper's DP runs on: coarse nodes, their downsets (node sets closed under successors)
/// and, per downset D, its splits into a first stage S = D \ D' and a downset D' that runs after.
struct PiperGraph {
  std::vector<std::vector<OpId>> nodes;  // coarse nodes, topologically ordered
  int words = 1;                         // 64-bit words per node set
  std::vector<uint64_t> downsets;        // downset k: words [k * words, (k + 1) * words)
  std::vector<uint32_t> first_split;     // splits of downset k: [first_split[k], first_split[k + 1])
  std::vector<int32_t> rest;             // per split: the downset D' after the stage
  int full = 0;                          // id of the whole graph
  plan::PiperCoarsening coarsening;      // how the op graph was coarsened
  size_t num_downsets() const { return first_split.empty() ? 0 : first_split.size() - 1; }
  size_t num_splits() const { return rest.size(); }
};

/// The most (downset, stage) splits a DP over `devices` devices and `sizes` micro-batch sizes may
/// weigh within `time_limit_s`: the space is coarsened until it fits.
size_t piper_split_budget(double time_limit_s, int devices, int sizes);

/// Coarsens the op graph only as far as the budget requires, finest first: series runs of 1, 2,
/// 4, ... ops within each branch of a parallel block (layers, then spans of layers) until every
/// branch is one node, ops outside blocks kept apart; then branches grouped, fewest ops first, into
/// ever fewer nodes per block; then runs outside blocks. Throws UserError past `deadline`.
PiperGraph piper_graph(const cost::CostModel& cm, size_t split_budget, std::chrono::steady_clock::time_point deadline,
                       double time_limit_s);

/// Piper's DP for one micro-batch size with a binary search on the target TPS.
bool piper_solve(const cost::CostModel& cm, const PiperGraph& pg, int micro_batch, int mini_batch, double memory_limit,
                 int num_devices, bool same_node, std::chrono::steady_clock::time_point deadline, double time_limit_s,
                 double tol, double* best_tps, std::vector<StageChoice>* best);

}  // namespace gp::planner::detail
