// The profiler: signature de-duplication, progress text, batch parsing, and a small real profiling
// run whose numbers are positive, grow with the batch and stay within 100x of the cpu roofline.
#include <gtest/gtest.h>

#include <sstream>

#include "cost/cost_model.h"
#include "profiler/profiler.h"

namespace gp::profiler {
namespace {

ir::Graph two_layer(int64_t seq, int64_t hidden, int64_t out) {
  ir::ModelBuilder b("p");
  std::string x = b.input("x", {seq, hidden});
  std::string h = b.linear("fc1", x, out);
  std::string a = b.unary("act", ir::OpKind::relu, h);
  std::string y = b.linear("fc2", a, out);  // same signature as fc1 when hidden == out
  b.output(b.op("loss", ir::OpKind::mse_loss, {y, b.input("t", {seq, out})}));
  return ir::Graph::build(b.build());
}

TEST(Profiler, FitLinkRecoversExactLineAndRejectsUselessData) {
  // t = 50 us + bytes / 2 GB/s, exactly.
  std::vector<std::pair<double, double>> pts;
  for (double b : {4096.0, 65536.0, 1048576.0, 16777216.0}) pts.emplace_back(b, 50e-6 + b / 2e9);
  cost::LinkFit f = fit_link(pts, "test");
  EXPECT_NEAR(f.latency_s, 50e-6, 1e-12);
  EXPECT_NEAR(f.bandwidth_Bps, 2e9, 1e-3);
  // Relative weighting: a 10% error at the largest size barely moves the latency.
  pts.back().second *= 1.1;
  EXPECT_NEAR(fit_link(pts, "test").latency_s, 50e-6, 5e-6);
  // A negative intercept refits through the origin: t = bytes / 1 GB/s at 1000 and 2000 bytes, with
  // the small one measured low -> latency 0, bandwidth from sum(w x y) / sum(w x^2).
  std::vector<std::pair<double, double>> low{{1000, 0.5e-6}, {2000, 2e-6}};
  cost::LinkFit o = fit_link(low, "test");
  EXPECT_EQ(o.latency_s, 0);
  double sxy = 1000 * 0.5e-6 / (0.5e-6 * 0.5e-6) + 2000 * 2e-6 / (2e-6 * 2e-6);
  double sxx = 1000.0 * 1000 / (0.5e-6 * 0.5e-6) + 2000.0 * 2000 / (2e-6 * 2e-6);
  EXPECT_NEAR(o.bandwidth_Bps, sxx / sxy, 1e-6 * sxx / sxy);
  EXPECT_THROW(fit_link({{4096, 1e-3}, {4096, 2e-3}}, "test"), UserError);  // one size only
  EXPECT_THROW(fit_link({{4096, 2e-3}, {65536, 1e-3}}, "test"), UserError);  // shrinking time
}

TEST(Profiler, ParseBatches) {
  EXPECT_EQ(parse_batches("1,2,4,8", "--batches"), (std::vector<int64_t>{1, 2, 4, 8}));
  EXPECT_EQ(parse_batches("16", "--batches"), (std::vector<int64_t>{16}));
  EXPECT_THROW(parse_batches("1,,2", "--batches"), UserError);
  EXPECT_THROW(parse_batches("0,2", "--batches"), UserError);
  EXPECT_THROW(parse_batches("2x", "--batches"), UserError);
}

TEST(Profiler, OneEntryPerSignatureWithProgress) {
  ir::Graph g = two_layer(4, 8, 8);
  ProfileOptions opt;
  opt.batches = {2, 1};
  opt.warmup = 0;
  opt.repeats = 1;
  std::ostringstream progress;
  cost::Profile p = profile_graph(g, opt, &progress);
  EXPECT_EQ(p.ops.size(), 3u);  // linear (fc1 == fc2), relu, mse_loss
  const auto& lin = p.ops.at(cost::op_signature(g, g.find("fc1")));
  EXPECT_EQ(lin.kind, "linear");
  EXPECT_EQ(lin.batches, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(p.ops.count(cost::op_signature(g, g.find("fc2"))), 1u);
  EXPECT_EQ(describe_op(g, g.find("fc1")), "linear [B, 4, 8] -> [B, 4, 8]");
  EXPECT_NE(progress.str().find("[1/3] linear [B, 4, 8] -> [B, 4, 8] b=1,2 ..."), std::string::npos)
      << progress.str();
  EXPECT_EQ(p.device.rfind("cpu: ", 0), 0u) << p.device;
}

TEST(Profiler, RealLinearTimesArePositiveOrderedAndNearRoofline) {
  ir::Graph g = two_layer(64, 256, 512);
  ProfileOptions opt;
  opt.batches = {1, 64};  // 64x the work: ordering survives a noisy, shared machine
  opt.warmup = 1;
  opt.repeats = 3;
  cost::Profile p = profile_graph(g, opt, nullptr);
  OpId fc1 = g.find("fc1");
  const auto& m = p.ops.at(cost::op_signature(g, fc1));
  cost::CostModel roof(g, cost::load_cluster("cpu"));
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_GT(m.fwd_s[i], 0);
    EXPECT_GT(m.bwd_s[i], 0);
    cost::OpTime r = roof.op_time(fc1, m.batches[i]);
    EXPECT_EQ(r.source, cost::Source::formula);
    double ratio = (m.fwd_s[i] + m.bwd_s[i]) / (r.fwd_s + r.bwd_s);
    EXPECT_GT(ratio, 0.01) << "b=" << m.batches[i];
    EXPECT_LT(ratio, 100.0) << "b=" << m.batches[i];
    std::printf("[roofline ratio] b=%lld %.3g\n", static_cast<long long>(m.batches[i]), ratio);
  }
  EXPECT_LT(m.fwd_s[0] + m.bwd_s[0], m.fwd_s[1] + m.bwd_s[1]);
}

}  // namespace
}  // namespace gp::profiler
