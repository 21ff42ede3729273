// The search across micro-batch sizes skips a size (per candidate kind) once no plan of it can enter
// that kind's shortlist: a DP with a cap on every stage's compute per sample proves it
// (detail::size_may_beat). These tests check the bound under it (every plan's predicted iteration is
// at least mini-batch x each stage's compute per sample), that the proof never rules out a size
// holding a plan below the cap's iteration, and that skipping changes no plan.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <random>

#include "planner/engine.h"
#include "planner/planner.h"
#include "planner/tests/util.h"

namespace gp::planner {
namespace {

// A random model with repeated parallel branches (some identical, some not) between a fork op and
// a join: the shape on which size bounds and shared sub-problems matter.
ir::Graph branchy_model(uint32_t seed) {
  std::mt19937 rng(seed);
  ir::ModelBuilder b("branchy");
  auto x = b.input("x", {256});
  auto y = b.input("y", {256});
  std::string in = b.linear("stem", x, 256);
  const int branches = 2 + static_cast<int>(rng() % 4), layers = 1 + static_cast<int>(rng() % 4);
  const int kinds = 1 + static_cast<int>(rng() % 2);  // 1: all branches alike
  std::vector<std::string> outs;
  for (int k = 0; k < branches; ++k) {
    std::string h = in;
    const int width = 256 * (1 + k % kinds);
    for (int l = 0; l < layers; ++l) {
      h = b.linear(fmt::format("b{}.l{}", k, l), h, l + 1 == layers ? 256 : width);
      if (l % 2 == 0) h = b.unary(fmt::format("b{}.r{}", k, l), ir::OpKind::relu, h);
    }
    outs.push_back(h);
  }
  auto sum = b.op("join", ir::OpKind::add, outs);
  b.output(b.op("loss", ir::OpKind::mse_loss, {b.linear("head", sum, 256), y}));
  return ir::Graph::build(b.build(), "branchy");
}

double max_compute_tps(const cost::CostModel& cm, const std::vector<detail::StageChoice>& st, int mbs, int mini) {
  std::vector<char> mask(cm.graph().num_ops(), 0);
  double worst = 0;
  for (const detail::StageChoice& c : st) {
    for (OpId o : c.ops) mask[o.v] = 1;
    const int z = c.mbs > 0 ? c.mbs : mbs;
    worst = std::max(worst, cost::stage_cost(cm, c.ops, mask, c.dp, z, mini, true).compute_s / z);
    for (OpId o : c.ops) mask[o.v] = 0;
  }
  return worst;
}

// Every plan a size's search finds predicts at least mini-batch x its stages' compute per sample,
// and size_may_beat at the best plan's iteration / mini-batch finds a plan (the bound never rules
// out a size that holds a plan below it). Below that it may rule the size out (counted: the test
// fails if it never does).
TEST(BruteForce, SizeBoundNeverRulesOutABetterPlan) {
  const int mini = 64;
  int checked = 0, ruled_out = 0;
  for (uint32_t seed = 1; seed <= 12; ++seed) {
    ir::Graph g = branchy_model(seed);
    for (int n : {2, 4, 8}) {
      cost::CostModel cm(g, test::round_cluster(n, 4));
      const double limit = cm.usable_memory_bytes();
      const detail::Structure sp = detail::sp_structure(cm, nullptr), chain = detail::chain_structure(cm);
      for (int kind = 0; kind < 2; ++kind)
        for (int mbs = 1; mbs <= mini; mbs *= 4) {
          SCOPED_TRACE(fmt::format("seed {} n {} kind {} mbs {}", seed, n, kind, mbs));
          const detail::Structure& st = kind == 0 ? sp : chain;
          const detail::SizeSearch ss{mbs, kind == 0 ? 2 : 0, mini, limit, n, n <= 4, 1e-3};
          double best = std::numeric_limits<double>::infinity(), tps = 0;
          detail::search_size(cm, st, ss, &tps, [&](const std::vector<detail::StageChoice>& c) {
            const plan::Plan p = detail::assemble(cm, c, mbs, mini, limit, detail::Order::dag, nullptr);
            EXPECT_GE(p.predicted.iteration_time_s, mini * max_compute_tps(cm, c, mbs, mini) * (1 - 1e-9));
            best = std::min(best, p.predicted.iteration_time_s);
          });
          if (best == std::numeric_limits<double>::infinity()) {
            EXPECT_FALSE(detail::size_may_beat(cm, st, ss, std::numeric_limits<double>::infinity()));
            continue;
          }
          ++checked;
          EXPECT_TRUE(detail::size_may_beat(cm, st, ss, best / mini * (1 + 1e-6)));
          const bool may = detail::size_may_beat(cm, st, ss, best / mini * 0.5);
          ruled_out += !may;
          // Out of budget the answer is "may beat" (no proof), never a wrong "cannot".
          if (may) {
            EXPECT_TRUE(detail::size_may_beat(cm, st, ss, best / mini * 0.5, 10));
          }
        }
    }
  }
  EXPECT_GT(checked, 100);
  EXPECT_GT(ruled_out, 10) << "the bound never ruled a size out: the test does not exercise it";
}

// The planner with and without the size bounds returns the same plan and candidates (everything
// but the search time), on models where the bounds skip sizes.
TEST(Planner, SizeBoundsChangeNoPlan) {
  int skipped = 0;
  for (uint32_t seed = 1; seed <= 10; ++seed) {
    ir::Graph g = branchy_model(seed);
    for (int n : {4, 8}) {
      cost::CostModel cm(g, test::round_cluster(n, 4));
      for (const char* planner : {"graphpipe", "pipedream"}) {
        SCOPED_TRACE(fmt::format("seed {} n {} {}", seed, n, planner));
        PlannerOptions o;
        o.mini_batch = 256;
        o.planner = planner;
        plan::Plan p[2];
        for (int on : {0, 1}) {
          o.bound_sizes = on == 1;
          PlanReport rep = run_planner_report(cm, o);
          p[on] = rep.plan;
          p[on].search_time_s = 0;
          if (on)
            for (const auto& c : rep.per_micro_batch) skipped += static_cast<int>(c.cut.size());
        }
        EXPECT_EQ(plan::plan_to_json(p[0]).dump(), plan::plan_to_json(p[1]).dump());
      }
    }
  }
  EXPECT_GT(skipped, 20) << "the bounds never skipped a size: the test does not exercise them";
}

// Identical sequences (mirror_sequences) share memo entries and stage costs: the searches with and
// without sharing offer the same plans (ops, degrees, sizes, costs) in the same order.
TEST(BruteForce, MirrorSequencesShareAnswersExactly) {
  size_t shared = 0, states[2] = {0, 0};
  for (uint32_t seed = 1; seed <= 16; ++seed) {
    ir::Graph g = branchy_model(seed);
    for (int n : {2, 4, 8}) {
      cost::CostModel cm(g, test::round_cluster(n, 4));
      detail::Structure st[2] = {detail::sp_structure(cm, nullptr), detail::sp_structure(cm, nullptr)};
      st[0].same_as.clear();
      for (size_t s = 0; s < st[1].seqs.size(); ++s) shared += st[1].canon(static_cast<int>(s)) != static_cast<int>(s);
      const double limit = seed % 3 == 0 ? 1e18 : cm.usable_memory_bytes() * 0.002 * (1 + seed % 4);
      for (const detail::StageSizes& sizes : {detail::StageSizes::uniform(8), detail::StageSizes::window(8, 2)}) {
        SCOPED_TRACE(fmt::format("seed {} n {} sizes {} limit {:.4g}", seed, n, sizes.sizes.size(), limit));
        std::vector<std::vector<detail::StageChoice>> plans[2];
        double tps[2] = {0, 0};
        bool ok[2];
        for (int on : {0, 1}) {
          detail::SeqDp dp(cm, st[on], sizes, 64, limit, n, true);
          std::vector<detail::StageChoice> best;
          ok[on] = dp.minimise(1e-3, 0, &tps[on], &best,
                               [&](const std::vector<detail::StageChoice>& p) { plans[on].push_back(p); });
          states[on] += dp.states_explored();
        }
        ASSERT_EQ(ok[0], ok[1]);
        EXPECT_EQ(tps[0], tps[1]);
        test::expect_same_plans(plans[0], plans[1]);
      }
    }
  }
  EXPECT_GT(shared, 50u) << "no identical sequences: the test does not exercise the sharing";
  EXPECT_LT(states[1], states[0]) << "sharing solved no fewer states";
}

// The DP's named outcomes (issue 39: no -1/-2/-3 integers): solve_within says whether a plan was
// found, none exists, or the budget ran out; solve() keeps minimise_target's contract (a plan and
// its depth, no plan at this target, none at any target).
TEST(PlannerEngine, SolveOutcomesAreNamed) {
  const double inf = std::numeric_limits<double>::infinity();
  ir::Graph g = branchy_model(3);
  cost::CostModel cm(g, test::round_cluster(4, 4));
  const detail::Structure st = detail::sp_structure(cm, nullptr);
  detail::SeqDp dp(cm, st, 8, 64, 1e18, 4, true);
  EXPECT_EQ(dp.solve_within(inf, 1), detail::SeqDp::Budgeted::out_of_budget);
  EXPECT_EQ(dp.solve_within(inf, 0), detail::SeqDp::Budgeted::plan);
  std::vector<detail::StageChoice> plan;
  const detail::SolveResult found = dp.solve(inf, &plan);
  EXPECT_EQ(found.kind, detail::SolveResult::Kind::plan);
  EXPECT_GE(found.depth, 1);
  EXPECT_FALSE(plan.empty());
  // Below every stage's compute: rejected for time, so infeasible here only.
  EXPECT_EQ(dp.solve(1e-15, nullptr), detail::SolveResult::no_plan());
  // One byte per device: memory alone rules every plan out, at every target.
  detail::SeqDp tiny(cm, st, 8, 64, 1.0, 4, true);
  EXPECT_EQ(tiny.solve(1.0, nullptr), detail::SolveResult::never_feasible());
  EXPECT_EQ(tiny.solve_within(inf, 0), detail::SeqDp::Budgeted::no_plan);
}

}  // namespace
}  // namespace gp::planner
