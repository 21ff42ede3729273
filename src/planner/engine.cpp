// The DP over sequences (GraphPipe paper, section 5: base / series / parallel cases).
#include "planner/engine.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>
#include <limits>

#include "graph/series_parallel.h"
#include "plan/plan.h"
#include "planner/range_cost.h"

namespace gp::planner::detail {

namespace {

Item op_item(const cost::CostModel& cm, int op) {
  Item it;
  it.ops = {OpId(op)};
  it.work_s = cm.op_step_time(OpId(op), 1);
  return it;
}

}  // namespace

Structure sp_structure(const cost::CostModel& cm, std::string* note) {
  const ir::Graph& g = cm.graph();
  graph::Dag dag = plan::op_dag(g);
  graph::SpResult r = graph::sp_decompose(dag);
  if (!r.tree) {
    graph::Dag spd = graph::sp_ize(dag);
    if (note)
      *note = fmt::format("not series-parallel ({}); SP-ized keeping {} of {} independent op pairs",
                          r.failure, graph::independent_pairs(spd), graph::independent_pairs(dag));
    r = graph::sp_decompose(spd);
    GP_ASSERT(r.tree.has_value(), "sp_ize result is not series-parallel: {}", r.failure);
  } else if (note) {
    *note = "series-parallel";
  }
  const graph::SpTree& t = *r.tree;
  Structure st;
  // Post-order conversion: each composite tree node becomes one Seq.
  std::function<Item(int)> build = [&](int node) -> Item {
    const graph::SpNode& n = t.nodes[node];
    if (n.kind == graph::SpNode::Kind::leaf) return op_item(cm, n.node);
    Seq q;
    q.parallel = n.kind == graph::SpNode::Kind::parallel;
    for (int c : n.children) q.items.push_back(build(c));
    if (q.parallel)
      std::stable_sort(q.items.begin(), q.items.end(),
                       [](const Item& a, const Item& b) { return a.work_s > b.work_s; });
    Item it;
    for (const Item& c : q.items) {
      it.ops.insert(it.ops.end(), c.ops.begin(), c.ops.end());
      it.work_s += c.work_s;
    }
    it.seq = static_cast<int>(st.seqs.size());
    st.seqs.push_back(std::move(q));
    return it;
  };
  Item root = build(t.root);
  if (root.seq < 0) {  // a one-op model
    Seq q;
    q.items.push_back(root);
    st.seqs.push_back(std::move(q));
    st.root = 0;
  } else {
    st.root = root.seq;
  }
  return st;
}

Structure chain_structure(const cost::CostModel& cm) {
  Structure st;
  Seq q;
  for (size_t i = 0; i < cm.graph().num_ops(); ++i) q.items.push_back(op_item(cm, static_cast<int>(i)));
  st.seqs.push_back(std::move(q));
  return st;
}

std::vector<int> device_candidates(int n) {
  std::vector<int> out;
  if (n <= 64) {
    for (int d = 1; d <= n; ++d) out.push_back(d);
    return out;
  }
  int g = std::max(1, n / 32);
  for (int d = 1; d <= n; ++d)
    if (std::has_single_bit(static_cast<unsigned>(d)) || d % g == 0) out.push_back(d);
  return out;
}

SeqDp::SeqDp(const cost::CostModel& cm, const Structure& st, int micro_batch, int mini_batch,
             double memory_limit, int num_devices, bool same_node)
    : cm_(cm),
      st_(st),
      mbs_(micro_batch),
      mini_(mini_batch),
      num_micro_(mini_batch / micro_batch),
      n_(num_devices),
      mem_limit_(memory_limit),
      same_node_(same_node),
      rc_(cm, st, micro_batch, mini_batch, same_node),
      dense_(st.seqs.size()) {
  GP_ASSERT(st.seqs.size() < 65536 && num_devices < 65536, "structure too large");
  plogs_ = std::bit_width(static_cast<unsigned>(std::min(n_, mbs_)));
  floor_cand_.assign(n_ + 1, 0);
  auto cands = device_candidates(n_);
  for (int d = 1, c = 0; d <= n_; ++d) {
    while (c + 1 < static_cast<int>(cands.size()) && cands[c + 1] <= d) ++c;
    floor_cand_[d] = cands[c];
  }
  // Device counts a state can have: the candidates and n itself (the root's).
  cidx_.assign(n_ + 1, -1);
  for (int d : cands) cidx_[d] = ncounts_++;
  if (cidx_[n_] < 0) cidx_[n_] = ncounts_++;
  seq_base_.resize(st.seqs.size());
  size_t total = 0;
  for (size_t q = 0; q < st.seqs.size(); ++q) {
    seq_base_[q] = total;
    total += st.seqs[q].items.size() * static_cast<size_t>(ncounts_);
  }
  slots_.resize(total);
}

const SeqDp::Entry* SeqDp::find(int s, int i, int d, int down) const {
  GP_ASSERT(cidx_[d] >= 0, "memo: device count {} is not a candidate", d);
  const Slot& sl = slots_[seq_base_[s] + static_cast<size_t>(i) * ncounts_ + cidx_[d]];
  if (sl.gen != gen_) return nullptr;
  if (sl.down == down) return &sl.e;
  if (overflow_.empty()) return nullptr;
  uint64_t key = (uint64_t(s) << 48) | (uint64_t(i) << 32) | (uint64_t(d) << 16) | uint64_t(down);
  auto it = overflow_.find(key);
  return it == overflow_.end() ? nullptr : &it->second;
}

void SeqDp::store(int s, int i, int d, int down, const Entry& e) {
  Slot& sl = slots_[seq_base_[s] + static_cast<size_t>(i) * ncounts_ + cidx_[d]];
  if (sl.gen != gen_) {
    sl.gen = gen_;
    sl.down = down;
    sl.e = e;
    return;
  }
  uint64_t key = (uint64_t(s) << 48) | (uint64_t(i) << 32) | (uint64_t(d) << 16) | uint64_t(down);
  overflow_[key] = e;
}

inline SeqDp::StageCostLite SeqDp::stage_head(int s, int i, int m, int plog) {
  const int k = static_cast<int>(st_.seqs[s].items.size());
  if (k <= kDenseItems) {  // the hot path: a filled dense slot, inline
    const auto& tab = dense_[s];
    if (!tab.empty()) {
      const StageCostLite& e = tab[(static_cast<size_t>(i) * (k + 1) + m) * plogs_ + plog];
      if (e.tps >= 0) return e;
    }
    return stage(s, i, m, plog);
  }
  const RangeCost::Cost c = rc_.cheap(s, i, m, plog);
  return {-1, c.compute_tps, c.state, c.act};
}

void SeqDp::complete(int s, int i, int m, int plog, StageCostLite* c) {
  if (c->tps >= 0) return;
  RangeCost::Cost rc{0, c->compute_tps, c->state, c->act};
  rc_.finish(s, i, m, plog, &rc);
  c->tps = rc.tps;
}

SeqDp::StageCostLite SeqDp::stage(int s, int i, int m, int plog) {
  // Dense cache for short sequences; long ones are costed directly (RangeCost is O(cut size)).
  const int k = static_cast<int>(st_.seqs[s].items.size());
  StageCostLite* slot = nullptr;
  if (k <= kDenseItems) {
    auto& tab = dense_[s];
    if (tab.empty()) tab.resize(static_cast<size_t>(k) * (k + 1) * plogs_);
    slot = &tab[(static_cast<size_t>(i) * (k + 1) + m) * plogs_ + plog];
    if (slot->tps >= 0) return *slot;
  }
  const RangeCost::Cost c = rc_.cost(s, i, m, plog);
  StageCostLite lite{c.tps, c.compute_tps, c.state, c.act};
  if (slot) *slot = lite;
  return lite;
}

bool SeqDp::fits(const StageCostLite& c, int depth) const {
  return c.state + std::min(depth, num_micro_) * c.act <= mem_limit_;
}

// Returns the minimal depth (in-flight micro-batches of its first stages) of the suffix
// [i, end) of sequence s on at most d devices, given `down` micro-batches in flight after it.
int SeqDp::go(int s, int i, int d, int down) {
  if (d < 1) return -1;
  const Seq& q = st_.seqs[s];
  const int k = static_cast<int>(q.items.size());
  const double tmax = target_ * (1 + 1e-12);
  // Prune by the target: d devices cannot run more than d x T device-seconds per sample.
  if (rc_.work_lower_bound(s, i, k) > d * tmax * (1 + 1e-9)) {
    target_hit_ = true;
    return -1;
  }
  Slot& slot = slots_[seq_base_[s] + static_cast<size_t>(i) * ncounts_ + cidx_[d]];
  if (slot.never_down == down) return -1;  // infeasible at every target (see below)
  if (const Entry* e = find(s, i, d, down)) {
    target_hit_ = target_hit_ || e->dep;
    return e->val;
  }
  ++states_;
  // Whether this state's answer depends on the target: some stage or suffix in its subtree was
  // rejected for its time (target_hit_ collects it from the children, memoised ones included).
  const bool outer_hit = target_hit_;
  target_hit_ = false;
  Entry best;
  const int pcap = std::bit_width(static_cast<unsigned>(std::min(d, mbs_))) - 1;
  // Base case: items [i, m) form one stage on p = 2^plog devices; the rest is solved recursively.
  // Per degree, m grows until the stage's compute alone exceeds the target (it only grows with m).
  // No plan of the suffix is shallower than min(down + 1, M): stop when one reaches it.
  const int floor_val = std::min(down + 1, num_micro_);
  for (int plog = 0; plog <= pcap && best.val != floor_val; ++plog) {
    const int p = 1 << plog;
    for (int m = d - p < 1 ? k : i + 1; m <= k; ++m) {
      if (++evals_ - solve_start_ > budget_ && budget_ > 0) aborted_ = true;  // memory_probe gives up
      if (aborted_) {
        target_hit_ = true;  // an unfinished answer: never recorded as memory-only
        break;
      }
      StageCostLite c = stage_head(s, i, m, plog);
      if (c.compute_tps > tmax) {
        target_hit_ = true;
        break;
      }
      // Memory only grows with m too, and no choice here is shallower than floor_val.
      if (!fits(c, floor_val)) break;
      complete(s, i, m, plog, &c);
      if (c.tps > tmax) {
        target_hit_ = true;
        continue;
      }
      int val;
      if (q.parallel) {  // parallel case: a group of branches as one stage beside the rest
        int self = floor_val;
        if (!fits(c, self)) continue;
        int rest = m < k ? go(s, m, floor_cand(d - p), down) : 0;
        if (rest < 0) continue;
        val = std::max(self, rest);
      } else {  // series case: this stage feeds the rest of the sequence
        int rest = m < k ? go(s, m, floor_cand(d - p), down) : down;
        if (rest < 0) continue;
        val = std::min(rest + 1, num_micro_);
        if (!fits(c, val)) continue;
      }
      if (best.val < 0 || val < best.val) best = {static_cast<int16_t>(val), 1, static_cast<int8_t>(plog), m};
      if (best.val == floor_val) break;
    }
  }
  // Nested item: item i is itself a series/parallel subgraph, split recursively on d1 devices.
  if (int c = q.items[i].seq; c >= 0) {
    if (best.val == floor_val) {
      // already as shallow as any plan of this suffix can be
    } else if (i + 1 == k) {
      int v = go(c, 0, d, down);
      if (v >= 0 && (best.val < 0 || v < best.val)) best = {static_cast<int16_t>(v), 2, 0, d};
    } else {
      for (int d1 = 1; d1 < d; ++d1) {
        if (floor_cand(d1) != d1) continue;
        int rd = floor_cand(d - d1);
        int v;
        if (q.parallel) {
          int a = go(c, 0, d1, down);
          if (a < 0) continue;
          int b = go(s, i + 1, rd, down);
          if (b < 0) continue;
          v = std::max(a, b);
        } else {
          int rest = go(s, i + 1, rd, down);
          if (rest < 0) continue;
          v = go(c, 0, d1, rest);
          if (v < 0) continue;
        }
        if (best.val < 0 || v < best.val) best = {static_cast<int16_t>(v), 2, 0, d1};
        if (best.val == floor_val) break;
      }
    }
  }
  best.dep = target_hit_;
  // Infeasible without any rejection for time: memory alone rules it out, so it stays infeasible
  // at every target (a larger one only admits more stages, a smaller one fewer). Kept across
  // solves, for the first `down` seen in this slot.
  if (best.val < 0 && !best.dep && slot.never_down < 0) slot.never_down = down;
  target_hit_ = outer_hit || target_hit_;
  store(s, i, d, down, best);
  return best.val;
}

void SeqDp::collect(int s, int i, int d, int down, std::vector<StageChoice>* out) {
  const Entry* found = find(s, i, d, down);
  GP_ASSERT(found && found->val >= 0, "collect on an unsolved state");
  const Entry e = *found;
  const Seq& q = st_.seqs[s];
  const int k = static_cast<int>(q.items.size());
  if (e.kind == 1) {
    const int m = e.arg, p = 1 << e.plog;
    StageChoice sc;
    for (int j = i; j < m; ++j) sc.ops.insert(sc.ops.end(), q.items[j].ops.begin(), q.items[j].ops.end());
    sc.dp = p;
    sc.tps_s = stage(s, i, m, e.plog).tps;
    out->push_back(std::move(sc));
    if (m < k) collect(s, m, floor_cand(d - p), down, out);
    return;
  }
  GP_ASSERT(e.kind == 2, "bad memo entry");
  const int c = q.items[i].seq;
  if (i + 1 == k) return collect(c, 0, d, down, out);
  const int d1 = e.arg, rd = floor_cand(d - d1);
  if (q.parallel) {
    collect(c, 0, d1, down, out);
    collect(s, i + 1, rd, down, out);
  } else {
    int rest = go(s, i + 1, rd, down);
    collect(s, i + 1, rd, down, out);
    collect(c, 0, d1, rest, out);
  }
}

int SeqDp::solve(double target_tps, std::vector<StageChoice>* out) {
  overflow_.clear();
  ++gen_;
  ++solves_;
  target_ = target_tps;
  target_hit_ = false;
  aborted_ = false;
  solve_start_ = evals_;
  int v = go(st_.root, 0, n_, 0);
  if (budget_ == 0) max_solve_evals_ = std::max(max_solve_evals_, evals_ - solve_start_);
  if (aborted_) return -1;
  // No stage or suffix was rejected for its time: the search failed on memory alone, and a larger
  // target (which only admits more stages) fails the same way.
  if (v < 0 && !target_hit_) return -2;
  if (v >= 0 && out) {
    out->clear();
    collect(st_.root, 0, n_, 0, out);
  }
  return v;
}

bool minimise_target(const std::function<int(double, std::vector<StageChoice>*)>& solve, int n,
                     double tol, double upper, double guess, double* best_tps,
                     std::vector<StageChoice>* best, const std::function<bool()>& never_feasible) {
  auto bottleneck = [](const std::vector<StageChoice>& p) {
    double b = 0;
    for (const auto& s : p) b = std::max(b, s.tps_s);
    return b;
  };
  std::vector<StageChoice> cur;
  double hi = 0, lo = 0;
  bool found = false;
  // Start from the whole model's single-device time spread over n devices and double: a finite
  // target lets the DP prune every stage slower than it (compute only grows with a stage).
  if (guess > 0) {
    for (double t = guess / n; t <= guess * 4; t *= 2) {
      const int r = solve(t, &cur);
      if (r >= 0) {
        found = true;
        break;
      }
      if (r == -2) return false;  // infeasible at every target
      lo = t;
      // Two targets failed: maybe no plan fits memory at all. A bounded probe can prove it (and
      // save the rest of the doubling); it never changes the search's trajectory otherwise.
      if (t > guess / n * 1.5 && t < guess / n * 3 && never_feasible && never_feasible()) return false;
    }
  }
  if (!found && solve(std::numeric_limits<double>::infinity(), &cur) < 0) return false;
  hi = bottleneck(cur);
  if (upper > 0 && hi >= upper) {
    if (solve(upper * (1 - tol), &cur) < 0) return false;
    hi = bottleneck(cur);
  }
  *best = cur;
  if (lo == 0) {
    lo = hi / (4.0 * n);
    while (solve(lo, &cur) >= 0) {  // the guess was not a lower bound: move it down
      *best = cur;
      hi = bottleneck(cur);
      lo = hi / (4.0 * n);
    }
  }
  while (hi > lo * (1 + tol)) {
    double mid = std::sqrt(lo * hi);
    if (solve(mid, &cur) >= 0) {
      *best = cur;
      hi = bottleneck(cur);
    } else {
      lo = mid;
    }
  }
  *best_tps = hi;
  return true;
}

bool SeqDp::minimise(double tol, double upper, double* best_tps, std::vector<StageChoice>* best) {
  const int k = static_cast<int>(st_.seqs[st_.root].items.size());
  const double guess = stage(st_.root, 0, k, 0).tps;
  return minimise_target([this](double t, std::vector<StageChoice>* out) { return solve(t, out); },
                         n_, tol, upper, guess, best_tps, best, [this] { return memory_probe(); });
}

bool SeqDp::memory_probe() {
  // An infinite target with a work budget of 4x the largest solve so far: without the target's
  // pruning it can be far larger than a bounded solve when memory does not bind, so give up then.
  budget_ = std::max<size_t>(4 * max_solve_evals_, 100000);
  const int v = solve(std::numeric_limits<double>::infinity(), nullptr);
  budget_ = 0;
  ++probes_;
  if (aborted_) ++probes_aborted_;
  return !aborted_ && v < 0;
}

}  // namespace gp::planner::detail
