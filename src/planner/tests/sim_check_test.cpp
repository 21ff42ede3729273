// The planner's iteration-time estimate ((M - 1) x slowest stage + critical path, used to pick the
// micro-batch size) against the discrete-event simulator on the planners' own plans.
#include <gtest/gtest.h>

#include <algorithm>

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

// Tolerance: the simulated iteration (without the optimizer step, which the planner leaves out)
// lies within [0.6, 1.05] x the prediction. The simulator overlaps sends with compute, so on these
// small, communication-heavy models it is up to ~36% faster than the estimate, which charges
// transfers to the stages (docs/schedule.md); it was never slower than predicted here.
constexpr double kLo = 0.6, kHi = 1.05;

double simulated_s(const plan::Plan& p, const cost::CostModel& cm) {
  sim::SimCosts costs = sim::sim_costs(p, cm);
  double step = 0;
  for (const auto& st : costs.stages) step = std::max(step, st.optimizer_s);
  return sim::simulate(p, schedule::build_schedule(p), costs).iteration_time_s - step;
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
