// `graphpipe piper-export`: write the instance msr-fiddle/piper's algo.cpp reads for one model,
// cluster and micro-batch size, from our cost model on our Piper baseline's coarse graph
// (planner::piper_instance; scripts/real_piper.sh runs real Piper on it).
#include <cstdio>
#include <memory>

#include "cli/command.h"
#include "cost/cost_model.h"
#include "importers/resolve.h"
#include "planner/planner.h"

namespace gp::cli {
namespace {

struct ExportArgs {
  std::string model, cluster = "summit", optimizer = "adam", out;
  int devices = 0, batch = 0, micro_batch = 0;
  double memory_limit_gb = 0, time_limit_s = 600;
};

void run(const ExportArgs& a) {
  GP_CHECK(a.devices >= 1, "--devices: need at least 1 device, got {}", a.devices);
  GP_CHECK(a.memory_limit_gb >= 0, "--memory-limit: must be >= 0 GB, got {}", a.memory_limit_gb);
  ir::Graph g = importers::load_graph(a.model);
  cost::Cluster c = cost::load_cluster(a.cluster, a.devices);
  cost::CostModel cm(g, c, cost::optimizer_from_string(a.optimizer));
  planner::PlannerOptions o;
  o.mini_batch = a.batch;
  o.micro_batch = a.micro_batch;
  o.planner = "piper";
  o.memory_limit_bytes = a.memory_limit_gb * 1e9;
  o.time_limit_s = a.time_limit_s;
  const std::string text = planner::piper_instance(cm, o).dump(1) + "\n";
  if (a.out.empty()) std::fputs(text.c_str(), stdout);
  else write_text_file(a.out, text);
}

Registrar reg(25, [](CLI::App& root) {
  auto a = std::make_shared<ExportArgs>();
  auto* c = root.add_subcommand("piper-export",
                                "Write msr-fiddle/piper's input (algo.cpp's JSON) for one micro-batch size, from our "
                                "cost model on the coarse graph our Piper baseline runs on");
  c->add_option("--model", a->model, "Model spec: builtin[:k=v,...] or a .json/.onnx file")->required();
  c->add_option("--cluster", a->cluster, "Cluster preset or graphpipe.cluster/1 file")->capture_default_str();
  c->add_option("--devices", a->devices, "Number of devices (Piper's maxDevices)")->required();
  c->add_option("--batch", a->batch, "Mini-batch size (samples per iteration)")->required();
  c->add_option("--micro-batch", a->micro_batch, "Micro-batch size: Piper's 'sample' (must divide --batch)")
      ->required();
  c->add_option("--optimizer", a->optimizer, "adam | sgd")->capture_default_str();
  c->add_option("--memory-limit", a->memory_limit_gb,
                "Per-device memory in GB (default: the device's); the preset's reserve is taken off it");
  c->add_option("--time-limit", a->time_limit_s,
                "Coarsen the graph as `plan --planner piper --micro-batch M --time-limit S` does")
      ->capture_default_str();
  c->add_option("--out", a->out, "Write the instance here (default: stdout)");
  c->callback([a] { run(*a); });
});

}  // namespace
}  // namespace gp::cli
