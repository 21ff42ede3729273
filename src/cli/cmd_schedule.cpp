// `graphpipe schedule show|check`: print or write the per-stage action lists of a plan, and
// prove a (hand-written) schedule runs against a plan (exit 2 naming the deadlock otherwise).
#include <cstdio>
#include <memory>

#include "cli/command.h"
#include "plan/plan.h"
#include "plan/schedule_kind.h"
#include "schedule/schedule.h"

namespace gp::cli {
namespace {

struct ScheduleArgs {
  std::string plan, kind = "1f1b", out, schedule;
  bool json = false;
};

void show(const ScheduleArgs& a) {
  plan::Plan p = plan::load_plan(a.plan);
  schedule::Schedule s = schedule::build_schedule(p, a.kind);
  if (!a.out.empty()) schedule::save_schedule(a.out, s);
  if (a.json) {
    std::printf("%s\n", schedule::schedule_to_json(s).dump(1).c_str());
    return;
  }
  std::vector<int> peak = schedule::peak_in_flight(s);
  for (const auto& st : s.stages) {
    std::printf("stage %d (%zu actions, peak in-flight %d):\n", st.stage, st.actions.size(), peak[st.stage]);
    for (size_t i = 0; i < st.actions.size(); ++i)
      std::printf("  [%zu] %s\n", i, schedule::to_string(st.actions[i]).c_str());
  }
  if (!a.out.empty()) std::printf("wrote %s\n", a.out.c_str());
}

void check(const ScheduleArgs& a) {
  plan::Plan p = plan::load_plan(a.plan);
  schedule::Schedule s = schedule::load_schedule(a.schedule);
  schedule::check_schedule(s, p, a.schedule);
  std::vector<int> peak = schedule::peak_in_flight(s);
  if (a.json) {
    std::printf(
        "%s\n",
        Json({{"format", "graphpipe.schedule-check/1"}, {"ok", true}, {"peak_in_flight", peak}}).dump().c_str());
    return;
  }
  std::string held;
  for (size_t i = 0; i < peak.size(); ++i) held += fmt::format("{}s{}: {}", i ? ", " : "", i, peak[i]);
  std::printf("%s: ok (%zu stages; peak in-flight %s)\n", a.schedule.c_str(), s.stages.size(), held.c_str());
}

Registrar reg(25, [](CLI::App& root) {
  auto a = std::make_shared<ScheduleArgs>();
  auto* c = root.add_subcommand("schedule", "Show a plan's schedule or check a schedule file");
  c->require_subcommand(1);
  auto* sh = c->add_subcommand("show", "Print (or write) the per-stage action lists of a plan");
  sh->add_option("--plan", a->plan, "Plan file (graphpipe.plan/1)")->required();
  sh->add_option("--kind", a->kind,
                 plan::schedule_kind_help("Schedule") +
                     "\n  (zb orders its passes by the plan's recorded stage pass times, else 1:1:1)")
      ->capture_default_str();
  sh->add_option("--out", a->out, "Write graphpipe.schedule/1");
  sh->add_flag("--json", a->json, "Print graphpipe.schedule/1 on stdout");
  sh->callback([a] { show(*a); });
  auto* ck = c->add_subcommand("check", "Prove a schedule runs against a plan (no deadlock)");
  ck->add_option("--plan", a->plan, "Plan file (graphpipe.plan/1)")->required();
  ck->add_option("--schedule", a->schedule, "Schedule file (graphpipe.schedule/1)")->required();
  ck->add_flag("--json", a->json, "Print the result as JSON");
  ck->callback([a] { check(*a); });
});

}  // namespace
}  // namespace gp::cli
