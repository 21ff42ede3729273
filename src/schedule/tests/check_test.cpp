// check_schedule on deliberately broken schedules: each failure names the stages and actions.
#include <gtest/gtest.h>

#include "schedule/schedule.h"
#include "schedule/tests/test_plans.h"

namespace gp::schedule {
namespace {

using gp::testing::check_error;
using gp::testing::make_chain;
using gp::testing::make_plan;

void swap_actions(Schedule& s, int stage, size_t i, size_t j) {
  std::swap(s.stages[stage].actions[i], s.stages[stage].actions[j]);
}

TEST(CheckSchedule, AcceptsBuiltSchedules) {
  plan::Plan p = make_chain(3, 32, 8);
  EXPECT_EQ(check_error(build_schedule(p, "1f1b"), p), "(no error)");
  EXPECT_EQ(check_error(build_schedule(p, "gpipe"), p), "(no error)");
}

TEST(CheckSchedule, DeadlockNamesTheCycle) {
  // Stage 1 of a 3-stage chain waits for the gradient of mb0 before sending mb0's activations;
  // stage 2 needs those activations before it can produce that gradient.
  plan::Plan p = make_chain(3, 32, 8);
  Schedule s = build_schedule(p);
  ASSERT_EQ(to_string(s.stages[1].actions[2]), "send_act ->s2 [0,8)");
  ASSERT_EQ(to_string(s.stages[1].actions[6]), "recv_grad <-s2 [0,8)");
  swap_actions(s, 1, 2, 6);
  EXPECT_EQ(check_error(s, p),
            "schedule: deadlock: stage 1 waits at [2] recv_grad <-s2 [0,8) while stage 2 waits "
            "at [0] recv_act <-s1 [0,8)");
}

TEST(CheckSchedule, ReorderedReceivesAreAMismatch) {
  plan::Plan p = make_chain(3, 32, 8);
  Schedule s = build_schedule(p);
  ASSERT_EQ(to_string(s.stages[1].actions[12]), "recv_grad <-s2 [8,16)");
  swap_actions(s, 1, 5, 12);  // receives mb1's gradient before mb0's
  EXPECT_EQ(check_error(s, p),
            "schedule: stage 1 [5] recv_grad <-s2 [8,16): matches stage 2 [3] send_grad ->s1 "
            "[0,8) (sends and receives on an edge must carry the same sample ranges in the same "
            "order)");
}

TEST(CheckSchedule, WaitOnFinishedStage) {
  plan::Plan p = make_chain(2, 4, 2);
  Schedule s = build_schedule(p);
  auto& a = s.stages[1].actions;
  ASSERT_EQ(to_string(a[a.size() - 2]), "send_grad ->s0 [2,4)");
  a.erase(a.end() - 2);
  EXPECT_EQ(check_error(s, p),
            "schedule: stage 0 waits at [6] recv_grad <-s1 [2,4) but stage 1 finished without "
            "sending it");
}

TEST(CheckSchedule, C4ForwardOrder) {
  plan::Plan p = make_chain(2, 4, 1);
  Schedule s = build_schedule(p);
  swap_actions(s, 0, 0, 2);  // F mb1 before F mb0
  EXPECT_EQ(check_error(s, p),
            "schedule: stage 0 [0] F mb1: C4: expected F mb0 next (forwards run in micro-batch "
            "order, each once; the stage has 4 micro-batches)");
}

TEST(CheckSchedule, C4BackwardBeforeForward) {
  plan::Plan p = make_chain(1, 2, 1);
  Schedule s = build_schedule(p);  // F0 B0 F1 B1 step
  swap_actions(s, 0, 0, 1);
  EXPECT_EQ(check_error(s, p), "schedule: stage 0 [0] B mb0: C4: backward before the forward of mb0");
}

TEST(CheckSchedule, MissingBackwardAndStep) {
  plan::Plan p = make_chain(1, 2, 1);
  Schedule s = build_schedule(p);
  s.stages[0].actions.erase(s.stages[0].actions.begin() + 3);  // B mb1
  EXPECT_EQ(check_error(s, p), "schedule: stage 0 [3] optimizer_step: optimizer step before the last backward");
  s = build_schedule(p);
  s.stages[0].actions.pop_back();
  EXPECT_EQ(check_error(s, p), "schedule: stage 0: needs exactly one optimizer_step, found 0");
}

TEST(CheckSchedule, SampleRangeMismatch) {
  plan::Plan p = make_chain(2, 4, 2);
  Schedule s = build_schedule(p);
  s.stages[1].actions[0].sample_count = 1;
  EXPECT_EQ(check_error(s, p),
            "schedule: stage 1 [0] recv_act <-s0 [0,1): matches stage 0 [1] send_act ->s1 [0,2) "
            "(sends and receives on an edge must carry the same sample ranges in the same order)");
}

TEST(CheckSchedule, TransferOnUndeclaredEdge) {
  plan::Plan p = make_chain(2, 4, 2);
  Schedule s = build_schedule(p);
  s.stages[1].actions[0].peer = 1;
  EXPECT_EQ(check_error(s, p),
            "schedule: stage 1 [0] recv_act <-s1 [0,2): stage 1 is not a predecessor of stage 1 "
            "in the plan");
}

TEST(CheckSchedule, ForwardBeforeItsInputArrived) {
  plan::Plan p = make_chain(2, 4, 2);
  Schedule s = build_schedule(p);
  swap_actions(s, 1, 0, 1);  // F mb0 before recv_act [0,2)
  EXPECT_EQ(check_error(s, p),
            "schedule: stage 1 [0] F mb0: runs before its activations from stage 0 for samples "
            "[0,2) arrived");
}

TEST(CheckSchedule, SendNeverReceived) {
  plan::Plan p = make_chain(2, 4, 2);
  Schedule s = build_schedule(p);
  auto& a = s.stages[1].actions;
  ASSERT_EQ(to_string(a[4]), "recv_act <-s0 [2,4)");
  a.erase(a.begin() + 4);
  EXPECT_EQ(check_error(s, p), "schedule: stage 0 [3] send_act ->s1 [2,4): is never received by stage 1");
}

TEST(CheckSchedule, DataParallelStageNeedsAllReduce) {
  plan::Plan p = make_plan(4, {{2, 2, {}}});
  Schedule s = build_schedule(p);
  auto& a = s.stages[0].actions;
  a.erase(a.end() - 2);
  EXPECT_EQ(check_error(s, p), "schedule: stage 0 [4] optimizer_step: optimizer step before the gradient all-reduce");
}

TEST(CheckSchedule, PlanMismatch) {
  plan::Plan p = make_chain(2, 4, 2);
  Schedule s = build_schedule(p);
  plan::Plan other = make_chain(3, 4, 2);
  EXPECT_EQ(check_error(s, other), "schedule: 2 stages but the plan has 3");
  other = make_chain(2, 8, 2);
  EXPECT_EQ(check_error(s, other), "schedule: mini_batch_size 4 differs from the plan's 8");
}

TEST(CheckSchedule, TooSmallInFlightIsReportedAsDeadlock) {
  // A hand-written plan whose first stage holds fewer samples than its successor needs before
  // the first backward: stage 1 (micro-batch 4) cannot start until stage 0 sends 2 micro-batches.
  plan::Plan p = make_plan(8, {{2, 1, {1}, 1}, {4, 1, {}}});
  try {
    build_schedule(p);
    FAIL() << "expected a deadlock";
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()),
              "1f1b schedule of the plan: deadlock: stage 0 waits at [2] recv_grad <-s1 [0,2) "
              "while stage 1 waits at [1] recv_act <-s0 [2,4)");
  }
}

}  // namespace
}  // namespace gp::schedule
