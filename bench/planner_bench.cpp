// Planner search time per planner on small multi-branch models (Google Benchmark).
// The paper-size table comes from scripts/bench.sh (make bench).
#include <benchmark/benchmark.h>

#include "importers/resolve.h"
#include "planner/planner.h"

namespace {

void plan_bench(benchmark::State& state, const char* spec, const char* planner) {
  gp::ir::Graph g = gp::importers::load_graph(spec);
  gp::cost::CostModel cm(g, gp::cost::load_cluster("summit", static_cast<int>(state.range(0))));
  gp::planner::PlannerOptions o;
  o.mini_batch = 64;
  o.planner = planner;
  o.time_limit_s = 30;
  for (auto _ : state) {
    gp::plan::Plan p = gp::planner::run_planner(cm, o);
    benchmark::DoNotOptimize(p.predicted.bottleneck_tps_s);
  }
}

constexpr const char* kMmt = "mmt:branches=2,layers=2";
constexpr const char* kCandle = "candle-uno:branches=3,layers=2";
BENCHMARK_CAPTURE(plan_bench, mmt_graphpipe, kMmt, "graphpipe")->Arg(4)->Arg(8)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(plan_bench, mmt_pipedream, kMmt, "pipedream")->Arg(4)->Arg(8)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(plan_bench, candle_graphpipe, kCandle, "graphpipe")->Arg(4)->Arg(8)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(plan_bench, candle_pipedream, kCandle, "pipedream")->Arg(4)->Arg(8)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(plan_bench, candle_piper, kCandle, "piper")->Arg(4)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
