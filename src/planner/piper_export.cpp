// `graphpipe piper-export`: the instance msr-fiddle/piper's algo.cpp reads (its README's input
// format), built from our cost model on the coarse graph our Piper baseline runs on, so that the
// two DPs can be compared on the same graph and per-op costs (scripts/real_piper.sh).
#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <map>

#include "planner/piper.h"
#include "planner/planner.h"

namespace gp::planner {

namespace {

// Per coarse node: its ops' costs at micro-batch `mb`, as Piper's one TMPC ("vanilla", t = 1).
Json node_json(const cost::CostModel& cm, const std::vector<OpId>& ops, int id, int mb, int num_micro,
               double ar_bytes_per_param_byte) {
  const ir::Graph& g = cm.graph();
  double comp = 0, act = 0, state = 0, param = 0, tensors = 0;
  for (OpId o : ops) {
    comp += cm.op_step_time(o, mb);
    act += cm.saved_bytes(o, mb);
    state += cm.state_bytes(o);
    tensors += g.costs(o).param_tensors;
    param += static_cast<double>(g.costs(o).param_bytes);
  }
  // Piper has no per-iteration term but its data-parallel resync: the optimizer step is spread
  // over the iteration's micro-batches, as the stage cost spreads it over the mini-batch.
  comp += cost::optimizer_step_time(cm, state, tensors) / num_micro;
  Json tmpc = {{"id", "vanilla"},
               {"timePerSample", comp * 1e3},  // ms per micro-batch
               {"parameterSize", param * ar_bytes_per_param_byte},
               {"memoryUsageA", act},
               {"memoryUsageB", state},
               {"syncTimeFw", Json::object()},
               {"syncTimeBw", Json::object()}};
  std::string name = g.op(ops.front()).name;
  if (ops.size() > 1) name += fmt::format(" .. {} ({} ops)", g.op(ops.back()).name, ops.size());
  return {{"id", id}, {"name", name}, {"TMPCs", {{"1", Json::array({tmpc})}}}};
}

}  // namespace

Json piper_instance(const cost::CostModel& cm, const PlannerOptions& opt) {
  const int n = cm.cluster().num_devices(), mb = opt.micro_batch;
  GP_CHECK(opt.mini_batch >= 1 && opt.mini_batch <= kMaxMiniBatch,
           "--batch: mini-batch size must be in [1, {}], got {}", kMaxMiniBatch, opt.mini_batch);
  GP_CHECK(mb >= 1 && opt.mini_batch % mb == 0, "--micro-batch: must be >= 1 and divide --batch {}, got {}",
           opt.mini_batch, mb);
  GP_CHECK(opt.time_limit_s > 0 && opt.time_limit_s <= kMaxTimeLimitS, "--time-limit must be in (0, {}] s, got {}",
           kMaxTimeLimitS, opt.time_limit_s);
  GP_CHECK(opt.memory_limit_bytes >= 0 && std::isfinite(opt.memory_limit_bytes),
           "--memory-limit must be >= 0 and finite, got {} GB", opt.memory_limit_bytes / 1e9);
  const double limit = cm.usable_memory_bytes(opt.memory_limit_bytes);
  GP_CHECK(limit > 0, "--memory-limit leaves nothing for tensors after the device reserve of {:.3g} GB",
           cm.cluster().device.memory_reserve_bytes / 1e9);
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(opt.time_limit_s));
  // The graph `plan --planner piper --micro-batch M --time-limit S` runs on (one size).
  detail::PiperGraph pg = detail::piper_graph(cm, detail::piper_split_budget(opt.time_limit_s, n, 1), deadline,
                                              opt.time_limit_s);
  const ir::Graph& g = cm.graph();
  const bool same_node = n <= cm.cluster().devices_per_node;
  const cost::LinkSpec& link = same_node ? cm.intra_link() : cm.inter_link();
  // Piper resyncs d replicas with 4 (d - 1) / d x parameterSize bytes over `bandwidth` and has no
  // latency term: scaled so that two replicas cost our all-reduce's per-byte time (its slope).
  const double probe = 1e9;
  const double slope = (cm.allreduce_time(2, same_node, 2 * probe) - cm.allreduce_time(2, same_node, probe)) / probe;
  const double ar_scale = slope * link.bandwidth_Bps / 2;
  const int num_micro = opt.mini_batch / mb;
  std::vector<int> node_of(g.num_ops());
  Json nodes = Json::array();
  for (size_t x = 0; x < pg.nodes.size(); ++x) {
    for (OpId o : pg.nodes[x]) node_of[o.v] = static_cast<int>(x);
    nodes.push_back(node_json(cm, pg.nodes[x], static_cast<int>(x), mb, num_micro, ar_scale));
  }
  // Edge u -> v: the bytes per micro-batch of u's outputs that v reads.
  std::map<std::pair<int, int>, double> edge_bytes;
  for (size_t o = 0; o < g.num_ops(); ++o) {
    std::vector<int> readers;
    for (OpId s : g.succs(OpId(static_cast<int32_t>(o))))
      if (node_of[s.v] != node_of[o]) readers.push_back(node_of[s.v]);
    std::sort(readers.begin(), readers.end());
    readers.erase(std::unique(readers.begin(), readers.end()), readers.end());
    for (int r : readers) edge_bytes[{node_of[o], r}] += cm.output_bytes(OpId(static_cast<int32_t>(o)), mb);
  }
  // Tensor parallelism is not modelled (t = 1 only): every edge's sync times are 0, keyed as
  // algo.cpp reads them (syncTimeFw by the edge's tail, syncTimeBw by its head).
  Json edges = Json::array();
  for (const auto& [e, bytes] : edge_bytes) {
    edges.push_back({{"sourceId", e.first}, {"destId", e.second}, {"communicationCost", bytes}});
    nodes[e.second]["TMPCs"]["1"][0]["syncTimeFw"][std::to_string(e.first)] = 0.0;
    nodes[e.first]["TMPCs"]["1"][0]["syncTimeBw"][std::to_string(e.second)] = 0.0;
  }
  const plan::PiperCoarsening& pc = pg.coarsening;
  return {{"maxMemoryPerDevice", limit},
          {"maxDevices", n},
          {"bandwidth", link.bandwidth_Bps / 1e3},  // bytes per ms: times are in ms
          {"mbsInBatch", num_micro},
          {"nodes", std::move(nodes)},
          {"edges", std::move(edges)},
          {"graphpipe",
           {{"model", g.name()},
            {"micro_batch", mb},
            {"mini_batch", opt.mini_batch},
            {"time_unit", "ms per micro-batch"},
            {"graph", pc.graph},
            {"ops", pc.ops},
            {"downsets", pc.downsets},
            {"splits", pc.splits}}}};
}

}  // namespace gp::planner
