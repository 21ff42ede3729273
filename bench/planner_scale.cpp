// planner_scale: where the GraphPipe search spends its time on one configuration. Per micro-batch
// size it runs the SP search (with per-stage sizes m, m/2, m/4, as `graphpipe plan` does) and the
// chain DP (the two candidates GraphPipe keeps) separately, with the planner's memory limit, and
// prints, for each, the best bottleneck TPS found, the DP states explored, the number of DP solves
// (binary-search steps), stage evaluations and the CPU time. Used to measure the large-scale case
// (mmt:branches=8,layers=32 on 1,024 summit devices); `graphpipe plan` is the real command (it also
// places and re-costs every plan found).
//
//   planner_scale MODEL DEVICES BATCH [MICRO_BATCH ...]
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
  std::printf("%s on %d summit devices, mini-batch %d, %zu ops\n", argv[1], n, batch, g.num_ops());
  std::printf("%6s  %-5s  %14s  %12s  %7s  %12s  %12s  %8s\n", "mbs", "dp", "bottleneck ms", "states", "solves",
              "evals", "mem-pruned", "cpu s");
  double total = 0;
  for (int mbs : sizes) {
    for (int which = 0; which < 2; ++which) {
      const double c0 = cpu_s();
      double tps = 0;
      planner::detail::SearchStats stats;
      const bool ok = planner::detail::search_size(
          cm, which == 0 ? sp : chain, {mbs, which == 0 ? 2 : 0, batch, limit, n, same_node, 1e-3}, &tps,
          [](const std::vector<planner::detail::StageChoice>&) {}, &stats);
      const double c = cpu_s() - c0;
      total += c;
      std::printf("%6d  %-5s  %14.6f  %12zu  %7zu  %12zu  %12zu  %8.2f\n", mbs, which == 0 ? "sp" : "chain",
                  ok ? tps * 1e3 : -1.0, stats.states, stats.solves, stats.evals, stats.memory_pruned, c);
      std::fflush(stdout);
    }
  }
  std::printf("total cpu s %.2f\n", total);
  return 0;
}
