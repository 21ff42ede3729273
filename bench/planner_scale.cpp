// planner_scale: where the GraphPipe search spends its time on one configuration. Per micro-batch
// size it runs the SP search (with per-stage sizes m, m/2, m/4, as `graphpipe plan` does) and the
// chain DP (the two candidates GraphPipe keeps) separately, with the planner's memory limit, and
// prints, for each, the best bottleneck TPS found, the DP states explored, the number of DP solves
// (binary-search steps), stage evaluations and the CPU time. Used to measure the large-scale case
// (mmt:branches=8,layers=32 on 1,024 summit devices); `graphpipe plan` is the real command (it also
// places and re-costs every plan found, and skips the sizes whose plans cannot enter its shortlists).
// The last columns: the plans the search offered and the best predicted iteration among them.
//
//   planner_scale MODEL DEVICES BATCH [MICRO_BATCH ...]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <string>
#include <vector>

#include "cost/cost_model.h"
#include "importers/resolve.h"
#include "planner/engine.h"

namespace {

double cpu_s() { return static_cast<double>(std::clock()) / CLOCKS_PER_SEC; }

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: planner_scale MODEL DEVICES BATCH [MICRO_BATCH ...]\n");
    return 2;
  }
  using namespace gp;
  ir::Graph g = importers::load_graph(argv[1]);
  const int n = std::stoi(argv[2]), batch = std::stoi(argv[3]);
  cost::CostModel cm(g, cost::load_cluster("summit", n));
  std::vector<int> sizes;
  for (int i = 4; i < argc; ++i) sizes.push_back(std::stoi(argv[i]));
  if (sizes.empty())
    for (int m = 1; m <= batch; m *= 2)
      if (batch % m == 0) sizes.push_back(m);
  const bool same_node = n <= cm.cluster().devices_per_node;
  const double limit = cm.usable_memory_bytes();  // the planner's: the device minus its reserve
  planner::detail::Structure sp = planner::detail::sp_structure(cm, nullptr);
  planner::detail::Structure chain = planner::detail::chain_structure(cm);
  int distinct = 0;
  for (size_t q = 0; q < sp.seqs.size(); ++q) distinct += sp.canon(static_cast<int>(q)) == static_cast<int>(q);
  std::printf("%s on %d summit devices, mini-batch %d, %zu ops; SP structure: %zu sequences, %d distinct for the DP\n",
              argv[1], n, batch, g.num_ops(), sp.seqs.size(), distinct);
  std::printf("%6s  %-5s  %14s  %12s  %7s  %12s  %12s  %8s  %6s  %12s\n", "mbs", "dp", "bottleneck ms", "states",
              "solves", "evals", "mem-pruned", "cpu s", "plans", "best iter s");
  double total = 0;
  for (int mbs : sizes) {
    for (int which = 0; which < 2; ++which) {
      const double c0 = cpu_s();
      double tps = 0;
      planner::detail::SearchStats stats;
      std::vector<std::vector<planner::detail::StageChoice>> plans;
      const bool ok = planner::detail::search_size(
          cm, which == 0 ? sp : chain, {mbs, which == 0 ? 2 : 0, batch, limit, n, same_node, 1e-3}, &tps,
          [&](const std::vector<planner::detail::StageChoice>& p) { plans.push_back(p); }, &stats);
      const double c = cpu_s() - c0;
      total += c;
      // The best predicted iteration time of the plans found (placed as the planner places them;
      // not timed: the CPU column is the search's).
      double best = -1;
      for (const auto& p : plans) {
        const plan::Plan pl = planner::detail::assemble(
            cm, p, mbs, batch, limit, which == 0 ? planner::detail::Order::dag : planner::detail::Order::chain,
            nullptr);
        const auto& peaks = pl.predicted.peak_memory_bytes;  // the planner drops plans over the limit
        if (!peaks.empty() && *std::max_element(peaks.begin(), peaks.end()) > limit * (1 + 1e-9)) continue;
        const double it = pl.predicted.iteration_time_s;
        if (best < 0 || it < best) best = it;
      }
      std::printf("%6d  %-5s  %14.6f  %12zu  %7zu  %12zu  %12zu  %8.2f  %6zu  %12.4f\n", mbs,
                  which == 0 ? "sp" : "chain", ok ? tps * 1e3 : -1.0, stats.states, stats.solves, stats.evals,
                  stats.memory_pruned, c, plans.size(), best);
      std::fflush(stdout);
    }
  }
  std::printf("total cpu s %.2f\n", total);
  return 0;
}
