// Piper baseline (Tarnawski et al., NeurIPS 2021, without tensor parallelism): a DP over downsets
// (node sets closed under successors) of a coarsened graph. A downset D splits into a stage
// S = D \ D' and a smaller downset D' that runs after it. Exact for chains; the number of downsets
// grows exponentially with the number of parallel branches, so, as Piper's paper does with its
// layer graphs, the DP runs on a coarsened graph, coarsened only as far as the time limit needs
// (piper.h): series runs within branches first, parallel branches grouped last.
#include "planner/piper.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>
#include <limits>
#include <unordered_map>

#include "graph/dag.h"
#include "graph/series_parallel.h"

namespace gp::planner::detail {

namespace {

using Bits = std::vector<uint64_t>;

struct BitsHash {
  size_t operator()(const Bits& b) const noexcept {
    size_t h = 1469598103934665603ull;
    for (uint64_t w : b) h = (h ^ w) * 1099511628211ull;
    return h;
  }
};

bool test(const uint64_t* b, int i) { return (b[i >> 6] >> (i & 63)) & 1; }
void set(Bits& b, int i) { b[i >> 6] |= uint64_t{1} << (i & 63); }
void reset(Bits& b, int i) { b[i >> 6] &= ~(uint64_t{1} << (i & 63)); }

// Downsets and pairs of nested downsets (D' within D, D' = D included) of a series-parallel graph,
// exactly: a node has 2 and 3; in parallel both multiply; in series (A then B)
// downsets = dA + dB - 1 and pairs = pA + pB - 1 + (dA - 1)(dB - 1). Splits = pairs - downsets.
struct Count {
  double downsets = 1, pairs = 1;  // the empty graph
};
constexpr Count kNode{2, 3};
Count in_series(Count a, Count b) {
  return {a.downsets + b.downsets - 1, a.pairs + b.pairs - 1 + (a.downsets - 1) * (b.downsets - 1)};
}
Count in_parallel(Count a, Count b) { return {a.downsets * b.downsets, a.pairs * b.pairs}; }

// One coarsening of the SP tree: series runs of at most `limit` parallel-free ops become nodes
// inside parallel blocks, of at most `outside` ops elsewhere (a chain between blocks adds few
// downsets, so it stays fine longest); parallel blocks keep each branch apart, or
// (max_groups > 0) merge adjacent branches, fewest ops first, until at most max_groups remain (a
// union of branches of one block is convex).
struct Coarsening {
  std::vector<std::vector<int>> groups;  // op ids per coarse node
  Count count;
};

Coarsening coarsen(const graph::SpTree& t, const std::vector<int>& size, const std::vector<int>& width, int limit,
                   int outside, int max_groups) {
  Coarsening out;
  auto emit = [&](const std::vector<int>& tree_nodes) {
    std::vector<int> ops;
    for (int v : tree_nodes)
      for (int leaf : t.leaves(v)) ops.push_back(leaf);
    out.groups.push_back(std::move(ops));
    return kNode;
  };
  auto whole = [&](int v, int lim) { return size[v] <= lim && (width[v] == 0 || max_groups == 1); };
  std::function<Count(int, bool)> cut = [&](int v, bool inside) -> Count {
    const int lim = inside ? limit : outside;
    if (whole(v, lim)) return emit({v});
    const graph::SpNode& n = t.nodes[v];
    Count c;
    if (n.kind == graph::SpNode::Kind::parallel) {
      std::vector<std::vector<int>> grp;
      std::vector<int> ops;
      for (int ch : n.children) grp.push_back({ch}), ops.push_back(size[ch]);
      while (max_groups > 0 && static_cast<int>(grp.size()) > max_groups) {
        size_t at = 0;
        for (size_t i = 1; i + 1 < grp.size(); ++i)
          if (ops[i] + ops[i + 1] < ops[at] + ops[at + 1]) at = i;
        grp[at].insert(grp[at].end(), grp[at + 1].begin(), grp[at + 1].end());
        ops[at] += ops[at + 1];
        grp.erase(grp.begin() + static_cast<long>(at) + 1);
        ops.erase(ops.begin() + static_cast<long>(at) + 1);
      }
      for (const auto& gr : grp) c = in_parallel(c, gr.size() == 1 ? cut(gr[0], true) : emit(gr));
      return c;
    }
    // Series: consecutive whole children are packed into runs of at most `lim` ops (a run of a
    // series composition is convex); the others are cut recursively.
    std::vector<int> run;
    int run_size = 0;
    auto flush = [&] {
      if (!run.empty()) c = in_series(c, emit(run));
      run.clear();
      run_size = 0;
    };
    for (int ch : n.children) {
      if (!whole(ch, lim)) {
        flush();
        c = in_series(c, cut(ch, inside));
        continue;
      }
      if (run_size + size[ch] > lim) flush();
      run.push_back(ch);
      run_size += size[ch];
    }
    flush();
    return c;
  };
  out.count = cut(t.root, false);
  return out;
}

// Sorts coarse nodes topologically (graph::kahn_order, smallest first op first), ops inside sorted.
std::vector<std::vector<OpId>> quotient_order(const ir::Graph& g, const std::vector<std::vector<int>>& groups) {
  const int ng = static_cast<int>(groups.size());
  std::vector<int> group(g.num_ops(), -1), first(ng, std::numeric_limits<int>::max());
  for (int k = 0; k < ng; ++k)
    for (int o : groups[k]) group[o] = k, first[k] = std::min(first[k], o);
  std::vector<std::pair<int, int>> edges;
  for (size_t o = 0; o < g.num_ops(); ++o) {
    GP_ASSERT(group[o] >= 0, "op {} in no coarse group", o);
    for (OpId s : g.succs(OpId(static_cast<int32_t>(o))))
      if (group[s.v] != group[o]) edges.push_back({group[o], group[s.v]});
  }
  graph::Dag coarse(ng);
  coarse.add_edges(edges);
  const std::vector<int> order = graph::kahn_order(coarse, [&](int k) { return first[k]; });
  GP_ASSERT(static_cast<int>(order.size()) == ng, "coarse graph has a cycle");
  std::vector<std::vector<OpId>> out;
  for (int k : order) {
    std::vector<int> ops = groups[k];
    std::sort(ops.begin(), ops.end());
    out.emplace_back();
    for (int o : ops) out.back().push_back(OpId(o));
  }
  return out;
}

// Enumerates the downsets and splits of pg.nodes; false when more than `cap` splits (or downsets).
bool enumerate(const ir::Graph& g, PiperGraph& pg, size_t cap, const std::function<void()>& check_time) {
  const int n = static_cast<int>(pg.nodes.size());
  const int words = pg.words = (n + 63) / 64;
  std::vector<int> where(g.num_ops());
  for (int v = 0; v < n; ++v)
    for (OpId o : pg.nodes[v]) where[o.v] = v;
  std::vector<std::vector<int>> succ(n), pred(n);
  for (size_t o = 0; o < g.num_ops(); ++o)
    for (OpId s : g.succs(OpId(static_cast<int32_t>(o))))
      if (where[s.v] != where[o]) succ[where[o]].push_back(where[s.v]), pred[where[s.v]].push_back(where[o]);
  std::vector<Bits> downsets{Bits(words, 0)};
  std::unordered_map<Bits, int, BitsHash> index{{downsets[0], 0}};
  // Downsets breadth-first (ids grow with size): add a node whose successors are all in.
  for (size_t k = 0; k < downsets.size(); ++k) {
    if ((k & 255) == 0) check_time();
    for (int x = 0; x < n; ++x) {
      if (test(downsets[k].data(), x)) continue;
      bool ok = true;
      for (int s : succ[x]) ok = ok && test(downsets[k].data(), s);
      if (!ok) continue;
      Bits nb = downsets[k];
      set(nb, x);
      if (index.emplace(nb, static_cast<int>(downsets.size())).second) downsets.push_back(std::move(nb));
    }
    if (downsets.size() > cap) return false;
  }
  // Splits of each downset D: stages S closed under predecessors within D (so D \ S is a downset).
  pg.first_split.assign(1, 0);
  pg.first_split.push_back(0);  // the empty downset has none
  pg.rest.clear();
  for (size_t k = 1; k < downsets.size(); ++k) {
    const Bits& D = downsets[k];
    std::vector<int> members;
    for (int x = 0; x < n; ++x)
      if (test(D.data(), x)) members.push_back(x);  // node order is topological
    Bits rest = D;
    bool any = false, over = false;
    std::function<void(size_t)> rec = [&](size_t pos) {
      if (over) return;
      if (pos == members.size()) {
        if (!any) return;
        pg.rest.push_back(index.at(rest));
        over = pg.rest.size() > cap;
        if ((pg.rest.size() & 4095) == 0) check_time();
        return;
      }
      const int x = members[pos];
      rec(pos + 1);  // x not in S
      bool ok = true;
      for (int p : pred[x]) ok = ok && (!test(D.data(), p) || !test(rest.data(), p));
      if (!ok) return;
      const bool was = any;
      reset(rest, x);
      any = true;
      rec(pos + 1);
      set(rest, x);
      any = was;
    };
    rec(0);
    if (over) return false;
    pg.first_split.push_back(static_cast<uint32_t>(pg.rest.size()));
  }
  pg.downsets.clear();
  for (const Bits& b : downsets) pg.downsets.insert(pg.downsets.end(), b.begin(), b.end());
  pg.full = static_cast<int>(downsets.size()) - 1;  // breadth-first: the full set comes last
  for (int x = 0; x < n; ++x)
    GP_ASSERT(test(&pg.downsets[pg.full * words], x), "the last downset is not the whole graph");
  return true;
}

struct Level {
  int limit = 1, outside = 1, groups = 0;  // see coarsen()
};

std::string describe(const Level& l, int branch, bool has_branches) {
  if (!has_branches) return l.outside == 1 ? "op graph" : fmt::format("series runs of <= {} ops", l.outside);
  const std::string rest = l.outside == 1 ? "ops elsewhere"
                                          : fmt::format("series runs of <= {} ops elsewhere", l.outside);
  if (l.groups == 1) return "each parallel block one node, " + rest;
  if (l.groups > 0) return fmt::format("branches grouped into <= {} nodes per parallel block, {}", l.groups, rest);
  if (l.limit == 1) return "op graph";
  if (l.limit >= branch) return "one node per branch, " + rest;
  return fmt::format("series runs of <= {} ops in branches, {}", l.limit, rest);
}

}  // namespace

size_t piper_split_budget(double time_limit_s, int devices, int sizes) {
  // The DP weighs each split at every device count for ~15 targets per micro-batch size; measured
  // at 0.05-0.08 us per split, device count and size of CPU time, and up to 0.7 us of wall clock
  // on the shared 2-core VM under load (dlrm 1.6M-4.9M, mmt 9.2M splits on 8 devices,
  // docs/results-history.md). Half the time limit goes to the DP at 1 us: conservative, so that a loaded
  // machine still finishes within the limit.
  const double per_split_s = 1e-6 * (devices + 1) * std::max(sizes, 1);
  return static_cast<size_t>(std::clamp(0.5 * time_limit_s / per_split_s, 1e3, 5e7));
}

PiperGraph piper_graph(const cost::CostModel& cm, size_t split_budget, std::chrono::steady_clock::time_point deadline,
                       double time_limit_s) {
  const ir::Graph& g = cm.graph();
  const graph::SpTree t = graph::sp_decompose_or_ize(plan::op_dag(g)).tree;
  // Per tree node: ops under it, and the most branches of a parallel block inside (0: none).
  std::vector<int> size(t.nodes.size(), 0), width(t.nodes.size(), 0);
  std::function<void(int)> measure = [&](int v) {
    const graph::SpNode& n = t.nodes[v];
    if (n.kind == graph::SpNode::Kind::leaf) return void(size[v] = 1);
    for (int c : n.children) measure(c), size[v] += size[c], width[v] = std::max(width[v], width[c]);
    if (n.kind == graph::SpNode::Kind::parallel) width[v] = std::max(width[v], static_cast<int>(n.children.size()));
  };
  measure(t.root);
  size_t explored = 0;
  auto check_time = [&] {
    if (std::chrono::steady_clock::now() > deadline)
      throw UserError(
          fmt::format("piper: no plan within the time limit of {:g} s (explored {} downsets)", time_limit_s, explored));
  };
  // Levels, finest first: inside parallel blocks, series runs of 1, 2, 4, ... ops up to one node
  // per branch (the largest branch of any block), ops elsewhere; then the branches of each block
  // grouped into at most width - 1, ..., 1 nodes; then runs of 2, 4, ... ops elsewhere too. Without
  // parallel blocks: series runs of 1, 2, 4, ... ops.
  const int num_ops = static_cast<int>(g.num_ops());
  int branch = width[t.root] == 0 ? num_ops : 1;
  for (size_t v = 0; v < t.nodes.size(); ++v)
    if (t.nodes[v].kind == graph::SpNode::Kind::parallel)
      for (int c : t.nodes[v].children) branch = std::max(branch, size[c]);
  const bool branches = width[t.root] > 0;
  std::vector<Level> levels;
  if (!branches) {
    for (int limit = 1;; limit *= 2) {
      levels.push_back({1, std::min(limit, num_ops), 0});
      if (limit >= num_ops) break;
    }
  } else {
    for (int limit = 1;; limit *= 2) {
      levels.push_back({std::min(limit, branch), 1, 0});
      if (limit >= branch) break;
    }
    for (int groups = width[t.root] - 1; groups >= 1; --groups) levels.push_back({branch, 1, groups});
    for (int outside = 2; outside < 2 * num_ops; outside *= 2)
      levels.push_back({branch, std::min(outside, num_ops), 1});
  }
  for (size_t i = 0; i < levels.size(); ++i) {
    const Level& level = levels[i];
    const bool last = i + 1 == levels.size();
    Coarsening c = coarsen(t, size, width, level.limit, level.outside, level.groups);
    // The count is exact for SP graphs; SP-ized ones have more, caught by enumerate's cap.
    if (!last && c.count.pairs - c.count.downsets > static_cast<double>(split_budget)) continue;
    PiperGraph pg;
    pg.nodes = quotient_order(g, c.groups);
    if (!enumerate(g, pg, last ? std::numeric_limits<size_t>::max() : 2 * split_budget, check_time)) {
      explored = std::max(explored, pg.first_split.size());
      continue;
    }
    pg.coarsening = {num_ops,
                     static_cast<int>(pg.nodes.size()),
                     std::max(level.limit, level.outside),
                     level.groups,
                     static_cast<int64_t>(pg.num_downsets()),
                     static_cast<int64_t>(pg.num_splits()),
                     static_cast<int64_t>(split_budget),
                     describe(level, branch, branches)};
    return pg;
  }
  GP_ASSERT(false, "piper: no coarsening level was tried");
  return {};
}

namespace {

// Per split and degree 2^plog: TPS, state and activation bytes, summed over the stage's coarse
// nodes (per-node sums, and the op tensors crossing the stage boundary for the cut edges): the
// same quantities as cost::stage_cost on the stage's ops (compute, transfers, all-reduce and the
// optimizer step), without walking them.
struct SplitCosts {
  int P = 1;
  std::vector<float> tps, act;  // [split * P + plog]
  std::vector<float> state;     // [split]
};

SplitCosts split_costs(const cost::CostModel& cm, const PiperGraph& pg, int micro_batch, int mini_batch, int pcap,
                       bool same_node, const std::function<void()>& check_time) {
  const ir::Graph& g = cm.graph();
  const int P = pcap + 1, nn = static_cast<int>(pg.nodes.size()), words = pg.words;
  std::vector<int> node_of(g.num_ops());
  for (int x = 0; x < nn; ++x)
    for (OpId o : pg.nodes[x]) node_of[o.v] = x;
  std::vector<double> ncomp(static_cast<size_t>(nn) * P, 0), nact(static_cast<size_t>(nn) * P, 0), nstate(nn, 0),
      nparam(nn, 0), ntensors(nn, 0);
  std::vector<std::vector<OpId>> inbound(nn);                                // producers outside the node
  std::vector<std::vector<std::pair<OpId, std::vector<int>>>> outbound(nn);  // op, reader nodes
  for (int x = 0; x < nn; ++x) {
    for (OpId o : pg.nodes[x]) {
      for (int plog = 0; plog <= pcap; ++plog) {
        ncomp[x * P + plog] += cm.op_step_time(o, micro_batch >> plog);
        nact[x * P + plog] += cm.saved_bytes(o, micro_batch >> plog);
      }
      nstate[x] += cm.state_bytes(o);
      nparam[x] += static_cast<double>(g.costs(o).param_bytes);
      ntensors[x] += g.costs(o).param_tensors;
      for (OpId p : g.preds(o))
        if (node_of[p.v] != x) inbound[x].push_back(p);
      std::vector<int> readers;
      for (OpId c : g.succs(o))
        if (node_of[c.v] != x) readers.push_back(node_of[c.v]);
      if (!readers.empty()) outbound[x].push_back({o, std::move(readers)});
    }
    std::sort(inbound[x].begin(), inbound[x].end());
    inbound[x].erase(std::unique(inbound[x].begin(), inbound[x].end()), inbound[x].end());
  }
  SplitCosts sc;
  sc.P = P;
  sc.tps.resize(pg.num_splits() * P);
  sc.act.resize(pg.num_splits() * P);
  sc.state.resize(pg.num_splits());
  std::vector<char> in_split(nn, 0);
  std::vector<size_t> seen(g.num_ops(), SIZE_MAX);
  std::vector<double> cut_bytes;
  std::vector<int> nodes;
  for (size_t k = 1; k < pg.num_downsets(); ++k)
    for (size_t si = pg.first_split[k]; si < pg.first_split[k + 1]; ++si) {
      const uint64_t* D = &pg.downsets[k * words];
      const uint64_t* R = &pg.downsets[static_cast<size_t>(pg.rest[si]) * words];
      nodes.clear();
      for (int w = 0; w < words; ++w)
        for (uint64_t b = D[w] & ~R[w]; b; b &= b - 1) nodes.push_back(w * 64 + std::countr_zero(b));
      for (int x : nodes) in_split[x] = 1;
      cut_bytes.clear();
      double st = 0, param = 0, tensors = 0;
      for (int x : nodes) {
        st += nstate[x];
        param += nparam[x];
        tensors += ntensors[x];
        for (OpId p : inbound[x])
          if (!in_split[node_of[p.v]] && seen[p.v] != si) {
            seen[p.v] = si;
            cut_bytes.push_back(cm.output_bytes(p, 1));
          }
        for (const auto& [o, readers] : outbound[x])
          if (std::any_of(readers.begin(), readers.end(), [&](int r) { return !in_split[r]; }))
            cut_bytes.push_back(cm.output_bytes(o, 1));
      }
      // The optimizer step, once per iteration, is spread over the mini-batch as in stage_cost.
      const double step = cost::optimizer_step_time(cm, st, tensors);
      for (int plog = 0; plog <= pcap; ++plog) {
        const double b = static_cast<double>(micro_batch >> plog);
        // The stage's passes: a fixed time per micro-batch beyond its ops, as stage_cost adds it.
        double comp = cm.cluster().device.pass_s(), a = 0, comm = 0;
        for (int x : nodes) comp += ncomp[x * P + plog], a += nact[x * P + plog];
        for (double bytes : cut_bytes) comm += 2 * cm.p2p_time(same_node, bytes * b);
        sc.tps[si * P + plog] = static_cast<float>(
            (comp + comm) / micro_batch + (cm.allreduce_time(1 << plog, same_node, param) + step) / mini_batch);
        sc.act[si * P + plog] = static_cast<float>(a);
      }
      sc.state[si] = static_cast<float>(st);
      for (int x : nodes) in_split[x] = 0;
      if ((si & 4095) == 0) check_time();
    }
  return sc;
}

}  // namespace

bool piper_solve(const cost::CostModel& cm, const PiperGraph& pg, int micro_batch, int mini_batch, double memory_limit,
                 int num_devices, bool same_node, std::chrono::steady_clock::time_point deadline, double time_limit_s,
                 double tol, double* best_tps, std::vector<StageChoice>* best) {
  const int num_micro = mini_batch / micro_batch;
  auto check_time = [&] {
    if (std::chrono::steady_clock::now() > deadline)
      throw UserError(fmt::format("piper: no plan within the time limit of {:g} s (explored {} downsets)", time_limit_s,
                                  pg.num_downsets()));
  };
  const int pcap = std::bit_width(static_cast<unsigned>(std::min(num_devices, micro_batch))) - 1;
  const SplitCosts sc = split_costs(cm, pg, micro_batch, mini_batch, pcap, same_node, check_time);
  const int P = sc.P, N = num_devices, words = pg.words;
  const size_t ND = pg.num_downsets();
  // F[k][d]: min depth of downset k on at most d devices (-1: none within the target).
  std::vector<int> F(ND * (N + 1));
  std::vector<std::pair<int, int>> choice(F.size());  // (split, plog)
  auto solve = [&](double target, std::vector<StageChoice>* out) -> SolveResult {
    check_time();
    const float tmax = static_cast<float>(target * (1 + 1e-6));
    std::fill(F.begin(), F.begin() + N + 1, 0);
    for (size_t k = 1; k < ND; ++k) {
      int* Fk = &F[k * (N + 1)];
      std::fill(Fk, Fk + N + 1, -1);
      for (size_t si = pg.first_split[k]; si < pg.first_split[k + 1]; ++si) {
        const int rest = pg.rest[si];
        const int* Fr = &F[static_cast<size_t>(rest) * (N + 1)];
        for (int plog = 0; plog < P && (1 << plog) <= N; ++plog) {
          const size_t at = si * P + plog;
          if (sc.tps[at] > tmax) continue;
          for (int d = 1 << plog; d <= N; ++d) {
            const int rd = d - (1 << plog);
            const int r = rest == 0 ? 0 : (rd >= 1 ? Fr[rd] : -1);
            if (r < 0) continue;
            const int val = std::min(r + 1, num_micro);
            if (Fk[d] >= 0 && val >= Fk[d]) continue;
            if (sc.state[si] + static_cast<double>(val) * sc.act[at] > memory_limit) continue;
            Fk[d] = val;
            choice[k * (N + 1) + d] = {static_cast<int>(si), plog};
          }
        }
      }
      if ((k & 255) == 0) check_time();
    }
    const int v = F[static_cast<size_t>(pg.full) * (N + 1) + N];
    if (v >= 0 && out) {
      out->clear();
      size_t k = static_cast<size_t>(pg.full);
      int d = N;
      while (k != 0) {
        auto [si, plog] = choice[k * (N + 1) + d];
        const size_t rest = static_cast<size_t>(pg.rest[si]);
        StageChoice s{{}, 1 << plog, sc.tps[static_cast<size_t>(si) * P + plog]};
        for (int w = 0; w < words; ++w)
          for (uint64_t b = pg.downsets[k * words + w] & ~pg.downsets[rest * words + w]; b; b &= b - 1) {
            const auto& ops = pg.nodes[w * 64 + std::countr_zero(b)];
            s.ops.insert(s.ops.end(), ops.begin(), ops.end());
          }
        std::sort(s.ops.begin(), s.ops.end());
        out->push_back(std::move(s));
        k = rest;
        d -= 1 << plog;
      }
    }
    return v >= 0 ? SolveResult::plan(v) : SolveResult::no_plan();
  };
  return minimise_target(solve, N, tol, 0, 0, best_tps, best);
}

}  // namespace gp::planner::detail
