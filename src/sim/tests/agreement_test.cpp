// The simulator against the planner's analytic estimate on a real cost model: both price stages
// with cost::stage_cost. On a chain with free links whose slowest stage is the last one, 1F1B
// takes exactly (M - 1) x slowest + path (the planner's formula) plus the optimizer step, which
// the planner leaves out. Elsewhere they differ (docs/schedule.md, "Agreement with the planner").
#include <gtest/gtest.h>

#include <limits>

#include "cost/cost_model.h"
#include "schedule/schedule.h"
#include "schedule/tests/test_plans.h"
#include "sim/sim.h"

namespace gp::sim {
namespace {

ir::Graph uniform_chain(int layers) {
  ir::ModelBuilder b("chain");
  std::string h = b.input("x", {512});
  std::string y = b.input("y", {512});
  for (int i = 0; i < layers; ++i) h = b.linear("l" + std::to_string(i), h, 512);
  b.output(b.op("loss", ir::OpKind::mse_loss, {h, y}));
  return ir::Graph::build(b.build());
}

cost::Cluster free_links(int devices) {
  cost::Cluster c = cost::load_cluster("summit", devices);
  double inf = std::numeric_limits<double>::infinity();
  c.intra = {inf, 0};
  c.inter = {inf, 0};
  c.node_injection_Bps = 0;
  return c;
}

// The planner's former estimate (before planner/assemble.cpp's iteration_time): micro-batch time
// per stage (compute + transfers) from stage_cost, iteration = (M - 1) x slowest + longest path.
double planner_estimate(const plan::Plan& p, const cost::CostModel& cm) {
  const ir::Graph& g = cm.graph();
  std::vector<double> finish(p.stages.size(), 0);
  double path = 0, slowest = 0;
  for (const plan::Stage& st : p.stages) {
    std::vector<OpId> ops;
    std::vector<char> mask(g.num_ops(), 0);
    for (const auto& name : st.ops) {
      ops.push_back(g.find(name));
      mask[ops.back().v] = 1;
    }
    cost::StageCost c = cost::stage_cost(cm, ops, mask, static_cast<int>(st.devices.size()), st.micro_batch_size,
                                         p.mini_batch_size, true);
    double mb = c.compute_s + c.comm_s, start = 0;  // tps_s also spreads per-iteration work
    for (int u : st.inputs_from) start = std::max(start, finish[u]);
    finish[st.id] = start + mb;
    path = std::max(path, finish[st.id]);
    slowest = std::max(slowest, mb);
  }
  return (p.mini_batch_size / p.stages[0].micro_batch_size - 1) * slowest + path;
}

TEST(PlannerAgreement, UniformChainWithFreeLinksIsExact) {
  ir::Graph g = uniform_chain(8);
  cost::CostModel cm(g, free_links(4));
  // 4 stages of 2 layers each; the loss joins the last stage, which makes it the slowest.
  plan::Plan p = gp::testing::make_chain(4, 64, 8);
  for (int s = 0; s < 4; ++s) p.stages[s].ops = {"l" + std::to_string(2 * s), "l" + std::to_string(2 * s + 1)};
  p.stages[3].ops.push_back("loss");
  SimCosts c = sim_costs(p, cm);
  SimResult r = simulate(p, schedule::build_schedule(p), c);
  double predicted = planner_estimate(p, cm);
  EXPECT_NEAR(r.iteration_time_s - c.stages[0].optimizer_s, predicted, 1e-9 * predicted);
  // Stages 0-2 are identical and the last one (with the loss) is the slowest: the case in
  // which the planner's formula is exact for 1F1B.
  for (int s = 1; s < 3; ++s)
    EXPECT_DOUBLE_EQ(c.stages[s].fwd_s + c.stages[s].bwd_s, c.stages[0].fwd_s + c.stages[0].bwd_s);
  EXPECT_GT(c.stages[3].fwd_s + c.stages[3].bwd_s, c.stages[0].fwd_s + c.stages[0].bwd_s);
}

TEST(PlannerAgreement, CostlyLinksMakeThePlannerPessimistic) {
  // The planner charges each stage its cut-edge transfers; the simulator overlaps sends with
  // compute, so it is faster, but never by more than the planner's communication share.
  ir::Graph g = uniform_chain(8);
  cost::CostModel cm(g, cost::load_cluster("summit", 4));
  plan::Plan p = gp::testing::make_chain(4, 64, 8);
  for (int s = 0; s < 4; ++s) p.stages[s].ops = {"l" + std::to_string(2 * s), "l" + std::to_string(2 * s + 1)};
  p.stages[3].ops.push_back("loss");
  SimCosts c = sim_costs(p, cm);
  double sim = simulate(p, schedule::build_schedule(p), c).iteration_time_s - c.stages[0].optimizer_s;
  double predicted = planner_estimate(p, cm);
  cost::CostModel free_cm(g, free_links(4));
  double compute_only = planner_estimate(p, free_cm);
  EXPECT_LE(sim, predicted * (1 + 1e-9));
  EXPECT_GE(sim, compute_only * (1 - 1e-9));
}

}  // namespace
}  // namespace gp::sim

namespace gp::sim {
namespace {

// A tied table: the embedding on stage 0 (2 replicas), the tied head on stage 1. Both holders'
// optimizer steps start with the sum of the table's gradient over all 3 holder devices.
TEST(SharedParams, HoldersOnTwoStagesSumTheGradientBeforeTheirOptimizerStep) {
  ir::ModelBuilder b("tied");
  b.input("ids", {4}, ir::DType::i64);
  auto e = b.op("emb", ir::OpKind::embedding, {"ids"}, {{"rows", 50}, {"dim", 16}});
  auto m = b.op("pool", ir::OpKind::mean, {b.linear("fc", e, 16)}, {{"axis", 1}});
  b.input("label", {}, ir::DType::i64);
  b.output(b.op("loss", ir::OpKind::cross_entropy, {b.linear("head", m, 50, false), "label"}));
  ir::Model model = b.build();
  model.shared_params.push_back({"table", {50, 16}, {"emb/weight", "head/weight"}});
  ir::Graph g = ir::Graph::build(model);
  cost::CostModel cm(g, cost::load_cluster("summit", 4), cost::Optimizer::adam);
  plan::Plan p = gp::testing::make_plan(16, {{4, 2, {1}}, {4, 1, {}}});
  p.stages[0].ops = {"emb", "fc"};
  p.stages[1].ops = {"pool", "head", "loss"};
  ASSERT_EQ(p.stages[1].devices, std::vector<int>{2});
  SimCosts c = sim_costs(p, cm);
  const double sum = cm.allreduce_time({0, 1, 2}, 50 * 16 * 4.0);
  EXPECT_GT(sum, 0);
  for (int s = 0; s < 2; ++s) {
    std::vector<OpId> ops;
    std::vector<char> mask(g.num_ops(), 0);
    for (const auto& n : p.stages[s].ops) mask[(ops.emplace_back(g.find(n))).v] = 1;
    cost::StageCost sc = cost::stage_cost(cm, ops, mask, static_cast<int>(p.stages[s].devices.size()),
                                          p.stages[s].micro_batch_size, p.mini_batch_size, true);
    EXPECT_DOUBLE_EQ(c.stages[s].optimizer_s, sc.optimizer_s + sum) << "stage " << s;
  }
  SimResult r = simulate(p, schedule::build_schedule(p), c);
  EXPECT_GT(r.iteration_time_s, sum);
}

}  // namespace
}  // namespace gp::sim
