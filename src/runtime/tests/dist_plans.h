// Hand-built plans and the single-process reference for the pipeline runtime tests.
#pragma once
#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

#include "importers/resolve.h"
#include "plan/plan.h"
#include "runtime/detail/executor.h"
#include "runtime/detail/optim.h"

namespace gp::runtime::testing {

/// A stage: ops whose names start with one of `prefixes` (the last stage may list none: it takes
/// every op left), its devices and its micro-batch size.
struct StageSpec {
  std::vector<std::string> prefixes;
  std::vector<int> devices;
  int micro_batch = 1;
};

inline plan::Plan make_plan(const std::string& spec, int batch, const std::vector<StageSpec>& stages,
                            int num_devices = 0) {
  ir::Graph g = importers::load_graph(spec);
  plan::Plan p;
  p.planner = "manual";
  p.model_name = g.name();
  p.num_ops = static_cast<int>(g.num_ops());
  p.model_spec = spec;
  p.cluster_name = "cpu";
  p.cluster_spec = "cpu";
  p.mini_batch_size = batch;
  for (size_t s = 0; s < stages.size(); ++s) {
    plan::Stage st;
    st.id = static_cast<int>(s);
    st.devices = stages[s].devices;
    st.micro_batch_size = stages[s].micro_batch;
    p.stages.push_back(st);
    for (int d : st.devices) num_devices = std::max(num_devices, d + 1);
  }
  p.num_devices = num_devices;
  for (size_t i = 0; i < g.num_ops(); ++i) {
    const std::string& n = g.op(OpId(static_cast<int32_t>(i))).name;
    size_t s = 0;
    for (; s < stages.size(); ++s) {
      bool hit = stages[s].prefixes.empty();
      for (const auto& pre : stages[s].prefixes) hit = hit || n.rfind(pre, 0) == 0;
      if (hit) break;
    }
    p.stages.at(s).ops.push_back(n);
  }
  plan::derive_stage_edges(p, g);
  plan::assign_min_in_flight(p);
  return p;
}

struct Reference {
  std::vector<double> losses;
  std::vector<std::pair<std::string, torch::Tensor>> params;
};

/// What `train --single` computes: the whole model, one micro-batch = the mini-batch.
inline Reference single_reference(const std::string& spec, int batch, int steps, const std::string& optimizer,
                                  double lr, uint64_t seed = 1) {
  ir::Graph g = importers::load_graph(spec);
  std::vector<OpId> all;
  for (size_t i = 0; i < g.num_ops(); ++i) all.emplace_back(static_cast<int32_t>(i));
  StageModule m(g, all, seed);
  auto opt = make_optimizer(optimizer, m.parameters(), lr, 0.9);
  Reference r;
  for (int step = 0; step < steps; ++step) {
    opt->zero_grad();
    MicroBatchInfo info{0, batch, batch, step};
    auto loss = m.scaled_loss(m.forward(synthetic_external_inputs(m, info), info), info);
    loss.backward();
    opt->step();
    r.losses.push_back(loss.item<double>());
  }
  for (auto& [n, t] : m.named_parameters()) r.params.emplace_back(n, t.detach().clone());
  return r;
}

}  // namespace gp::runtime::testing
