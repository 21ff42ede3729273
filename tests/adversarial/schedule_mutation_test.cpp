// Mutated schedules (from build_schedule on planner plans and on random stage DAGs): dropping or
// duplicating actions and changing sample ranges must be rejected by check_schedule; a swap of two
// actions may pass, and then the simulator must finish the iteration (no deadlock).
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cmath>

#include "adversarial.h"
#include "schedule/schedule.h"
#include "schedule/tests/random_plans.h"
#include "sim/sim.h"

namespace gp::adversarial {
namespace {

using schedule::ActionKind;
using schedule::Schedule;

/// A plan and its schedule: half from the planner (real models), half random stage DAGs with
/// data parallelism and mixed micro-batch sizes.
std::pair<plan::Plan, Schedule> random_scheduled_plan() {
  plan::Plan p = *rc::gen::arbitrary<bool>() ? random_valid_plan().plan : gp::testing::random_plan();
  Schedule s = schedule::build_schedule(p, *rc::gen::element(std::string("1f1b"), std::string("gpipe")));
  return {p, s};
}

std::string rejection(const Schedule& s, const plan::Plan& p) {
  try {
    schedule::check_schedule(s, p, "mutant");
  } catch (const UserError& e) {
    RC_ASSERT(std::string(e.what()).rfind("mutant", 0) == 0);
    return e.what();
  }
  return "";
}

/// Round-number costs with real transfers, on nodes of two devices.
sim::SimCosts costs(const plan::Plan& p) {
  sim::SimCosts c;
  c.cluster.name = "adversarial";
  c.cluster.num_nodes = (p.num_devices + 1) / 2;
  c.cluster.devices_per_node = 2;
  c.cluster.intra = {4, 0.25};
  c.cluster.inter = {1, 0.5};
  c.cluster.node_injection_Bps = 2;
  for (const plan::Stage& st : p.stages) {
    sim::StageTimes t;
    t.fwd_s = 1;
    t.bwd_s = 2;
    t.allreduce_s = st.devices.size() > 1 ? 1 : 0;
    t.optimizer_s = 0.5;
    t.act_bytes_per_mb = 1;
    t.out_bytes_per_sample.assign(st.outputs_to.size(), 1.0);
    c.stages.push_back(t);
  }
  return c;
}

/// Positions (stage, index) of actions satisfying `pred`.
template <class Pred>
std::vector<std::pair<int, int>> positions(const Schedule& s, Pred pred) {
  std::vector<std::pair<int, int>> out;
  for (size_t st = 0; st < s.stages.size(); ++st)
    for (size_t i = 0; i < s.stages[st].actions.size(); ++i)
      if (pred(s.stages[st].actions[i])) out.emplace_back(static_cast<int>(st), static_cast<int>(i));
  return out;
}

bool is_transfer(const schedule::Action& a) {
  return a.kind == ActionKind::send_act || a.kind == ActionKind::recv_act || a.kind == ActionKind::send_grad ||
         a.kind == ActionKind::recv_grad;
}

RC_GTEST_PROP(ScheduleMutation, SwapPassesOnlyIfTheSimulatorFinishes, ()) {
  auto [p, s] = random_scheduled_plan();
  int st = *rc::gen::inRange(0, static_cast<int>(s.stages.size()));
  auto& a = s.stages[st].actions;
  size_t i = *rc::gen::inRange<size_t>(0, a.size()), j = *rc::gen::inRange<size_t>(0, a.size());
  RC_PRE(!(a[i] == a[j]));
  std::swap(a[i], a[j]);
  RC_TAG(rejection(s, p).empty() ? "accepted" : "rejected");
  if (!rejection(s, p).empty()) return;
  sim::SimResult r = sim::simulate(p, s, costs(p));  // a stuck device throws UserError
  RC_ASSERT(std::isfinite(r.iteration_time_s));
  RC_ASSERT(r.iteration_time_s > 0);
}

RC_GTEST_PROP(ScheduleMutation, DroppedRecvIsRejected, ()) {
  auto [p, s] = random_scheduled_plan();
  auto recvs = positions(
      s, [](const schedule::Action& a) { return a.kind == ActionKind::recv_act || a.kind == ActionKind::recv_grad; });
  RC_PRE(!recvs.empty());
  auto [st, i] = *rc::gen::elementOf(recvs);
  s.stages[st].actions.erase(s.stages[st].actions.begin() + i);
  RC_ASSERT(!rejection(s, p).empty());
}

RC_GTEST_PROP(ScheduleMutation, DroppedOrDuplicatedActionIsRejected, ()) {
  auto [p, s] = random_scheduled_plan();
  auto all = positions(s, [](const schedule::Action&) { return true; });
  auto [st, i] = *rc::gen::elementOf(all);
  auto& a = s.stages[st].actions;
  if (*rc::gen::arbitrary<bool>()) a.erase(a.begin() + i);
  else a.insert(a.begin() + *rc::gen::inRange<size_t>(0, a.size() + 1), a[i]);
  RC_ASSERT(!rejection(s, p).empty());
}

RC_GTEST_PROP(ScheduleMutation, ChangedSampleRangeIsRejected, ()) {
  auto [p, s] = random_scheduled_plan();
  auto xfers = positions(s, is_transfer);
  RC_PRE(!xfers.empty());
  auto [st, i] = *rc::gen::elementOf(xfers);
  schedule::Action& a = s.stages[st].actions[i];
  switch (*rc::gen::inRange(0, 4)) {
    case 0: a.sample_begin += *rc::gen::inRange(1, 9); break;
    case 1: a.sample_begin -= *rc::gen::inRange(1, 9); break;
    case 2: a.sample_count += *rc::gen::inRange(1, 9); break;
    default: a.sample_count = *rc::gen::inRange(-3, a.sample_count); break;
  }
  RC_ASSERT(!rejection(s, p).empty());
}

RC_GTEST_PROP(ScheduleMutation, WrongPeerOrMicroBatchIsRejected, ()) {
  auto [p, s] = random_scheduled_plan();
  auto all = positions(s, [](const schedule::Action& a) {
    return a.kind != ActionKind::allreduce && a.kind != ActionKind::optimizer_step;
  });
  auto [st, i] = *rc::gen::elementOf(all);
  schedule::Action& a = s.stages[st].actions[i];
  int n = static_cast<int>(p.stages.size());
  if (is_transfer(a)) a.peer = *rc::gen::element(-1, st, n, (a.peer + 1) % std::max(n, 1));
  else a.micro_batch = *rc::gen::element(-1, a.micro_batch + 1000, 1 << 30);
  RC_PRE(!(s == schedule::build_schedule(p, s.kind)));  // the peer change may be a no-op (n == 1)
  RC_ASSERT(!rejection(s, p).empty());
}

}  // namespace
}  // namespace gp::adversarial
