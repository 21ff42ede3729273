// From the DP's stage choices to a plan::Plan: stage order and edges, device placement (each
// stage's devices contiguous and, for power-of-two degrees, inside one node), in-flight counts,
// and the predictions (per-stage TPS and memory re-costed with the placed links).
#include <algorithm>
#include <functional>
#include <limits>
#include <numeric>

#include "planner/assemble.h"
#include "planner/engine.h"
#include "plan/plan.h"
#include "plan/schedule_kind.h"
#include "planner/timeline.h"

namespace gp::planner::detail {

namespace {
std::string ms(double s) { return fmt::format("{:.4g} ms", s * 1e3); }

// The share of the stage's compute that is backward (the simulator splits it the same way).
double backward_share(const cost::StageCost& c) { return c.fwd_s + c.bwd_s > 0 ? c.bwd_s / (c.fwd_s + c.bwd_s) : 0; }
// The share of the stage's backward that computes parameter gradients (zero-bubble W; sim_costs
// splits it the same way).
double weight_share(const cost::StageCost& c) { return c.bwd_s > 0 ? c.bwd_weight_s / c.bwd_s : 0; }

// Bytes per sample on each stage edge (per stage, in outputs_to order), as sim_costs counts them.
std::vector<std::vector<double>> edge_bytes_per_sample(const cost::CostModel& cm, const plan::Plan& p,
                                                       const std::vector<std::vector<OpId>>& ops) {
  std::vector<int> stage_of(cm.graph().num_ops(), -1);
  for (size_t k = 0; k < ops.size(); ++k)
    for (OpId o : ops[k]) stage_of[o.v] = static_cast<int>(k);
  const plan::CutEdges cut = plan::cut_edges(cm.graph(), stage_of);
  std::vector<std::vector<double>> out;
  for (const plan::Stage& s : p.stages) out.push_back(plan::out_bytes_per_sample(s, cut, cm));
  return out;
}

// The stages of the plan under assembly, in its stage order: ops (in OpId, i.e. topological,
// order), data-parallel degree and micro-batch size.
struct Parts {
  std::vector<std::vector<OpId>> ops;
  std::vector<int> dp, mb;
};

// p.stages from parts (stage k holds parts' k-th ops), with the stage edges those ops imply.
void make_stages(const ir::Graph& g, const Parts& parts, plan::Plan& p) {
  p.stages.clear();
  for (size_t k = 0; k < parts.ops.size(); ++k) {
    plan::Stage s;
    s.id = static_cast<int>(k);
    for (OpId o : parts.ops[k]) s.ops.push_back(g.op(o).name);
    s.micro_batch_size = parts.mb[k];
    p.stages.push_back(std::move(s));
  }
  plan::derive_stage_edges(p, g);
}

// A sequential pipeline runs its stages one after the other: stage k -> k + 1 is declared even when
// no op tensor crosses it (the runtime then sends a token), so independent branches in different
// stages do not run concurrently and in-flight counts are the chain depth S - k.
void declare_chain_edges(plan::Plan& p) {
  for (size_t k = 0; k + 1 < p.stages.size(); ++k) {
    auto& out = p.stages[k].outputs_to;
    auto& in = p.stages[k + 1].inputs_from;
    if (!std::binary_search(out.begin(), out.end(), static_cast<int>(k + 1)))
      out.insert(std::upper_bound(out.begin(), out.end(), static_cast<int>(k + 1)), static_cast<int>(k + 1));
    if (!std::binary_search(in.begin(), in.end(), static_cast<int>(k)))
      in.insert(std::upper_bound(in.begin(), in.end(), static_cast<int>(k)), static_cast<int>(k));
  }
}

// Stages in a topological order of the stage DAG (Order::dag; `parts` reordered to match), or the
// chain's own order, checked.
void order_stages(const ir::Graph& g, Order order, Parts& parts, plan::Plan& p) {
  make_stages(g, parts, p);
  if (order == Order::dag) {
    Parts sorted;
    for (int k : plan::stage_topo_order(p))
      sorted.ops.push_back(parts.ops[k]), sorted.dp.push_back(parts.dp[k]), sorted.mb.push_back(parts.mb[k]);
    parts = std::move(sorted);
    make_stages(g, parts, p);
  } else {
    // A chain: the choices are already in pipeline order (first stage first).
    for (const plan::Stage& s : p.stages)
      for (int t : s.outputs_to) GP_ASSERT(t > s.id, "chain stage {} feeds earlier stage {}", s.id, t);
  }
  if (order == Order::chain_edges) declare_chain_edges(p);
}

// The base orders placement tries: the topological order, and (a DAG over more than one node)
// depth-first orders from the sinks, each chain of stages contiguous and the chain that holds a join
// placed next to it, trying both orders of each stage's predecessors.
std::vector<std::vector<int>> placement_bases(const plan::Plan& p, const cost::Cluster& cl, Order order) {
  std::vector<int> ident(p.stages.size());
  std::iota(ident.begin(), ident.end(), 0);
  std::vector<std::vector<int>> bases = {ident};
  if (order != Order::dag || cl.num_devices() <= cl.devices_per_node) return bases;
  for (bool reversed : {false, true}) {
    std::vector<int> dfs;
    std::vector<char> seen(p.stages.size(), 0);
    std::function<void(int)> visit = [&](int k) {
      if (seen[k]) return;
      seen[k] = 1;
      std::vector<int> preds = p.stages[k].inputs_from;
      if (reversed) std::reverse(preds.begin(), preds.end());
      for (int f : preds) visit(f);
      dfs.push_back(k);
    };
    for (int k = static_cast<int>(p.stages.size()) - 1; k >= 0; --k)
      if (p.stages[k].outputs_to.empty()) visit(k);
    if (std::find(bases.begin(), bases.end(), dfs) == bases.end()) bases.push_back(std::move(dfs));
  }
  return bases;
}

// Places the plan's stages and predicts it: stages get contiguous device blocks, largest degree
// first (stable in a base order); power-of-two blocks in descending size stay aligned, so a block
// no larger than a node never straddles one. Then each stage is re-costed on its placed links and
// the iteration estimated by the recurrence over the plan's schedule (timeline.h).
class Placer {
 public:
  Placer(const cost::CostModel& cm, const Parts& parts, int mbs, int mini_batch, double memory_limit,
         std::vector<std::vector<double>> edge_bytes)
      : cm_(cm),
        parts_(parts),
        mbs_(mbs),
        mini_batch_(mini_batch),
        memory_limit_(memory_limit),
        edge_bytes_(std::move(edge_bytes)),
        mask_(cm.graph().num_ops(), 0) {}

  void place_and_cost(plan::Plan& p, const std::vector<int>& base, std::vector<std::string>* lines) {
    std::vector<int> by_size(base);
    std::stable_sort(by_size.begin(), by_size.end(), [&](int a, int b) { return parts_.dp[a] > parts_.dp[b]; });
    for (auto& s : p.stages) s.devices.clear();
    int next = 0;
    for (int k : by_size)
      for (int j = 0; j < parts_.dp[k]; ++j) p.stages[k].devices.push_back(next++);
    GP_ASSERT(next <= p.num_devices, "placed {} devices of {}", next, p.num_devices);
    plan::assign_min_in_flight(p);
    p.predicted = {};
    p.predicted.peak_memory_bytes.assign(p.num_devices, 0);
    // Per stage and micro-batch (see timeline.h): forward and backward compute, and the tail after
    // the last backward (gradient all-reduce among replicas, the sum of shared parameters'
    // gradients with their other holders, optimizer step).
    TimelineCosts st;
    st.out_bytes_per_sample = edge_bytes_;
    zb_ = plan::find_schedule_kind(p.schedule) == plan::ScheduleKind::zb;
    all_in_flight_ = plan::find_schedule_kind(p.schedule) == plan::ScheduleKind::gpipe;
    for (size_t k = 0; k < p.stages.size(); ++k) cost_stage(p, k, st, lines);
    p.predicted.iteration_time_s = timeline_iteration_s(p, cm_, st);
    p.predicted.throughput_samples_per_s = mini_batch_ / p.predicted.iteration_time_s;
  }

 private:
  // Whether stage s and all its neighbours sit on s's node (its transfers then use intra-node links).
  bool local(const plan::Plan& p, const plan::Stage& s) const {
    const cost::Cluster& cl = cm_.cluster();
    const int node = cl.node_of(s.devices.front());
    bool on = true;
    auto on_node = [&](const plan::Stage& t) {
      for (int d : t.devices) on = on && cl.node_of(d) == node;
    };
    on_node(s);
    for (int t : s.inputs_from) on_node(p.stages[t]);
    for (int t : s.outputs_to) on_node(p.stages[t]);
    return on;
  }

  void cost_stage(plan::Plan& p, size_t k, TimelineCosts& st, std::vector<std::string>* lines) {
    plan::Stage& s = p.stages[k];
    const std::vector<OpId>& ops = parts_.ops[k];
    const int dp = parts_.dp[k], mb = parts_.mb[k];
    const bool near = local(p, s);
    for (OpId o : ops) mask_[o.v] = 1;
    cost::StageCost c = cost::stage_cost(cm_, ops, mask_, dp, mb, mini_batch_, near);
    s.tps_s = c.tps_s;
    // GPipe holds every micro-batch's activations before the first backward.
    s.memory_bytes = cost::stage_memory(c, all_in_flight_ ? mini_batch_ / mb : std::min(s.in_flight, mini_batch_ / mb));
    for (int d : s.devices) p.predicted.peak_memory_bytes[d] = s.memory_bytes;
    const double bwd = c.compute_s * backward_share(c);
    st.fwd_s.push_back(c.compute_s - bwd);
    st.bwd_s.push_back(bwd);
    if (zb_) {
      // Zero-bubble: the backward split into B and W as the ops' own times split it (sim_costs
      // does the same); the plan records them, its schedule is built from them.
      const double w = bwd * weight_share(c);
      st.bwd_input_s.push_back(bwd - w);
      st.bwd_weight_s.push_back(w);
      s.fwd_s = st.fwd_s.back();
      s.bwd_input_s = bwd - w;
      s.bwd_weight_s = w;
    }
    st.tail_s.push_back((dp > 1 ? c.allreduce_s : 0) + c.shared_allreduce_s + c.optimizer_s);
    p.predicted.bottleneck_tps_s = std::max(p.predicted.bottleneck_tps_s, c.tps_s);
    if (lines) lines->push_back(stage_line(s, k, c, near));
    for (OpId o : ops) mask_[o.v] = 0;
  }

  // --explain: the stage, its cost, and the same stage on half and twice the devices.
  std::string stage_line(const plan::Stage& s, size_t k, const cost::StageCost& c, bool near) const {
    const ir::Graph& g = cm_.graph();
    const std::vector<OpId>& ops = parts_.ops[k];
    const int dp = parts_.dp[k], mb = parts_.mb[k];
    std::string alt;
    if (dp > 1)
      alt += fmt::format(", {} on {} device{}",
                         ms(cost::stage_cost(cm_, ops, mask_, dp / 2, mb, mini_batch_, near).tps_s), dp / 2,
                         dp / 2 == 1 ? "" : "s");
    if (dp * 2 <= mb)
      alt += fmt::format(", {} on {} devices",
                         ms(cost::stage_cost(cm_, ops, mask_, dp * 2, mb, mini_batch_, near).tps_s), dp * 2);
    return fmt::format(
        "stage {} ({} ops, {} .. {}): {} device{}{} -> {} per sample{}; in-flight {} -> {:.2f} of {:.2f} GB", k,
        ops.size(), g.op(ops.front()).name, g.op(ops.back()).name, dp, dp == 1 ? "" : "s",
        mb == mbs_ ? "" : fmt::format(" at micro-batch {}", mb), ms(c.tps_s), alt, s.in_flight, s.memory_bytes / 1e9,
        memory_limit_ / 1e9);
  }

  const cost::CostModel& cm_;
  const Parts& parts_;
  const int mbs_, mini_batch_;
  const double memory_limit_;
  const std::vector<std::vector<double>> edge_bytes_;
  std::vector<char> mask_;
  bool zb_ = false, all_in_flight_ = false;  // the schedule placed for: zero-bubble, GPipe
};

}  // namespace

plan::Plan assemble(const cost::CostModel& cm, const std::vector<StageChoice>& choices, int mbs, int mini_batch,
                    double memory_limit, Order order, std::vector<std::string>* explain) {
  return assemble_for(cm, choices, mbs, mini_batch, memory_limit, order, "1f1b", explain);
}

plan::Plan assemble_for(const cost::CostModel& cm, const std::vector<StageChoice>& choices, int mbs, int mini_batch,
                        double memory_limit, Order order, const std::string& schedule,
                        std::vector<std::string>* explain) {
  const ir::Graph& g = cm.graph();
  const cost::Cluster& cl = cm.cluster();
  plan::Plan p;
  p.model_name = g.name();
  p.num_ops = static_cast<int>(g.num_ops());
  p.cluster_name = cl.name;
  p.num_devices = cl.num_devices();
  p.mini_batch_size = mini_batch;
  p.schedule = schedule;
  p.optimizer = cm.optimizer();
  Parts parts;
  for (const auto& c : choices) {
    parts.ops.push_back(c.ops);
    std::sort(parts.ops.back().begin(), parts.ops.back().end());
    parts.dp.push_back(c.dp);
    parts.mb.push_back(c.mbs > 0 ? c.mbs : mbs);
  }
  order_stages(g, order, parts, p);
  // The base order decides which stages share a node; the placement with the smallest predicted
  // iteration time is kept.
  Placer placer(cm, parts, mbs, mini_batch, memory_limit, edge_bytes_per_sample(cm, p, parts.ops));
  const std::vector<std::vector<int>> bases = placement_bases(p, cl, order);
  size_t chosen = 0;
  if (bases.size() > 1) {
    double best = std::numeric_limits<double>::infinity();
    for (size_t b = 0; b < bases.size(); ++b) {
      placer.place_and_cost(p, bases[b], nullptr);
      if (p.predicted.iteration_time_s < best * (1 - 1e-12)) best = p.predicted.iteration_time_s, chosen = b;
    }
  }
  placer.place_and_cost(p, bases[chosen], explain);
  return p;
}

}  // namespace gp::planner::detail
