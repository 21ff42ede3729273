// Test helpers: SimCosts with round numbers and compact renderings of simulated timelines.
#pragma once
#include <limits>
#include <string>

#include "sim/sim.h"

namespace gp::sim {

/// Every stage: forward f, backward b per micro-batch, state and activation bytes as given;
/// one node with free links (zero latency, infinite bandwidth); zero-byte edges.
inline SimCosts uniform_costs(const plan::Plan& p, double f, double b, double state = 0, double act = 0) {
  SimCosts c;
  c.cluster.name = "test";
  c.cluster.num_nodes = 1;
  c.cluster.devices_per_node = 1 << 20;
  c.cluster.intra = {std::numeric_limits<double>::infinity(), 0};
  c.cluster.inter = {std::numeric_limits<double>::infinity(), 0};
  for (const plan::Stage& st : p.stages) {
    StageTimes t;
    t.fwd_s = f;
    t.bwd_s = b;
    t.state_bytes = state;
    t.act_bytes_per_mb = act;
    t.out_bytes_per_sample.assign(st.outputs_to.size(), 0.0);
    c.stages.push_back(t);
  }
  return c;
}

/// "F0[0,1] B0[4,6] ... allreduce[15,20] opt[20,20]": the device's own work in time order
/// (zero-bubble passes: "I0" backward_input, "W0" backward_weight).
inline std::string compute_slices(const SimResult& r, int device) {
  using schedule::ActionKind;
  std::string out;
  for (const Event& e : r.events) {
    if (e.device != device || e.track != 0) continue;
    std::string what;
    switch (e.kind) {
      case ActionKind::forward: what = "F" + std::to_string(e.micro_batch); break;
      case ActionKind::backward: what = "B" + std::to_string(e.micro_batch); break;
      case ActionKind::backward_input: what = "I" + std::to_string(e.micro_batch); break;
      case ActionKind::backward_weight: what = "W" + std::to_string(e.micro_batch); break;
      case ActionKind::allreduce: what = "allreduce"; break;
      case ActionKind::optimizer_step: what = "opt"; break;
      default: continue;  // receives (waits)
    }
    out += fmt::format("{}{}[{:g},{:g}]", out.empty() ? "" : " ", what, e.start_s, e.end_s);
  }
  return out;
}

/// "send_act ->s1 [0,1)[1,1.5] ...": the device's sends and the time they occupy its links.
inline std::string send_slices(const SimResult& r, int device) {
  std::string out;
  for (const Event& e : r.events)
    if (e.device == device && e.track == 1)
      out += fmt::format("{}{}[{:g},{:g}]", out.empty() ? "" : " ", e.name.substr(e.name.find(' ') + 1), e.start_s,
                         e.end_s);
  return out;
}

}  // namespace gp::sim
