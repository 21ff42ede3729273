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
