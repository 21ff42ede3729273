// Tests for graphpipe.plan/1: JSON round trip, strict parsing, and every validity rule.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>

#include "plan/plan.h"

namespace gp::plan {
namespace {

using ::testing::HasSubstr;

// x -> a -> {b1 -> b2, c1 -> c2} -> d -> loss : two parallel chains between a and d.
ir::Graph two_chains() {
  ir::ModelBuilder b("twochains");
  auto x = b.input("x", {16});
  auto y = b.input("y", {16});
  auto a = b.linear("a", x, 16);
  auto b1 = b.unary("b1", ir::OpKind::relu, a);
  auto b2 = b.unary("b2", ir::OpKind::tanh, b1);
  auto c1 = b.unary("c1", ir::OpKind::gelu, a);
  auto c2 = b.unary("c2", ir::OpKind::sigmoid, c1);
  auto d = b.op("d", ir::OpKind::add, {b2, c2});
  auto loss = b.op("loss", ir::OpKind::mse_loss, {d, y});
  b.output(loss);
  return ir::Graph::build(b.build(), "twochains");
}

Stage stage(int id, std::vector<std::string> ops, std::vector<int> devs, int mbs, int inflight, std::vector<int> in,
            std::vector<int> out) {
  Stage s;
  s.id = id;
  s.ops = std::move(ops);
  s.devices = std::move(devs);
  s.micro_batch_size = mbs;
  s.in_flight = inflight;
  s.inputs_from = std::move(in);
  s.outputs_to = std::move(out);
  return s;
}

// A valid graph pipeline: {a} -> {b1,b2} || {c1,c2} -> {d,loss}.
Plan good_plan() {
  Plan p;
  p.planner = "manual";
  p.model_name = "twochains";
  p.num_ops = 7;
  p.model_spec = "twochains.json";
  p.cluster_name = "test";
  p.num_devices = 5;
  p.cluster_spec = "test.json";
  p.mini_batch_size = 16;
  p.stages = {stage(0, {"a"}, {0}, 4, 3, {}, {1, 2}), stage(1, {"b1", "b2"}, {1}, 4, 2, {0}, {3}),
              stage(2, {"c1", "c2"}, {2}, 4, 2, {0}, {3}), stage(3, {"d", "loss"}, {3, 4}, 4, 1, {1, 2}, {})};
  p.stages[1].tps_s = 0.25;
  p.stages[1].memory_bytes = 1024;
  p.predicted = {1.5, 10.67, 0.0625, {1, 2, 3, 4, 5}};
  p.search_time_s = 0.01;
  p.search = {"sp", {{"sp", 4, 4, 3, 1.5, 10.67, 0.0625, 1.52}, {"chain", 2, 4, 4, 1.7, 9.41, 0.07}}};
  return p;
}

std::string error_of(const Plan& p, const ir::Graph& g) {
  try {
    validate_plan(p, g, "plan.json");
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(PlanJson, RoundTripsEveryField) {
  Plan p = good_plan();
  Json j = plan_to_json(p);
  EXPECT_EQ(j["format"], "graphpipe.plan/1");
  EXPECT_EQ(j["model"]["spec"], "twochains.json");
  EXPECT_EQ(j["stages"][3]["devices"], Json({3, 4}));
  EXPECT_EQ(plan_from_json(j, "p.json"), p);
}

TEST(PlanJson, SearchRecord) {
  Json j = plan_to_json(good_plan());
  EXPECT_EQ(j["search"]["winner"], "sp");
  EXPECT_EQ(j["search"]["candidates"]["chain"]["depth"], 4);
  EXPECT_EQ(j["search"]["candidates"]["sp"]["iteration_time_s"], 1.5);
  EXPECT_EQ(j["search"]["candidates"]["sp"]["simulated_iteration_time_s"], 1.52);
  EXPECT_FALSE(j["search"]["candidates"]["chain"].contains("simulated_iteration_time_s"));  // 0: unknown
  Plan none = good_plan();
  none.search = {};
  EXPECT_FALSE(plan_to_json(none).contains("search"));  // optional: baselines have none
  j["search"]["winner"] = "piper";
  try {
    plan_from_json(j, "p.json");
    FAIL() << "an unknown winner was accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("p.json"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("search"), std::string::npos) << e.what();
  }
}

// Piper's coarsening record: optional, round-trips, counts must be >= 0, older plans load without.
TEST(PlanJson, PiperCoarseningRecord) {
  Plan p = good_plan();
  EXPECT_FALSE(plan_to_json(p).contains("piper"));
  p.planner = "piper";
  p.piper = {70, 15, 8, 0, 16385, 4782969, 20000000, "one node per branch"};
  Json j = plan_to_json(p);
  EXPECT_EQ(j["piper"]["nodes"], 15);
  EXPECT_EQ(j["piper"]["splits"], 4782969);
  EXPECT_EQ(j["piper"]["graph"], "one node per branch");
  EXPECT_EQ(plan_from_json(j, "p.json"), p);
  j["piper"]["downsets"] = -1;
  try {
    plan_from_json(j, "p.json");
    FAIL() << "a negative count was accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("p.json"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("piper"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("downsets"), std::string::npos) << e.what();
  }
}

TEST(PlanJson, SaveAndLoad) {
  auto path = std::filesystem::temp_directory_path() / "gp_plan_test_roundtrip.json";
  save_plan(path.string(), good_plan());
  EXPECT_EQ(load_plan(path.string()), good_plan());
  std::filesystem::remove(path);
}

TEST(PlanJson, OptionalFieldsDefault) {
  Json j = plan_to_json(good_plan());
  j.erase("predicted");
  j.erase("search_time_s");
  j.erase("optimizer");
  j["model"].erase("spec");
  for (auto& s : j["stages"]) s.erase("tps_s");
  Plan p = plan_from_json(j, "p.json");
  EXPECT_EQ(p.predicted, Predicted{});
  EXPECT_EQ(p.optimizer, cost::Optimizer::adam);
  EXPECT_EQ(p.model_spec, "");
  EXPECT_EQ(p.stages[1].tps_s, 0);
}

std::string parse_error(Json j) {
  try {
    plan_from_json(j, "p.json");
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(PlanJson, StrictErrorsNameFileAndPath) {
  Json j = plan_to_json(good_plan());
  Json k = j;
  k["format"] = "graphpipe.plan/0";
  EXPECT_THAT(parse_error(k), HasSubstr("p.json"));
  EXPECT_THAT(parse_error(k), HasSubstr("graphpipe.plan/0"));
  k = j;
  k["stages"][1].erase("devices");
  EXPECT_EQ(parse_error(k), "p.json: stages[1]: missing required field \"devices\"");
  k = j;
  k["stages"][2]["micro_batch_size"] = 0;
  EXPECT_EQ(parse_error(k), "p.json: stages[2].micro_batch_size: expected an integer >= 1, found 0");
  k = j;
  k["stages"][0]["devices"][0] = -1;
  EXPECT_EQ(parse_error(k), "p.json: stages[0].devices[0]: expected an integer >= 0, found -1");
  k = j;
  k["stages"][1]["id"] = 5;
  EXPECT_THAT(parse_error(k), HasSubstr("stages[1].id: stage ids must be 0, 1, 2, ... in order"));
  k = j;
  k["optimizer"] = "lamb";
  EXPECT_THAT(parse_error(k), HasSubstr("unknown optimizer \"lamb\""));
  k = j;
  k["stages"] = Json::array();
  EXPECT_THAT(parse_error(k), HasSubstr("at least one stage"));
  k = j;
  k["mini_batch_size"] = "16";
  EXPECT_THAT(parse_error(k), HasSubstr("mini_batch_size: expected an integer"));
}

TEST(Validate, GoodPlanPasses) {
  ir::Graph g = two_chains();
  EXPECT_EQ(error_of(good_plan(), g), "");
}

TEST(Validate, NumOpsMismatch) {
  Plan p = good_plan();
  p.num_ops = 6;
  EXPECT_EQ(error_of(p, two_chains()), "plan.json: model.num_ops is 6 but model \"twochains\" has 7 ops");
}

TEST(Validate, C1OpInTwoStages) {
  Plan p = good_plan();
  p.stages[2].ops.push_back("a");
  EXPECT_EQ(error_of(p, two_chains()), "plan.json: C1: op \"a\" is in stages 0 and 2");
}

TEST(Validate, C1MissingAndUnknownOps) {
  ir::Graph g = two_chains();
  Plan p = good_plan();
  p.stages[3].ops = {"loss"};
  EXPECT_EQ(error_of(p, g), "plan.json: C1: 1 op is in no stage, e.g. \"d\"");
  p = good_plan();
  p.stages[1].ops.push_back("zz");
  EXPECT_EQ(error_of(p, g), "plan.json: C1: stage 1 lists unknown op \"zz\"");
  p = good_plan();
  p.stages[1].ops.push_back("x");  // a graph input: allowed, ignored
  EXPECT_EQ(error_of(p, g), "");
}

TEST(Validate, C1NonConvexStage) {
  Plan p = good_plan();
  // {a, b2}: the path a -> b1 -> b2 leaves the stage through b1 and comes back.
  p.stages[0].ops = {"a", "b2"};
  p.stages[1].ops = {"b1"};
  EXPECT_EQ(error_of(p, two_chains()),
            "plan.json: C1: stage 0 is not convex: op \"b1\" (stage 1) lies on a path from \"a\" to "
            "\"b2\"");
}

TEST(Validate, C2UndeclaredAndInconsistentEdges) {
  ir::Graph g = two_chains();
  Plan p = good_plan();
  p.stages[0].outputs_to = {1};
  p.stages[2].inputs_from = {};
  EXPECT_EQ(error_of(p, g),
            "plan.json: C2: op \"a\" (stage 0) feeds op \"c1\" (stage 2) but stage 0 outputs_to does "
            "not list 2");
  p = good_plan();
  p.stages[2].inputs_from = {};
  EXPECT_EQ(error_of(p, g), "plan.json: C2: stage 0 outputs_to 2 but stage 2 inputs_from does not list 0");
  p = good_plan();
  p.stages[3].outputs_to = {7};
  EXPECT_EQ(error_of(p, g), "plan.json: C2: stage 3 outputs_to unknown stage 7");
}

TEST(Validate, C2CycleBetweenConvexStages) {
  // {b1, c2} and {c1, b2} are each convex, but b1 -> b2 and c1 -> c2 link them both ways.
  Plan p = good_plan();
  p.stages[1] = stage(1, {"b1", "c2"}, {1}, 4, 2, {0, 2}, {2, 3});
  p.stages[2] = stage(2, {"c1", "b2"}, {2}, 4, 2, {0, 1}, {1, 3});
  std::string err = error_of(p, two_chains());
  EXPECT_TRUE(err == "plan.json: C2: stage graph has a cycle: 1 -> 2 -> 1" ||
              err == "plan.json: C2: stage graph has a cycle: 2 -> 1 -> 2")
      << err;
}

TEST(Validate, C3Devices) {
  ir::Graph g = two_chains();
  Plan p = good_plan();
  p.stages[2].devices = {1};
  EXPECT_EQ(error_of(p, g), "plan.json: C3: device 1 in stages 1 and 2");
  p = good_plan();
  p.stages[3].devices = {3, 5};
  EXPECT_EQ(error_of(p, g), "plan.json: C3: stage 3 uses device 5 outside [0, 5)");
  p = good_plan();
  p.stages[1].devices = {};
  EXPECT_EQ(error_of(p, g), "plan.json: C3: stage 1 has no devices");
}

TEST(Validate, MicroBatchDivisibility) {
  ir::Graph g = two_chains();
  Plan p = good_plan();
  p.stages[1].micro_batch_size = 3;
  EXPECT_EQ(error_of(p, g), "plan.json: stage 1: micro_batch_size 3 does not divide mini_batch_size 16");
  p = good_plan();
  p.stages[3].devices = {3, 4};
  p.stages[3].micro_batch_size = 1;
  EXPECT_EQ(error_of(p, g),
            "plan.json: stage 3: micro_batch_size 1 is not divisible by its 2 devices (data-parallel "
            "replicas)");
}

TEST(Validate, InFlightRule) {
  ir::Graph g = two_chains();
  Plan p = good_plan();
  p.stages[0].in_flight = 2;
  EXPECT_THAT(error_of(p, g), HasSubstr("in_flight: stage 0 has 2, needs >= 3"));
  // Per-stage micro-batch sizes count in samples: the sink holds 1 x 8 samples, so a stage with
  // micro-batch 4 feeding it needs 1 + 8 / 4 = 3.
  p = good_plan();
  p.stages[3].micro_batch_size = 8;
  EXPECT_THAT(error_of(p, g), HasSubstr("in_flight: stage 1 has 2, needs >= 3"));
  p.stages[1].in_flight = 3;
  p.stages[2].in_flight = 3;
  p.stages[0].in_flight = 4;
  EXPECT_EQ(error_of(p, g), "");
}

TEST(Helpers, RequiredInFlight) {
  EXPECT_EQ(required_in_flight(4, 0), 1);
  EXPECT_EQ(required_in_flight(4, 4), 2);
  EXPECT_EQ(required_in_flight(4, 5), 3);
  EXPECT_EQ(required_in_flight(8, 4), 2);
}

TEST(Helpers, DeriveEdgesAndInFlight) {
  ir::Graph g = two_chains();
  Plan p = good_plan();
  for (auto& s : p.stages) {
    s.inputs_from.clear();
    s.outputs_to.clear();
    s.in_flight = 1;
  }
  derive_stage_edges(p, g);
  assign_min_in_flight(p);
  EXPECT_EQ(p, good_plan());
}

TEST(Helpers, CutEdgesListEachCrossingOpOnce) {
  ir::Graph g = two_chains();
  Plan p = good_plan();
  auto id = [&](const char* name) { return g.find(name); };
  CutEdges cut = cut_edges(g, stage_of_ops(p, g));
  EXPECT_EQ(cut, (CutEdges{{{0, 1}, {id("a")}}, {{0, 2}, {id("a")}}, {{1, 3}, {id("b2")}}, {{2, 3}, {id("c2")}}}));
  // a feeds both b1 and c1 in one stage: still listed once; ops without a stage are left out.
  p.stages = {stage(0, {"a"}, {0}, 4, 1, {}, {}), stage(1, {"b1", "b2", "c1", "c2"}, {1}, 4, 1, {}, {})};
  std::vector<int> st = stage_of_ops(p, g);
  EXPECT_EQ(cut_edges(g, st), (CutEdges{{{0, 1}, {id("a")}}}));
}

TEST(Helpers, StageOfOpsAndTopoOrder) {
  ir::Graph g = two_chains();
  Plan p = good_plan();
  auto st = stage_of_ops(p, g);
  EXPECT_EQ(st[g.find("a").v], 0);
  EXPECT_EQ(st[g.find("c2").v], 2);
  EXPECT_EQ(st[g.find("loss").v], 3);
  EXPECT_EQ(stage_topo_order(p), (std::vector<int>{0, 1, 2, 3}));
  graph::Dag d = op_dag(g);
  EXPECT_EQ(d.size(), 7);
  EXPECT_EQ(d.num_edges(), 7u);
}

}  // namespace
}  // namespace gp::plan
