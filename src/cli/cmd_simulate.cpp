// `graphpipe simulate`: time one training iteration of a plan under a schedule with the
// discrete-event simulator; print a summary or graphpipe.sim/1, write a Chrome trace / SVG.
#include <algorithm>
#include <cstdio>
#include <memory>

#include "cli/command.h"
#include "cost/cost_model.h"
#include "cost/profile.h"
#include "importers/resolve.h"
#include "plan/costs.h"
#include "plan/plan.h"
#include "plan/schedule_kind.h"
#include "schedule/schedule.h"
#include "sim/sim.h"

namespace gp::cli {
namespace {

struct SimArgs {
  std::string plan, schedule, schedule_file, trace, svg, model, cluster, profile;  // schedule "": the plan's
  std::string zb_times = "plan";
  bool json = false;
};

void run(const SimArgs& a) {
  plan::Plan p = plan::load_plan(a.plan);
  std::string model = a.model.empty() ? p.model_spec : a.model;
  GP_CHECK(!model.empty(), "{}: the plan has no model.spec; pass --model SPEC", a.plan);
  ir::Graph g = importers::load_graph(model);
  plan::validate_plan(p, g, a.plan);
  // The costs the plan was made with, unless --cluster / --profile replace them (with a note).
  plan::CostSource costs = plan::plan_costs(p, a.plan, "simulate", a.cluster, a.profile);
  for (const std::string& note : costs.notes) std::fprintf(stderr, "%s\n", note.c_str());
  const cost::Cluster& c = costs.cluster;
  cost::CostModel cm(g, c, p.optimizer, costs.profile);
  const sim::SimCosts sim_costs = sim::sim_costs(p, cm);
  schedule::Schedule s;
  if (!a.schedule_file.empty()) {
    s = schedule::load_schedule(a.schedule_file);
    schedule::check_schedule(s, p, a.schedule_file);
  } else {
    // zb orders its passes by the plan's pass times (schedule::pass_times_of: what `train` runs),
    // or with --zb-times sim by this simulator's own (1f1b and gpipe ignore them).
    const std::string kind = a.schedule.empty() ? p.schedule : a.schedule;
    s = a.zb_times == "sim" ? schedule::build_schedule(p, kind, sim::pass_times(sim_costs))
                            : schedule::build_schedule(p, kind);
  }
  sim::SimResult r = sim::simulate(p, s, sim_costs);
  std::string title = fmt::format("{} plan for {} on {} x {} ({}), {} schedule", p.planner, g.name(), p.num_devices,
                                  c.device.name, c.name, s.kind);
  if (!a.trace.empty()) write_json_file(a.trace, sim::chrome_trace(p, r), -1);
  if (!a.svg.empty()) write_text_file(a.svg, sim::svg_timeline(p, r, title));
  if (a.json) {
    Json j = sim::sim_result_to_json(r);
    // Extras for scripts: the plan's shape and the planner's own numbers.
    std::vector<int> depth(p.stages.size(), 1);
    for (int k : plan::stage_topo_order(p))
      for (int v : p.stages[k].outputs_to) depth[v] = std::max(depth[v], depth[k] + 1);
    double peak = 0;
    for (double m : r.peak_memory_bytes) peak = std::max(peak, m);
    j["schedule"] = s.kind;
    j["planner"] = p.planner;
    j["num_stages"] = p.stages.size();
    j["pipeline_depth"] = depth.empty() ? 0 : *std::max_element(depth.begin(), depth.end());
    j["peak_memory_max_bytes"] = peak;
    j["predicted_iteration_time_s"] = p.predicted.iteration_time_s;
    j["search_time_s"] = p.search_time_s;
    j["costs"] = {{"cluster", costs.cluster_from}, {"profile", costs.profile_from}};
    std::printf("%s\n", j.dump(1).c_str());
    return;
  }
  std::printf("%s\n", title.c_str());
  std::printf("costs: cluster from %s, profile: %s\n", costs.cluster_from.c_str(), costs.profile_from.c_str());
  std::printf("%5s  %-10s  %5s  %9s  %9s  %12s  %10s\n", "stage", "devices", "mb", "in-flight", "peak held", "busy s",
              "memory GB");
  for (const plan::Stage& st : p.stages) {
    std::string devs = st.devices.size() == 1 ? std::to_string(st.devices[0])
                                              : fmt::format("{}-{}", st.devices.front(), st.devices.back());
    int d = st.devices.front();
    std::printf("%5d  %-10s  %5d  %9d  %9d  %12.6f  %10.3f\n", st.id, devs.c_str(), st.micro_batch_size, st.in_flight,
                r.peak_in_flight[st.id], r.busy_s[d], r.peak_memory_bytes[d] / 1e9);
  }
  double peak = 0;
  for (double m : r.peak_memory_bytes) peak = std::max(peak, m);
  std::printf(
      "simulated: iteration %.6f s, throughput %.1f samples/s, bubble %.1f%%, peak memory "
      "%.2f GB\n",
      r.iteration_time_s, r.throughput_samples_per_s, r.bubble_fraction * 100, peak / 1e9);
  if (p.predicted.iteration_time_s > 0)
    std::printf("planner predicted: iteration %.6f s (simulated / predicted = %.3f)\n", p.predicted.iteration_time_s,
                r.iteration_time_s / p.predicted.iteration_time_s);
  if (!a.trace.empty()) std::printf("wrote %s\n", a.trace.c_str());
  if (!a.svg.empty()) std::printf("wrote %s\n", a.svg.c_str());
}

Registrar reg(30, [](CLI::App& root) {
  auto a = std::make_shared<SimArgs>();
  auto* c = root.add_subcommand("simulate", "Simulate one training iteration of a plan");
  c->add_option("--plan", a->plan, "Plan file (graphpipe.plan/1)")->required();
  c->add_option(
      "--schedule", a->schedule,
      plan::schedule_kind_help("Schedule") + "\n  (default: the schedule the plan records, 1f1b in older plans)");
  c->add_option("--zb-times", a->zb_times,
                "The pass times zb orders its passes by: plan (the plan's recorded ones, else 1:1:1; "
                "what train runs) | sim (this simulator's)")
      ->check(CLI::IsMember({"plan", "sim"}))
      ->capture_default_str();
  c->add_option("--schedule-file", a->schedule_file, "A graphpipe.schedule/1 file instead");
  c->add_option("--trace", a->trace, "Write a Chrome trace-event JSON (Perfetto, chrome://tracing)");
  c->add_option("--svg", a->svg, "Write a timeline picture (SVG)");
  c->add_option("--model", a->model, "Override the plan's model.spec");
  c->add_option("--cluster", a->cluster,
                "Use this cluster instead of the one the plan was made with (recorded in the plan)");
  c->add_option("--profile", a->profile,
                "Use these measured op costs (graphpipe.profile/1) instead of the profile the plan was "
                "made with (recorded in the plan; none if it was made without)");
  c->add_flag("--json", a->json, "Print graphpipe.sim/1 on stdout");
  c->callback([a] { run(*a); });
});

}  // namespace
}  // namespace gp::cli
