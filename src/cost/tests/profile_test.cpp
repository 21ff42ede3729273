// graphpipe.profile/1: signatures, interpolation, the cost model's measured-vs-formula choice,
// round trip and strict errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>

#include "cost/cost_model.h"
#include "cost/profile.h"
#include "cost/tests/test_util.h"

using namespace gp;
using namespace gp::cost;
using namespace gp::cost::testing;
using ::testing::HasSubstr;

namespace {

ir::Graph two_layers() {
  ir::ModelBuilder b("two");
  b.input("x", {16});
  std::string h = b.linear("fc1", "x", 16);
  h = b.linear("fc2", h, 16);
  b.output(b.op("loss", ir::OpKind::mse_loss, {h, "x"}));
  return ir::Graph::build(b.build());
}

Profile sample_profile(const std::string& sig) {
  Profile p;
  p.device = "test cpu";
  p.ops[sig] = {sig, "linear", {2, 4, 8}, {1.0, 3.0, 7.0}, {2.0, 6.0, 14.0}};
  p.p2p = LinkFit{5e-5, 2e9};
  p.allreduce = LinkFit{1e-4, 1e9};
  return p;
}

std::string parse_error(const Json& j) {
  return error_of([&] { profile_from_json(j, "p.json"); });
}

}  // namespace

TEST(Profile, SignatureNamesKindShapesAndAttrs) {
  ir::Graph g = two_layers();
  EXPECT_EQ(op_signature(g, g.find("fc1")), "linear(f32[B, 16])->f32[B, 16] {\"out_features\":16}");
  // Identical layers share one measurement.
  EXPECT_EQ(op_signature(g, g.find("fc1")), op_signature(g, g.find("fc2")));
  EXPECT_EQ(op_signature(g, g.find("loss")), "mse_loss(f32[B, 16],f32[B, 16])->f32[] {}");
}

TEST(Profile, LookupInterpolatesInsideTheRangeAndFollowsTheFittedCurveOutside) {
  Profile p = sample_profile("s");
  EXPECT_EQ(p.lookup("s", 2), std::make_pair(1.0, 2.0));
  EXPECT_EQ(p.lookup("s", 3), std::make_pair(2.0, 4.0));   // midpoint of 2 and 4
  EXPECT_EQ(p.lookup("s", 6), std::make_pair(5.0, 10.0));  // midpoint of 4 and 8
  EXPECT_EQ(p.lookup("s", 7), std::make_pair(6.0, 12.0));
  EXPECT_EQ(p.lookup("s", 8), std::make_pair(7.0, 14.0));
  EXPECT_FALSE(p.estimate("s", 8)->extrapolated);
  // t = b - 1 would need a negative fixed time: the fit is proportional (fixed_s = 0), scaled
  // through the nearest measured point.
  EXPECT_EQ(fit_batch_curve({2, 4, 8}, {1.0, 3.0, 7.0}).fixed_s, 0.0);
  auto below = p.estimate("s", 1), above = p.estimate("s", 9);
  ASSERT_TRUE(below && above);
  EXPECT_TRUE(below->extrapolated);
  EXPECT_DOUBLE_EQ(below->fwd_s, 0.5);  // 1.0 * 1/2
  EXPECT_DOUBLE_EQ(below->bwd_s, 1.0);
  EXPECT_TRUE(above->extrapolated);
  EXPECT_DOUBLE_EQ(above->fwd_s, 7.875);  // 7.0 * 9/8
  EXPECT_DOUBLE_EQ(above->bwd_s, 15.75);
  EXPECT_EQ(p.lookup("other", 4), std::nullopt);
}

TEST(Profile, BatchFitRecoversAnAffineCurveAndStaysNonNegative) {
  // t(b) = 2e-4 + 1e-4 b: the efficiency-curve family (fixed time + per-sample time).
  BatchFit f = fit_batch_curve({1, 2, 4, 8}, {3e-4, 4e-4, 6e-4, 10e-4});
  EXPECT_NEAR(f.fixed_s, 2e-4, 1e-15);
  EXPECT_NEAR(f.per_sample_s, 1e-4, 1e-15);
  // One batch: proportional (flat efficiency).
  EXPECT_EQ(fit_batch_curve({4}, {2.0}), (BatchFit{0.0, 0.5}));
  // Time falling with the batch: the best constant on relative error.
  BatchFit falling = fit_batch_curve({1, 2}, {2.0, 1.0});
  EXPECT_EQ(falling.per_sample_s, 0.0);
  EXPECT_NEAR(falling.fixed_s, 1.2, 1e-12);  // argmin (a/2 - 1)^2 + (a - 1)^2
  // Zero times carry no relative error; all zero is the zero curve.
  EXPECT_EQ(fit_batch_curve({1, 2}, {0.0, 0.0}), BatchFit{});
  BatchFit skip_zero = fit_batch_curve({1, 2, 4}, {0.0, 2.0, 4.0});
  EXPECT_NEAR(skip_zero.fixed_s, 0.0, 1e-12);
  EXPECT_NEAR(skip_zero.per_sample_s, 1.0, 1e-12);
}

TEST(Profile, CostModelUsesTheProfileAtEveryBatchAndTheFormulaForUnprofiledOps) {
  ir::Graph g = two_layers();
  OpId fc1 = g.find("fc1"), loss = g.find("loss");
  auto prof = std::make_shared<Profile>(sample_profile(op_signature(g, fc1)));
  CostModel cm(g, made_up_cluster(), Optimizer::adam, prof);
  CostModel formula(g, made_up_cluster());

  OpTime t4 = cm.op_time(fc1, 4);  // from the power-of-two table
  EXPECT_EQ(t4.source, Source::measured);
  EXPECT_EQ(t4.fwd_s, 3.0);
  EXPECT_EQ(t4.bwd_s, 6.0);
  OpTime t6 = cm.op_time(fc1, 6);  // interpolated on demand
  EXPECT_EQ(t6.source, Source::measured);
  EXPECT_EQ(t6.fwd_s, 5.0);
  EXPECT_EQ(cm.op_step_time(fc1, 3), 6.0);
  EXPECT_EQ(cm.op_time(g.find("fc2"), 8).fwd_s, 7.0);  // same signature

  // Outside the measured batches 2..8: the profile's curve (here proportional, see above), never
  // the roofline.
  for (auto [b, fwd] : std::vector<std::pair<int64_t, double>>{{1, 0.5}, {16, 14.0}, {17, 14.875}}) {
    OpTime t = cm.op_time(fc1, b);
    EXPECT_EQ(t.source, Source::extrapolated) << b;
    EXPECT_DOUBLE_EQ(t.fwd_s, fwd) << b;
    EXPECT_NE(t.fwd_s, formula.op_time(fc1, b).fwd_s) << b;
  }
  EXPECT_EQ(cm.op_time(loss, 4).source, Source::formula);
  EXPECT_EQ(cm.op_time(loss, 4).fwd_s, formula.op_time(loss, 4).fwd_s);

  // Measured links replace the intra-node link; the all-reduce fit t = a + n/B gives a ring
  // latency a/2 per step and bandwidth B.
  EXPECT_EQ(cm.link_source(), Source::measured);
  EXPECT_DOUBLE_EQ(cm.p2p_time(0, 1, 2e6), 5e-5 + 1e-3);
  EXPECT_DOUBLE_EQ(cm.allreduce_time(2, true, 1e6), 1e-4 + 1e-3);
  EXPECT_DOUBLE_EQ(cm.allreduce_time(4, true, 1e6), 1.5e-3 + 6 * 5e-5);
  EXPECT_DOUBLE_EQ(cm.p2p_time(0, 4, 1e6), 1e-4 + 1e6 / 1e10);  // inter-node stays analytic
}

TEST(Profile, RoundTripsThroughAFile) {
  Profile p = sample_profile("linear(f32[B, 16])->f32[B, 16] {}");
  p.ops["relu(f32[B, 8])->f32[B, 8] {}"] = {"relu(f32[B, 8])->f32[B, 8] {}", "relu", {1}, {0.5}, {0.25}};
  Json j = profile_to_json(p);
  EXPECT_EQ(j["format"], "graphpipe.profile/1");
  EXPECT_EQ(profile_from_json(j, "p.json"), p);
  std::string path = ::testing::TempDir() + "/gp_profile_roundtrip.json";
  save_profile(path, p);
  EXPECT_EQ(load_profile(path), p);
  std::remove(path.c_str());

  Profile bare;
  bare.device = "x";
  EXPECT_EQ(profile_from_json(profile_to_json(bare), "p.json"), bare);  // no links, no ops
}

TEST(Profile, MalformedFilesNameTheFieldAndValue) {
  const Json good = profile_to_json(sample_profile("s"));
  EXPECT_EQ(parse_error(good), "");

  Json j = good;
  j["format"] = "graphpipe.profile/0";
  EXPECT_THAT(parse_error(j), HasSubstr("p.json: format: format is \"graphpipe.profile/0\""));
  j = good;
  j.erase("ops");
  EXPECT_THAT(parse_error(j), HasSubstr("missing required field \"ops\""));
  j = good;
  j["ops"][0]["batches"] = {2, 2, 8};
  EXPECT_THAT(parse_error(j), HasSubstr("p.json: ops[0].batches[1]: batches must be strictly ascending"));
  j = good;
  j["ops"][0]["batches"] = {0, 4, 8};
  EXPECT_THAT(parse_error(j), HasSubstr("ops[0].batches[0]: batch must be >= 1, found 0"));
  j = good;
  j["ops"][0]["fwd_s"] = {1.0, 3.0};
  EXPECT_THAT(parse_error(j), HasSubstr("ops[0].fwd_s: has 2 entries, expected 3"));
  j = good;
  j["ops"][0]["bwd_s"][2] = -1.0;
  EXPECT_THAT(parse_error(j), HasSubstr("ops[0].bwd_s[2]: must be a non-negative time in seconds, found -1"));
  j = good;
  j["ops"][0]["bwd_s"][1] = "fast";
  EXPECT_THAT(parse_error(j), HasSubstr("ops[0].bwd_s[1]: expected a number, found \"fast\""));
  j = good;
  j["ops"][0]["kind"] = "lineer";
  EXPECT_THAT(parse_error(j), HasSubstr("p.json: ops[0].kind:"));
  EXPECT_THAT(parse_error(j), HasSubstr("lineer"));
  j = good;
  j["ops"].push_back(good["ops"][0]);
  EXPECT_THAT(parse_error(j), HasSubstr("ops[1].signature: duplicate signature \"s\""));
  j = good;
  j["p2p"]["bandwidth_Bps"] = 0;
  EXPECT_THAT(parse_error(j), HasSubstr("p.json: p2p.bandwidth_Bps: must be a positive number, found 0"));
  j = good;
  j["allreduce"].erase("latency_s");
  EXPECT_THAT(parse_error(j), HasSubstr("allreduce: missing required field \"latency_s\""));
  EXPECT_THAT(error_of([] { load_profile("/nonexistent/profile.json"); }),
              HasSubstr("/nonexistent/profile.json: cannot open file"));
}

TEST(Profile, InSequenceFactorScalesMeasuredOpsOnlyAndInterpolatesOverBatches) {
  ir::Graph g = two_layers();
  OpId fc1 = g.find("fc1"), loss = g.find("loss");
  Profile p = sample_profile(op_signature(g, fc1));
  // At batch 2 the whole model took 1.5x its ops forward and 1.2x backward; at 8, 1.1x and 1.0x.
  p.context = ContextTiming{{2, 8}, {3.0, 11.0}, {6.0, 20.0}, {2.0, 10.0}, {5.0, 20.0}};
  EXPECT_EQ(p.context->factor(1), std::make_pair(1.5, 1.2));  // the nearest end outside
  EXPECT_EQ(p.context->factor(2), std::make_pair(1.5, 1.2));
  auto [f5, b5] = p.context->factor(5);  // halfway between 2 and 8
  EXPECT_DOUBLE_EQ(f5, 1.3);
  EXPECT_DOUBLE_EQ(b5, 1.1);
  EXPECT_EQ(p.context->factor(64), std::make_pair(1.1, 1.0));
  ContextTiming zero{{4}, {1.0}, {1.0}, {0.0}, {0.0}};
  EXPECT_EQ(zero.factor(4), std::make_pair(1.0, 1.0));  // nothing measured to compare with

  auto prof = std::make_shared<Profile>(p);
  CostModel cm(g, made_up_cluster(), Optimizer::adam, prof);
  CostModel alone(g, made_up_cluster(), Optimizer::adam,
                  std::make_shared<Profile>(sample_profile(op_signature(g, fc1))));
  EXPECT_DOUBLE_EQ(cm.op_time(fc1, 2).fwd_s, 1.0 * 1.5);
  EXPECT_DOUBLE_EQ(cm.op_time(fc1, 2).bwd_s, 2.0 * 1.2);
  EXPECT_DOUBLE_EQ(cm.op_time(fc1, 8).fwd_s, 7.0 * 1.1);
  EXPECT_DOUBLE_EQ(cm.op_time(fc1, 8).bwd_s, 14.0);
  EXPECT_DOUBLE_EQ(alone.op_time(fc1, 8).fwd_s, 7.0);
  // An op the profile does not hold keeps the cluster's formula, unscaled.
  EXPECT_EQ(cm.op_time(loss, 4).fwd_s, alone.op_time(loss, 4).fwd_s);
}

TEST(Profile, MeasuredOptimizerStepReplacesTheBandwidthFormula) {
  ir::Graph g = two_layers();
  Profile p = sample_profile(op_signature(g, g.find("fc1")));
  p.optimizer["adam"] = {1000, 0.016};  // 1,000 parameters of 16 state bytes each: 1 us per byte
  p.optimizer["sgd"] = {1000, 0.006};   // 12 state bytes each: 0.5 us per byte
  auto prof = std::make_shared<Profile>(p);
  CostModel adam(g, made_up_cluster(), Optimizer::adam, prof);
  CostModel sgd(g, made_up_cluster(), Optimizer::sgd, prof);
  EXPECT_DOUBLE_EQ(optimizer_step_time(adam, 3200), 3200 * 1e-6);
  EXPECT_DOUBLE_EQ(optimizer_step_time(sgd, 2400), 2400 * 0.5e-6);
  // Without a measurement of that optimizer: 2 x state bytes / memory bandwidth.
  Profile only_sgd = sample_profile("s");
  only_sgd.optimizer["sgd"] = {1000, 0.006};
  CostModel formula(g, made_up_cluster(), Optimizer::adam, std::make_shared<Profile>(only_sgd));
  EXPECT_DOUBLE_EQ(optimizer_step_time(formula, 3200), 2 * 3200 / made_up_cluster().device.mem_bandwidth_Bps);
  // A stage's optimizer_s is that step.
  std::vector<OpId> all = g.op_ids();
  std::vector<char> in(g.num_ops(), 1);
  StageCost s = stage_cost(adam, all, in, 1, 4, 8, true);
  EXPECT_DOUBLE_EQ(s.optimizer_s, s.state_bytes * 1e-6);
}

TEST(Profile, ContextAndOptimizerRoundTripAndNameBadFields) {
  Profile p = sample_profile("s");
  p.context = ContextTiming{{1, 4}, {1.0, 2.0}, {2.0, 4.0}, {0.5, 1.5}, {1.5, 3.5}};
  p.optimizer["adam"] = {10, 1e-3};
  p.lockstep = 1.2;
  Json j = profile_to_json(p);
  EXPECT_EQ(profile_from_json(j, "p.json"), p);
  Json bad = j;
  bad["context"]["model_fwd_s"] = {1.0};
  EXPECT_THAT(parse_error(bad), HasSubstr("p.json: context.model_fwd_s: has 1 entries, expected 2"));
  bad = j;
  bad["context"]["batches"] = {4, 1};
  EXPECT_THAT(parse_error(bad), HasSubstr("context.batches[1]: batches must be >= 1 and strictly ascending, found 1"));
  bad = j;
  bad["optimizer"]["lamb"] = {{"params", 1}, {"step_s", 1.0}};
  EXPECT_THAT(parse_error(bad), HasSubstr("p.json: optimizer.lamb: unknown optimizer (valid: sgd, adam)"));
  bad = j;
  bad["optimizer"]["adam"]["params"] = 0;
  EXPECT_THAT(parse_error(bad), HasSubstr("optimizer.adam.params: must be >= 1, found 0"));
  bad = j;
  bad["optimizer"]["adam"]["step_s"] = -2.0;
  EXPECT_THAT(parse_error(bad), HasSubstr("optimizer.adam.step_s: must be a non-negative time in seconds, found -2"));
  bad = j;
  bad["lockstep"]["ranks"] = 4;
  EXPECT_THAT(parse_error(bad), HasSubstr("p.json: lockstep.ranks: only 2-rank lockstep factors are measured"));
  bad = j;
  bad["lockstep"]["factor"] = 0;
  EXPECT_THAT(parse_error(bad), HasSubstr("lockstep.factor: must be a positive ratio, found 0"));
}
