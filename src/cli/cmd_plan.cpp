// `graphpipe plan`: search a GPP strategy and print it as a table (or JSON), optionally writing the
// plan file, an explanation and a Graphviz drawing of the stage graph.
#include <cstdio>
#include <memory>

#include "cli/command.h"
#include "cost/cost_model.h"
#include "cost/profile.h"
#include "importers/resolve.h"
#include "plan/costs.h"
#include "plan/schedule_kind.h"
#include "planner/planner.h"

namespace gp::cli {
namespace {

struct PlanArgs {
  std::string model, cluster = "summit", planner = "graphpipe", optimizer = "adam", profile, out, dot;
  std::string schedule = "1f1b";
  int devices = 0, batch = 0, micro_batch = 0;
  bool no_data_parallel = false;
  double memory_limit_gb = 0, time_limit_s = 600;
  bool json = false, explain = false;
};

std::string stage_dot(const plan::Plan& p) {
  std::string s = "digraph stages {\n  rankdir=LR;\n  node [shape=box];\n";
  for (const auto& st : p.stages) {
    std::string devs;
    for (int d : st.devices) devs += (devs.empty() ? "" : ",") + std::to_string(d);
    s += fmt::format(
        "  s{} [label=\"stage {}\\n{} ops: {} .. {}\\ndevices {}\\nmb {} in-flight {}\\n{:.3g} ms/sample\"];\n", st.id,
        st.id, st.ops.size(), st.ops.front(), st.ops.back(), devs, st.micro_batch_size, st.in_flight, st.tps_s * 1e3);
  }
  for (const auto& st : p.stages)
    for (int t : st.outputs_to) s += fmt::format("  s{} -> s{};\n", st.id, t);
  return s + "}\n";
}

void run(const PlanArgs& a) {
  GP_CHECK(a.devices >= 1, "--devices: need at least 1 device, got {}", a.devices);
  GP_CHECK(a.memory_limit_gb >= 0, "--memory-limit: must be >= 0 GB, got {}", a.memory_limit_gb);
  ir::Graph g = importers::load_graph(a.model);
  cost::Cluster c = cost::load_cluster(a.cluster, a.devices);
  std::shared_ptr<const cost::Profile> prof;
  if (!a.profile.empty()) prof = std::make_shared<cost::Profile>(cost::load_profile(a.profile));
  cost::CostModel cm(g, c, cost::optimizer_from_string(a.optimizer), prof);
  planner::PlannerOptions o;
  o.mini_batch = a.batch;
  o.micro_batch = a.micro_batch;
  o.whole_model = !a.no_data_parallel;
  o.planner = a.planner;
  o.schedule = a.schedule;
  o.memory_limit_bytes = a.memory_limit_gb * 1e9;
  o.time_limit_s = a.time_limit_s;
  o.explain = a.explain;
  o.progress = true;
  planner::PlanReport rep = planner::run_planner_report(cm, o);
  plan::Plan& p = rep.plan;
  p.model_spec = a.model;
  p.cluster_spec = a.cluster;
  plan::record_costs(p, c, prof.get(), a.profile);
  plan::validate_plan(p, g, "planner output");
  for (const std::string& w : plan::micro_batch_warnings(p, g))
    std::fprintf(stderr, "graphpipe: warning: %s\n", w.c_str());
  if (!a.out.empty()) plan::save_plan(a.out, p);
  if (!a.dot.empty()) write_text_file(a.dot, stage_dot(p));
  if (a.json) {
    std::printf("%s\n", plan::plan_to_json(p).dump(1).c_str());
    return;
  }
  std::printf("%s plan for %s (%zu ops) on %d x %s (%s), mini-batch %d, %s%s\n", p.planner.c_str(), g.name().c_str(),
              g.num_ops(), c.num_devices(), c.device.name.c_str(), c.name.c_str(), a.batch, a.optimizer.c_str(),
              plan::find_schedule_kind(p.schedule) == plan::ScheduleKind::one_f_one_b
                  ? ""
                  : (", schedule " + p.schedule).c_str());
  std::printf("%5s  %5s  %-44s  %-12s  %5s  %9s  %12s  %10s\n", "stage", "#ops", "first .. last op", "devices", "mb",
              "in-flight", "ms/sample", "memory GB");
  for (const auto& s : p.stages) {
    std::string devs = s.devices.size() == 1 ? std::to_string(s.devices[0])
                                             : fmt::format("{}-{}", s.devices.front(), s.devices.back());
    std::string ops = s.ops.front() + " .. " + s.ops.back();
    if (ops.size() > 44) ops = ops.substr(0, 41) + "...";
    std::printf("%5d  %5zu  %-44s  %-12s  %5d  %9d  %12.4f  %10.2f\n", s.id, s.ops.size(), ops.c_str(), devs.c_str(),
                s.micro_batch_size, s.in_flight, s.tps_s * 1e3, s.memory_bytes / 1e9);
  }
  double peak = 0;
  for (double m : p.predicted.peak_memory_bytes) peak = std::max(peak, m);
  std::printf(
      "predicted: bottleneck %.4f ms/sample, iteration %.4f s, throughput %.1f samples/s, "
      "peak memory %.2f GB\n",
      p.predicted.bottleneck_tps_s * 1e3, p.predicted.iteration_time_s, p.predicted.throughput_samples_per_s,
      peak / 1e9);
  std::printf("search time: %.3f s\n", p.search_time_s);
  for (const auto& line : rep.explain) std::printf("  %s\n", line.c_str());
  if (!a.out.empty()) std::printf("wrote %s\n", a.out.c_str());
}

Registrar reg(20, [](CLI::App& root) {
  auto a = std::make_shared<PlanArgs>();
  auto* c = root.add_subcommand("plan", "Search a pipeline strategy (GraphPipe, PipeDream or Piper)");
  c->add_option("--model", a->model, "Model spec: builtin[:k=v,...] or a .json/.onnx file")->required();
  c->add_option("--cluster", a->cluster, "Cluster preset or graphpipe.cluster/1 file")->capture_default_str();
  c->add_option("--devices", a->devices, "Number of devices to use")->required();
  c->add_option("--batch", a->batch, "Mini-batch size (samples per iteration)")->required();
  c->add_option("--micro-batch", a->micro_batch,
                "Fix every stage's micro-batch size to M (must divide --batch); default: search "
                "every power of two dividing it");
  c->add_flag("--no-data-parallel", a->no_data_parallel,
              "Pipelines only: leave out the whole model as one stage (on one device or replicated on "
              "several), which the planner otherwise returns where it is predicted fastest");
  c->add_option("--planner", a->planner, planner::planner_kind_help("Planner"))->capture_default_str();
  c->add_option("--schedule", a->schedule,
                plan::schedule_kind_help("The schedule to plan for (the estimate times it, the plan records it)"))
      ->capture_default_str();
  c->add_option("--optimizer", a->optimizer, "adam | sgd")->capture_default_str();
  c->add_option("--memory-limit", a->memory_limit_gb,
                "Per-device memory in GB (default: the device's); the preset's reserve is taken off it");
  c->add_option("--time-limit", a->time_limit_s, "Piper: give up after this many seconds")->capture_default_str();
  c->add_option("--profile", a->profile, "Measured op costs (graphpipe.profile/1)");
  c->add_option("--out", a->out, "Write the plan (graphpipe.plan/1)");
  c->add_flag("--json", a->json, "Print the plan JSON on stdout");
  c->add_flag("--explain", a->explain, "Say why each stage got its devices and micro-batch size");
  c->add_option("--dot", a->dot, "Write the stage graph as Graphviz");
  c->callback([a] { run(*a); });
});

}  // namespace
}  // namespace gp::cli
