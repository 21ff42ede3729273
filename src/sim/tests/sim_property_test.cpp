// Property tests on random stage DAGs (skip edges, diamonds, mixed micro-batch sizes, data
// parallelism): the simulated iteration is never shorter than the critical path of one
// micro-batch nor than the busiest device's work; with one micro-batch and free links it equals
// the critical path; traces have one slice per action per device.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "schedule/tests/random_plans.h"
#include "sim/sim.h"
#include "sim/tests/sim_helpers.h"

namespace gp::sim {
namespace {

SimCosts random_costs(const plan::Plan& p, bool comm) {
  SimCosts c = uniform_costs(p, 0, 0);
  for (const plan::Stage& st : p.stages) {
    StageTimes& t = c.stages[st.id];
    t.fwd_s = *rc::gen::inRange(1, 6);
    t.bwd_s = *rc::gen::inRange(1, 11);
    t.optimizer_s = *rc::gen::inRange(0, 3);
    if (st.devices.size() > 1) t.allreduce_s = *rc::gen::inRange(1, 5);
    if (comm)
      for (double& b : t.out_bytes_per_sample) b = *rc::gen::inRange(0, 4);
  }
  if (comm) {
    c.cluster.devices_per_node = 2;
    c.cluster.intra = {4, 0.25};
    c.cluster.inter = {1, 0.5};
    c.cluster.node_injection_Bps = *rc::gen::element(0.0, 1.0, 2.0);
  }
  return c;
}

// Lower bound: micro-batch 0 through the stage DAG (forwards then backwards), then the stage's
// all-reduce and optimizer step. Stages are listed in topological order.
double critical_path(const plan::Plan& p, const SimCosts& c) {
  size_t n = p.stages.size();
  std::vector<double> fwd(n, 0), bwd(n, 0);
  for (size_t s = 0; s < n; ++s) {
    for (int u : p.stages[s].inputs_from) fwd[s] = std::max(fwd[s], fwd[u]);
    fwd[s] += c.stages[s].fwd_s;
  }
  double best = 0;
  for (size_t s = n; s-- > 0;) {
    bwd[s] = fwd[s];
    for (int v : p.stages[s].outputs_to) bwd[s] = std::max(bwd[s], bwd[v]);
    bwd[s] += c.stages[s].bwd_s;
    best = std::max(best, bwd[s] + c.stages[s].allreduce_s + c.stages[s].optimizer_s);
  }
  return best;
}

double busiest_device(const plan::Plan& p, const SimCosts& c) {
  double best = 0;
  for (const plan::Stage& st : p.stages) {
    const StageTimes& t = c.stages[st.id];
    int m = p.mini_batch_size / st.micro_batch_size;
    best = std::max(best, m * (t.fwd_s + t.bwd_s) + t.allreduce_s + t.optimizer_s);
  }
  return best;
}

RC_GTEST_PROP(SimProperty, NeverBeatsCriticalPathOrBusiestDevice, ()) {
  plan::Plan p = gp::testing::random_plan();
  SimCosts c = random_costs(p, *rc::gen::arbitrary<bool>());
  std::string kind = *rc::gen::element(std::string("1f1b"), std::string("gpipe"));
  schedule::Schedule s = schedule::build_schedule(p, kind);
  SimResult r = simulate(p, s, c);
  RC_ASSERT(r.iteration_time_s >= critical_path(p, c) - 1e-9);
  RC_ASSERT(r.iteration_time_s >= busiest_device(p, c) - 1e-9);
  RC_ASSERT(r.bubble_fraction >= 0 && r.bubble_fraction < 1);
  RC_ASSERT(r.peak_in_flight == schedule::peak_in_flight(s));
  size_t slices = 0, expected = 0;
  for (const plan::Stage& st : p.stages) expected += s.stages[st.id].actions.size() * st.devices.size();
  Json trace = chrome_trace(p, r);
  for (const Json& e : trace["traceEvents"]) slices += e["ph"] == "X";
  RC_ASSERT(slices == expected);
}

RC_GTEST_PROP(SimProperty, OneMicroBatchWithFreeLinksIsTheCriticalPath, ()) {
  plan::Plan p = gp::testing::random_plan();
  for (plan::Stage& st : p.stages) st.micro_batch_size = p.mini_batch_size;
  SimCosts c = random_costs(p, false);
  SimResult r = simulate(p, schedule::build_schedule(p), c);
  RC_ASSERT(std::abs(r.iteration_time_s - critical_path(p, c)) < 1e-9);
}

}  // namespace
}  // namespace gp::sim
