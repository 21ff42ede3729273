// Round-number simulator costs for the plan and schedule fuzzers: anything the checker accepts
// must simulate to completion (no deadlock, finite iteration time).
#pragma once
#include <cmath>

#include "sim/sim.h"

namespace gp::fuzz {

inline sim::SimCosts round_costs(const plan::Plan& p) {
  sim::SimCosts c;
  c.cluster.name = "fuzz";
  c.cluster.num_nodes = 1;
  c.cluster.devices_per_node = 1 << 20;
  c.cluster.intra = {1e9, 1e-6};
  c.cluster.inter = {1e9, 1e-6};
  for (const plan::Stage& st : p.stages) {
    sim::StageTimes t;
    t.fwd_s = 1;
    t.bwd_s = 2;
    t.allreduce_s = st.devices.size() > 1 ? 0.5 : 0;
    t.optimizer_s = 0.25;
    t.act_bytes_per_mb = 1;
    t.out_bytes_per_sample.assign(st.outputs_to.size(), 100.0);
    c.stages.push_back(t);
  }
  return c;
}

/// Simulates; traps when the result is not a finished iteration.
inline void simulate_or_trap(const plan::Plan& p, const schedule::Schedule& s) {
  sim::SimResult r = sim::simulate(p, s, round_costs(p));
  if (!(r.iteration_time_s > 0) || !std::isfinite(r.iteration_time_s)) __builtin_trap();
}

/// Micro-batches a schedule for this plan would hold in total; the fuzzers skip building and
/// simulating schedules above a bound (a huge mini-batch is valid but slow, not a bug).
inline long long total_micro_batches(const plan::Plan& p) {
  long long n = 0;
  for (const plan::Stage& st : p.stages)
    if (st.micro_batch_size > 0) n += p.mini_batch_size / st.micro_batch_size;
  return n;
}

}  // namespace gp::fuzz
