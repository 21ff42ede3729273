// Schedules built from hand-made plans: exact action lists, regrouping, peak in-flight, JSON.
#include <gtest/gtest.h>

#include <cstdio>

#include "schedule/schedule.h"
#include "schedule/tests/test_plans.h"

namespace gp::schedule {
namespace {

using gp::testing::make_chain;
using gp::testing::make_plan;

std::string actions_str(const StageSchedule& st) {
  std::string out;
  for (const Action& a : st.actions) out += (out.empty() ? "" : "; ") + to_string(a);
  return out;
}

TEST(EdgePieces, CutAtBothSidesBoundaries) {
  using P = std::vector<std::pair<int, int>>;
  EXPECT_EQ(edge_pieces(4, 4, 8), (P{{0, 4}, {4, 4}}));
  EXPECT_EQ(edge_pieces(4, 2, 8), (P{{0, 2}, {2, 2}, {4, 2}, {6, 2}}));
  EXPECT_EQ(edge_pieces(2, 8, 8), (P{{0, 2}, {2, 2}, {4, 2}, {6, 2}}));
  EXPECT_EQ(edge_pieces(4, 6, 12), (P{{0, 4}, {4, 2}, {6, 2}, {8, 4}}));
  EXPECT_EQ(edge_pieces(4, 6, 6, 12), (P{{6, 2}, {8, 4}}));  // one micro-batch of the 6-side
  EXPECT_EQ(edge_pieces(8, 2, 8, 16), (P{{8, 2}, {10, 2}, {12, 2}, {14, 2}}));
}

TEST(BuildSchedule, TwoStageChain1F1B) {
  plan::Plan p = make_chain(2, 4, 1);
  ASSERT_EQ(p.stages[0].in_flight, 2);
  Schedule s = build_schedule(p, "1f1b");
  EXPECT_EQ(s.kind, "1f1b");
  EXPECT_EQ(s.mini_batch_size, 4);
  EXPECT_EQ(actions_str(s.stages[0]),
            "F mb0; send_act ->s1 [0,1); F mb1; send_act ->s1 [1,2); "
            "recv_grad <-s1 [0,1); B mb0; F mb2; send_act ->s1 [2,3); "
            "recv_grad <-s1 [1,2); B mb1; F mb3; send_act ->s1 [3,4); "
            "recv_grad <-s1 [2,3); B mb2; recv_grad <-s1 [3,4); B mb3; optimizer_step");
  EXPECT_EQ(actions_str(s.stages[1]),
            "recv_act <-s0 [0,1); F mb0; B mb0; send_grad ->s0 [0,1); "
            "recv_act <-s0 [1,2); F mb1; B mb1; send_grad ->s0 [1,2); "
            "recv_act <-s0 [2,3); F mb2; B mb2; send_grad ->s0 [2,3); "
            "recv_act <-s0 [3,4); F mb3; B mb3; send_grad ->s0 [3,4); optimizer_step");
  EXPECT_EQ(peak_in_flight(s), (std::vector<int>{2, 1}));
}

TEST(BuildSchedule, GPipeRunsAllForwardsThenAllBackwards) {
  plan::Plan p = make_chain(2, 2, 1);
  Schedule s = build_schedule(p, "gpipe");
  EXPECT_EQ(actions_str(s.stages[0]),
            "F mb0; send_act ->s1 [0,1); F mb1; send_act ->s1 [1,2); "
            "recv_grad <-s1 [0,1); B mb0; recv_grad <-s1 [1,2); B mb1; optimizer_step");
  EXPECT_EQ(peak_in_flight(s), (std::vector<int>{2, 2}));
}

TEST(BuildSchedule, FourStageChainPeakEqualsDepth) {
  plan::Plan p = make_chain(4, 32, 4);  // 8 micro-batches
  Schedule s = build_schedule(p);
  EXPECT_EQ(peak_in_flight(s), (std::vector<int>{4, 3, 2, 1}));
  EXPECT_EQ(peak_in_flight(build_schedule(p, "gpipe")), (std::vector<int>{8, 8, 8, 8}));
}

TEST(BuildSchedule, FewMicroBatchesCapWarmUp) {
  plan::Plan p = make_chain(4, 8, 4);  // 2 micro-batches, in-flight 4 on stage 0
  EXPECT_EQ(peak_in_flight(build_schedule(p)), (std::vector<int>{2, 2, 2, 1}));
}

TEST(BuildSchedule, DiamondIsShallowerThanChain) {
  // 0 -> {1, 2} -> 3: branches 1 and 2 run concurrently; depth 3 instead of 4.
  plan::Plan p = make_plan(16, {{2, 1, {1, 2}}, {2, 1, {3}}, {2, 1, {3}}, {2, 1, {}}});
  Schedule s = build_schedule(p);
  EXPECT_EQ(peak_in_flight(s), (std::vector<int>{3, 2, 2, 1}));
  // The join receives from both branches before each forward and sends gradients to both.
  std::string join = actions_str(s.stages[3]);
  EXPECT_EQ(join.substr(0, join.find("; recv_act <-s1 [2,4)")),
            "recv_act <-s1 [0,2); recv_act <-s2 [0,2); F mb0; B mb0; "
            "send_grad ->s1 [0,2); send_grad ->s2 [0,2)");
}

TEST(BuildSchedule, SkipEdge) {
  // 0 -> 1 -> 2 and 0 -> 2 directly.
  plan::Plan p = make_plan(4, {{1, 1, {1, 2}}, {1, 1, {2}}, {1, 1, {}}});
  Schedule s = build_schedule(p);
  EXPECT_EQ(peak_in_flight(s), (std::vector<int>{3, 2, 1}));
  std::string first = actions_str(s.stages[0]);
  EXPECT_EQ(first.substr(0, first.find("; F mb2")),
            "F mb0; send_act ->s1 [0,1); send_act ->s2 [0,1); F mb1; send_act ->s1 [1,2); "
            "send_act ->s2 [1,2)");
  std::string last = actions_str(s.stages[2]);
  EXPECT_EQ(last.substr(0, last.find("; recv_act <-s0 [1,2)")),
            "recv_act <-s0 [0,1); recv_act <-s1 [0,1); F mb0; B mb0; "
            "send_grad ->s0 [0,1); send_grad ->s1 [0,1)");
}

TEST(BuildSchedule, RegroupsWhenMicroBatchSizesDiffer) {
  // Stage 0 runs micro-batches of 4 samples, stage 1 of 2: each of stage 0's micro-batches
  // travels as two pieces of 2 samples, one per micro-batch of stage 1.
  plan::Plan p = make_plan(8, {{4, 1, {1}}, {2, 1, {}}});
  EXPECT_EQ(p.stages[0].in_flight, 2);  // 1 + ceil(1*2 / 4)
  Schedule s = build_schedule(p);
  EXPECT_EQ(actions_str(s.stages[0]),
            "F mb0; send_act ->s1 [0,2); send_act ->s1 [2,4); F mb1; send_act ->s1 [4,6); "
            "send_act ->s1 [6,8); recv_grad <-s1 [0,2); recv_grad <-s1 [2,4); B mb0; "
            "recv_grad <-s1 [4,6); recv_grad <-s1 [6,8); B mb1; optimizer_step");
  EXPECT_EQ(actions_str(s.stages[1]),
            "recv_act <-s0 [0,2); F mb0; B mb0; send_grad ->s0 [0,2); "
            "recv_act <-s0 [2,4); F mb1; B mb1; send_grad ->s0 [2,4); "
            "recv_act <-s0 [4,6); F mb2; B mb2; send_grad ->s0 [4,6); "
            "recv_act <-s0 [6,8); F mb3; B mb3; send_grad ->s0 [6,8); optimizer_step");
}

TEST(BuildSchedule, RegroupsSmallIntoLarge) {
  // Stage 0 micro-batches of 2, stage 1 of 4: stage 1 waits for two pieces per forward.
  plan::Plan p = make_plan(8, {{2, 1, {1}}, {4, 1, {}}});
  EXPECT_EQ(p.stages[0].in_flight, 3);  // 1 + ceil(1*4 / 2)
  Schedule s = build_schedule(p);
  std::string st1 = actions_str(s.stages[1]);
  EXPECT_EQ(st1,
            "recv_act <-s0 [0,2); recv_act <-s0 [2,4); F mb0; B mb0; send_grad ->s0 [0,2); "
            "send_grad ->s0 [2,4); recv_act <-s0 [4,6); recv_act <-s0 [6,8); F mb1; B mb1; "
            "send_grad ->s0 [4,6); send_grad ->s0 [6,8); optimizer_step");
  EXPECT_EQ(peak_in_flight(s), (std::vector<int>{3, 1}));
}

TEST(BuildSchedule, DataParallelStageAllReducesBeforeTheStep) {
  plan::Plan p = make_plan(4, {{2, 2, {1}}, {2, 1, {}}});
  Schedule s = build_schedule(p);
  const auto& a = s.stages[0].actions;
  ASSERT_GE(a.size(), 2u);
  EXPECT_EQ(a[a.size() - 2].kind, ActionKind::allreduce);
  EXPECT_EQ(a.back().kind, ActionKind::optimizer_step);
  EXPECT_EQ(s.stages[1].actions[s.stages[1].actions.size() - 2].kind, ActionKind::send_grad);
}

TEST(BuildSchedule, RejectsUnknownKindAndBadSizes) {
  plan::Plan p = make_chain(2, 4, 1);
  EXPECT_THROW(build_schedule(p, "zb-h1"), UserError);
  p.stages[1].micro_batch_size = 3;
  try {
    build_schedule(p);
    FAIL();
  } catch (const UserError& e) {
    EXPECT_STREQ(e.what(), "stage 1: micro_batch_size 3 does not divide the mini-batch 4");
  }
}

TEST(ScheduleJson, RoundTrips) {
  plan::Plan p = make_plan(8, {{4, 2, {1, 2}}, {2, 1, {2}}, {2, 1, {}}});
  for (const char* kind : {"1f1b", "gpipe"}) {
    Schedule s = build_schedule(p, kind);
    Json j = schedule_to_json(s);
    EXPECT_EQ(j["format"], "graphpipe.schedule/1");
    EXPECT_EQ(schedule_from_json(j, "s.json"), s);
    EXPECT_EQ(schedule_from_json(Json::parse(j.dump()), "s.json"), s);
  }
  std::string path = ::testing::TempDir() + "/gp_schedule_roundtrip.json";
  Schedule s = build_schedule(p);
  save_schedule(path, s);
  EXPECT_EQ(load_schedule(path), s);
  std::remove(path.c_str());
}

std::string parse_error(const std::function<void(Json&)>& edit) {
  Json j = schedule_to_json(build_schedule(make_chain(2, 2, 1)));
  edit(j);
  try {
    schedule_from_json(j, "s.json");
  } catch (const UserError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(ScheduleJson, StrictErrorsNameFileAndPath) {
  EXPECT_EQ(parse_error([](Json& j) { j["stages"][1]["actions"][2]["kind"] = "fwd"; }),
            "s.json: stages[1].actions[2].kind: unknown action kind \"fwd\" (valid: forward, "
            "backward, backward_input, backward_weight, send_act, recv_act, send_grad, recv_grad, "
            "allreduce, optimizer_step)");
  EXPECT_EQ(parse_error([](Json& j) { j["stages"][0]["actions"][0]["peer"] = 1; }),
            "s.json: stages[0].actions[0]: unexpected field \"peer\" (valid here: kind, "
            "micro_batch)");
  EXPECT_EQ(parse_error([](Json& j) { j["stages"][0]["actions"][1].erase("sample_count"); }),
            "s.json: stages[0].actions[1]: missing required field \"sample_count\"");
  EXPECT_EQ(parse_error([](Json& j) { j["stages"][0]["actions"][0]["micro_batch"] = -1; }),
            "s.json: stages[0].actions[0].micro_batch: expected an integer >= 0, found -1");
  EXPECT_EQ(parse_error([](Json& j) { j["stages"][1]["stage"] = 0; }),
            "s.json: stages[1].stage: expected 1 (stages are listed in id order)");
  EXPECT_EQ(parse_error([](Json& j) { j["kind"] = "zb-v"; }),
            "s.json: kind: unknown schedule kind \"zb-v\" (valid: 1f1b, gpipe, zb, manual)");
  EXPECT_NE(parse_error([](Json& j) { j["format"] = "graphpipe.plan/1"; }).find("graphpipe.plan/1"), std::string::npos);
  EXPECT_EQ(parse_error([](Json& j) { j["extra"] = 1; }).substr(0, 36), "s.json: (top): unexpected field \"ext");
}

}  // namespace
}  // namespace gp::schedule
