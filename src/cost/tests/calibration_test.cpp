// The calibrated cpu preset: graphpipe.calibration/1 round trip and strict errors, the per-machine
// cache key, and what a calibration changes in the preset (rates, curve, sharing of cores).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <thread>

#include "cost/calibration.h"
#include "cost/profile.h"
#include "cost/tests/test_util.h"

using namespace gp;
using namespace gp::cost;
using namespace gp::cost::testing;
using ::testing::HasSubstr;

namespace {

CpuCalibration made_up() {
  CpuCalibration k;
  k.cpu_model = "AMD EPYC 7B13 64-Core Processor";
  k.cores = 2;
  k.torch_version = "1.13.0";
  k.measured_at = "2026-12-01T00:00:00Z";
  k.seconds = 4.5;
  k.gemm_flops = 40e9;
  k.gemm_n0_rows = 12;
  k.attention_efficiency = 0.5;
  k.mem_bandwidth_Bps = 8e9;
  k.kernel_overhead_s = 20e-6;
  k.link_bandwidth_Bps = 1.5e9;
  k.link_latency_s = 60e-6;
  return k;
}

int cores() { return static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); }

}  // namespace

TEST(Calibration, JsonRoundTripAndStrictErrors) {
  CpuCalibration k = made_up();
  EXPECT_EQ(calibration_from_json(calibration_to_json(k), "k.json"), k);
  auto error_with = [&](const char* field, Json v) {
    Json j = calibration_to_json(k);
    if (std::string(field) == "link.latency_s") j["link"]["latency_s"] = v;
    else j[field] = v;
    return error_of([&] { calibration_from_json(j, "k.json"); });
  };
  EXPECT_THAT(error_with("gemm_flops", -1), HasSubstr("k.json: gemm_flops: must be a positive number, found -1"));
  EXPECT_THAT(error_with("mem_bandwidth_Bps", 0), HasSubstr("mem_bandwidth_Bps: must be a positive number"));
  EXPECT_THAT(error_with("kernel_overhead_s", -2e-6), HasSubstr("kernel_overhead_s: must be a non-negative"));
  EXPECT_THAT(error_with("link.latency_s", "x"), HasSubstr("k.json: link.latency_s"));
  EXPECT_THAT(error_with("lockstep", 0), HasSubstr("k.json: lockstep: must be a positive number"));
  k.lockstep = 1.25;
  EXPECT_EQ(calibration_from_json(calibration_to_json(k), "k.json"), k);
  Json old = calibration_to_json(k);  // caches written before the field: no lockstep stretch
  old.erase("lockstep");
  EXPECT_EQ(calibration_from_json(old, "k.json").lockstep, 1);
  k.method = 2;  // calibrate's revision: caches written before it read as 0 (and are measured again)
  EXPECT_EQ(calibration_from_json(calibration_to_json(k), "k.json").method, 2);
  Json unrevised = calibration_to_json(k);
  unrevised.erase("method");
  EXPECT_EQ(calibration_from_json(unrevised, "k.json").method, 0);
  // The per-call GEMM/attention overheads (issue 35): round trip, optional (0), non-negative.
  k.gemm_overhead_s = 15e-6;
  k.attention_overhead_s = 120e-6;
  EXPECT_EQ(calibration_from_json(calibration_to_json(k), "k.json"), k);
  Json before = calibration_to_json(k);
  before.erase("gemm_overhead_s");
  before.erase("attention_overhead_s");
  EXPECT_EQ(calibration_from_json(before, "k.json").gemm_overhead_s, 0);
  EXPECT_EQ(calibration_from_json(before, "k.json").attention_overhead_s, 0);
  EXPECT_THAT(error_with("attention_overhead_s", -1e-6),
              HasSubstr("k.json: attention_overhead_s: must be a non-negative"));
  EXPECT_THAT(error_with("attention_efficiency", 1.5), HasSubstr("attention_efficiency: must be in (0, 1], found 1.5"));
  EXPECT_THAT(error_with("cores", 0), HasSubstr("k.json: cores: must be in [1, 1000000], found 0"));
  EXPECT_THAT(error_with("format", "graphpipe.profile/1"), HasSubstr("graphpipe.calibration/1"));
}

TEST(Calibration, CacheFileIsKeyedByCpuCoresAndTorchVersion) {
  ::setenv("GRAPHPIPE_CACHE_DIR", "/tmp/gp-cache", 1);
  std::string a = calibration_cache_path("AMD EPYC 7B13 64-Core Processor", 2, "1.13.0");
  EXPECT_EQ(a, "/tmp/gp-cache/cpu-calibration-amd-epyc-7b13-64-core-processor-2c-torch1.13.0.json");
  EXPECT_NE(a, calibration_cache_path("AMD EPYC 7B13 64-Core Processor", 4, "1.13.0"));
  EXPECT_NE(a, calibration_cache_path("AMD EPYC 7B13 64-Core Processor", 2, "2.1.0"));
  EXPECT_NE(a, calibration_cache_path("Intel(R) Xeon(R) Gold 6248", 2, "1.13.0"));
  ::unsetenv("GRAPHPIPE_CACHE_DIR");
  ::setenv("XDG_CACHE_HOME", "/tmp/xdg", 1);
  EXPECT_EQ(calibration_cache_dir(), "/tmp/xdg/graphpipe");
  ::unsetenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  std::string saved = home ? home : "";
  ::setenv("HOME", "/home/u", 1);
  EXPECT_EQ(calibration_cache_dir(), "/home/u/.cache/graphpipe");
  if (home) ::setenv("HOME", saved.c_str(), 1);
  else ::unsetenv("HOME");
}

TEST(Calibration, PresetUsesTheMeasuredRatesAndSharesCores) {
  CpuCalibration k = made_up();
  Cluster fixed = cpu_preset(0, nullptr);
  Cluster c = cpu_preset(0, &k);
  EXPECT_EQ(c.name, "cpu");
  EXPECT_EQ(c.num_devices(), cores());
  EXPECT_DOUBLE_EQ(c.device.peak_flops_f32, 40e9);
  EXPECT_DOUBLE_EQ(c.device.mem_bandwidth_Bps, 8e9);
  EXPECT_DOUBLE_EQ(c.device.kernel_overhead_s, 20e-6);
  EXPECT_DOUBLE_EQ(c.intra.bandwidth_Bps, 1.5e9);
  EXPECT_DOUBLE_EQ(c.intra.latency_s, 60e-6);
  EXPECT_THAT(c.device.name, HasSubstr("AMD EPYC 7B13 64-Core Processor, calibrated 2026-12-01"));
  EXPECT_NE(c.device.name, fixed.device.name);
  // The GEMM curve: half the rate at N0 rows, for gemm, attention and conv; memory-bound ops flat.
  EXPECT_DOUBLE_EQ(c.device.efficiency.curve(WorkClass::gemm, false).at(12, 1 << 20), 0.5);
  EXPECT_DOUBLE_EQ(c.device.efficiency.curve(WorkClass::attention, false).at(36, 1 << 10), 0.5 * 0.75);
  EXPECT_DOUBLE_EQ(c.device.efficiency.curve(WorkClass::other, false).at(1, 0), 0.25);
  // Two cores computing in lockstep measured 1.25x one core's pace: 2+ workers get the slower pace.
  CpuCalibration slow = k;
  slow.lockstep = 1.25;
  const double share2 = std::min(1.0, cores() / 2.0);
  EXPECT_DOUBLE_EQ(cpu_preset(1, &slow).device.peak_flops_f32, 40e9);
  EXPECT_DOUBLE_EQ(cpu_preset(2, &slow).device.peak_flops_f32, 40e9 * share2 / 1.25);
  EXPECT_DOUBLE_EQ(cpu_preset(2, &slow).device.kernel_overhead_s, 20e-6 / share2 * 1.25);
  // Four times as many workers as cores: each gets a quarter of a core; CPU-time costs stretch 4x.
  Cluster over = cpu_preset(4 * cores(), &k);
  EXPECT_DOUBLE_EQ(over.device.peak_flops_f32, 10e9);
  EXPECT_DOUBLE_EQ(over.device.mem_bandwidth_Bps, 2e9);
  EXPECT_DOUBLE_EQ(over.device.kernel_overhead_s, 80e-6);
  EXPECT_DOUBLE_EQ(over.intra.bandwidth_Bps, 1.5e9 / 4);
  EXPECT_DOUBLE_EQ(over.intra.latency_s, 240e-6);
  // The JSON the plan records round-trips the calibrated preset (efficiency included).
  EXPECT_EQ(cluster_to_json(cluster_from_json(cluster_to_json(c), "c.json")), cluster_to_json(c));
}

TEST(Calibration, RooflineWithTheCalibrationReproducesAGemmOnTheCurve) {
  // A 256 x 256 linear at b rows: compute = 6 * 256^2 * b * (b + N0) / (b * P) per fwd+bwd.
  CpuCalibration k = made_up();
  k.mem_bandwidth_Bps = 1e15;  // leave the memory term out
  Cluster c = cpu_preset(1, &k);
  ir::ModelBuilder b("g");
  std::string y = b.linear("fc", b.unary("pre", ir::OpKind::relu, b.input("x", {256})), 256);
  b.output(y);
  ir::Graph g = ir::Graph::build(b.build());
  OpId fc = g.find("fc");
  for (int64_t rows : {1, 12, 64}) {
    OpTime t = roofline_time(op_work(g, fc), g.costs(fc), c.device, false, rows);
    double flops = rows * (g.costs(fc).fwd_flops + g.costs(fc).bwd_flops);
    EXPECT_NEAR(t.fwd_s + t.bwd_s, flops * (rows + 12.0) / (rows * 40e9) + 2 * 20e-6, 1e-12) << rows;
  }
  // With a per-call GEMM overhead (issue 35) each pass pays it on top; the relu (class other) does not.
  k.gemm_overhead_s = 30e-6;
  k.attention_overhead_s = 100e-6;
  Cluster o = cpu_preset(1, &k);
  OpTime t = roofline_time(op_work(g, fc), g.costs(fc), o.device, false, 12);
  double flops = 12 * (g.costs(fc).fwd_flops + g.costs(fc).bwd_flops);
  EXPECT_NEAR(t.fwd_s + t.bwd_s, flops * 24.0 / (12 * 40e9) + 2 * (20e-6 + 30e-6), 1e-12);
  OpId pre = g.find("pre");
  EXPECT_NEAR(roofline_time(op_work(g, pre), g.costs(pre), o.device, false, 1).fwd_s,
              roofline_time(op_work(g, pre), g.costs(pre), c.device, false, 1).fwd_s, 1e-15);
  // Two workers on the lockstep pace: the per-call overheads stretch like kernel_overhead_s.
  k.lockstep = 1.25;
  const double share2 = std::min(1.0, cores() / 2.0);
  Cluster two = cpu_preset(2, &k);
  EXPECT_DOUBLE_EQ(two.device.efficiency.curve(WorkClass::gemm, false).overhead_s, 30e-6 / share2 * 1.25);
  EXPECT_DOUBLE_EQ(two.device.efficiency.curve(WorkClass::attention, false).overhead_s, 100e-6 / share2 * 1.25);
  // The plan's recorded cluster keeps them (written only where set: the GPU presets' JSON is unchanged).
  EXPECT_EQ(cluster_to_json(cluster_from_json(cluster_to_json(two), "c.json")), cluster_to_json(two));
  EXPECT_EQ(cluster_to_json(load_cluster("summit", 4)).dump().find("\"overhead_s\""), std::string::npos);
}

namespace {

ir::Graph relu_linear() {
  ir::ModelBuilder b("g");
  std::string y = b.linear("fc", b.unary("pre", ir::OpKind::relu, b.input("x", {64})), 64);
  b.output(y);
  return ir::Graph::build(b.build());
}

/// fc measured at batch 1 and 2: forward 0.1 / 0.2 ms, backward 0.3 / 0.6 ms.
std::shared_ptr<Profile> profile_of_fc(const ir::Graph& g) {
  auto prof = std::make_shared<Profile>();
  std::string sig = op_signature(g, g.find("fc"));
  prof->ops.emplace(sig, OpMeasurement{sig, "linear", {1, 2}, {1e-4, 2e-4}, {3e-4, 6e-4}});
  return prof;
}

}  // namespace

TEST(Calibration, ProfiledTimesStretchWhenWorkersShareCores) {
  // A profile is measured by one process on a free core: with 4x as many workers as cores each op
  // takes 4x as long, and the profile's link is 4x slower.
  ir::Graph g = relu_linear();
  OpId fc = g.find("fc");
  auto prof = profile_of_fc(g);
  prof->p2p = LinkFit{1e-4, 1e9};
  CostModel own(g, cpu_preset(cores(), nullptr), Optimizer::adam, prof);
  CostModel shared(g, cpu_preset(4 * cores(), nullptr), Optimizer::adam, prof);
  EXPECT_DOUBLE_EQ(own.op_time(fc, 2).fwd_s, 2e-4);
  EXPECT_DOUBLE_EQ(shared.op_time(fc, 2).fwd_s, 8e-4);
  EXPECT_DOUBLE_EQ(shared.op_time(fc, 2).bwd_s, 24e-4);
  EXPECT_EQ(shared.op_time(fc, 2).source, Source::measured);
  EXPECT_DOUBLE_EQ(own.intra_link().latency_s, 1e-4);
  EXPECT_DOUBLE_EQ(shared.intra_link().latency_s, 4e-4);
  EXPECT_DOUBLE_EQ(shared.intra_link().bandwidth_Bps, 0.25e9);
  // Other clusters never stretch.
  CostModel summit(g, load_cluster("summit", 4 * cores()), Optimizer::adam, prof);
  EXPECT_DOUBLE_EQ(summit.op_time(fc, 2).fwd_s, 2e-4);
}

TEST(Calibration, ProfiledComputeStretchesByTheLockstepFactorWithTwoOrMoreWorkers) {
  // Two cores computing in lockstep wait for the slower one: a profile measured that as 1.25, so
  // plans of 2+ workers on the cpu preset run every profiled op and the optimizer step 1.25x as long;
  // one worker, and other clusters, do not.
  ir::Graph g = relu_linear();
  OpId fc = g.find("fc");
  auto prof = profile_of_fc(g);
  prof->optimizer["adam"] = {1000, 0.016};
  prof->lockstep = 1.25;
  const double over2 = std::max(1.0, 2.0 / cores());  // 2 workers on a 1-core machine share it
  CostModel one(g, take_devices(cpu_preset(1, nullptr), 1, "test"), Optimizer::adam, prof);
  CostModel two(g, take_devices(cpu_preset(2, nullptr), 2, "test"), Optimizer::adam, prof);
  EXPECT_DOUBLE_EQ(one.op_time(fc, 2).fwd_s, 2e-4);
  EXPECT_DOUBLE_EQ(two.op_time(fc, 2).fwd_s, 2e-4 * over2 * 1.25);
  EXPECT_DOUBLE_EQ(two.op_time(fc, 2).bwd_s, 6e-4 * over2 * 1.25);
  EXPECT_DOUBLE_EQ(two.measured_optimizer_s_per_byte(), one.measured_optimizer_s_per_byte() * over2 * 1.25);
  // A factor below 1 (noise) never speeds ops up; summit never stretches.
  prof->lockstep = 0.9;
  CostModel below(g, take_devices(cpu_preset(2, nullptr), 2, "test"), Optimizer::adam, prof);
  EXPECT_DOUBLE_EQ(below.op_time(fc, 2).fwd_s, 2e-4 * over2);
  prof->lockstep = 1.25;
  CostModel summit(g, load_cluster("summit", 2), Optimizer::adam, prof);
  EXPECT_DOUBLE_EQ(summit.op_time(fc, 2).fwd_s, 2e-4);
}

// Issue 35: the optimizer's measured rate and the link between busy cores. The optimizer step is
// priced per parameter as measured (not as its state's bytes at the memory bandwidth); with a worker
// on every core, point-to-point messages use the busy link and a data-parallel all-reduce the idle
// one; fewer workers than cores, or a calibration without the busy link, keep the idle link for both.
TEST(Calibration, OptimizerRateAndTheBusyLink) {
  CpuCalibration k = made_up();
  k.sgd_step_s_per_param = 0.3e-9;
  k.adam_step_s_per_param = 1.4e-9;
  k.busy_link_latency_s = 2e-3;
  EXPECT_EQ(calibration_from_json(calibration_to_json(k), "k.json"), k);
  Json old = calibration_to_json(k);  // caches written before the fields
  old.erase("optimizer_step_s_per_param");
  old.erase("busy_link");
  CpuCalibration before = calibration_from_json(old, "k.json");
  EXPECT_EQ(before.adam_step_s_per_param, 0);
  EXPECT_EQ(before.busy_link_latency_s, 0);
  Json bad = calibration_to_json(k);
  bad["optimizer_step_s_per_param"]["adam"] = -1;
  EXPECT_THAT(error_of([&] { calibration_from_json(bad, "k.json"); }),
              HasSubstr("k.json: optimizer_step_s_per_param.adam: must be a non-negative number"));

  ir::Graph g = relu_linear();
  const int n = cores();  // a worker on every core
  Cluster all = cpu_preset(n, &k);
  EXPECT_DOUBLE_EQ(all.device.adam_step_s_per_param, 1.4e-9);
  EXPECT_DOUBLE_EQ(all.intra.latency_s, 2e-3);
  EXPECT_DOUBLE_EQ(all.collective_intra.latency_s, 60e-6);
  CostModel cm(g, all, Optimizer::adam);
  EXPECT_DOUBLE_EQ(cm.intra_link().latency_s, 2e-3);
  // Adam's state is 16 bytes per parameter (weights, gradients, two moments).
  EXPECT_DOUBLE_EQ(optimizer_step_time(cm, 16.0 * 1000), 1.4e-9 * 1000);
  CostModel sgd(g, all, Optimizer::sgd);
  EXPECT_DOUBLE_EQ(optimizer_step_time(sgd, 12.0 * 1000), 0.3e-9 * 1000);
  // The all-reduce of 2 workers meets the idle link: the same time as without the busy figures.
  CpuCalibration idle_only = k;
  idle_only.busy_link_latency_s = 0;
  CostModel idle(g, cpu_preset(n, &idle_only), Optimizer::adam);
  EXPECT_DOUBLE_EQ(idle.intra_link().latency_s, 60e-6);
  if (n >= 2) {
    EXPECT_DOUBLE_EQ(cm.allreduce_time(2, true, 1e6), idle.allreduce_time(2, true, 1e6));
  }
  // Measured after computing, the all-reduce pays its own latency per ring step, at the idle bandwidth.
  CpuCalibration after = k;
  after.busy_allreduce_latency_s = 1e-3;
  EXPECT_EQ(calibration_from_json(calibration_to_json(after), "k.json"), after);
  Cluster reduced = cpu_preset(n, &after);
  EXPECT_DOUBLE_EQ(reduced.collective_intra.latency_s, 1e-3);
  EXPECT_DOUBLE_EQ(reduced.collective_intra.bandwidth_Bps, 1.5e9);
  if (n >= 2) {
    CostModel r(g, reduced, Optimizer::adam);
    EXPECT_DOUBLE_EQ(r.allreduce_time(2, true, 1e6), 1e6 / 1.5e9 + ring_latencies(2, 1e6, true) * 1e-3);
    EXPECT_DOUBLE_EQ(ring_latencies(2, 1e6, true), 4);  // 2 x 2 segments of the 2-rank ring
  }
  // At the all-reduce's own bandwidth between idle processes where it was measured.
  after.allreduce_bandwidth_Bps = 0.7e9;
  EXPECT_EQ(calibration_from_json(calibration_to_json(after), "k.json"), after);
  EXPECT_DOUBLE_EQ(cpu_preset(n, &after).collective_intra.bandwidth_Bps, 0.7e9);
  EXPECT_DOUBLE_EQ(cpu_preset(n, &after).intra.bandwidth_Bps, 1.5e9);  // messages keep the link's
  // Fewer workers than cores: the idle link.
  if (n >= 2) {
    EXPECT_DOUBLE_EQ(cpu_preset(1, &k).intra.latency_s, 60e-6);
    EXPECT_EQ(cpu_preset(1, &k).collective_intra.bandwidth_Bps, 0);
  }
  // The plan's recorded cluster keeps both (and the optimizer's rates).
  Cluster back = cluster_from_json(cluster_to_json(all), "c.json");
  EXPECT_DOUBLE_EQ(back.collective_intra.latency_s, 60e-6);
  EXPECT_DOUBLE_EQ(back.device.sgd_step_s_per_param, 0.3e-9);
  EXPECT_EQ(cluster_to_json(back), cluster_to_json(all));
  // Without a measured rate the bandwidth estimate stays (GPU presets, old caches).
  CostModel fixed(g, cpu_preset(n, &before), Optimizer::adam);
  EXPECT_DOUBLE_EQ(optimizer_step_time(fixed, 16e3), 2 * 16e3 / fixed.cluster().device.mem_bandwidth_Bps);
}

// Issue 35: on the busy link a message also costs CPU time at both ends (hand-off rounds): the
// figures survive the cache; a worker on every core gets them on its link, stretched by workers per
// core like the latency; fewer workers than cores, or an older cache, keep none; a plan's recorded
// cluster keeps them, and a bad one is refused naming the field.
TEST(Calibration, MessagesCostCpuTimeOnTheBusyLink) {
  CpuCalibration k = made_up();
  k.busy_link_latency_s = 2e-3;
  k.busy_message_cpu = {30e-6, 0.1e-9, 60e-6, 0.3e-9};
  EXPECT_EQ(calibration_from_json(calibration_to_json(k), "k.json"), k);
  Json old = calibration_to_json(k);
  old["busy_link"].erase("cpu");
  EXPECT_EQ(calibration_from_json(old, "k.json").busy_message_cpu, MessageCpu{});
  Json bad = calibration_to_json(k);
  bad["busy_link"]["cpu"]["recv_s"] = -1;
  EXPECT_THAT(error_of([&] { calibration_from_json(bad, "k.json"); }),
              HasSubstr("k.json: busy_link.cpu.recv_s: must be a non-negative number"));

  const int n = cores();
  const Cluster all = cpu_preset(n, &k);
  EXPECT_DOUBLE_EQ(all.intra.cpu.send(1000), 30e-6 + 1000 * 0.1e-9);
  EXPECT_DOUBLE_EQ(all.intra.cpu.recv(1000), 60e-6 + 1000 * 0.3e-9);
  EXPECT_DOUBLE_EQ(cpu_preset(2 * n, &k).intra.cpu.recv_s, 120e-6);
  if (n >= 2) {
    EXPECT_EQ(cpu_preset(1, &k).intra.cpu.send(1000), 0);
  }
  const Cluster back = cluster_from_json(cluster_to_json(all), "c.json");
  EXPECT_DOUBLE_EQ(back.intra.cpu.send_s_per_byte, 0.1e-9);
  EXPECT_EQ(cluster_to_json(back), cluster_to_json(all));
  Json bad_link = cluster_to_json(all);
  bad_link["intra"]["cpu"]["send_s"] = "slow";
  EXPECT_THAT(error_of([&] { cluster_from_json(bad_link, "c.json"); }), HasSubstr("c.json: intra.cpu.send_s"));
  // Without them (GPU presets, old caches) a link has none.
  const CpuCalibration none = made_up();
  EXPECT_FALSE(cluster_to_json(cpu_preset(n, &none))["intra"].contains("cpu"));
}

// Calibration method 10: a stage's forward and backward pass cost the runtime a fixed time per
// micro-batch beyond their ops. The figures survive the cache and a plan's cluster, stretch with
// workers per core, are absent (0) from a cache or cluster written before them, and stage_cost adds
// them once per micro-batch to the stage's forward and backward, whatever its ops.
TEST(Calibration, StagePassesCostAFixedTimePerMicroBatch) {
  CpuCalibration k = made_up();
  k.pass_fwd_s = 30e-6;
  k.pass_bwd_s = 40e-6;
  EXPECT_EQ(calibration_from_json(calibration_to_json(k), "k.json"), k);
  Json bad = calibration_to_json(k);
  bad["pass"]["bwd_s"] = -1;
  EXPECT_THAT(error_of([&] { calibration_from_json(bad, "k.json"); }),
              HasSubstr("k.json: pass.bwd_s: must be a non-negative number"));
  CpuCalibration none = k;
  none.pass_fwd_s = none.pass_bwd_s = 0;
  Json old = calibration_to_json(k);
  old.erase("pass");
  EXPECT_EQ(calibration_from_json(old, "k.json"), none);
  EXPECT_FALSE(calibration_to_json(none).contains("pass"));

  const Cluster c = cpu_preset(1, &k);
  EXPECT_DOUBLE_EQ(c.device.pass_fwd_s, 30e-6);
  const Cluster back = cluster_from_json(cluster_to_json(c), "c.json");
  EXPECT_DOUBLE_EQ(back.device.pass_bwd_s, 40e-6);
  EXPECT_EQ(cluster_to_json(back), cluster_to_json(c));
  EXPECT_FALSE(cluster_to_json(cpu_preset(1, &none))["device"].contains("pass"));
  Json bad_device = cluster_to_json(c);
  bad_device["device"]["pass"]["fwd_s"] = "fast";
  EXPECT_THAT(error_of([&] { cluster_from_json(bad_device, "c.json"); }), HasSubstr("c.json: device.pass.fwd_s"));
  const Cluster over = cpu_preset(2 * cores(), &k);
  EXPECT_DOUBLE_EQ(over.device.pass_bwd_s / over.device.kernel_overhead_s, 40e-6 / 20e-6);

  // Per micro-batch, once per stage: two stages pay it twice, a stage of more ops not more.
  ir::Graph g = relu_linear();
  CostModel with(g, cpu_preset(1, &k)), without(g, cpu_preset(1, &none));
  std::vector<OpId> all = g.op_ids();
  std::vector<char> in_stage(g.num_ops(), 1);
  for (int64_t mb : {1, 8}) {
    const StageCost a = stage_cost(with, all, in_stage, 1, mb, 32, true);
    const StageCost b = stage_cost(without, all, in_stage, 1, mb, 32, true);
    EXPECT_NEAR(a.fwd_s - b.fwd_s, 30e-6, 1e-12);
    EXPECT_NEAR(a.bwd_s - b.bwd_s, 40e-6, 1e-12);
    EXPECT_NEAR(a.bwd_input_s + a.bwd_weight_s, a.bwd_s, 1e-12);
    EXPECT_NEAR(a.compute_s - b.compute_s, 70e-6, 1e-12);
    EXPECT_NEAR(a.tps_s - b.tps_s, 70e-6 / static_cast<double>(mb), 1e-12);
  }
}

// Issue 35: ops in a step cost more than timed alone. The calibrated preset adds a time per call and
// one per weight byte the call touches (forward reads the weights; backward reads them again and
// writes their gradient); both stretch with workers per core like the per-op overhead; the figures
// survive the calibration's cache and a plan's recorded cluster; without them nothing changes.
TEST(Calibration, OpsInSequenceCostPerCallAndPerWeightByte) {
  CpuCalibration k = made_up();
  k.sequence_overhead_s = 3e-6;
  k.sequence_s_per_weight_byte = 0.1e-9;
  EXPECT_EQ(calibration_from_json(calibration_to_json(k), "k.json"), k);
  Json bad = calibration_to_json(k);
  bad["in_sequence"]["s_per_weight_byte"] = -1;
  EXPECT_THAT(error_of([&] { calibration_from_json(bad, "k.json"); }),
              HasSubstr("k.json: in_sequence.s_per_weight_byte: must be a non-negative number"));
  CpuCalibration alone = k;
  alone.sequence_overhead_s = alone.sequence_s_per_weight_byte = 0;
  Json old = calibration_to_json(k);
  old.erase("in_sequence");  // caches written before the fields read as 0
  EXPECT_EQ(calibration_from_json(old, "k.json"), alone);

  ir::Graph g = relu_linear();
  const OpId fc = g.find("fc"), pre = g.find("pre");
  CostModel with(g, cpu_preset(1, &k)), without(g, cpu_preset(1, &alone));
  const double weights = static_cast<double>(g.costs(fc).param_bytes);  // 64 x 64 + 64 floats
  for (int64_t b : {1, 16}) {
    EXPECT_NEAR(with.op_time(fc, b).fwd_s - without.op_time(fc, b).fwd_s, 3e-6 + weights * 0.1e-9, 1e-12);
    EXPECT_NEAR(with.op_time(fc, b).bwd_s - without.op_time(fc, b).bwd_s, 3e-6 + 2 * weights * 0.1e-9, 1e-12);
    EXPECT_NEAR(with.op_time(pre, b).fwd_s - without.op_time(pre, b).fwd_s, 3e-6, 1e-12);  // no weights
  }
  Cluster c = cpu_preset(1, &k);
  EXPECT_DOUBLE_EQ(c.device.sequence_overhead_s, 3e-6);
  Cluster back = cluster_from_json(cluster_to_json(c), "c.json");
  EXPECT_DOUBLE_EQ(back.device.sequence_s_per_weight_byte, 0.1e-9);
  EXPECT_EQ(cluster_to_json(back), cluster_to_json(c));
  EXPECT_FALSE(cluster_to_json(cpu_preset(1, &alone))["device"].contains("in_sequence"));
  // Twice as many workers as cores: every CPU-time figure doubles.
  Cluster over = cpu_preset(2 * cores(), &k);
  EXPECT_DOUBLE_EQ(over.device.sequence_overhead_s / over.device.kernel_overhead_s, 3e-6 / 20e-6);
}

// Calibration method 4: a step's activations leave the caches too. The calibrated preset adds a time
// per activation byte a call moves (forward: its inputs and output; backward twice that), which
// survives the cache and a plan's cluster, stretches with workers per core, and is absent (0) from a
// cache or cluster written before it.
TEST(Calibration, OpsInSequenceCostPerActivationByte) {
  CpuCalibration k = made_up();
  k.sequence_s_per_activation_byte = 0.05e-9;
  EXPECT_EQ(calibration_from_json(calibration_to_json(k), "k.json"), k);
  Json bad = calibration_to_json(k);
  bad["in_sequence"]["s_per_activation_byte"] = -1;
  EXPECT_THAT(error_of([&] { calibration_from_json(bad, "k.json"); }),
              HasSubstr("k.json: in_sequence.s_per_activation_byte: must be a non-negative number"));
  CpuCalibration alone = k;
  alone.sequence_s_per_activation_byte = 0;
  Json old = calibration_to_json(k);
  old["in_sequence"].erase("s_per_activation_byte");
  EXPECT_EQ(calibration_from_json(old, "k.json"), alone);

  ir::Graph g = relu_linear();
  CostModel with(g, cpu_preset(1, &k)), without(g, cpu_preset(1, &alone));
  for (OpId id : {g.find("fc"), g.find("pre")})
    for (int64_t b : {1, 16}) {
      const ir::OpCosts& c = g.costs(id);
      const double act = static_cast<double>(b) * (c.input_bytes + c.output_bytes);  // neither has extra bytes
      ASSERT_GT(act, 0);
      EXPECT_DOUBLE_EQ(activation_bytes(op_work(g, id), c, b), act);
      EXPECT_NEAR(with.op_time(id, b).fwd_s - without.op_time(id, b).fwd_s, act * 0.05e-9, 1e-12);
      EXPECT_NEAR(with.op_time(id, b).bwd_s - without.op_time(id, b).bwd_s, 2 * act * 0.05e-9, 1e-12);
    }
  Cluster c = cpu_preset(1, &k);
  Cluster back = cluster_from_json(cluster_to_json(c), "c.json");
  EXPECT_DOUBLE_EQ(back.device.sequence_s_per_activation_byte, 0.05e-9);
  EXPECT_EQ(cluster_to_json(back), cluster_to_json(c));
  EXPECT_FALSE(cluster_to_json(cpu_preset(1, &alone))["device"].contains("in_sequence"));
  Cluster over = cpu_preset(2 * cores(), &k);
  EXPECT_DOUBLE_EQ(over.device.sequence_s_per_activation_byte / over.device.kernel_overhead_s, 0.05e-9 / 20e-6);
}

// Issue 35, method 5: each memory-bound kind's own fixed time per call, on top of the relu's.
TEST(Calibration, KindOverheadPerCallOfThatKindOnly) {
  CpuCalibration k = made_up();
  k.kind_overhead_s = {{ir::OpKind::gelu, 24e-6}, {ir::OpKind::layernorm, 11e-6}};
  EXPECT_EQ(calibration_from_json(calibration_to_json(k), "k.json"), k);
  Json bad = calibration_to_json(k);
  bad["kind_overhead_s"]["gelu"] = -1;
  EXPECT_THAT(error_of([&] { calibration_from_json(bad, "k.json"); }),
              HasSubstr("k.json: kind_overhead_s.gelu: must be a non-negative number"));
  bad = calibration_to_json(k);
  bad["kind_overhead_s"]["nosuchkind"] = 1e-6;
  EXPECT_THAT(error_of([&] { calibration_from_json(bad, "k.json"); }),
              HasSubstr("k.json: kind_overhead_s.nosuchkind: is not an op kind"));
  CpuCalibration none = k;
  none.kind_overhead_s.clear();
  EXPECT_FALSE(calibration_to_json(none).contains("kind_overhead_s"));  // older files: none measured
  EXPECT_EQ(calibration_from_json(calibration_to_json(none), "k.json"), none);

  ir::ModelBuilder b("g");
  std::string x = b.input("x", {16, 32});
  x = b.unary("act", ir::OpKind::gelu, b.unary("pre", ir::OpKind::relu, x));
  b.output(b.linear("fc", x, 8));
  ir::Graph g = ir::Graph::build(b.build());
  CostModel with(g, cpu_preset(1, &k)), without(g, cpu_preset(1, &none));
  for (int64_t batch : {1, 32}) {
    EXPECT_NEAR(with.op_time(g.find("act"), batch).fwd_s - without.op_time(g.find("act"), batch).fwd_s, 24e-6, 1e-12);
    EXPECT_NEAR(with.op_time(g.find("act"), batch).bwd_s - without.op_time(g.find("act"), batch).bwd_s, 24e-6, 1e-12);
    for (const char* other : {"pre", "fc"})
      EXPECT_DOUBLE_EQ(with.op_step_time(g.find(other), batch), without.op_step_time(g.find(other), batch));
  }
  Cluster c = cpu_preset(1, &k);
  Cluster back = cluster_from_json(cluster_to_json(c), "c.json");
  EXPECT_EQ(back.device.kind_overhead_s, c.device.kind_overhead_s);
  EXPECT_EQ(cluster_to_json(back), cluster_to_json(c));
  EXPECT_FALSE(cluster_to_json(cpu_preset(1, &none))["device"].contains("kind_overhead_s"));
  Json bad_cluster = cluster_to_json(c);
  bad_cluster["device"]["kind_overhead_s"]["relu6"] = 1e-6;
  EXPECT_THAT(error_of([&] { cluster_from_json(bad_cluster, "c.json"); }),
              HasSubstr("c.json: device.kind_overhead_s.relu6: is not an op kind"));
  // More workers than cores stretch it as they stretch the relu's overhead.
  Cluster over = cpu_preset(2 * cores(), &k);
  EXPECT_DOUBLE_EQ(over.device.kind_overhead(ir::OpKind::gelu) / over.device.kernel_overhead_s, 24e-6 / 20e-6);
}

// Issue 35, method 7: a memory-bound kind timed at several sizes costs elements x its pace there,
// forward and backward apart, in place of the FLOP and bandwidth terms; other kinds keep the roofline.
TEST(Calibration, KindPacePerElementReplacesTheRooflineOfThatKind) {
  const std::vector<PacePoint> pts{{1000, 1e-9, 0.1e-9}, {100000, 2e-9, 0.4e-9}};
  EXPECT_EQ(pace_at(pts, 10), pts.front());  // outside: the nearer point's
  EXPECT_EQ(pace_at(pts, 1e7), pts.back());
  const PacePoint mid = pace_at(pts, 10000);  // halfway on log(elements)
  EXPECT_DOUBLE_EQ(mid.fwd_s, 1.5e-9);
  EXPECT_DOUBLE_EQ(mid.bwd_s, 0.25e-9);

  CpuCalibration k = made_up();
  k.kind_pace = {{ir::OpKind::gelu, pts}};
  EXPECT_EQ(calibration_from_json(calibration_to_json(k), "k.json"), k);
  Json bad = calibration_to_json(k);
  bad["kind_pace"]["gelu"][1][0] = 500;
  EXPECT_THAT(error_of([&] { calibration_from_json(bad, "k.json"); }),
              HasSubstr("k.json: kind_pace.gelu[1][0]: must be larger than the point before it (1000), found 500"));
  bad = calibration_to_json(k);
  bad["kind_pace"]["gelu"][0][2] = -1;
  EXPECT_THAT(error_of([&] { calibration_from_json(bad, "k.json"); }),
              HasSubstr("k.json: kind_pace.gelu[0][2]: must be a non-negative number"));
  bad = calibration_to_json(k);
  bad["kind_pace"]["gelu"] = Json::array();
  EXPECT_THAT(error_of([&] { calibration_from_json(bad, "k.json"); }),
              HasSubstr("k.json: kind_pace.gelu: must be a non-empty list"));
  bad = calibration_to_json(k);
  bad["kind_pace"]["nosuchkind"] = bad["kind_pace"]["gelu"];
  EXPECT_THAT(error_of([&] { calibration_from_json(bad, "k.json"); }),
              HasSubstr("k.json: kind_pace.nosuchkind: is not an op kind"));
  CpuCalibration none = k;
  none.kind_pace.clear();
  EXPECT_FALSE(calibration_to_json(none).contains("kind_pace"));  // before method 7

  // The gelu's largest tensor is its input or output, 16 x 32 = 512 elements per sample.
  ir::ModelBuilder b("g");
  std::string x = b.input("x", {16, 32});
  x = b.unary("act", ir::OpKind::gelu, b.unary("pre", ir::OpKind::relu, x));
  b.output(b.linear("fc", x, 8));
  ir::Graph g = ir::Graph::build(b.build());
  EXPECT_EQ(op_work(g, g.find("act")).elems, 512);
  CostModel with(g, cpu_preset(1, &k)), without(g, cpu_preset(1, &none));
  for (int64_t batch : {1, 32, 8192}) {
    const double n = 512.0 * static_cast<double>(batch);
    const PacePoint p = pace_at(pts, n);
    const OpTime t = with.op_time(g.find("act"), batch);
    EXPECT_NEAR(t.fwd_s, n * p.fwd_s + 20e-6, 1e-12) << batch;  // + the per-op overhead
    EXPECT_NEAR(t.bwd_s, n * p.bwd_s + 20e-6, 1e-12) << batch;
    for (const char* other : {"pre", "fc"})
      EXPECT_DOUBLE_EQ(with.op_step_time(g.find(other), batch), without.op_step_time(g.find(other), batch));
  }
  Cluster c = cpu_preset(1, &k);
  EXPECT_EQ(cluster_from_json(cluster_to_json(c), "c.json").device.kind_pace, c.device.kind_pace);
  EXPECT_FALSE(cluster_to_json(cpu_preset(1, &none))["device"].contains("kind_pace"));
  // More workers than cores stretch it as they stretch the per-op overhead.
  Cluster over = cpu_preset(2 * cores(), &k);
  EXPECT_DOUBLE_EQ(over.device.kind_pace.at(ir::OpKind::gelu)[1].fwd_s / over.device.kernel_overhead_s, 2e-9 / 20e-6);
}

// Issue 35, method 8: a kind's extra per call in a step, signed, interpolated like the pace, on the
// call's fixed time (never below nothing); JSON keeps the sign.
TEST(Calibration, KindInSequenceAddsSignedTimePerCall) {
  CpuCalibration k = made_up();
  k.kind_in_sequence = {{ir::OpKind::gelu, {{512, -30e-6, 5e-6}, {16384, 10e-6, 40e-6}}}};
  EXPECT_EQ(calibration_from_json(calibration_to_json(k), "k.json"), k);
  Json bad = calibration_to_json(k);
  bad["kind_in_sequence"]["gelu"][0][1] = "x";
  EXPECT_THAT(error_of([&] { calibration_from_json(bad, "k.json"); }),
              HasSubstr("k.json: kind_in_sequence.gelu[0][1]"));
  CpuCalibration none = k;
  none.kind_in_sequence.clear();
  EXPECT_FALSE(calibration_to_json(none).contains("kind_in_sequence"));

  ir::ModelBuilder b("g");
  std::string x = b.input("x", {16, 32});  // 512 elements per sample
  x = b.unary("act", ir::OpKind::gelu, b.unary("pre", ir::OpKind::relu, x));
  b.output(b.linear("fc", x, 8));
  ir::Graph g = ir::Graph::build(b.build());
  CostModel with(g, cpu_preset(1, &k)), without(g, cpu_preset(1, &none));
  const OpId act = g.find("act");
  // Batch 1: -30 us on a 20 us call leaves nothing of the call forward; +5 us backward.
  EXPECT_NEAR(with.op_time(act, 1).fwd_s, without.op_time(act, 1).fwd_s - 20e-6, 1e-12);
  EXPECT_NEAR(with.op_time(act, 1).bwd_s - without.op_time(act, 1).bwd_s, 5e-6, 1e-12);
  // Batch 32 (16 K elements) and beyond: the larger point's.
  for (int64_t batch : {32, 1024}) {
    EXPECT_NEAR(with.op_time(act, batch).fwd_s - without.op_time(act, batch).fwd_s, 10e-6, 1e-12);
    EXPECT_NEAR(with.op_time(act, batch).bwd_s - without.op_time(act, batch).bwd_s, 40e-6, 1e-12);
    EXPECT_DOUBLE_EQ(with.op_step_time(g.find("fc"), batch), without.op_step_time(g.find("fc"), batch));
  }
  Cluster c = cpu_preset(1, &k);
  EXPECT_EQ(cluster_from_json(cluster_to_json(c), "c.json").device.kind_in_sequence, c.device.kind_in_sequence);
}

// A reduction's and a concat's largest tensor is an input; a loss's its logits.
TEST(Calibration, OpWorkElementsAreTheLargestTensors) {
  ir::ModelBuilder b("g");
  std::string x = b.input("x", {16, 64});
  std::string m = b.op("m", ir::OpKind::mean, {x}, {{"axis", 1}});
  std::string c = b.op("c", ir::OpKind::concat, {m, m}, {{"axis", 1}});
  std::string y = b.linear("fc", c, 10);
  b.output(b.op("loss", ir::OpKind::cross_entropy, {y, b.input("label", {}, ir::DType::i64)}));
  ir::Graph g = ir::Graph::build(b.build());
  EXPECT_EQ(op_work(g, g.find("m")).elems, 1024);
  EXPECT_EQ(op_work(g, g.find("c")).elems, 128);
  EXPECT_EQ(op_work(g, g.find("loss")).elems, 10);
}

// Issue 35: LibTorch's optimizers loop over the parameter tensors; the calibrated preset prices a
// step per parameter and per tensor, and the stage cost counts the stage's tensors (a linear's
// weight and bias are two, a layernorm's two, an attention's eight).
TEST(Calibration, OptimizerStepPaysPerParameterAndPerTensor) {
  CpuCalibration k = made_up();
  k.adam_step_s_per_param = 1.4e-9;
  k.adam_step_s_per_tensor = 20e-6;
  k.sgd_step_s_per_tensor = 5e-6;
  k.sgd_step_s_per_param = 0.3e-9;
  EXPECT_EQ(calibration_from_json(calibration_to_json(k), "k.json"), k);
  Json old = calibration_to_json(k);
  old.erase("optimizer_step_s_per_tensor");
  EXPECT_EQ(calibration_from_json(old, "k.json").adam_step_s_per_tensor, 0);

  ir::ModelBuilder b("g");
  std::string x = b.input("x", {16, 32});
  x = b.op("ln", ir::OpKind::layernorm, {b.linear("fc", x, 32)});
  x = b.op("att", ir::OpKind::attention, {x}, {{"heads", 2}});
  b.output(x);
  ir::Graph g = ir::Graph::build(b.build());
  EXPECT_EQ(g.costs(g.find("fc")).param_tensors, 2);
  EXPECT_EQ(g.costs(g.find("ln")).param_tensors, 2);
  EXPECT_EQ(g.costs(g.find("att")).param_tensors, 8);
  Cluster c = cpu_preset(1, &k);
  CostModel cm(g, c, Optimizer::adam), sgd(g, c, Optimizer::sgd);
  EXPECT_DOUBLE_EQ(cm.optimizer_s_per_tensor(), 20e-6);
  std::vector<OpId> ops = g.op_ids();
  std::vector<char> all(g.num_ops(), 1);
  StageCost s = stage_cost(cm, ops, all, 1, 4, 4, true);
  EXPECT_EQ(s.param_tensors, 12);
  EXPECT_NEAR(s.optimizer_s, 1.4e-9 * static_cast<double>(g.total_params()) + 12 * 20e-6, 1e-12);
  EXPECT_NEAR(stage_cost(sgd, ops, all, 1, 4, 4, true).optimizer_s,
              0.3e-9 * static_cast<double>(g.total_params()) + 12 * 5e-6, 1e-12);
  EXPECT_EQ(cluster_to_json(cluster_from_json(cluster_to_json(c), "c.json")), cluster_to_json(c));
  EXPECT_DOUBLE_EQ(cluster_from_json(cluster_to_json(c), "c.json").device.adam_step_s_per_tensor, 20e-6);
  // A profile's measured step holds the model's own tensors: nothing per tensor on top.
  auto prof = std::make_shared<Profile>();
  prof->optimizer["adam"] = OptimizerStep{1000, 1e-3};
  EXPECT_EQ(CostModel(g, c, Optimizer::adam, prof).optimizer_s_per_tensor(), 0);
}
