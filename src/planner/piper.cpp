// Piper baseline (Tarnawski et al., NeurIPS 2021, without tensor parallelism): a DP over downsets
// (op sets closed under successors). A downset D splits into a stage S = D \ D' and a smaller
// downset D' that runs after it. Exact for chains; the number of downsets grows exponentially
// with the number of parallel branches, hence the time limit.
#include <algorithm>
#include <bit>
#include <functional>
#include <limits>
#include <unordered_map>

#include "planner/engine.h"

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

bool test(const Bits& b, int i) { return (b[i >> 6] >> (i & 63)) & 1; }
void set(Bits& b, int i) { b[i >> 6] |= uint64_t{1} << (i & 63); }
void reset(Bits& b, int i) { b[i >> 6] &= ~(uint64_t{1} << (i & 63)); }

struct Split {
  int rest = 0;                       // downset id of D' (0 = empty)
  std::vector<OpId> ops;              // the stage S = D \ D'
  std::vector<double> tps, state, act;  // per plog
  std::vector<double> compute_tps;
};

}  // namespace

bool piper_minimise(const cost::CostModel& cm, int micro_batch, int mini_batch, double memory_limit,
                    int num_devices, bool same_node, std::chrono::steady_clock::time_point deadline,
                    double time_limit_s, double tol, double* best_tps, std::vector<StageChoice>* best,
                    size_t* explored) {
  const ir::Graph& g = cm.graph();
  const int n = static_cast<int>(g.num_ops());
  const int words = (n + 63) / 64;
  const int num_micro = mini_batch / micro_batch;
  std::vector<Bits> downsets{Bits(words, 0)};
  std::unordered_map<Bits, int, BitsHash> index{{downsets[0], 0}};
  auto check_time = [&] {
    if (std::chrono::steady_clock::now() > deadline)
      throw UserError(fmt::format("piper: no plan within the time limit of {:g} s (explored {} downsets)",
                                  time_limit_s, downsets.size()));
  };
  // Enumerate downsets breadth-first (so ids grow with size): add an op whose successors are in.
  for (size_t k = 0; k < downsets.size(); ++k) {
    if ((k & 255) == 0) check_time();
    for (int x = 0; x < n; ++x) {
      if (test(downsets[k], x)) continue;
      bool ok = true;
      for (OpId s : g.succs(OpId(x))) ok = ok && test(downsets[k], s.v);
      if (!ok) continue;
      Bits nb = downsets[k];
      set(nb, x);
      if (index.emplace(nb, static_cast<int>(downsets.size())).second) downsets.push_back(std::move(nb));
    }
  }
  *explored = downsets.size();
  const int pcap = std::bit_width(static_cast<unsigned>(std::min(num_devices, micro_batch))) - 1;
  // Splits of each downset: S closed under predecessors within D (so D \ S is a downset).
  std::vector<std::vector<Split>> splits(downsets.size());
  std::vector<char> in_stage(n, 0);
  size_t work = 0;
  for (size_t k = 1; k < downsets.size(); ++k) {
    const Bits& D = downsets[k];
    std::vector<int> members;
    for (int x = 0; x < n; ++x)
      if (test(D, x)) members.push_back(x);  // OpId order is topological
    Bits S(words, 0);
    std::function<void(size_t)> rec = [&](size_t pos) {
      if ((++work & 1023) == 0) check_time();
      if (pos == members.size()) {
        Split sp;
        for (int x : members)
          if (test(S, x)) sp.ops.push_back(OpId(x));
        if (sp.ops.empty()) return;
        Bits rest = D;
        for (OpId o : sp.ops) reset(rest, o.v);
        sp.rest = index.at(rest);
        for (OpId o : sp.ops) in_stage[o.v] = 1;
        for (int plog = 0; plog <= pcap; ++plog) {
          cost::StageCost c = cost::stage_cost(cm, sp.ops, in_stage, 1 << plog, micro_batch, mini_batch, same_node);
          sp.tps.push_back(c.tps_s);
          sp.compute_tps.push_back(c.compute_s / micro_batch);
          sp.state.push_back(c.state_bytes);
          sp.act.push_back(c.act_bytes_per_mb);
        }
        for (OpId o : sp.ops) in_stage[o.v] = 0;
        splits[k].push_back(std::move(sp));
        return;
      }
      int x = members[pos];
      rec(pos + 1);  // x not in S
      bool ok = true;
      for (OpId p : g.preds(OpId(x))) ok = ok && (!test(D, p.v) || test(S, p.v));
      if (ok) {
        set(S, x);
        rec(pos + 1);
        reset(S, x);
      }
    };
    rec(0);
  }
  const int full = index.at([&] {
    Bits b(words, 0);
    for (int x = 0; x < n; ++x) set(b, x);
    return b;
  }());
  // F[k][d]: min depth of downset k on at most d devices; choice for reconstruction.
  const int N = num_devices;
  std::vector<int> F((downsets.size()) * (N + 1));
  std::vector<std::pair<int, int>> choice(F.size());
  auto solve = [&](double target, std::vector<StageChoice>* out) -> int {
    check_time();
    const double tmax = target * (1 + 1e-12);
    for (int d = 0; d <= N; ++d) F[d] = 0;
    for (size_t k = 1; k < downsets.size(); ++k) {
      for (int d = 0; d <= N; ++d) {
        int best = -1;
        std::pair<int, int> ch{-1, -1};
        for (size_t si = 0; si < splits[k].size() && d >= 1; ++si) {
          const Split& sp = splits[k][si];
          for (int plog = 0; plog <= pcap && (1 << plog) <= d; ++plog) {
            if (sp.tps[plog] > tmax) continue;
            int rd = d - (1 << plog);
            int rest = sp.rest == 0 ? 0 : (rd >= 1 ? F[sp.rest * (N + 1) + rd] : -1);
            if (rest < 0) continue;
            int val = std::min(rest + 1, num_micro);
            if (sp.state[plog] + static_cast<double>(val) * sp.act[plog] > memory_limit) continue;
            if (best < 0 || val < best) {
              best = val;
              ch = {static_cast<int>(si), plog};
            }
          }
        }
        F[k * (N + 1) + d] = best;
        choice[k * (N + 1) + d] = ch;
      }
    }
    int v = F[full * (N + 1) + N];
    if (v >= 0 && out) {
      out->clear();
      int k = full, d = N;
      while (k != 0) {
        auto [si, plog] = choice[k * (N + 1) + d];
        const Split& sp = splits[k][si];
        out->push_back({sp.ops, 1 << plog, sp.tps[plog]});
        k = sp.rest;
        d -= 1 << plog;
      }
    }
    return v;
  };
  return minimise_target(solve, N, tol, 0, 0, best_tps, best);
}

}  // namespace gp::planner::detail
