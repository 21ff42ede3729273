// `graphpipe profile`: measure each distinct op of a model with LibTorch on this machine and write
// graphpipe.profile/1 for `--cluster cpu --profile F` in plan/simulate.
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>

#include "cli/command.h"
#include "cost/profile.h"
#include "importers/resolve.h"
#include "profiler/profiler.h"
#include "support/error.h"

namespace gp::cli {
namespace {

struct ProfileArgs {
  std::string spec, out = "profile.json", batches = "1,2,4,8";
  int warmup = 2, repeats = 5, threads = 1;
  bool json = false;
};

void run(const ProfileArgs& a) {
  ir::Graph g = importers::load_graph(a.spec);
  profiler::ProfileOptions opt;
  opt.batches = profiler::parse_batches(a.batches, "--batches");
  GP_CHECK(a.repeats >= 1, "--repeats must be >= 1, found {}", a.repeats);
  GP_CHECK(a.warmup >= 0, "--warmup must be >= 0, found {}", a.warmup);
  opt.warmup = a.warmup;
  opt.repeats = a.repeats;
  opt.threads = a.threads;
  auto t0 = std::chrono::steady_clock::now();
  cost::Profile p = profiler::profile_graph(g, opt, &std::cerr);
  double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  cost::save_profile(a.out, p);
  if (a.json) {
    Json out = {{"format", "graphpipe.profile_run/1"}, {"out", a.out}, {"model", g.name()},
                {"device", p.device}, {"signatures", p.ops.size()}, {"seconds", dt}};
    std::printf("%s\n", out.dump(1).c_str());
  } else {
    std::printf("wrote %s: %zu op signatures of %s at batches %s on %s (%.1f s)\n", a.out.c_str(), p.ops.size(),
                g.name().c_str(), a.batches.c_str(), p.device.c_str(), dt);
  }
}

Registrar reg(70, [](CLI::App& root) {
  auto a = std::make_shared<ProfileArgs>();
  auto* c = root.add_subcommand("profile", "Measure operator costs on this machine with LibTorch (graphpipe.profile/1)");
  c->add_option("--model", a->spec, "Model spec or file")->required();
  c->add_option("--out", a->out, "Output profile file")->capture_default_str();
  c->add_option("--batches", a->batches, "Per-device batch sizes to measure")->capture_default_str();
  c->add_option("--warmup", a->warmup, "Untimed calls before measuring")->capture_default_str();
  c->add_option("--repeats", a->repeats, "Timed calls; the median is recorded")->capture_default_str();
  c->add_option("--threads", a->threads, "LibTorch intra-op threads")->capture_default_str();
  c->add_flag("--json", a->json, "Print a machine-readable summary");
  c->callback([a] { run(*a); });
});

}  // namespace
}  // namespace gp::cli
