// Piper baseline (Tarnawski et al., NeurIPS 2021, without tensor parallelism): a DP over downsets
// (node sets closed under successors) of a coarsened graph. A downset D splits into a stage
// S = D \ D' and a smaller downset D' that runs after it. Exact for chains; the number of downsets
// grows exponentially with the number of parallel branches, so, as Piper's paper does with its
// layer graphs, the DP runs on a coarsened graph: maximal series-parallel subtrees of at most t
// ops (and runs of consecutive series children of at most t ops) become single nodes, with t the smallest power of two whose graph has at most
// kMaxDownsets downsets and kMaxSplits (downset, stage) pairs.
#include <algorithm>
#include <bit>
#include <functional>
#include <limits>
#include <unordered_map>

#include "graph/series_parallel.h"
#include "planner/engine.h"

namespace gp::planner::detail {

namespace {

constexpr size_t kMaxDownsets = 20000;
constexpr size_t kMaxSplits = 200000;

using Bits = std::vector<uint64_t>;

struct BitsHash {
  size_t operator()(const Bits& b) const noexcept {
    size_t h = 1469598103934665603ull;
    for (uint64_t w : b) h = (h ^ w) * 1099511628211ull;
    return h;
  }
};

bool test(const Bits& b, int i) { return (b[i >> 6] >> (i & 63)) & 1; }
void set(Bits& b, int i) { b[i >> 6] |= uint64_t{1} << (i & 63); }
void reset(Bits& b, int i) { b[i >> 6] &= ~(uint64_t{1} << (i & 63)); }

// Groups of ops for threshold t: maximal SP subtrees with at most t leaves, and runs of consecutive
// series children of at most t leaves in total; in topological order.
std::vector<std::vector<OpId>> coarse_groups(const ir::Graph& g, const graph::SpTree& t, int limit) {
  std::vector<int> size(t.nodes.size(), 0);
  std::function<int(int)> count = [&](int v) {
    const graph::SpNode& n = t.nodes[v];
    if (n.kind == graph::SpNode::Kind::leaf) return size[v] = 1;
    int s = 0;
    for (int c : n.children) s += count(c);
    return size[v] = s;
  };
  count(t.root);
  std::vector<int> group(g.num_ops(), -1);
  int ngroups = 0;
  std::vector<int> run;
  auto flush = [&] {
    if (run.empty()) return;
    for (int c : run)
      for (int leaf : t.leaves(c)) group[leaf] = ngroups;
    ++ngroups;
    run.clear();
  };
  std::function<void(int)> cut = [&](int v) {
    if (size[v] <= limit) {
      run = {v};
      flush();
      return;
    }
    const graph::SpNode& n = t.nodes[v];
    if (n.kind == graph::SpNode::Kind::parallel) {
      for (int c : n.children) cut(c);
      return;
    }
    // Series: consecutive children are packed into runs of at most `limit` ops (a run of a
    // series composition is convex), larger children are cut recursively.
    std::vector<int> mine;
    int run_size = 0;
    auto flush_mine = [&] {
      run = mine;
      flush();
      mine.clear();
      run_size = 0;
    };
    for (int c : n.children) {
      if (size[c] > limit) {
        flush_mine();
        cut(c);
      } else {
        if (run_size + size[c] > limit) flush_mine();
        mine.push_back(c);
        run_size += size[c];
      }
    }
    flush_mine();
  };
  cut(t.root);
  // Quotient DAG, topologically sorted (Kahn, smallest first op first).
  std::vector<std::vector<int>> succ(ngroups);
  std::vector<int> indeg(ngroups, 0), first(ngroups, std::numeric_limits<int>::max());
  for (size_t o = 0; o < g.num_ops(); ++o) {
    GP_ASSERT(group[o] >= 0, "op {} in no coarse group", o);
    first[group[o]] = std::min(first[group[o]], static_cast<int>(o));
    for (OpId s : g.succs(OpId(static_cast<int32_t>(o))))
      if (group[s.v] != group[o]) succ[group[o]].push_back(group[s.v]);
  }
  for (auto& s : succ) {
    std::sort(s.begin(), s.end());
    s.erase(std::unique(s.begin(), s.end()), s.end());
    for (int v : s) ++indeg[v];
  }
  auto later = [&](int a, int b) { return first[a] > first[b]; };
  std::vector<int> ready, order;
  for (int v = 0; v < ngroups; ++v)
    if (indeg[v] == 0) ready.push_back(v);
  std::make_heap(ready.begin(), ready.end(), later);
  while (!ready.empty()) {
    std::pop_heap(ready.begin(), ready.end(), later);
    int v = ready.back();
    ready.pop_back();
    order.push_back(v);
    for (int s : succ[v])
      if (--indeg[s] == 0) ready.push_back(s), std::push_heap(ready.begin(), ready.end(), later);
  }
  GP_ASSERT(static_cast<int>(order.size()) == ngroups, "coarse graph has a cycle");
  std::vector<int> rank(ngroups);
  for (int k = 0; k < ngroups; ++k) rank[order[k]] = k;
  std::vector<std::vector<OpId>> out(ngroups);
  for (size_t o = 0; o < g.num_ops(); ++o) out[rank[group[o]]].push_back(OpId(static_cast<int32_t>(o)));
  return out;
}

}  // namespace

PiperSpace piper_space(const cost::CostModel& cm, std::chrono::steady_clock::time_point deadline,
                       double time_limit_s) {
  const ir::Graph& g = cm.graph();
  graph::Dag dag = plan::op_dag(g);
  graph::SpResult r = graph::sp_decompose(dag);
  if (!r.tree) r = graph::sp_decompose(graph::sp_ize(dag));
  GP_ASSERT(r.tree.has_value(), "sp_ize result is not series-parallel: {}", r.failure);
  size_t explored = 0;
  auto check_time = [&] {
    if (std::chrono::steady_clock::now() > deadline)
      throw UserError(fmt::format("piper: no plan within the time limit of {:g} s (explored {} downsets)",
                                  time_limit_s, explored));
  };
  for (int limit = 1;; limit *= 2) {
    PiperSpace sp;
    sp.threshold = limit;
    sp.nodes = coarse_groups(g, *r.tree, limit);
    const int n = static_cast<int>(sp.nodes.size());
    const int words = (n + 63) / 64;
    std::vector<int> where(g.num_ops());
    for (int v = 0; v < n; ++v)
      for (OpId o : sp.nodes[v]) where[o.v] = v;
    std::vector<std::vector<int>> succ(n), pred(n);
    for (size_t o = 0; o < g.num_ops(); ++o)
      for (OpId s : g.succs(OpId(static_cast<int32_t>(o))))
        if (where[s.v] != where[o]) succ[where[o]].push_back(where[s.v]), pred[where[s.v]].push_back(where[o]);
    std::vector<Bits> downsets{Bits(words, 0)};
    std::unordered_map<Bits, int, BitsHash> index{{downsets[0], 0}};
    bool too_big = false;
    // Downsets breadth-first (ids grow with size): add a node whose successors are all in.
    for (size_t k = 0; k < downsets.size() && !too_big; ++k) {
      if ((k & 255) == 0) check_time();
      for (int x = 0; x < n; ++x) {
        if (test(downsets[k], x)) continue;
        bool ok = true;
        for (int s : succ[x]) ok = ok && test(downsets[k], s);
        if (!ok) continue;
        Bits nb = downsets[k];
        set(nb, x);
        if (index.emplace(nb, static_cast<int>(downsets.size())).second) downsets.push_back(std::move(nb));
      }
      explored = std::max(explored, downsets.size());
      too_big = downsets.size() > kMaxDownsets;
    }
    if (too_big) continue;
    // Splits of each downset: S closed under predecessors within D (so D \ S is a downset).
    sp.splits.assign(downsets.size(), {});
    size_t total = 0;
    for (size_t k = 1; k < downsets.size() && !too_big; ++k) {
      const Bits& D = downsets[k];
      std::vector<int> members;
      for (int x = 0; x < n; ++x)
        if (test(D, x)) members.push_back(x);  // node order is topological
      Bits S(words, 0);
      std::function<void(size_t)> rec = [&](size_t pos) {
        if (too_big) return;
        if (pos == members.size()) {
          PiperSpace::Split s;
          Bits rest = D;
          for (int x : members)
            if (test(S, x)) {
              s.ops.insert(s.ops.end(), sp.nodes[x].begin(), sp.nodes[x].end());
              s.nodes.push_back(x);
              reset(rest, x);
            }
          if (s.ops.empty()) return;
          std::sort(s.ops.begin(), s.ops.end());
          s.rest = index.at(rest);
          sp.splits[k].push_back(std::move(s));
          if (++total > kMaxSplits) too_big = true;
          if ((total & 1023) == 0) check_time();
          return;
        }
        int x = members[pos];
        rec(pos + 1);  // x not in S
        bool ok = true;
        for (int p : pred[x]) ok = ok && (!test(D, p) || test(S, p));
        if (ok) {
          set(S, x);
          rec(pos + 1);
          reset(S, x);
        }
      };
      rec(0);
    }
    if (too_big) continue;
    sp.full = static_cast<int>(downsets.size()) - 1;  // breadth-first: the full set comes last
    GP_ASSERT(downsets[sp.full] == [&] {
      Bits b(words, 0);
      for (int x = 0; x < n; ++x) set(b, x);
      return b;
    }(), "the last downset is not the whole graph");
    sp.num_downsets = downsets.size();
    sp.num_splits = total;
    return sp;
  }
}

bool piper_minimise(const cost::CostModel& cm, const PiperSpace& space, int micro_batch,
                    int mini_batch, double memory_limit, int num_devices, bool same_node,
                    std::chrono::steady_clock::time_point deadline, double time_limit_s, double tol,
                    double* best_tps, std::vector<StageChoice>* best) {
  const ir::Graph& g = cm.graph();
  const int num_micro = mini_batch / micro_batch;
  auto check_time = [&] {
    if (std::chrono::steady_clock::now() > deadline)
      throw UserError(fmt::format("piper: no plan within the time limit of {:g} s (explored {} downsets)",
                                  time_limit_s, space.num_downsets));
  };
  const int pcap = std::bit_width(static_cast<unsigned>(std::min(num_devices, micro_batch))) - 1;
  const int P = pcap + 1;
  // Per split and degree: TPS, state and activation bytes, summed over the split's coarse nodes
  // (per-node sums, and the op tensors crossing node boundaries for the cut edges): the same
  // quantities as cost::stage_cost on the split's ops, without walking them.
  const int nn = static_cast<int>(space.nodes.size());
  std::vector<int> node_of(g.num_ops());
  for (int x = 0; x < nn; ++x)
    for (OpId o : space.nodes[x]) node_of[o.v] = x;
  std::vector<double> ncomp(static_cast<size_t>(nn) * P, 0), nact(static_cast<size_t>(nn) * P, 0),
      nstate(nn, 0), nparam(nn, 0);
  std::vector<std::vector<OpId>> inbound(nn);                 // producers outside the node
  std::vector<std::vector<std::pair<OpId, std::vector<int>>>> outbound(nn);  // op, reader nodes
  for (int x = 0; x < nn; ++x) {
    for (OpId o : space.nodes[x]) {
      for (int plog = 0; plog <= pcap; ++plog) {
        ncomp[x * P + plog] += cm.op_step_time(o, micro_batch >> plog);
        nact[x * P + plog] += cm.saved_bytes(o, micro_batch >> plog);
      }
      nstate[x] += cm.state_bytes(o);
      nparam[x] += static_cast<double>(g.costs(o).param_bytes);
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
  std::vector<size_t> first(space.splits.size() + 1, 0);
  for (size_t k = 0; k < space.splits.size(); ++k) first[k + 1] = first[k] + space.splits[k].size();
  std::vector<double> tps(first.back() * P), state(first.back() * P), act(first.back() * P);
  std::vector<char> in_split(nn, 0);
  std::vector<int> seen(g.num_ops(), -1);
  std::vector<double> cut_bytes;
  for (size_t k = 0; k < space.splits.size(); ++k)
    for (size_t si = 0; si < space.splits[k].size(); ++si) {
      const auto& nodes = space.splits[k][si].nodes;
      const int stamp = static_cast<int>(first[k] + si);
      for (int x : nodes) in_split[x] = 1;
      cut_bytes.clear();
      double st = 0, param = 0;
      for (int x : nodes) {
        st += nstate[x];
        param += nparam[x];
        for (OpId p : inbound[x])
          if (!in_split[node_of[p.v]] && seen[p.v] != stamp) {
            seen[p.v] = stamp;
            cut_bytes.push_back(cm.output_bytes(p, 1));
          }
        for (const auto& [o, readers] : outbound[x])
          if (std::any_of(readers.begin(), readers.end(), [&](int r) { return !in_split[r]; }))
            cut_bytes.push_back(cm.output_bytes(o, 1));
      }
      for (int plog = 0; plog <= pcap; ++plog) {
        const double b = static_cast<double>(micro_batch >> plog);
        double comp = 0, a = 0, comm = 0;
        for (int x : nodes) comp += ncomp[x * P + plog], a += nact[x * P + plog];
        for (double bytes : cut_bytes) comm += 2 * cm.p2p_time(same_node, bytes * b);
        const size_t at = (first[k] + si) * P + plog;
        tps[at] = (comp + comm) / micro_batch + cm.allreduce_time(1 << plog, same_node, param) / mini_batch;
        state[at] = st;
        act[at] = a;
      }
      for (int x : nodes) in_split[x] = 0;
      if ((stamp & 1023) == 0) check_time();
    }
  // F[k][d]: min depth of downset k on at most d devices; choice for reconstruction.
  const int N = num_devices;
  const size_t ND = space.splits.size();
  std::vector<int> F(ND * (N + 1));
  std::vector<std::pair<int, int>> choice(F.size());
  auto solve = [&](double target, std::vector<StageChoice>* out) -> int {
    check_time();
    const double tmax = target * (1 + 1e-12);
    for (int d = 0; d <= N; ++d) F[d] = 0;
    for (size_t k = 1; k < ND; ++k) {
      for (int d = 0; d <= N; ++d) {
        int bestv = -1;
        std::pair<int, int> ch{-1, -1};
        for (size_t si = 0; si < space.splits[k].size() && d >= 1; ++si) {
          const auto& sp = space.splits[k][si];
          for (int plog = 0; plog <= pcap && (1 << plog) <= d; ++plog) {
            const size_t at = (first[k] + si) * P + plog;
            if (tps[at] > tmax) continue;
            int rd = d - (1 << plog);
            int rest = sp.rest == 0 ? 0 : (rd >= 1 ? F[sp.rest * (N + 1) + rd] : -1);
            if (rest < 0) continue;
            int val = std::min(rest + 1, num_micro);
            if (state[at] + static_cast<double>(val) * act[at] > memory_limit) continue;
            if (bestv < 0 || val < bestv) {
              bestv = val;
              ch = {static_cast<int>(si), plog};
            }
          }
        }
        F[k * (N + 1) + d] = bestv;
        choice[k * (N + 1) + d] = ch;
      }
    }
    int v = F[space.full * (N + 1) + N];
    if (v >= 0 && out) {
      out->clear();
      int k = space.full, d = N;
      while (k != 0) {
        auto [si, plog] = choice[k * (N + 1) + d];
        const auto& sp = space.splits[k][si];
        out->push_back({sp.ops, 1 << plog, tps[(first[k] + si) * P + plog]});
        k = sp.rest;
        d -= 1 << plog;
      }
    }
    return v;
  };
  return minimise_target(solve, N, tol, 0, 0, best_tps, best);
}

}  // namespace gp::planner::detail
