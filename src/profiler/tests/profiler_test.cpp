// The profiler: signature de-duplication, progress text, batch parsing, and a small real profiling
// run whose numbers are positive, grow with the batch and stay within 100x of the cpu roofline.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "cost/cost_model.h"
#include "profiler/calibrate.h"
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
  EXPECT_THROW(fit_link({{4096, 1e-3}, {4096, 2e-3}}, "test"), UserError);   // one size only
  EXPECT_THROW(fit_link({{4096, 2e-3}, {65536, 1e-3}}, "test"), UserError);  // shrinking time
}

TEST(Profiler, LinkTimesAreCappedByLargerSizes) {
  // Medians of a burst-hit small size come down to the next larger size's; sorted by size.
  std::vector<std::pair<double, double>> pts{{1048576, 3e-3}, {4096, 4e-4}, {65536, 5e-3}, {262144, 2e-3}};
  cap_by_larger_sizes(pts);
  EXPECT_EQ(pts,
            (std::vector<std::pair<double, double>>{{4096, 4e-4}, {65536, 2e-3}, {262144, 2e-3}, {1048576, 3e-3}}));
}

TEST(Profiler, LinkFitUsesTheMediansUnlessTheyDoNotGrow) {
  // Medians on the line t = 100 us + bytes / 1 GB/s: they are fitted.
  std::vector<std::pair<double, double>> med, fast;
  for (double b : {4096.0, 1048576.0, 4194304.0}) {
    med.emplace_back(b, 100e-6 + b / 1e9);
    fast.emplace_back(b, 50e-6 + b / 2e9);
  }
  std::ostringstream notes;
  EXPECT_NEAR(fit_link_medians(med, fast, "t", &notes).bandwidth_Bps, 1e9, 1);
  EXPECT_EQ(notes.str(), "");
  // Every size but the largest hit by a burst: capped, the medians are flat; the fastest are fitted.
  for (auto& [b, t] : med) t = 5e-3;
  cost::LinkFit f = fit_link_medians(med, fast, "t", &notes);
  EXPECT_NEAR(f.bandwidth_Bps, 2e9, 1);
  EXPECT_NEAR(f.latency_s, 50e-6, 1e-9);
  EXPECT_NE(notes.str().find("fitting the fastest repeats instead"), std::string::npos) << notes.str();
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
  EXPECT_NE(progress.str().find("[1/3] linear [B, 4, 8] -> [B, 4, 8] b=1,2 ..."), std::string::npos) << progress.str();
  EXPECT_EQ(p.device.rfind("cpu: ", 0), 0u) << p.device;
}

TEST(Profiler, ContextTimesTheWholeModelAgainstItsOpsAndBothOptimizers) {
  ir::Graph g = two_layer(4, 8, 8);
  ProfileOptions opt;
  opt.batches = {4, 1};
  opt.warmup = 0;
  opt.repeats = 2;
  std::ostringstream progress;
  cost::Profile p = profile_graph(g, opt, &progress);
  ASSERT_TRUE(p.context.has_value());
  const cost::ContextTiming& c = *p.context;
  EXPECT_EQ(c.batches, (std::vector<int64_t>{1, 4}));
  for (size_t k = 0; k < 2; ++k) {
    EXPECT_GT(c.model_fwd_s[k], 0);
    EXPECT_GT(c.model_bwd_s[k], 0);
    // The ops' column is the sum of the profile's own entries over every op (fc1 and fc2 share one).
    double fwd = 0, bwd = 0;
    for (OpId id : g.op_ids()) {
      auto t = p.lookup(cost::op_signature(g, id), c.batches[k]);
      fwd += t->first;
      bwd += t->second;
    }
    EXPECT_DOUBLE_EQ(c.ops_fwd_s[k], fwd);
    EXPECT_DOUBLE_EQ(c.ops_bwd_s[k], bwd);
  }
  // fc1 and fc2: 2 x (8 x 8 weights + 8 biases).
  ASSERT_EQ(p.optimizer.count("sgd"), 1u);
  ASSERT_EQ(p.optimizer.count("adam"), 1u);
  EXPECT_EQ(p.optimizer.at("adam").params, 144);
  EXPECT_GT(p.optimizer.at("adam").step_s, 0);
  EXPECT_NE(progress.str().find("[model] 4 ops in sequence, b=1,4 ..."), std::string::npos) << progress.str();
  EXPECT_NE(progress.str().find("[optimizer] adam step over 144 parameters"), std::string::npos) << progress.str();

  opt.context = false;
  cost::Profile bare = profile_graph(g, opt, nullptr);
  EXPECT_FALSE(bare.context.has_value());
  EXPECT_TRUE(bare.optimizer.empty());
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

TEST(Calibrate, FitGemmRecoversRateAndN0) {
  // t = flops * (rows + N0) / (rows * P) with P = 40 GFLOP/s, N0 = 12 rows, for two weight sizes.
  std::vector<std::array<double, 3>> pts;
  for (double per_row : {6.0 * 64 * 64, 6.0 * 256 * 256})
    for (double r : {1.0, 4.0, 16.0, 64.0, 256.0}) pts.push_back({r, r * per_row, r * per_row * (r + 12) / (r * 40e9)});
  auto [p, n0] = fit_gemm(pts);
  EXPECT_NEAR(p, 40e9, 1e-3 * 40e9);
  EXPECT_NEAR(n0, 12, 1e-6);
  // Faster at few rows than the line allows (noise): N0 clamps at 0, the rate comes from the slope.
  std::vector<std::array<double, 3>> flat{{1, 1e6, 0.5e-4}, {2, 2e6, 1e-4}};
  EXPECT_EQ(fit_gemm(flat).second, 0);
  EXPECT_NEAR(fit_gemm(flat).first, 2e10, 1e-3 * 2e10);
  EXPECT_THROW(fit_gemm({{4, 1e6, 1e-4}, {4, 1e6, 2e-4}}), UserError);  // one row count
}

TEST(Calibrate, GemmFitWithOverheadRecoversRateHalfRowsAndFixedTime) {
  // t = flops (r + N0) / (r P) + c at P = 40 GFLOP/s, N0 = 12 rows, c = 50 us (fwd + bwd).
  std::vector<std::array<double, 3>> pts;
  for (double per_row : {6.0 * 64 * 64, 6.0 * 256 * 256})
    for (double r : {1.0, 4.0, 16.0, 64.0, 256.0})
      pts.push_back({r, r * per_row, r * per_row * (r + 12) / (r * 40e9) + 50e-6});
  auto f = fit_gemm_overhead(pts);
  EXPECT_NEAR(f[0], 40e9, 1e-3 * 40e9);
  EXPECT_NEAR(f[1], 12, 1e-3);
  EXPECT_NEAR(f[2], 50e-6, 1e-9);
  // Without a fixed time the fit finds none (to rounding), and agrees with fit_gemm.
  std::vector<std::array<double, 3>> plain;
  for (auto p : pts) plain.push_back({p[0], p[1], p[2] - 50e-6});
  auto g = fit_gemm_overhead(plain);
  EXPECT_NEAR(g[0], 40e9, 1e-3 * 40e9);
  EXPECT_NEAR(g[2], 0, 1e-9);
  // A fit that would need a negative fixed time falls back to fit_gemm's {P, N0} and 0.
  std::vector<std::array<double, 3>> neg;
  for (auto p : plain) neg.push_back({p[0], p[1], p[2] * 1.5 - 2e-6 > 0 ? p[2] + p[1] / 40e9 * 0.5 - 2e-6 : p[2]});
  auto h = fit_gemm_overhead(neg);
  EXPECT_GE(h[2], 0);
  EXPECT_GT(h[0], 0);
}

TEST(Calibrate, AttentionFitRecoversEfficiencyAndFixedTimeTogether) {
  // t = C / e + 2 c_att + o with e = 0.8, c_att = 300 us, o = 20 us: small ops (C 50 us, mostly the
  // fixed time) and large ones (C 50 ms) together pin both.
  std::vector<std::array<double, 3>> pts;
  for (double c : {50e-6, 200e-6, 1e-3, 5e-3, 20e-3, 50e-3}) pts.push_back({c, 20e-6, c / 0.8 + 600e-6 + 20e-6});
  auto [e, v] = fit_attention_figures(pts);
  EXPECT_NEAR(e, 0.8, 1e-9);
  EXPECT_NEAR(v, 300e-6, 1e-12);
  // Faster than the GEMM curve (e would be 1.25): e stays 1, the fixed time takes what is left.
  std::vector<std::array<double, 3>> fast;
  for (double c : {50e-6, 1e-3, 20e-3}) fast.push_back({c, 0.0, c * 0.8 + 100e-6});
  auto [e1, v1] = fit_attention_figures(fast);
  EXPECT_EQ(e1, 1.0);
  EXPECT_GT(v1, 0);
  // A line through below the origin (a negative fixed time, 20 us): none, e from the slope.
  std::vector<std::array<double, 3>> neg;
  for (double c : {1e-3, 5e-3, 20e-3}) neg.push_back({c, 0.0, c / 0.5 - 40e-6});
  auto [e2, v2] = fit_attention_figures(neg);
  EXPECT_EQ(v2, 0);
  EXPECT_GT(e2, 0.5);
  EXPECT_LT(e2, 0.52);
  EXPECT_THROW(fit_attention_figures({{0.0, 0.0, 1e-3}}), UserError);
}

TEST(Calibrate, KindPaceFitReproducesTheThreeTimings) {
  // Forward: 3 us + 0.5 ns per element up to 32 K, 0.8 ns per element at 512 K; backward 5 us + 0.1 ns.
  const double n1 = 1024, n2 = 32768, n3 = 524288;
  auto fwd = [](double n, double e) { return 3e-6 + n * e; };
  std::array<std::array<double, 3>, 3> pts{{{n1, fwd(n1, 0.5e-9), 5e-6 + n1 * 0.1e-9},
                                            {n2, fwd(n2, 0.5e-9), 5e-6 + n2 * 0.1e-9},
                                            {n3, fwd(n3, 0.8e-9), 5e-6 + n3 * 0.1e-9}}};
  auto [overhead, pace] = fit_kind_pace(pts, 2e-6);
  EXPECT_NEAR(overhead, 4e-6 - 2e-6, 1e-15);  // the mean of 3 and 5 us, less the per-op overhead
  ASSERT_EQ(pace.size(), 2u);
  EXPECT_EQ(pace[0].elems, n2);
  EXPECT_EQ(pace[1].elems, n3);
  EXPECT_NEAR(pace[0].fwd_s, 0.5e-9, 1e-18);
  EXPECT_NEAR(pace[1].fwd_s, 0.8e-9, 1e-18);
  EXPECT_NEAR(pace[0].bwd_s, 0.1e-9, 1e-18);
  EXPECT_NEAR(pace[1].bwd_s, 0.1e-9, 1e-18);
  // Noise that makes the larger call cheaper than the smaller: no negative pace or fixed time.
  std::array<std::array<double, 3>, 3> noisy{{{n1, 10e-6, 10e-6}, {n2, 9e-6, 9e-6}, {n3, 8e-6, 8e-6}}};
  auto [o2, p2] = fit_kind_pace(noisy, 2e-6);
  EXPECT_NEAR(o2, 8e-6, 1e-15);
  EXPECT_EQ(p2[0].fwd_s, 0);
  EXPECT_EQ(p2[1].bwd_s, 0);
  std::array<std::array<double, 3>, 3> unordered{{{n2, 1e-6, 1e-6}, {n1, 1e-6, 1e-6}, {n3, 1e-6, 1e-6}}};
  EXPECT_THROW(fit_kind_pace(unordered, 0), UserError);
}

TEST(Calibrate, MeasuresThisMachineAndTheRooflineReproducesTheGemms) {
  CalibrateOptions o;
  o.warmup = 1;
  o.repeats = 3;
  o.links = false;  // spawns the graphpipe binary; the CLI test covers it
  o.passes = 2;     // the fit reads each timing's median over the passes
  std::ostringstream progress;
  CalibrationResult r = calibrate_cpu(o, &progress);
  const cost::CpuCalibration& k = r.calibration;
  EXPECT_GT(k.gemm_flops, 1e8);
  EXPECT_GT(k.mem_bandwidth_Bps, 1e8);
  EXPECT_GT(k.kernel_overhead_s, 0);
  // The runtime's optimizer steps, per parameter: Adam keeps two moments, SGD one.
  EXPECT_GT(k.sgd_step_s_per_param, 0);
  EXPECT_GT(k.adam_step_s_per_param, 0);
  EXPECT_EQ(k.busy_link_latency_s, 0);  // no links measured
  EXPECT_EQ(k.cpu_model, cost::local_cpu_model());
  EXPECT_FALSE(k.torch_version.empty());
  EXPECT_NE(progress.str().find("calibrating: GEMM fit:"), std::string::npos) << progress.str();
  EXPECT_NE(progress.str().find("calibrating: op timings, pass 2 of 2:"), std::string::npos) << progress.str();
  EXPECT_LT(progress.str().find("pass 2 of 2"), progress.str().find("GEMM fit:")) << "fitted before every pass";
  // The fit is of these very timings: the roofline with the fitted figures lands near most of them
  // (median GEMM error within 2x even on a loaded machine).
  std::vector<double> err;
  for (const auto& p : r.points) {
    EXPECT_GT(p.measured_s, 0) << p.what;
    EXPECT_GT(p.fitted_s, 0) << p.what;
    if (p.what.rfind("linear", 0) == 0) err.push_back(std::abs(std::log(p.fitted_s / p.measured_s)));
    std::printf("[calibration] %-32s measured %.4g ms model %.4g ms\n", p.what.c_str(), p.measured_s * 1e3,
                p.fitted_s * 1e3);
  }
  ASSERT_EQ(err.size(), 18u);          // 3 widths x (1 row + 4, 16, 64, 256, 1024 rows)
  EXPECT_EQ(k.kind_pace.size(), 11u);  // relu and the ten memory-bound kinds, each at its two larger sizes
  EXPECT_EQ(k.kind_pace.at(ir::OpKind::gelu).size(), 2u);
  ASSERT_EQ(k.kind_in_sequence.size(), 1u);  // the attention's, at 1 K and 32 K floats
  EXPECT_EQ(k.kind_in_sequence.at(ir::OpKind::attention).size(), 2u);
  EXPECT_EQ(k.kind_in_sequence.at(ir::OpKind::attention)[1].elems, 32 * 1024);
  std::nth_element(err.begin(), err.begin() + 9, err.end());
  EXPECT_LT(err[9], std::log(2.0));
}

}  // namespace
}  // namespace gp::profiler
