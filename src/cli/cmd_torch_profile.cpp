// `graphpipe profile`: measure each distinct op of a model with LibTorch on this machine (and with
// --links the p2p / all-reduce links between local worker processes) and write graphpipe.profile/1
// for `--cluster cpu --profile F` in plan/simulate. Also the hidden `link-worker` subcommand.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <iostream>
#include <memory>

#include "cli/command.h"
#include "cost/profile.h"
#include "importers/resolve.h"
#include "profiler/profiler.h"
#include "runtime/launch/link_bench.h"
#include "runtime/base/train.h"
#include "runtime/exec/build_info.h"
#include "runtime/exec/memory_report.h"
#include "support/error.h"
#include "support/memory.h"

namespace gp::cli {
namespace {

constexpr int kMaxRepeats = 100000;
constexpr int64_t kMaxLinkBytes = int64_t{1} << 30;

struct ProfileArgs {
  std::string spec, out = "profile.json", batches = "1,2,4,8", link_sizes, clock = "wall", device = "cpu";
  int warmup = 2, repeats = 5, threads = 1;
  bool json = false, links = false, no_context = false;
};

void run(const ProfileArgs& a) {
  GP_CHECK(!a.spec.empty() || a.links, "profile: needs --model SPEC, --links, or both");
  runtime::check_device_available(a.device);  // --device cuda without CUDA: exit 2 before any work
  GP_CHECK(!a.links || a.device == "cpu",
           "profile --links --device {}: --links measures Gloo between two CPU processes; measure GPU links "
           "separately (nccl-tests) and write them into a cluster file",
           a.device);
  GP_CHECK(a.repeats >= 1 && a.repeats <= kMaxRepeats, "--repeats must be in [1, {}], found {}", kMaxRepeats,
           a.repeats);
  GP_CHECK(a.warmup >= 0 && a.warmup <= kMaxRepeats, "--warmup must be in [0, {}], found {}", kMaxRepeats, a.warmup);
  GP_CHECK(a.threads >= 1 && a.threads <= runtime::kMaxThreads, "--threads must be in [1, {}], found {}",
           runtime::kMaxThreads, a.threads);
  auto t0 = std::chrono::steady_clock::now();
  cost::Profile p;
  std::string model = "-";
  if (!a.spec.empty()) {
    ir::Graph g = importers::load_graph(a.spec);
    model = g.name();
    profiler::ProfileOptions opt;
    opt.batches = profiler::parse_batches(a.batches, "--batches");
    // The largest op run alone at the largest batch: its weights (and gradients) plus its inputs,
    // output and saved activations.
    double worst = 0;
    int64_t max_batch = *std::max_element(opt.batches.begin(), opt.batches.end());
    for (OpId id : g.op_ids()) {
      const ir::OpCosts& c = g.costs(id);
      worst = std::max(worst, 2.0 * static_cast<double>(c.param_bytes) +
                                  static_cast<double>(max_batch) * (c.input_bytes + c.output_bytes + c.saved_bytes));
    }
    check_fits_in_memory(worst, fmt::format("profile --batches {}", max_batch),
                         "the largest op's weights, gradients and activations at that batch");
    opt.warmup = a.warmup;
    opt.repeats = a.repeats;
    opt.threads = a.threads;
    GP_CHECK(a.clock == "wall" || a.clock == "cpu", "--clock: expected wall or cpu, found \"{}\"", a.clock);
    opt.cpu_clock = a.clock == "cpu";
    opt.device = a.device;
    GP_CHECK(!opt.cpu_clock || a.threads == 1, "--clock cpu: needs --threads 1 (found {}): it times the calling thread",
             a.threads);
    opt.context = !a.no_context;
    if (opt.context) {  // the whole model at the largest batch: weights, gradients, Adam state, activations
      const double whole = runtime::training_bytes_estimate(g, g.op_ids(), static_cast<double>(max_batch), "adam");
      if (whole > machine_memory_bytes()) {
        opt.context = false;
        std::cerr << fmt::format(
            "note: not timing the whole model in sequence: at batch {} it needs about {:.3g} GB (weights, "
            "gradients, Adam state, activations) and this machine has {:.3g} GB; the profile's op times are "
            "used as measured alone\n",
            max_batch, whole / 1e9, machine_memory_bytes() / 1e9);
      }
    }
    p = profiler::profile_graph(g, opt, &std::cerr);
  } else {
    p.device = profiler::describe_device(a.threads, a.device);
  }
  if (a.links) {
    profiler::LinkOptions lo;
    if (!a.link_sizes.empty()) lo.sizes_bytes = profiler::parse_batches(a.link_sizes, "--link-sizes");
    for (int64_t s : lo.sizes_bytes)
      GP_CHECK(s <= kMaxLinkBytes, "--link-sizes: {} bytes is above the largest message measured, {} (1 GiB)", s,
               kMaxLinkBytes);
    lo.warmup = a.warmup;
    lo.repeats = std::max(a.repeats, 3);
    profiler::profile_links(p, lo, &std::cerr);
  }
  double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  cost::save_profile(a.out, p);
  if (a.json) {
    Json out = {{"format", "graphpipe.profile_run/1"}, {"out", a.out}, {"model", model}, {"device", p.device},
                {"signatures", p.ops.size()},          {"seconds", dt}};
    if (p.p2p) out["p2p"] = {{"latency_s", p.p2p->latency_s}, {"bandwidth_Bps", p.p2p->bandwidth_Bps}};
    if (p.allreduce)
      out["allreduce"] = {{"latency_s", p.allreduce->latency_s}, {"bandwidth_Bps", p.allreduce->bandwidth_Bps}};
    std::printf("%s\n", out.dump(1).c_str());
    return;
  }
  if (!a.spec.empty())
    std::printf("wrote %s: %zu op signatures of %s at batches %s on %s (%.1f s)\n", a.out.c_str(), p.ops.size(),
                model.c_str(), a.batches.c_str(), p.device.c_str(), dt);
  else std::printf("wrote %s: links only, on %s (%.1f s)\n", a.out.c_str(), p.device.c_str(), dt);
  if (p.p2p)
    std::printf(
        "links: p2p latency %.1f us, bandwidth %.3f GB/s; all-reduce (2 ranks) latency %.1f us, "
        "bandwidth %.3f GB/s\n",
        p.p2p->latency_s * 1e6, p.p2p->bandwidth_Bps / 1e9, p.allreduce->latency_s * 1e6,
        p.allreduce->bandwidth_Bps / 1e9);
}

Registrar reg(70, [](CLI::App& root) {
  auto a = std::make_shared<ProfileArgs>();
  auto* c = root.add_subcommand("profile",
                                "Measure operator costs on this machine with LibTorch (graphpipe.profile/1)");
  c->add_option("--model", a->spec, "Model spec or file (optional with --links)");
  c->add_option("--out", a->out, "Output profile file")->capture_default_str();
  c->add_option("--batches", a->batches, "Per-device batch sizes to measure")->capture_default_str();
  c->add_option("--warmup", a->warmup, "Untimed calls before measuring")->capture_default_str();
  c->add_option("--repeats", a->repeats, "Timed calls; the median is recorded")->capture_default_str();
  c->add_option("--threads", a->threads, "LibTorch intra-op threads")->capture_default_str();
  c->add_option("--clock", a->clock,
                "wall, or cpu: the thread's CPU time (with --threads 1), which leaves out the time other jobs on "
                "a shared machine take from it")
      ->capture_default_str();
  c->add_option("--device", a->device,
                "cpu, or cuda: time the ops on GPU 0 (synchronized before and after each timed call)")
      ->capture_default_str();
  c->add_flag("--json", a->json, "Print a machine-readable summary");
  c->add_flag("--links", a->links,
              "Also measure p2p and all-reduce over c10d Gloo between 2 local processes and store the "
              "fitted latency + bandwidth (p2p, allreduce); each size keeps its median of max(--repeats, 3) "
              "repeats. Also measures the lockstep factor: two cores running the same GEMMs round by "
              "round, the slower one's mean over one core's (the cost model stretches profiled op "
              "times of plans with 2 or more workers by it)");
  c->add_flag("--no-context", a->no_context,
              "Skip timing the whole model in sequence (the cost model's in-sequence factor over ops timed "
              "alone) and the optimizer step; for a model too large to run whole here");
  c->add_option("--link-sizes", a->link_sizes,
                "Message sizes in bytes for --links (default 4096,65536,262144,1048576,4194304,16777216)");
  c->callback([a] { run(*a); });

  auto lo = std::make_shared<runtime::LinkBenchOptions>();
  auto sizes = std::make_shared<std::string>();
  auto* w = root.add_subcommand("link-worker", "");  // hidden: one of the two --links processes
  w->group("");
  w->add_option("--sizes", *sizes)->required();
  w->add_option("--warmup", lo->warmup);
  w->add_option("--repeats", lo->repeats);
  w->add_option("--lockstep-rounds", lo->lockstep_rounds);
  w->add_option("--timeout", lo->timeout_s);
  w->add_option("--busy", lo->busy);
  w->callback([lo, sizes] {
    lo->sizes_bytes = profiler::parse_batches(*sizes, "--sizes");
    for (int64_t s : lo->sizes_bytes)
      GP_CHECK(s <= kMaxLinkBytes, "--sizes: {} bytes is above the largest message measured, {}", s, kMaxLinkBytes);
    int code = runtime::run_link_worker(*lo);
    if (code != 0) std::exit(code);
  });
});

}  // namespace
}  // namespace gp::cli
