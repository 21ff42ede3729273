// `graphpipe calibrate`: measure this machine for the `cpu` preset (per-op overhead, GEMM rate,
// bandwidth of memory-bound ops, loopback link) and cache it; also installs the calibration source
// that `--cluster cpu` uses in this (LibTorch) build: the cache, or a measurement on first use.
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <optional>

#include "cli/command.h"
#include "cost/calibration.h"
#include "cost/profile.h"
#include "importers/resolve.h"
#include "profiler/calibrate.h"
#include "support/error.h"

namespace gp::cli {
namespace {

struct CalibrateArgs {
  bool json = false, no_links = false, show = false;
  int repeats = 2, passes = 9;
  std::string compare, model;
};

/// Per op kind, summed over every op of the model: the profile's measured fwd + bwd against the
/// calibrated preset's roofline, at each batch the profile measured.
void compare(const std::string& model, const std::string& profile_path) {
  GP_CHECK(!model.empty(), "calibrate --compare: needs --model SPEC (the model the profile was measured on)");
  ir::Graph g = importers::load_graph(model);
  cost::Profile prof = cost::load_profile(profile_path);
  cost::CostModel cm(g, cost::load_cluster("cpu", 1));
  std::map<std::string, std::map<int64_t, std::pair<double, double>>> by_kind;  // kind -> b -> (measured, model)
  for (OpId op : g.op_ids()) {
    auto it = prof.ops.find(cm.signature(op));
    if (it == prof.ops.end()) continue;
    const cost::OpMeasurement& m = it->second;
    for (size_t i = 0; i < m.batches.size(); ++i) {
      cost::OpTime r = cm.op_time(op, m.batches[i]);
      auto& [meas, fit] = by_kind[m.kind][m.batches[i]];
      meas += m.fwd_s[i] + m.bwd_s[i];
      fit += r.fwd_s + r.bwd_s;
    }
  }
  GP_CHECK(!by_kind.empty(), "calibrate --compare: {} measures none of {}'s ops", profile_path, g.name());
  std::printf("%s: measured (profile %s) vs the calibrated cpu preset, fwd + bwd summed over the model's ops, ms\n",
              g.name().c_str(), profile_path.c_str());
  if (cm.cluster().device.sequence_overhead_s > 0 || cm.cluster().device.sequence_s_per_weight_byte > 0)
    std::printf(
        "  (the preset prices ops as in a step, the profile times each alone: model/measured above 1 "
        "by the ops-in-sequence figures)\n");
  std::map<int64_t, std::pair<double, double>> total;
  for (const auto& [kind, rows] : by_kind)
    for (const auto& [b, t] : rows) {
      std::printf("  %-14s b=%-4lld measured %10.3f  model %10.3f  model/measured %5.2f\n", kind.c_str(),
                  static_cast<long long>(b), t.first * 1e3, t.second * 1e3, t.second / t.first);
      total[b].first += t.first;
      total[b].second += t.second;
    }
  for (const auto& [b, t] : total)
    std::printf("  %-14s b=%-4lld measured %10.3f  model %10.3f  model/measured %5.2f\n", "all ops",
                static_cast<long long>(b), t.first * 1e3, t.second * 1e3, t.second / t.first);
}

void print(const profiler::CalibrationResult& r, const std::string& path) {
  const cost::CpuCalibration& k = r.calibration;
  std::printf("cpu preset calibration: %s, %d cores, LibTorch %s, %s (%.1f s)\n", k.cpu_model.c_str(), k.cores,
              k.torch_version.c_str(), k.measured_at.c_str(), k.seconds);
  std::printf("  GEMM %.1f GFLOP/s per thread, N0 %.1f rows; memory-bound ops %.2f GB/s; per-op overhead %.1f us\n",
              k.gemm_flops / 1e9, k.gemm_n0_rows, k.mem_bandwidth_Bps / 1e9, k.kernel_overhead_s * 1e6);
  std::printf("  per call on top of it: linear %.1f us, attention %.1f us (attention at %.3f of the GEMM curve)\n",
              k.gemm_overhead_s * 1e6, k.attention_overhead_s * 1e6, k.attention_efficiency);
  std::printf("  optimizer step: SGD %.2f ms per million parameters + %.1f us per tensor, Adam %.2f ms + %.1f us\n",
              k.sgd_step_s_per_param * 1e9, k.sgd_step_s_per_tensor * 1e6, k.adam_step_s_per_param * 1e9,
              k.adam_step_s_per_tensor * 1e6);
  if (k.sequence_overhead_s > 0 || k.sequence_s_per_weight_byte > 0)
    std::printf(
        "  ops in sequence (as in a step) against alone: %.2f us more per call, %.3f ns per weight byte touched\n",
        k.sequence_overhead_s * 1e6, k.sequence_s_per_weight_byte * 1e9);
  if (!k.kind_in_sequence.empty()) {
    std::string kinds;
    for (const auto& [kind, pts] : k.kind_in_sequence)
      kinds += fmt::format("{}{} {:+.0f}/{:+.0f}", kinds.empty() ? "" : ", ", ir::to_string(kind),
                           pts.back().fwd_s * 1e6, pts.back().bwd_s * 1e6);
    std::printf("  each kind in sequence, us per call forward/backward at %.0f K floats: %s\n",
                k.kind_in_sequence.begin()->second.back().elems / 1024, kinds.c_str());
  }
  if (k.pass_fwd_s > 0 || k.pass_bwd_s > 0)
    std::printf("  a stage's passes beyond their ops (per micro-batch): %.1f us forward, %.1f us backward\n",
                k.pass_fwd_s * 1e6, k.pass_bwd_s * 1e6);
  std::printf("  loopback link: %.1f us + %.2f GB/s; two cores in lockstep: %.3f of one core's pace\n",
              k.link_latency_s * 1e6, k.link_bandwidth_Bps / 1e9, 1 / k.lockstep);
  if (k.busy_link_latency_s > 0)
    std::printf(
        "  the link while every core computes: %.1f us + %.2f GB/s, all-reduce %.1f us per ring step + %.2f GB/s "
        "(plans with a worker on every core)\n",
        k.busy_link_latency_s * 1e6, k.link_bandwidth_Bps / 1e9, k.busy_allreduce_latency_s * 1e6,
        k.reduce_bandwidth_Bps() / 1e9);
  if (k.busy_message_cpu.any())
    std::printf("  a message's CPU time there: %.1f us + %.3f ns/B sending, %.1f us + %.3f ns/B receiving\n",
                k.busy_message_cpu.send_s * 1e6, k.busy_message_cpu.send_s_per_byte * 1e9,
                k.busy_message_cpu.recv_s * 1e6, k.busy_message_cpu.recv_s_per_byte * 1e9);
  if (!r.points.empty()) {
    std::printf("  %-36s %12s %12s %8s\n", "op (forward + backward)", "measured ms", "model ms", "ratio");
    for (const auto& p : r.points)
      std::printf("  %-36s %12.4f %12.4f %8.2f\n", p.what.c_str(), p.measured_s * 1e3, p.fitted_s * 1e3,
                  p.fitted_s / p.measured_s);
  }
  std::printf("%s %s\n", r.points.empty() ? "cached in" : "wrote", path.c_str());
}

void run(const CalibrateArgs& a) {
  if (!a.compare.empty()) return compare(a.model, a.compare);
  GP_CHECK(a.repeats >= 1 && a.repeats <= 1000, "--repeats must be in [1, 1000], found {}", a.repeats);
  GP_CHECK(a.passes >= 1 && a.passes <= 100, "--passes must be in [1, 100], found {}", a.passes);
  std::string path = profiler::calibration_cache_file();
  profiler::CalibrationResult r;
  if (a.show) {
    GP_CHECK(!path.empty(), "calibrate --show: no cache directory (set HOME, XDG_CACHE_HOME or GRAPHPIPE_CACHE_DIR)");
    r.calibration = cost::calibration_from_json(read_json_file(path), path);
  } else {
    profiler::CalibrateOptions o;
    o.repeats = a.repeats;
    o.passes = a.passes;
    o.links = !a.no_links;
    r = profiler::calibrate_cpu(o, &std::cerr);
    if (o.links && !path.empty()) {  // a calibration without its link is not cached
      std::error_code ec;
      std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
      write_json_file(path, cost::calibration_to_json(r.calibration));
    }
  }
  if (a.json) {
    Json j = cost::calibration_to_json(r.calibration);
    j["cache_file"] = path;
    for (const auto& p : r.points)
      j["points"].push_back({{"op", p.what}, {"measured_s", p.measured_s}, {"model_s", p.fitted_s}});
    std::printf("%s\n", j.dump(1).c_str());
    return;
  }
  print(r, a.no_links ? "(not cached: --no-links)" : path);
}

Registrar reg(75, [](CLI::App& root) {
  // --cluster cpu in this build: this machine's cached calibration; `plan` and `simulate` measure it
  // when none is cached (or GRAPHPIPE_CALIBRATION=refresh). Other commands (train comparing its
  // time with a plan's prediction, the workers) only read the cache: no surprise measurement there.
  CLI::App* app = &root;
  cost::set_calibration_source([app]() -> std::optional<cost::CpuCalibration> {
    bool planning = app->got_subcommand("plan") || app->got_subcommand("simulate");
    if (planning) return profiler::cached_or_calibrate(cost::calibration_env() == "refresh", &std::cerr);
    return profiler::cached_calibration();
  });
  auto a = std::make_shared<CalibrateArgs>();
  auto* c = root.add_subcommand(
      "calibrate",
      "Measure this machine for the cpu preset (GEMM rate, bandwidth, per-op overhead, each memory-bound kind's "
      "time per element, attention alone and in sequence, optimizer step, "
      "loopback link idle and between computing cores, a message's CPU time at both ends, a stage's passes beyond "
      "their ops) and cache it; --cluster cpu does this on first use");
  c->add_flag("--show", a->show, "Print the cached calibration instead of measuring");
  c->add_flag("--no-links", a->no_links, "Skip the link measurement (the result is then not cached)");
  c->add_option("--repeats", a->repeats,
                "Timed calls per op and batch in each pass (after one untimed call); their median is used")
      ->capture_default_str();
  c->add_option("--passes", a->passes,
                "Passes over the op timings, spread before, between and after the link measurements; each "
                "timing's median over them is fitted (one pass: ~2.5 s on 2 cores)")
      ->capture_default_str();
  c->add_flag("--json", a->json, "Print graphpipe.calibration/1 with every timing on stdout");
  c->add_option("--compare", a->compare,
                "A profile (graphpipe profile) of --model: print its measured op times beside the calibrated "
                "preset's, per op kind");
  c->add_option("--model", a->model, "The model of --compare");
  c->callback([a] { run(*a); });
});

}  // namespace
}  // namespace gp::cli
