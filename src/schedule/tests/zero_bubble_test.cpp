// The zero-bubble (zb, ZB-H1) schedule on stage DAGs: built schedules pass the checker on every
// plan shape, hold what 1F1B holds, and the checker rejects broken B/W orders.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "plan/schedule_kind.h"
#include "schedule/schedule.h"
#include "schedule/tests/random_plans.h"
#include "schedule/tests/test_plans.h"

namespace gp::schedule {
namespace {

using gp::testing::check_error;
using gp::testing::make_chain;
using gp::testing::make_plan;

std::string passes_str(const StageSchedule& s) {
  std::string out;
  for (const Action& a : s.actions) {
    if (a.kind != ActionKind::forward && a.kind != ActionKind::backward_input && a.kind != ActionKind::backward_weight)
      continue;
    out += (out.empty() ? "" : " ") + to_string(a);
  }
  return out;
}

// The plan shapes the schedule tests make: chains, branches and joins, a skip edge, replicas,
// different micro-batch sizes per stage, one and many micro-batches.
std::vector<plan::Plan> shapes() {
  return {
      make_chain(1, 8, 2),
      make_chain(2, 4, 1),
      make_chain(4, 32, 4),
      make_chain(4, 8, 4),                                                    // 2 micro-batches
      make_chain(3, 4, 4),                                                    // 1 micro-batch
      make_plan(16, {{2, 1, {1, 2}}, {2, 1, {3}}, {2, 1, {3}}, {2, 1, {}}}),  // diamond
      make_plan(4, {{1, 1, {1, 2}}, {1, 1, {2}}, {1, 1, {}}}),                // skip edge
      make_plan(8, {{4, 1, {1}}, {2, 1, {}}}),                                // large into small
      make_plan(8, {{2, 1, {1}}, {4, 1, {}}}),                                // small into large
      make_plan(8, {{4, 2, {1, 2}}, {2, 1, {2}}, {2, 1, {}}}),                // replicas, skip
      make_plan(16, {{4, 2, {1}}, {2, 1, {2, 3}}, {4, 2, {4}}, {2, 1, {4}}, {8, 2, {}}}),
  };
}

TEST(ZeroBubble, PassesTheCheckerAndHoldsWhat1F1BHolds) {
  for (const plan::Plan& p : shapes()) {
    SCOPED_TRACE(fmt::format("{} stages, mini-batch {}", p.stages.size(), p.mini_batch_size));
    Schedule zb = build_schedule(p, "zb");  // runs check_schedule
    EXPECT_EQ(zb.kind, "zb");
    EXPECT_EQ(check_error(zb, p), "(no error)");
    EXPECT_EQ(peak_in_flight(zb), peak_in_flight(build_schedule(p, "1f1b")));
    for (const StageSchedule& st : zb.stages)
      for (const Action& a : st.actions) EXPECT_NE(a.kind, ActionKind::backward);
  }
}

TEST(ZeroBubble, TwoStageChainByHand) {
  // 1:1:1 pass times, in_flight 2 and 1. Stage 0: F0 F1 [0,2]; waits for mb0's gradient (stage 1:
  // F0 [1,2], BI0 [2,3]); BI0 [3,4]; F2 is over the activation bound (mb0 and mb1 held until
  // their W), so W0 [4,5] comes first; and so on. The sink runs BI right after F and its W while
  // the bound holds its next F back.
  plan::Plan p = make_chain(2, 4, 1);
  Schedule s = build_schedule(p, "zb");
  EXPECT_EQ(passes_str(s.stages[0]), "F mb0 F mb1 BI mb0 W mb0 F mb2 BI mb1 W mb1 F mb3 BI mb2 W mb2 BI mb3 W mb3");
  EXPECT_EQ(passes_str(s.stages[1]), "F mb0 BI mb0 W mb0 F mb1 BI mb1 W mb1 F mb2 BI mb2 W mb2 F mb3 BI mb3 W mb3");
  EXPECT_EQ(peak_in_flight(s), (std::vector<int>{2, 1}));
}

TEST(ZeroBubble, PassTimesOfThePlan) {
  // Recorded pass times are what pass_times_of returns; without them 1:1:1 at tps x mbs / 3.
  plan::Plan p = make_chain(2, 4, 1);
  p.stages[0].fwd_s = 2, p.stages[0].bwd_input_s = 3, p.stages[0].bwd_weight_s = 4;
  EXPECT_EQ(pass_times_of(p).fwd_s, (std::vector<double>{1, 1}));  // stage 1 has none
  p.stages[1].fwd_s = 5;
  PassTimes rec = pass_times_of(p);
  EXPECT_EQ(rec.fwd_s, (std::vector<double>{2, 5}));
  EXPECT_EQ(rec.bwd_input_s, (std::vector<double>{3, 0}));
  EXPECT_EQ(rec.bwd_weight_s, (std::vector<double>{4, 0}));
  plan::Plan q = make_chain(2, 4, 2);
  q.stages[0].tps_s = 0.3, q.stages[1].tps_s = 0.6;
  EXPECT_EQ(pass_times_of(q).bwd_weight_s, (std::vector<double>{0.3 * 2 / 3, 0.6 * 2 / 3}));
  EXPECT_THROW(build_schedule(p, "zb", PassTimes{{1}, {1}, {1}}), UserError);
  EXPECT_THROW(build_schedule(p, "zb", PassTimes{{1, -1}, {1, 1}, {1, 1}}), UserError);
}

TEST(ZeroBubble, TooSmallInFlightIsAUserError) {
  // Stage 1 (micro-batch 4) needs two of stage 0's micro-batches of 2 before its first forward,
  // but stage 0 may hold only one until its backward (as in CheckSchedule's 1F1B case).
  plan::Plan p = make_plan(8, {{2, 1, {1}, 1}, {4, 1, {}}});
  try {
    build_schedule(p, "zb");
    FAIL() << "built";
  } catch (const UserError& e) {
    EXPECT_STREQ(e.what(),
                 "zb schedule of the plan: stage 0 stops after 1 forwards, 0 backward_inputs and 0 "
                 "backward_weights of 4 micro-batches (its in_flight 1 is too small for its successors?)");
  }
}

// Replaces stage `st`'s action at `i`.
void set_action(Schedule& s, int st, size_t i, Action a) { s.stages[st].actions[i] = a; }
size_t find_action(const Schedule& s, int st, const std::string& what) {
  const auto& acts = s.stages[st].actions;
  for (size_t i = 0; i < acts.size(); ++i)
    if (to_string(acts[i]) == what) return i;
  ADD_FAILURE() << "no " << what << " on stage " << st;
  return 0;
}

TEST(ZeroBubble, CheckerRejectsBrokenWeightPasses) {
  plan::Plan p = make_chain(2, 4, 1);
  const Schedule good = build_schedule(p, "zb");
  {  // W before its BI: swap stage 0's "BI mb0" and "W mb0".
    Schedule s = good;
    size_t bi = find_action(s, 0, "BI mb0"), w = find_action(s, 0, "W mb0");
    std::swap(s.stages[0].actions[bi], s.stages[0].actions[w]);
    EXPECT_EQ(check_error(s, p), fmt::format("schedule: stage 0 [{}] W mb0: backward_weight before the "
                                             "backward_input of mb0",
                                             bi));
  }
  {  // BI twice: stage 1's "BI mb1" becomes a second "BI mb0".
    Schedule s = good;
    size_t i = find_action(s, 1, "BI mb1");
    set_action(s, 1, i, {ActionKind::backward_input, 0, -1, 0, 0});
    EXPECT_EQ(check_error(s, p), fmt::format("schedule: stage 1 [{}] BI mb0: C4: mb0 already had its backward (BI; a "
                                             "micro-batch runs either B or BI then W, once)",
                                             i));
  }
  {  // W twice.
    Schedule s = good;
    size_t i = find_action(s, 1, "W mb1");
    set_action(s, 1, i, {ActionKind::backward_weight, 0, -1, 0, 0});
    EXPECT_EQ(check_error(s, p), fmt::format("schedule: stage 1 [{}] W mb0: second backward_weight of mb0", i));
  }
  {  // W missing: the optimizer step comes before it.
    Schedule s = good;
    auto& acts = s.stages[0].actions;
    acts.erase(acts.begin() + static_cast<long>(find_action(s, 0, "W mb3")));
    EXPECT_EQ(check_error(s, p), fmt::format("schedule: stage 0 [{}] optimizer_step: optimizer step before "
                                             "the backward_weight of mb3",
                                             acts.size() - 1));
    acts.pop_back();
    EXPECT_EQ(check_error(s, p), "schedule: stage 0: BI mb3 ran but its backward_weight (W mb3) is missing");
  }
  {  // B and W of one micro-batch.
    Schedule s = good;
    size_t i = find_action(s, 1, "BI mb0");
    set_action(s, 1, i, {ActionKind::backward, 0, -1, 0, 0});
    EXPECT_EQ(check_error(s, p), fmt::format("schedule: stage 1 [{}] W mb0: mb0 ran its whole backward (B) already; a "
                                             "micro-batch runs either B or BI then W",
                                             find_action(s, 1, "W mb0")));
  }
  {  // A W for a micro-batch that does not exist.
    Schedule s = good;
    set_action(s, 1, find_action(s, 1, "W mb3"), {ActionKind::backward_weight, 4, -1, 0, 0});
    EXPECT_NE(check_error(s, p).find("W mb4: no micro-batch 4 (the stage has 4)"), std::string::npos);
  }
}

TEST(ZeroBubble, MixedBAndSplitBackwardsPassPerMicroBatch) {
  // A hand-written schedule may split some micro-batches and not others.
  plan::Plan p = make_chain(2, 2, 1);
  Schedule s = build_schedule(p, "1f1b");
  size_t i = find_action(s, 1, "B mb1");
  s.stages[1].actions[i].kind = ActionKind::backward_input;
  s.stages[1].actions.insert(s.stages[1].actions.begin() + static_cast<long>(i) + 1,
                             Action{ActionKind::backward_weight, 1, -1, 0, 0});
  EXPECT_EQ(check_error(s, p), "(no error)");
  EXPECT_EQ(peak_in_flight(s), (std::vector<int>{2, 1}));
}

TEST(ZeroBubble, JsonRoundTrip) {
  plan::Plan p = make_plan(8, {{4, 2, {1, 2}}, {2, 1, {2}}, {2, 1, {}}});
  Schedule s = build_schedule(p, "zb");
  Json j = schedule_to_json(s);
  EXPECT_EQ(j["kind"], "zb");
  EXPECT_EQ(schedule_from_json(Json::parse(j.dump()), "s.json"), s);
  // The sink: recv_act from stages 0 and 1, F mb0, then BI mb0 at once.
  EXPECT_EQ(j["stages"][2]["actions"][3], (Json{{"kind", "backward_input"}, {"micro_batch", 0}}));
}

TEST(ScheduleKinds, OneTableForNamesHelpAndDispatch) {
  EXPECT_EQ(plan::schedule_kind_names(), "1f1b, gpipe, zb");
  EXPECT_EQ(plan::find_schedule_kind("zb"), plan::ScheduleKind::zb);
  EXPECT_FALSE(plan::find_schedule_kind("zb-v").has_value());
  for (const plan::ScheduleKindInfo& k : plan::kScheduleKinds) {
    EXPECT_EQ(build_schedule(make_chain(2, 4, 1), k.name).kind, k.name);
    EXPECT_NE(plan::schedule_kind_help("Schedule").find(k.help), std::string::npos);
  }
  try {
    build_schedule(make_chain(2, 4, 1), "zb-v");
    FAIL();
  } catch (const UserError& e) {
    EXPECT_STREQ(e.what(), "unknown schedule kind \"zb-v\" (valid: 1f1b, gpipe, zb)");
  }
}

RC_GTEST_PROP(ZeroBubbleProperty, BuiltSchedulesPassAndHoldNoMoreThan1F1B, ()) {
  plan::Plan p = gp::testing::random_plan();
  const size_t n = p.stages.size();
  PassTimes t;
  for (size_t i = 0; i < n; ++i) {
    t.fwd_s.push_back(*rc::gen::inRange(0, 4));
    t.bwd_input_s.push_back(*rc::gen::inRange(0, 4));
    t.bwd_weight_s.push_back(*rc::gen::inRange(0, 4));
  }
  Schedule zb = build_schedule(p, "zb", t);  // runs check_schedule; throws on failure
  std::vector<int> peak = peak_in_flight(zb), f1b1 = peak_in_flight(build_schedule(p, "1f1b"));
  for (size_t i = 0; i < n; ++i) RC_ASSERT(peak[i] <= f1b1[i]);
  RC_ASSERT(schedule_from_json(schedule_to_json(zb), "s.json") == zb);
}

}  // namespace
}  // namespace gp::schedule
