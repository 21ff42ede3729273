// Mutated valid plans: each mutation breaks one rule, and validate_plan must reject the plan with
// that rule named in the message (C1 ops, C2 stage edges, C3 devices, in_flight counts).
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>

#include "adversarial.h"

namespace gp::adversarial {
namespace {

/// The validator's message, or "" when it accepts.
std::string rejection(const plan::Plan& p, const ir::Graph& g) {
  try {
    plan::validate_plan(p, g, "mutant");
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

void expect_rule(const plan::Plan& p, const ir::Graph& g, const std::string& rule) {
  std::string msg = rejection(p, g);
  RC_ASSERT(!msg.empty());
  if (msg.find(rule) == std::string::npos) RC_FAIL("expected rule " + rule + ", got: " + msg);
}

int random_stage(const plan::Plan& p) { return *rc::gen::inRange<int>(0, static_cast<int>(p.stages.size())); }

/// Every stage edge GraphPipe declares carries at least one op edge (derive_stage_edges gives
/// exactly the declared edges). PipeDream plans keep their chain order as declared edges even
/// between stages that exchange no tensor (a sequential pipeline by design), so they are skipped.
TEST(PlanMutation, GraphPipeDeclaresExactlyTheImpliedEdges) {
  for (const Planned& pl : plan_pool()) {
    if (pl.plan.planner != "graphpipe") continue;
    plan::Plan derived = pl.plan;
    plan::derive_stage_edges(derived, *pl.graph);
    for (size_t k = 0; k < derived.stages.size(); ++k) {
      EXPECT_EQ(derived.stages[k].outputs_to, pl.plan.stages[k].outputs_to) << pl.plan.model_name << " stage " << k;
      EXPECT_EQ(derived.stages[k].inputs_from, pl.plan.stages[k].inputs_from) << pl.plan.model_name << " stage " << k;
    }
  }
}

RC_GTEST_PROP(PlanMutation, DropAnOpIsC1, ()) {
  auto [g, p] = random_valid_plan();
  plan::Stage& st = p.stages[random_stage(p)];
  st.ops.erase(st.ops.begin() + *rc::gen::inRange<size_t>(0, st.ops.size()));
  expect_rule(p, *g, "C1");
}

RC_GTEST_PROP(PlanMutation, OpInTwoStagesIsC1, ()) {
  auto [g, p] = random_valid_plan();
  RC_PRE(p.stages.size() >= 2);
  int a = random_stage(p), b = random_stage(p);
  RC_PRE(a != b);
  p.stages[b].ops.push_back(*rc::gen::elementOf(p.stages[a].ops));
  expect_rule(p, *g, "C1: op");
}

RC_GTEST_PROP(PlanMutation, UnknownOpIsC1, ()) {
  auto [g, p] = random_valid_plan();
  p.stages[random_stage(p)].ops.push_back("no.such.op");
  expect_rule(p, *g, "C1: stage");
}

RC_GTEST_PROP(PlanMutation, SharedDeviceIsC3, ()) {
  auto [g, p] = random_valid_plan();
  int a = random_stage(p), b = random_stage(p);  // a == b: the device twice in one stage
  p.stages[b].devices.push_back(*rc::gen::elementOf(p.stages[a].devices));
  expect_rule(p, *g, "C3: device");
}

RC_GTEST_PROP(PlanMutation, DeviceOutOfRangeIsC3, ()) {
  auto [g, p] = random_valid_plan();
  plan::Stage& st = p.stages[random_stage(p)];
  int bad = *rc::gen::element(-1, p.num_devices, p.num_devices + 7, 1 << 30);
  st.devices[*rc::gen::inRange<size_t>(0, st.devices.size())] = bad;
  expect_rule(p, *g, "C3: stage");
}

RC_GTEST_PROP(PlanMutation, NoDevicesIsC3, ()) {
  auto [g, p] = random_valid_plan();
  p.stages[random_stage(p)].devices.clear();
  expect_rule(p, *g, "C3: stage");
}

/// The declared edges (u, v) that carry op edges (removing or reversing one breaks C2).
std::vector<std::pair<int, int>> edges(const plan::Plan& p, const ir::Graph& g) {
  plan::Plan derived = p;
  plan::derive_stage_edges(derived, g);
  std::vector<std::pair<int, int>> e;
  for (const plan::Stage& st : derived.stages)
    for (int v : st.outputs_to) e.emplace_back(st.id, v);
  return e;
}

void erase_value(std::vector<int>& xs, int x) { xs.erase(std::remove(xs.begin(), xs.end(), x), xs.end()); }
void insert_sorted(std::vector<int>& xs, int x) { xs.insert(std::lower_bound(xs.begin(), xs.end(), x), x); }

RC_GTEST_PROP(PlanMutation, ReversedEdgeIsC2, ()) {
  auto [g, p] = random_valid_plan();
  auto e = edges(p, *g);
  RC_PRE(!e.empty());
  auto [u, v] = *rc::gen::elementOf(e);
  erase_value(p.stages[u].outputs_to, v);
  erase_value(p.stages[v].inputs_from, u);
  if (std::find(p.stages[v].outputs_to.begin(), p.stages[v].outputs_to.end(), u) == p.stages[v].outputs_to.end()) {
    insert_sorted(p.stages[v].outputs_to, u);
    insert_sorted(p.stages[u].inputs_from, v);
  }
  expect_rule(p, *g, "C2");
}

RC_GTEST_PROP(PlanMutation, RemovedEdgeIsC2, ()) {
  auto [g, p] = random_valid_plan();
  auto e = edges(p, *g);
  RC_PRE(!e.empty());
  auto [u, v] = *rc::gen::elementOf(e);
  int how = *rc::gen::inRange(0, 3);  // 0: both ends, 1: only outputs_to, 2: only inputs_from
  if (how != 2) erase_value(p.stages[u].outputs_to, v);
  if (how != 1) erase_value(p.stages[v].inputs_from, u);
  expect_rule(p, *g, "C2");
}

RC_GTEST_PROP(PlanMutation, EdgeToUnknownStageIsC2, ()) {
  auto [g, p] = random_valid_plan();
  int n = static_cast<int>(p.stages.size());
  plan::Stage& st = p.stages[random_stage(p)];
  int bad = *rc::gen::element(-1, n, st.id);  // st.id: a self loop
  if (*rc::gen::arbitrary<bool>()) st.outputs_to.push_back(bad);
  else st.inputs_from.push_back(bad);
  expect_rule(p, *g, "C2: stage");
}

RC_GTEST_PROP(PlanMutation, LoweredInFlightIsRejected, ()) {
  auto [g, p] = random_valid_plan();
  std::vector<int> with_succ;
  for (const plan::Stage& st : p.stages)
    if (!st.outputs_to.empty()) with_succ.push_back(st.id);
  RC_PRE(!with_succ.empty());
  plan::Stage& st = p.stages[*rc::gen::elementOf(with_succ)];
  // Independent of plan.cpp: the stage must hold its successors' in-flight samples plus one of
  // its own micro-batches, so ceil(successor samples / own micro-batch) is one too few.
  int64_t succ = 0;
  for (int v : st.outputs_to)
    succ = std::max<int64_t>(succ, int64_t{p.stages[v].in_flight} * p.stages[v].micro_batch_size);
  int too_few = static_cast<int>((succ + st.micro_batch_size - 1) / st.micro_batch_size);
  RC_ASSERT(st.in_flight > too_few);  // the valid plan satisfies the rule
  st.in_flight = *rc::gen::inRange(0, too_few + 1);
  expect_rule(p, *g, "in_flight: stage " + std::to_string(st.id));
}

RC_GTEST_PROP(PlanMutation, MicroBatchNotDividingIsRejected, ()) {
  auto [g, p] = random_valid_plan();
  plan::Stage& st = p.stages[random_stage(p)];
  st.micro_batch_size = p.mini_batch_size + 1;
  expect_rule(p, *g, "does not divide mini_batch_size");
}

RC_GTEST_PROP(PlanMutation, ValidPlansStillPass, ()) {
  auto [g, p] = random_valid_plan();
  RC_ASSERT(rejection(p, *g).empty());
}

}  // namespace
}  // namespace gp::adversarial
