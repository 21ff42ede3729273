// The zero-bubble schedule in the simulator: BI and W timed from their own costs, never slower
// than 1F1B on the same plan when B and W are non-zero, the same peak memory, traces and SVG
// timelines that tell F, B, BI and W apart.
#include <gtest/gtest.h>

#include "schedule/schedule.h"
#include "schedule/tests/test_plans.h"
#include "sim/sim.h"
#include "sim/tests/sim_helpers.h"

namespace gp::sim {
namespace {

using gp::testing::make_chain;
using gp::testing::make_plan;
using schedule::build_schedule;

// f = 1, b = 2 split into bi = 1 and w = 1 (the zero-bubble paper's 1:1:1), activations 10 bytes.
SimCosts split_costs(const plan::Plan& p) {
  SimCosts c = uniform_costs(p, 1, 2, 100, 10);
  for (StageTimes& t : c.stages) t.bwd_input_s = t.bwd_weight_s = 1;
  return c;
}

TEST(ZeroBubbleSim, TwoStageChainByHand) {
  // The pass order of schedule's TwoStageChainByHand, timed: one slot per pass.
  plan::Plan p = make_chain(2, 4, 1);
  SimResult r = simulate(p, build_schedule(p, "zb"), split_costs(p));
  EXPECT_EQ(compute_slices(r, 0),
            "F0[0,1] F1[1,2] I0[3,4] W0[4,5] F2[5,6] I1[6,7] W1[7,8] F3[8,9] "
            "I2[9,10] W2[10,11] I3[12,13] W3[13,14] opt[14,14]");
  EXPECT_DOUBLE_EQ(r.iteration_time_s, 14);  // 1F1B: 15
  EXPECT_DOUBLE_EQ(simulate(p, build_schedule(p, "1f1b"), split_costs(p)).iteration_time_s, 15);
}

TEST(ZeroBubbleSim, NoSlowerThan1F1BWithTheSamePeakMemory) {
  const std::vector<plan::Plan> plans = {
      make_chain(4, 32, 4),                                                                // chain
      make_plan(32, {{2, 1, {1, 2}}, {2, 1, {3}}, {2, 1, {3}}, {2, 1, {}}}),               // diamond
      make_plan(32, {{4, 2, {1, 2}}, {2, 1, {3}}, {4, 1, {3}}, {2, 1, {4}}, {4, 2, {}}}),  // branches, replicas
  };
  for (const plan::Plan& p : plans) {
    SCOPED_TRACE(fmt::format("{} stages", p.stages.size()));
    SimCosts c = split_costs(p);
    SimResult f = simulate(p, build_schedule(p, "1f1b"), c);
    SimResult z = simulate(p, build_schedule(p, "zb", pass_times(c)), c);
    EXPECT_LE(z.iteration_time_s, f.iteration_time_s);
    EXPECT_LE(z.bubble_fraction, f.bubble_fraction);
    EXPECT_EQ(z.peak_memory_bytes, f.peak_memory_bytes);
    EXPECT_EQ(z.busy_s, f.busy_s);  // the same work, moved
  }
  // On the 4-stage chain the deferred W passes fill most of 1F1B's bubble.
  plan::Plan p = plans[0];
  SimCosts c = split_costs(p);
  EXPECT_DOUBLE_EQ(simulate(p, build_schedule(p, "1f1b"), c).iteration_time_s, (8 + 3) * 3.0);
  EXPECT_LT(simulate(p, build_schedule(p, "zb", pass_times(c)), c).iteration_time_s, (8 + 3) * 3.0 - 2);
}

TEST(ZeroBubbleSim, PassTimesComeFromTheCosts) {
  plan::Plan p = make_chain(2, 4, 1);
  SimCosts c = split_costs(p);
  c.stages[1].fwd_s = 3;
  c.stages[1].bwd_weight_s = 0.5;
  schedule::PassTimes t = pass_times(c);
  EXPECT_EQ(t.fwd_s, (std::vector<double>{1, 3}));
  EXPECT_EQ(t.bwd_input_s, (std::vector<double>{1, 1}));
  EXPECT_EQ(t.bwd_weight_s, (std::vector<double>{1, 0.5}));
}

TEST(ZeroBubbleSim, TraceAndSvgTellThePassesApart) {
  plan::Plan p = make_chain(2, 4, 1);
  SimResult r = simulate(p, build_schedule(p, "zb"), split_costs(p));
  Json t = chrome_trace(p, r);
  std::map<std::string, std::string> colour;  // category -> cname
  for (const Json& e : t["traceEvents"])
    if (e["ph"] == "X" && e.contains("cname")) colour[e["cat"]] = e["cname"];
  EXPECT_EQ(colour.size(), 3u);  // forward, backward_input, backward_weight
  EXPECT_NE(colour["backward_input"], colour["backward_weight"]);
  EXPECT_NE(colour["forward"], colour["backward_weight"]);
  std::string svg = svg_timeline(p, r, "zb");
  EXPECT_NE(svg.find("s1 F / BI / W"), std::string::npos);
  EXPECT_EQ(svg.find("F / B /"), std::string::npos);  // no whole backward in this timeline
  EXPECT_NE(svg.find("<title>s0 W mb2"), std::string::npos);
  EXPECT_NE(svg.find("url(#w-hatch)"), std::string::npos);
  EXPECT_NE(svg.find("<pattern id=\"w-hatch\""), std::string::npos);
  EXPECT_NE(svg_timeline(p, simulate(p, build_schedule(p), split_costs(p))).find("s1 F / B<"), std::string::npos);
}

}  // namespace
}  // namespace gp::sim
