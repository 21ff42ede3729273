// graphpipe.plan/1: JSON reading/writing and the validity rules C1-C3 of DESIGN.md.
#include "plan/plan.h"

#include <algorithm>
#include <map>
#include <set>

#include "cost/cost_model.h"
#include "graph/dag.h"
#include "plan/costs.h"
#include "plan/schedule_kind.h"

namespace gp::plan {

// ---------------------------------------------------------------------------------------------
// JSON

Json plan_to_json(const Plan& p) {
  Json stages = Json::array();
  for (const Stage& s : p.stages) {
    stages.push_back({{"id", s.id},
                      {"ops", s.ops},
                      {"devices", s.devices},
                      {"micro_batch_size", s.micro_batch_size},
                      {"in_flight", s.in_flight},
                      {"inputs_from", s.inputs_from},
                      {"outputs_to", s.outputs_to},
                      {"tps_s", s.tps_s},
                      {"memory_bytes", s.memory_bytes}});
    if (s.fwd_s > 0 || s.bwd_input_s > 0 || s.bwd_weight_s > 0) {
      stages.back()["fwd_s"] = s.fwd_s;
      stages.back()["bwd_input_s"] = s.bwd_input_s;
      stages.back()["bwd_weight_s"] = s.bwd_weight_s;
    }
  }
  Json model = {{"name", p.model_name}, {"num_ops", p.num_ops}};
  if (!p.model_spec.empty()) model["spec"] = p.model_spec;
  Json cluster = {{"name", p.cluster_name}, {"num_devices", p.num_devices}};
  if (!p.cluster_spec.empty()) cluster["spec"] = p.cluster_spec;
  Json doc = {{"format", "graphpipe.plan/1"},
              {"planner", p.planner},
              {"model", model},
              {"cluster", cluster},
              {"mini_batch_size", p.mini_batch_size},
              {"optimizer", cost::to_string(p.optimizer)},
              {"stages", stages},
              {"predicted",
               {{"iteration_time_s", p.predicted.iteration_time_s},
                {"throughput_samples_per_s", p.predicted.throughput_samples_per_s},
                {"bottleneck_tps_s", p.predicted.bottleneck_tps_s},
                {"peak_memory_bytes", p.predicted.peak_memory_bytes}}},
              {"search_time_s", p.search_time_s}};
  if (!p.search.winner.empty()) {
    Json cands = Json::object();
    for (const SearchCandidate& c : p.search.candidates)
      cands[c.name] = {{"micro_batch_size", c.micro_batch_size},
                       {"num_stages", c.num_stages},
                       {"depth", c.depth},
                       {"iteration_time_s", c.iteration_time_s},
                       {"throughput_samples_per_s", c.throughput_samples_per_s},
                       {"bottleneck_tps_s", c.bottleneck_tps_s}};
    for (const SearchCandidate& c : p.search.candidates)
      if (c.simulated_iteration_time_s > 0) cands[c.name]["simulated_iteration_time_s"] = c.simulated_iteration_time_s;
    doc["search"] = {{"winner", p.search.winner}, {"candidates", cands}};
  }
  if (p.piper.recorded())
    doc["piper"] = {{"ops", p.piper.ops},
                    {"nodes", p.piper.nodes},
                    {"max_ops_per_node", p.piper.max_ops_per_node},
                    {"branch_groups", p.piper.branch_groups},
                    {"downsets", p.piper.downsets},
                    {"splits", p.piper.splits},
                    {"split_budget", p.piper.split_budget},
                    {"graph", p.piper.graph}};
  if (p.costs.recorded()) doc["costs"] = costs_to_json(p.costs);
  if (find_schedule_kind(p.schedule) != ScheduleKind::one_f_one_b)
    doc["schedule"] = p.schedule;  // absent = 1f1b (older files)
  return doc;
}

namespace {

int positive_int(const JsonAt& j, int min_value) {
  int64_t v = j.i64();
  if (v < min_value || v > (int64_t{1} << 30)) j.fail(fmt::format("expected an integer >= {}, found {}", min_value, v));
  return static_cast<int>(v);
}

std::vector<int> int_list(const JsonAt& j, int min_value) {
  std::vector<int> out;
  for (size_t i = 0; i < j.size(); ++i) out.push_back(positive_int(j.at(i), min_value));
  return out;
}

std::vector<std::string> str_list(const JsonAt& j) {
  std::vector<std::string> out;
  for (size_t i = 0; i < j.size(); ++i) out.push_back(j.at(i).str());
  return out;
}

double nonneg(const JsonAt& j) {
  double v = j.num();
  if (!(v >= 0)) j.fail(fmt::format("expected a number >= 0, found {}", j.json().dump()));
  return v;
}

/// Sets `out` from the optional member `key` of `j` (a number >= 0) when it is there.
void optional_nonneg(const JsonAt& j, const char* key, double& out) {
  if (j.has(key)) out = nonneg(j.at(key));
}

}  // namespace

namespace {

Stage stage_from_json(const JsonAt& sj, size_t index) {
  sj.expect_object();
  Stage s;
  s.id = positive_int(sj.at("id"), 0);
  if (s.id != static_cast<int>(index))
    sj.at("id").fail(fmt::format("stage ids must be 0, 1, 2, ... in order; found {} at index {}", s.id, index));
  s.ops = str_list(sj.at("ops"));
  s.devices = int_list(sj.at("devices"), 0);
  s.micro_batch_size = positive_int(sj.at("micro_batch_size"), 1);
  s.in_flight = positive_int(sj.at("in_flight"), 1);
  s.inputs_from = int_list(sj.at("inputs_from"), 0);
  s.outputs_to = int_list(sj.at("outputs_to"), 0);
  optional_nonneg(sj, "tps_s", s.tps_s);
  optional_nonneg(sj, "memory_bytes", s.memory_bytes);
  optional_nonneg(sj, "fwd_s", s.fwd_s);
  optional_nonneg(sj, "bwd_input_s", s.bwd_input_s);
  optional_nonneg(sj, "bwd_weight_s", s.bwd_weight_s);
  return s;
}

Predicted predicted_from_json(const JsonAt& pr) {
  pr.expect_object();
  Predicted out;
  optional_nonneg(pr, "iteration_time_s", out.iteration_time_s);
  optional_nonneg(pr, "throughput_samples_per_s", out.throughput_samples_per_s);
  optional_nonneg(pr, "bottleneck_tps_s", out.bottleneck_tps_s);
  if (pr.has("peak_memory_bytes")) {
    JsonAt m = pr.at("peak_memory_bytes");
    for (size_t i = 0; i < m.size(); ++i) out.peak_memory_bytes.push_back(nonneg(m.at(i)));
  }
  return out;
}

SearchCandidate candidate_from_json(const JsonAt& c, const std::string& name) {
  c.expect_object();
  SearchCandidate sc;
  sc.name = name;
  sc.micro_batch_size = static_cast<int>(c.i64_or("micro_batch_size", 0));
  sc.num_stages = static_cast<int>(c.i64_or("num_stages", 0));
  sc.depth = static_cast<int>(c.i64_or("depth", 0));
  optional_nonneg(c, "iteration_time_s", sc.iteration_time_s);
  optional_nonneg(c, "throughput_samples_per_s", sc.throughput_samples_per_s);
  optional_nonneg(c, "bottleneck_tps_s", sc.bottleneck_tps_s);
  optional_nonneg(c, "simulated_iteration_time_s", sc.simulated_iteration_time_s);
  return sc;
}

Search search_from_json(const JsonAt& sr) {
  sr.expect_object();
  Search out;
  out.winner = sr.at("winner").str();
  JsonAt cs = sr.at("candidates");
  cs.expect_object();
  for (const auto& [name, _] : cs.json().items())
    out.candidates.push_back(candidate_from_json(cs.at(name.c_str()), name));
  // JSON objects are unordered: list "sp" first, as the planner does.
  std::stable_sort(
      out.candidates.begin(), out.candidates.end(),
      [](const SearchCandidate& a, const SearchCandidate& b) { return (a.name == "sp") > (b.name == "sp"); });
  bool known = false;
  for (const auto& c : out.candidates) known = known || c.name == out.winner;
  if (!known) sr.at("winner").fail(fmt::format("\"{}\" is not one of the listed candidates", out.winner));
  return out;
}

PiperCoarsening piper_from_json(const JsonAt& pc) {
  pc.expect_object();
  auto count = [&](const char* key) {
    const int64_t v = pc.i64_or(key, 0);
    if (v < 0) pc.at(key).fail(fmt::format("must be >= 0, got {}", v));
    return v;
  };
  PiperCoarsening out;
  out.ops = static_cast<int>(count("ops"));
  out.nodes = static_cast<int>(count("nodes"));
  out.max_ops_per_node = static_cast<int>(count("max_ops_per_node"));
  out.branch_groups = static_cast<int>(count("branch_groups"));
  out.downsets = count("downsets");
  out.splits = count("splits");
  out.split_budget = count("split_budget");
  if (pc.has("graph")) out.graph = pc.at("graph").str();
  return out;
}

}  // namespace

Plan plan_from_json(const Json& j, const std::string& file) {
  JsonAt doc(j, file);
  doc.expect_object();
  expect_format(doc, "graphpipe.plan/1");
  Plan p;
  p.planner = doc.at("planner").str();
  JsonAt model = doc.at("model");
  p.model_name = model.at("name").str();
  p.num_ops = positive_int(model.at("num_ops"), 1);
  p.model_spec = model.str_or("spec", "");
  JsonAt cluster = doc.at("cluster");
  p.cluster_name = cluster.at("name").str();
  p.num_devices = positive_int(cluster.at("num_devices"), 1);
  p.cluster_spec = cluster.str_or("spec", "");
  p.mini_batch_size = positive_int(doc.at("mini_batch_size"), 1);
  if (doc.has("schedule")) {
    JsonAt sk = doc.at("schedule");
    p.schedule = sk.str();
    if (!find_schedule_kind(p.schedule))
      sk.fail(fmt::format("unknown schedule \"{}\" (valid: {})", p.schedule, schedule_kind_names()));
  }
  if (doc.has("optimizer")) {
    JsonAt o = doc.at("optimizer");
    const std::string name = o.str();
    if (name != "adam" && name != "sgd") o.fail(fmt::format("unknown optimizer \"{}\" (valid: adam, sgd)", name));
    p.optimizer = cost::optimizer_from_string(name);
  }
  JsonAt stages = doc.at("stages");
  if (stages.size() == 0) stages.fail("a plan needs at least one stage");
  for (size_t i = 0; i < stages.size(); ++i) p.stages.push_back(stage_from_json(stages.at(i), i));
  if (doc.has("predicted")) p.predicted = predicted_from_json(doc.at("predicted"));
  optional_nonneg(doc, "search_time_s", p.search_time_s);
  if (doc.has("search")) p.search = search_from_json(doc.at("search"));
  if (doc.has("piper")) p.piper = piper_from_json(doc.at("piper"));
  if (doc.has("costs")) p.costs = costs_from_json(doc.at("costs"), p.num_devices);
  return p;
}

Plan load_plan(const std::string& path) { return plan_from_json(read_json_file(path), path); }

void save_plan(const std::string& path, const Plan& p) { write_json_file(path, plan_to_json(p)); }

// ---------------------------------------------------------------------------------------------
// Building plans: the op graph, the in-flight rule, stage edges

graph::Dag op_dag(const ir::Graph& g) {
  graph::Dag d(static_cast<int>(g.num_ops()));
  for (size_t i = 0; i < g.num_ops(); ++i)
    for (OpId s : g.succs(OpId(static_cast<int32_t>(i)))) d.add_edge(static_cast<int>(i), s.v);
  return d;
}

int required_in_flight(int mbs, int64_t succ_in_flight_samples) {
  GP_ASSERT(mbs >= 1, "micro-batch size {}", mbs);
  return 1 + static_cast<int>((succ_in_flight_samples + mbs - 1) / mbs);
}

void assign_min_in_flight(Plan& p) {
  for (int id : [&] {
         auto order = stage_topo_order(p);
         std::reverse(order.begin(), order.end());
         return order;
       }()) {
    Stage& s = p.stages[id];
    int64_t succ = 0;
    for (int t : s.outputs_to)
      succ = std::max<int64_t>(succ, int64_t{p.stages[t].in_flight} * p.stages[t].micro_batch_size);
    s.in_flight = required_in_flight(s.micro_batch_size, succ);
  }
}

void derive_stage_edges(Plan& p, const ir::Graph& g) {
  std::vector<int> st = stage_of_ops(p, g);
  GP_ASSERT(std::find(st.begin(), st.end(), -1) == st.end(), "op without a stage");
  std::vector<std::set<int>> out(p.stages.size()), in(p.stages.size());
  for (const auto& [edge, ops] : cut_edges(g, st)) {
    out[edge.first].insert(edge.second);
    in[edge.second].insert(edge.first);
  }
  for (size_t k = 0; k < p.stages.size(); ++k) {
    p.stages[k].outputs_to.assign(out[k].begin(), out[k].end());
    p.stages[k].inputs_from.assign(in[k].begin(), in[k].end());
  }
}

CutEdges cut_edges(const ir::Graph& g, const std::vector<int>& stage_of) {
  CutEdges cut;
  for (size_t i = 0; i < g.num_ops(); ++i) {
    const OpId op(static_cast<int32_t>(i));
    for (OpId s : g.succs(op)) {
      const int a = stage_of[i], b = stage_of[s.v];
      if (a < 0 || b < 0 || a == b) continue;
      std::vector<OpId>& ops = cut[{a, b}];
      if (ops.empty() || ops.back() != op) ops.push_back(op);  // ops arrive in ascending order
    }
  }
  return cut;
}

std::vector<double> out_bytes_per_sample(const Stage& s, const CutEdges& cut, const cost::CostModel& cm) {
  std::vector<double> out;
  for (int v : s.outputs_to) {
    double bytes = 0;
    if (auto it = cut.find({s.id, v}); it != cut.end())
      for (OpId o : it->second) bytes += cm.output_bytes(o, 1);
    out.push_back(bytes);
  }
  return out;
}

std::vector<int> stage_of_ops(const Plan& p, const ir::Graph& g) {
  std::vector<int> st(g.num_ops(), -1);
  for (const Stage& s : p.stages)
    for (const std::string& name : s.ops) {
      OpId id = g.find(name);
      if (id.valid()) st[id.v] = s.id;
    }
  return st;
}

std::vector<std::string> micro_batch_warnings(const Plan& p, const ir::Graph& g) {
  std::vector<std::string> bn_parts;
  for (const Stage& s : p.stages) {
    const int per_replica = s.micro_batch_size / std::max<int>(1, static_cast<int>(s.devices.size()));
    if (per_replica >= p.mini_batch_size) continue;
    std::vector<std::string> bn;
    for (const std::string& name : s.ops) {
      const OpId id = g.find(name);
      if (!id.valid()) continue;
      const ir::Op& op = g.op(id);
      if (op.kind == ir::OpKind::batchnorm) bn.push_back(name);
    }
    if (bn.empty()) continue;
    const size_t shown = std::min<size_t>(bn.size(), 2);
    bn_parts.push_back(fmt::format("stage {} ({} batchnorm op(s): {}{}) normalizes over {} sample(s) at a time", s.id,
                                   bn.size(),
                                   fmt::join(bn.begin(), bn.begin() + static_cast<std::ptrdiff_t>(shown), ", "),
                                   bn.size() > shown ? ", ..." : "", per_replica));
  }
  std::vector<std::string> out;
  if (!bn_parts.empty())
    out.push_back(fmt::format(
        "batch normalization uses the statistics of each micro-batch on each replica, not of the mini-batch of {}: "
        "{}; this trains a different model than one device taking the whole mini-batch (and than PyTorch's own "
        "step with batch {}), the more the smaller the micro-batch. With `plan --micro-batch {}` and one device "
        "per such stage the statistics are the mini-batch's (exact); smaller micro-batches follow GPipe's "
        "convention (statistics per micro-batch)",
        p.mini_batch_size, fmt::join(bn_parts, "; "), p.mini_batch_size, p.mini_batch_size));
  return out;
}

namespace {
graph::Dag stage_dag(const Plan& p) {
  graph::Dag d(static_cast<int>(p.stages.size()));
  for (const Stage& s : p.stages)
    for (int t : s.outputs_to)
      if (t >= 0 && t < d.size()) d.add_edge(s.id, t);
  return d;
}

std::string cycle_str(const std::vector<int>& cyc) {
  std::string out;
  for (int v : cyc) out += fmt::format("{} -> ", v);
  return out + std::to_string(cyc.front());
}
}  // namespace

std::vector<int> stage_topo_order(const Plan& p) {
  auto order = graph::topo_order(stage_dag(p));
  if (!order) throw UserError("plan: C2: stage graph has a cycle: " + cycle_str(graph::find_cycle(stage_dag(p))));
  return *order;
}

int pipeline_depth(const Plan& p) {
  std::vector<int> depth(p.stages.size(), 1);
  std::vector<int> order = stage_topo_order(p);
  int best = p.stages.empty() ? 0 : 1;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    for (int t : p.stages[*it].outputs_to) depth[*it] = std::max(depth[*it], depth[t] + 1);
    best = std::max(best, depth[*it]);
  }
  return best;
}

// ---------------------------------------------------------------------------------------------
// Validation

namespace {

/// A witness that stage `members` is not convex: an op outside it on a path between two members.
std::string convexity_witness(const ir::Graph& g, const graph::Dag& d, const std::vector<int>& st, int stage) {
  // Forward reachability from the stage through outside ops, remembering where each walk began.
  const int n = d.size();
  std::vector<int> origin(n, -1);
  std::vector<int> stack;
  for (int u = 0; u < n; ++u)
    if (st[u] == stage)
      for (int v : d.succs(u))
        if (st[v] != stage && origin[v] < 0) {
          origin[v] = u;
          stack.push_back(v);
        }
  while (!stack.empty()) {
    int u = stack.back();
    stack.pop_back();
    for (int v : d.succs(u)) {
      if (st[v] == stage)
        return fmt::format("op \"{}\" (stage {}) lies on a path from \"{}\" to \"{}\"", g.op(OpId(u)).name, st[u],
                           g.op(OpId(origin[u])).name, g.op(OpId(v)).name);
      if (origin[v] < 0) {
        origin[v] = origin[u];
        stack.push_back(v);
      }
    }
  }
  return "a path leaves it and re-enters it";
}

}  // namespace

namespace {

// The steps of validate_plan, in order; each throws UserError "WHERE: RULE: ..." on the first
// violation it finds.
[[noreturn]] void fail(const std::string& where, const std::string& msg) { throw UserError(where + ": " + msg); }

void check_header(const Plan& p, const ir::Graph& g, const std::string& where) {
  const int num_stages = static_cast<int>(p.stages.size());
  if (num_stages == 0) fail(where, "plan has no stages");
  if (p.num_ops != static_cast<int>(g.num_ops()))
    fail(where, fmt::format("model.num_ops is {} but model \"{}\" has {} ops", p.num_ops, g.name(), g.num_ops()));
  for (int k = 0; k < num_stages; ++k)
    if (p.stages[k].id != k)
      fail(where, fmt::format("stages[{}] has id {}; ids must equal positions", k, p.stages[k].id));
}

// C1: every op in exactly one stage. Returns each op's stage.
std::vector<int> check_ops_in_one_stage(const Plan& p, const ir::Graph& g, const std::string& where) {
  std::vector<int> st(g.num_ops(), -1);
  for (const Stage& s : p.stages) {
    if (s.ops.empty()) fail(where, fmt::format("C1: stage {} has no ops", s.id));
    for (const std::string& name : s.ops) {
      OpId id = g.find(name);
      if (!id.valid()) {
        if (g.find_input(name)) continue;  // graph inputs may be listed; they are not ops
        fail(where, fmt::format("C1: stage {} lists unknown op \"{}\"", s.id, name));
      }
      if (st[id.v] >= 0) fail(where, fmt::format("C1: op \"{}\" is in stages {} and {}", name, st[id.v], s.id));
      st[id.v] = s.id;
    }
  }
  std::vector<std::string> missing;
  for (size_t i = 0; i < g.num_ops(); ++i)
    if (st[i] < 0) missing.push_back(g.op(OpId(static_cast<int32_t>(i))).name);
  if (!missing.empty()) {
    std::string eg;
    for (size_t i = 0; i < std::min<size_t>(3, missing.size()); ++i)
      eg += fmt::format("{}\"{}\"", i ? ", " : "", missing[i]);
    fail(where,
         fmt::format("C1: {} op{} in no stage, e.g. {}", missing.size(), missing.size() == 1 ? " is" : "s are", eg));
  }
  return st;
}

// C1: convex stages.
void check_convex(const Plan& p, const ir::Graph& g, const graph::Dag& d, const std::vector<int>& st,
                  const std::string& where) {
  std::vector<std::vector<int>> members(p.stages.size());
  for (size_t i = 0; i < st.size(); ++i) members[st[i]].push_back(static_cast<int>(i));
  for (size_t k = 0; k < members.size(); ++k)
    if (!graph::is_convex(d, members[k]))
      fail(where, fmt::format("C1: stage {} is not convex: {}", k, convexity_witness(g, d, st, static_cast<int>(k))));
}

// C2: declared stage edges well-formed and each listed from both ends.
void check_declared_edges(const Plan& p, const std::string& where) {
  const int num_stages = static_cast<int>(p.stages.size());
  for (const Stage& s : p.stages) {
    for (int t : s.outputs_to) {
      if (t < 0 || t >= num_stages) fail(where, fmt::format("C2: stage {} outputs_to unknown stage {}", s.id, t));
      if (t == s.id) fail(where, fmt::format("C2: stage {} lists itself in outputs_to", s.id));
      const auto& back = p.stages[t].inputs_from;
      if (std::find(back.begin(), back.end(), s.id) == back.end())
        fail(where,
             fmt::format("C2: stage {} outputs_to {} but stage {} inputs_from does not list {}", s.id, t, t, s.id));
    }
    for (int f : s.inputs_from) {
      if (f < 0 || f >= num_stages) fail(where, fmt::format("C2: stage {} inputs_from unknown stage {}", s.id, f));
      const auto& fwd = p.stages[f].outputs_to;
      if (std::find(fwd.begin(), fwd.end(), s.id) == fwd.end())
        fail(where,
             fmt::format("C2: stage {} inputs_from {} but stage {} outputs_to does not list {}", s.id, f, f, s.id));
    }
  }
}

// C2: every op edge across stages is a declared stage edge, and the stage graph is acyclic.
void check_implied_edges(const Plan& p, const ir::Graph& g, const graph::Dag& d, const std::vector<int>& st,
                         const std::string& where) {
  for (int u = 0; u < d.size(); ++u)
    for (int v : d.succs(u))
      if (st[u] != st[v]) {
        const auto& outs = p.stages[st[u]].outputs_to;
        if (std::find(outs.begin(), outs.end(), st[v]) == outs.end())
          fail(where, fmt::format("C2: op \"{}\" (stage {}) feeds op \"{}\" (stage {}) but stage {} "
                                  "outputs_to does not list {}",
                                  g.op(OpId(u)).name, st[u], g.op(OpId(v)).name, st[v], st[u], st[v]));
      }
  if (auto cyc = graph::find_cycle(stage_dag(p)); !cyc.empty())
    fail(where, "C2: stage graph has a cycle: " + cycle_str(cyc));
}

// C3: devices non-empty, in range, disjoint.
void check_devices(const Plan& p, const std::string& where) {
  std::map<int, int> stage_of_device;
  for (const Stage& s : p.stages) {
    if (s.devices.empty()) fail(where, fmt::format("C3: stage {} has no devices", s.id));
    for (int dev : s.devices) {
      if (dev < 0 || dev >= p.num_devices)
        fail(where, fmt::format("C3: stage {} uses device {} outside [0, {})", s.id, dev, p.num_devices));
      auto [it, fresh] = stage_of_device.emplace(dev, s.id);
      if (!fresh) fail(where, fmt::format("C3: device {} in stages {} and {}", dev, it->second, s.id));
    }
  }
}

// Micro-batch sizes divide the mini-batch and split evenly over the stage's replicas.
void check_micro_batches(const Plan& p, const std::string& where) {
  if (p.mini_batch_size < 1) fail(where, fmt::format("mini_batch_size {} must be >= 1", p.mini_batch_size));
  for (const Stage& s : p.stages) {
    if (s.micro_batch_size < 1 || p.mini_batch_size % s.micro_batch_size != 0)
      fail(where, fmt::format("stage {}: micro_batch_size {} does not divide mini_batch_size {}", s.id,
                              s.micro_batch_size, p.mini_batch_size));
    if (s.micro_batch_size % static_cast<int>(s.devices.size()) != 0)
      fail(where, fmt::format("stage {}: micro_batch_size {} is not divisible by its {} devices "
                              "(data-parallel replicas)",
                              s.id, s.micro_batch_size, s.devices.size()));
  }
}

// In-flight rule: 1 + max over successors (in samples when micro-batch sizes differ).
void check_in_flight(const Plan& p, const std::string& where) {
  for (const Stage& s : p.stages) {
    int64_t succ = 0;
    for (int t : s.outputs_to)
      succ = std::max<int64_t>(succ, int64_t{p.stages[t].in_flight} * p.stages[t].micro_batch_size);
    int need = required_in_flight(s.micro_batch_size, succ);
    if (s.in_flight < need)
      fail(where, fmt::format("in_flight: stage {} has {}, needs >= {} (1 + its successors' in-flight "
                              "samples / micro_batch_size {})",
                              s.id, s.in_flight, need, s.micro_batch_size));
  }
}

}  // namespace

void validate_plan(const Plan& p, const ir::Graph& g, const std::string& where) {
  check_header(p, g, where);
  const std::vector<int> st = check_ops_in_one_stage(p, g, where);
  const graph::Dag d = op_dag(g);
  check_convex(p, g, d, st, where);
  check_declared_edges(p, where);
  check_implied_edges(p, g, d, st, where);
  check_devices(p, where);
  check_micro_batches(p, where);
  check_in_flight(p, where);
}

}  // namespace gp::plan
