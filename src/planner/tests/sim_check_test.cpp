// The planner's iteration-time estimate ((M - 1) x slowest stage + critical path, used to pick the
// micro-batch size) against the discrete-event simulator on the planners' own plans.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "cost/cost_model.h"
#include "importers/resolve.h"
#include "planner/planner.h"
#include "schedule/schedule.h"
#include "sim/sim.h"

namespace gp::planner {
namespace {

struct Case {
  const char* spec;
  int devices;
};

// Tolerance on these small models: the simulated iteration lies within [0.85, 1.05] x the
// prediction (measured 0.86-0.99). The estimate runs the simulator's model analytically (optimizer
// step and all-reduce after each stage's last backward, sends overlapping compute); what it leaves
// out is which transfers and backward passes overlap off the critical path, so it errs high.
constexpr double kLo = 0.85, kHi = 1.05;

double simulated_s(const plan::Plan& p, const cost::CostModel& cm) {
  return sim::simulate(p, schedule::build_schedule(p), cm).iteration_time_s;
}

TEST(SimCheck, PredictedIterationTimeMatchesTheSimulator) {
  for (Case c : {Case{"mmt:branches=2,layers=2,seq=32,hidden=128,heads=4,ffn=256", 4},
                 Case{"mmt:branches=4,layers=2,seq=64,hidden=256,heads=4,ffn=512", 8},
                 Case{"dlrm:dense_branches=2,embedding_branches=4,layers=2,hidden=256,rows=1000", 8},
                 Case{"candle-uno:branches=3,layers=2,hidden=256", 4}}) {
    ir::Graph g = importers::load_graph(c.spec);
    cost::CostModel cm(g, cost::load_cluster("summit", c.devices));
    for (std::string name : planner_names()) {
      PlannerOptions o;
      o.mini_batch = 64;
      o.planner = name;
      o.time_limit_s = 20;
      plan::Plan p = run_planner(cm, o);
      double simulated = simulated_s(p, cm);
      double ratio = simulated / p.predicted.iteration_time_s;
      EXPECT_GE(ratio, kLo) << c.spec << " " << name << " on " << c.devices;
      EXPECT_LE(ratio, kHi) << c.spec << " " << name << " on " << c.devices;
      RecordProperty(std::string(c.spec).substr(0, 4) + "_" + name + "_" + std::to_string(c.devices),
                     std::to_string(ratio));
      std::printf("%-70s %-9s %2d devices: predicted %.3f ms, simulated %.3f ms (x%.3f)\n", c.spec,
                  name.c_str(), c.devices, p.predicted.iteration_time_s * 1e3, simulated * 1e3, ratio);
    }
  }
}

// The paper's models at their preset sizes (summit, mini-batch 128, 4-32 devices): the simulated
// iteration is within [0.9, 1.1] x the prediction for GraphPipe's and PipeDream's plans (and
// Piper's at a short time limit), and for GraphPipe's best plan of each kind (sp, chain), which
// the planner ranks by the estimate. Before the estimate included the optimizer step, dlrm on 8
// devices was predicted at 15.2 ms and simulated at 28.7 ms; before it ran the 1F1B recurrence
// (timeline.h), dlrm's chain candidate on 8 devices simulated at 0.800 of its prediction.
void expect_agrees(const plan::Plan& p, const cost::CostModel& cm, const std::string& what) {
  const double ratio = simulated_s(p, cm) / p.predicted.iteration_time_s;
  EXPECT_GE(ratio, 0.9) << what;
  EXPECT_LE(ratio, 1.1) << what;
  std::printf("%-34s predicted %9.3f ms, simulated x%.3f\n", what.c_str(), p.predicted.iteration_time_s * 1e3, ratio);
}

void expect_preset_agrees(const char* model, const std::vector<std::string>& planners) {
  ir::Graph g = importers::load_graph(model);
  for (int n : {4, 8, 16, 32}) {
    cost::CostModel cm(g, cost::load_cluster("summit", n));
    for (const std::string& name : planners) {
      PlannerOptions o;
      o.mini_batch = 128;
      o.planner = name;
      o.time_limit_s = 2;
      const PlanReport rep = run_planner_report(cm, o);
      const std::string what = fmt::format("{} {} {} devices", model, name, n);
      expect_agrees(rep.plan, cm, what);
      ASSERT_EQ(rep.candidate_plans.size(), rep.plan.search.candidates.size());
      for (size_t c = 0; c < rep.candidate_plans.size(); ++c)
        expect_agrees(rep.candidate_plans[c], cm, what + " " + rep.plan.search.candidates[c].name);
    }
  }
}

// Per-stage micro-batch sizes: on candle-uno at 8 summit devices (mini-batch 128) GraphPipe's plan
// mixes sizes (towers at 32, the head stage at 64); it validates, its 1F1B schedule passes the
// deadlock checker, the simulator agrees with its prediction within 10%, and it is simulated
// faster than the best plan with one size for every stage (--micro-batch 16, 32, 64, 128).
TEST(SimCheck, PerStageSizes) {
  ir::Graph g = importers::load_graph("candle-uno");
  cost::CostModel cm(g, cost::load_cluster("summit", 8));
  PlannerOptions o;
  o.mini_batch = 128;
  const plan::Plan p = run_planner(cm, o);
  plan::validate_plan(p, g, "per-stage sizes");
  std::set<int> sizes;
  for (const auto& s : p.stages) sizes.insert(s.micro_batch_size);
  EXPECT_GE(sizes.size(), 2u) << plan::plan_to_json(p).dump();
  const schedule::Schedule sched = schedule::build_schedule(p);
  EXPECT_NO_THROW(schedule::check_schedule(sched, p));
  const double mixed = simulated_s(p, cm);
  EXPECT_NEAR(mixed / p.predicted.iteration_time_s, 1.0, 0.1);
  double uniform = 1e300;
  for (int mb : {16, 32, 64, 128}) {
    o.micro_batch = mb;
    uniform = std::min(uniform, simulated_s(run_planner(cm, o), cm));
  }
  std::printf("candle-uno, 8 devices: per-stage sizes simulated %.3f ms, best one-size plan %.3f ms\n",
              mixed * 1e3, uniform * 1e3);
  EXPECT_LT(mixed, uniform);
}

TEST(SimCheck, PresetDlrmPredictionWithinTenPercent) {
  expect_preset_agrees("dlrm", {"graphpipe", "pipedream", "piper"});
}
TEST(SimCheck, PresetCandleUnoPredictionWithinTenPercent) {
  expect_preset_agrees("candle-uno", {"graphpipe", "pipedream", "piper"});
}
TEST(SimCheck, PresetMmtPredictionWithinTenPercent) { expect_preset_agrees("mmt", {"graphpipe", "pipedream"}); }

// Weak scaling at 32 devices (mini-batch 32 x devices, as `make paper` runs it): the simulated
// iteration of each planner's chosen plan, and of its plans at a fixed micro-batch of 256 and 512,
// is within [0.9, 1.1] x the prediction. The estimate used to place a non-source stage's last
// backward at the sources' end minus the backwards between them: GraphPipe's dlrm plan here (7
// one-device sources, an 8-device sink at micro-batch 512) simulated at 0.825x its prediction, the
// fixed sizes at 0.855-0.868x (docs/results.md, issue 22); the 1F1B recurrence runs the schedule.
TEST(SimCheck, WeakScalingThirtyTwoDevicesPredictionWithinTenPercent) {
  for (const char* model : {"dlrm", "candle-uno"}) {
    ir::Graph g = importers::load_graph(model);
    cost::CostModel cm(g, cost::load_cluster("summit", 32));
    for (const std::string name : {"graphpipe", "pipedream"}) {
      for (int micro : {0, 256, 512}) {
        PlannerOptions o;
        o.mini_batch = 32 * 32;
        o.micro_batch = micro;
        o.planner = name;
        const plan::Plan p = run_planner(cm, o);
        expect_agrees(p, cm, fmt::format("{} {} B=1024 micro-batch {}", model, name, p.stages.front().micro_batch_size));
      }
    }
  }
}

// The micro-batch size picked by predicted iteration time is (nearly) the simulator's best: its
// simulated iteration is within 10% of the fastest simulated plan over all sizes.
TEST(SimCheck, ChosenMicroBatchIsNearTheSimulatedBest) {
  for (const char* spec : {"mmt:branches=4,layers=2,seq=64,hidden=256,heads=4,ffn=512",
                           "candle-uno:branches=3,layers=2,hidden=256"}) {
    ir::Graph g = importers::load_graph(spec);
    cost::CostModel cm(g, cost::load_cluster("summit", 8));
    for (std::string name : {"graphpipe", "pipedream"}) {
      PlannerOptions o;
      o.mini_batch = 64;
      o.planner = name;
      const double chosen = simulated_s(run_planner(cm, o), cm);
      double best = 1e300;
      int best_m = 0;
      for (int m = 1; m <= 64; m *= 2) {
        o.micro_batch = m;
        double t = simulated_s(run_planner(cm, o), cm);
        if (t < best) best = t, best_m = m;
      }
      EXPECT_LE(chosen, best * 1.10) << spec << " " << name << ": simulated best at micro-batch " << best_m;
    }
  }
}

}  // namespace
}  // namespace gp::planner
