// SimCosts from the cost model: the same cost::stage_cost the planner uses, so both agree.
#include <algorithm>

#include "sim/sim.h"

namespace gp::sim {

namespace {

/// Per stage: the time to sum the gradients of its shared parameters with their holders on other
/// stages (a ring all-reduce among every device of every holding stage, placement-aware), taken
/// just before the optimizer step.
std::vector<double> shared_allreduce_times(const plan::Plan& p, const cost::CostModel& cm,
                                           const std::vector<int>& stage_of) {
  const ir::Graph& g = cm.graph();
  std::vector<double> out(p.stages.size(), 0.0);
  for (size_t k = 0; k < g.model().shared_params.size(); ++k) {
    std::vector<int> holders;
    for (OpId u : g.shared_users(k))
      if (std::find(holders.begin(), holders.end(), stage_of[u.v]) == holders.end()) holders.push_back(stage_of[u.v]);
    if (holders.size() < 2) continue;
    const OpId canon = g.shared_users(k).front();
    const double bytes = static_cast<double>(g.shared_numel(k)) / static_cast<double>(g.costs(canon).params) *
                         static_cast<double>(g.costs(canon).param_bytes);
    std::vector<int> devices;
    for (int h : holders) devices.insert(devices.end(), p.stages[h].devices.begin(), p.stages[h].devices.end());
    std::sort(devices.begin(), devices.end());
    const double t = cm.allreduce_time(devices, bytes);
    for (int h : holders) out[h] += t;
  }
  return out;
}

}  // namespace

SimCosts sim_costs(const plan::Plan& p, const cost::CostModel& cm) {
  const ir::Graph& g = cm.graph();
  const cost::Cluster& cl = cm.cluster();
  GP_CHECK(p.num_devices <= cl.num_devices(), "plan uses {} devices but the cluster \"{}\" has {}", p.num_devices,
           cl.name, cl.num_devices());
  std::vector<int> stage_of(g.num_ops(), -1);
  std::vector<std::vector<OpId>> ops(p.stages.size());
  for (const plan::Stage& st : p.stages) {
    for (const std::string& name : st.ops) {
      OpId id = g.find(name);
      GP_CHECK(id.valid(), "plan: stage {}: op \"{}\" is not in model \"{}\"", st.id, name, g.name());
      GP_CHECK(stage_of[id.v] < 0, "plan: op \"{}\" is in stages {} and {}", name, stage_of[id.v], st.id);
      stage_of[id.v] = st.id;
      ops[st.id].push_back(id);
    }
  }
  const std::vector<double> shared_s = shared_allreduce_times(p, cm, stage_of);
  const plan::CutEdges cut = plan::cut_edges(g, stage_of);
  SimCosts c;
  c.cluster = cl;
  c.p2p_time = [&cm](int a, int b, double bytes) { return cm.p2p_time(a, b, bytes); };
  for (const plan::Stage& st : p.stages) {
    std::vector<char> in_stage(g.num_ops(), 0);
    for (OpId op : ops[st.id]) in_stage[op.v] = 1;
    int dp = static_cast<int>(st.devices.size());
    GP_CHECK(dp >= 1, "plan: stage {} has no devices", st.id);
    bool same_node = true;
    for (int d : st.devices) same_node = same_node && cl.same_node(d, st.devices[0]);
    for (int v : st.outputs_to)
      for (int d : p.stages[v].devices) same_node = same_node && cl.same_node(d, st.devices[0]);
    for (int u : st.inputs_from)
      for (int d : p.stages[u].devices) same_node = same_node && cl.same_node(d, st.devices[0]);
    cost::StageCost sc = cost::stage_cost(cm, ops[st.id], in_stage, dp, st.micro_batch_size, p.mini_batch_size,
                                          same_node);
    // Split the planner's compute time into forward and backward as the ops' own times do.
    StageTimes t;
    t.fwd_s = sc.fwd_s + sc.bwd_s > 0 ? sc.compute_s * sc.fwd_s / (sc.fwd_s + sc.bwd_s) : 0;
    t.bwd_s = sc.compute_s - t.fwd_s;
    // The zero-bubble split of that backward, by the cost model's analytic weight fraction.
    t.bwd_weight_s = sc.bwd_s > 0 ? t.bwd_s * (sc.bwd_weight_s / sc.bwd_s) : 0;
    t.bwd_input_s = t.bwd_s - t.bwd_weight_s;
    t.allreduce_s = dp > 1 ? sc.allreduce_s : 0;
    t.state_bytes = sc.state_bytes;
    t.act_bytes_per_mb = sc.act_bytes_per_mb;
    const double sent = sc.micro_batches * sc.sent_grad_bytes_per_mb;
    t.other_bytes = sent + sc.transient_bytes;
    t.step_bytes = sent + sc.step_transient_bytes;
    t.optimizer_s = sc.optimizer_s + shared_s[st.id];
    t.out_bytes_per_sample = plan::out_bytes_per_sample(st, cut, cm);
    c.stages.push_back(std::move(t));
  }
  return c;
}

schedule::PassTimes pass_times(const SimCosts& c) {
  schedule::PassTimes t;
  for (const StageTimes& st : c.stages) {
    t.fwd_s.push_back(st.fwd_s);
    t.bwd_input_s.push_back(st.bwd_input_s);
    t.bwd_weight_s.push_back(st.bwd_weight_s);
  }
  return t;
}

SimResult simulate(const plan::Plan& p, const schedule::Schedule& s, const cost::CostModel& cm, const SimOptions& opt) {
  SimCosts c = sim_costs(p, cm);
  return simulate(p, s, c, opt);
}

}  // namespace gp::sim
