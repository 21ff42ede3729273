// The DP over sequences (GraphPipe paper, section 5: base / series / parallel cases).
#include "planner/engine.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>
#include <limits>
#include <unordered_map>
#include <utility>

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
  const graph::SpDecomposition d = graph::sp_decompose_or_ize(dag);
  if (note)
    *note = d.series_parallel()
                ? "series-parallel"
                : fmt::format("not series-parallel ({}); SP-ized keeping {} of {} independent op pairs", d.failure,
                              graph::independent_pairs(*d.sp_ized), graph::independent_pairs(dag));
  const graph::SpTree& t = d.tree;
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
  add_boundary_options(st, cm, kMaxJoinTail);
  st.same_as = mirror_sequences(st, cm);
  return st;
}

namespace {

// What the cost model knows of one op (its signature, hence its times, and its byte counts).
std::string op_cost_key(const cost::CostModel& cm, OpId op) {
  const ir::OpCosts& c = cm.graph().costs(op);
  return fmt::format("{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}", cm.signature(op), cm.state_bytes(op), c.params,
                     c.param_bytes, c.fwd_flops, c.bwd_flops, c.input_bytes, c.weight_read_bytes, c.output_bytes,
                     c.saved_bytes, cm.graph().preds(op).size());
}

// A key equal for two branches exactly when one is a relabelling of the other for the cost model:
// the same op signatures and costs in the same order, the same edges among them, the same outside
// producers. Join options of such branches are mirror images; one of them is enough.
std::string branch_key(const cost::CostModel& cm, const Item& br) {
  const ir::Graph& g = cm.graph();
  std::unordered_map<int32_t, int> pos;
  for (size_t x = 0; x < br.ops.size(); ++x) pos[br.ops[x].v] = static_cast<int>(x);
  std::string key;
  for (OpId op : br.ops) {
    key += op_cost_key(cm, op);
    for (OpId p : g.preds(op)) {
      auto it = pos.find(p.v);
      key += it != pos.end() ? fmt::format(",i{}", it->second) : fmt::format(",o{}", p.v);
    }
    int outside = 0;
    for (OpId c2 : g.succs(op)) outside += pos.count(c2.v) ? 0 : 1;
    key += fmt::format(";{}\n", outside);
  }
  return key;
}

}  // namespace

namespace {

// Branch j of parallel block `blk` as the items of a series sequence: its own items (one item when
// it is an op or a parallel block).
std::vector<Item> branch_items(const Structure& st, int blk, int j) {
  const Item& br = st.seqs[blk].items[j];
  if (br.seq >= 0 && !st.seqs[br.seq].parallel) return st.seqs[br.seq].items;
  return {br};
}

// The first branch of each set of mirror images in block `blk` (see branch_key).
std::vector<int> distinct_branches(const Structure& st, const cost::CostModel& cm, int blk) {
  const auto& items = st.seqs[blk].items;
  std::vector<std::string> keys;
  std::vector<int> out;
  for (int j = 0; j < static_cast<int>(items.size()); ++j) {
    std::string key = branch_key(cm, items[j]);
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) out.push_back(j);
    keys.push_back(std::move(key));
  }
  return out;
}

// The memo packs a sequence index in 16 bits and an option index in int16: beyond that the
// remaining options are left out (graphs of tens of thousands of branches).
bool room_for(const Structure& st, int s, int i) {
  return st.seqs.size() + 2 < 65536 && (st.joins[s].empty() || st.joins[s][i].size() < 32767) &&
         (st.forks[s].empty() || st.forks[s][i].size() < 32767);
}

// Join options of series sequence s (see JoinOption): block at item i, tail (i, t).
int add_joins_at(Structure& st, const cost::CostModel& cm, int s, int lo, int hi, int max_tail) {
  int added = 0;
  for (int i = lo; i + 1 < hi; ++i) {
    const int blk = st.seqs[s].items[i].seq;
    if (blk < 0 || !st.seqs[blk].parallel) continue;
    const std::vector<int> branches = distinct_branches(st, cm, blk);
    const int r = static_cast<int>(st.seqs[blk].items.size());
    for (int t = i + 2; t <= std::min(hi, i + 1 + max_tail); ++t) {
      if (st.seqs[s].items[t - 1].seq >= 0) break;  // tails are single ops
      for (int j : branches) {
        if (!room_for(st, s, i)) break;
        const Item br = st.seqs[blk].items[j];
        Seq ext;
        ext.items = branch_items(st, blk, j);
        ext.join_from = static_cast<int>(ext.items.size());
        Item ext_item = br;
        for (int x = i + 1; x < t; ++x) {
          const Item& op = st.seqs[s].items[x];
          ext.items.push_back(op);
          ext_item.ops.insert(ext_item.ops.end(), op.ops.begin(), op.ops.end());
          ext_item.work_s += op.work_s;
        }
        ext_item.seq = static_cast<int>(st.seqs.size());
        st.seqs.push_back(std::move(ext));
        // The block with branch j moved last, extended: the other branches (still sorted by
        // work) feed it, so the sequence order stays topological (RangeCost relies on it) and
        // groups with the join stage are the lightest other branches.
        Seq block = st.seqs[blk];
        block.items.erase(block.items.begin() + j);
        block.items.push_back(std::move(ext_item));
        block.join_item = r - 1;
        if (st.joins[s].empty()) st.joins[s].resize(st.seqs[s].items.size());
        st.joins[s][i].push_back({t, static_cast<int>(st.seqs.size())});
        st.seqs.push_back(std::move(block));
        ++added;
      }
    }
  }
  return added;
}

// Fork options of series sequence s (see ForkOption): head [h, i), block at item i.
int add_forks_at(Structure& st, const cost::CostModel& cm, int s, int lo, int hi, int max_head) {
  int added = 0;
  for (int i = lo + 1; i < hi; ++i) {
    const int blk = st.seqs[s].items[i].seq;
    if (blk < 0 || !st.seqs[blk].parallel) continue;
    const std::vector<int> branches = distinct_branches(st, cm, blk);
    for (int h = i - 1; h >= std::max(lo, i - max_head); --h) {
      if (st.seqs[s].items[h].seq >= 0) break;  // heads are single ops
      for (int j : branches) {
        if (!room_for(st, s, h)) break;
        Seq ext;
        ext.items.assign(st.seqs[s].items.begin() + h, st.seqs[s].items.begin() + i);
        ext.fork_to = i - h;
        for (Item& it : branch_items(st, blk, j)) ext.items.push_back(std::move(it));
        Seq others = st.seqs[blk];
        others.items.erase(others.items.begin() + j);
        if (st.forks[s].empty()) st.forks[s].resize(st.seqs[s].items.size());
        const int e = static_cast<int>(st.seqs.size());
        st.seqs.push_back(std::move(ext));
        st.seqs.push_back(std::move(others));
        st.forks[s][h].push_back({i, e, e + 1});
        ++added;
      }
    }
  }
  return added;
}

}  // namespace

int add_boundary_options(Structure& st, const cost::CostModel& cm, int max_ops) {
  int added = 0;
  // The extended branches are series sequences too: their own blocks get options in turn (only
  // inside the branch's own items, not across its fork or join ops).
  for (int s = 0; s < static_cast<int>(st.seqs.size()); ++s) {
    st.joins.resize(st.seqs.size());
    st.forks.resize(st.seqs.size());
    const Seq& q = st.seqs[s];
    if (q.parallel) continue;
    const int lo = std::max(q.fork_to, 0);
    const int hi = q.join_from >= 0 ? q.join_from : static_cast<int>(q.items.size());
    added += add_joins_at(st, cm, s, lo, hi, max_ops);
    added += add_forks_at(st, cm, s, lo, hi, max_ops);
  }
  st.joins.resize(st.seqs.size());
  st.forks.resize(st.seqs.size());
  return added;
}

namespace {

// The ops under sequence s in item order, as the DP's costs see them: each op's costs, its inputs
// (an op of s by position, an outside producer by its first appearance, with its output's size)
// and whether an op outside s reads it. Outside producers are relabelled: two sequences reading
// different but equal tensors cost the same (RangeCost and cost::stage_cost only tell producers
// apart, and by their bytes).
std::string ops_key(const cost::CostModel& cm, const Seq& q) {
  const ir::Graph& g = cm.graph();
  std::unordered_map<int32_t, int> pos, outside;
  int x = 0;
  for (const Item& it : q.items)
    for (OpId op : it.ops) pos[op.v] = x++;
  std::string key;
  for (const Item& it : q.items) {
    key += it.seq < 0 ? "o" : fmt::format("n{}", it.ops.size());
    for (OpId op : it.ops) {
      key += op_cost_key(cm, op);
      for (OpId p : g.preds(op)) {
        if (auto in = pos.find(p.v); in != pos.end()) {
          key += fmt::format(",i{}", in->second);
          continue;
        }
        auto [at, fresh] = outside.emplace(p.v, static_cast<int>(outside.size()));
        key += fmt::format(",x{}:{}:{}", at->second, cm.output_bytes(p, 1), fresh ? cm.signature(p) : "");
      }
      int leaves = 0;
      for (OpId c : g.succs(op)) leaves += pos.count(c.v) ? 0 : 1;
      key += fmt::format(";{}\n", leaves);
    }
  }
  return key;
}

}  // namespace

std::vector<int> mirror_sequences(const Structure& st, const cost::CostModel& cm) {
  // Shared parameters make a stage's cost depend on ops outside it: no sharing then.
  if (!cm.graph().model().shared_params.empty()) return {};
  const int n = static_cast<int>(st.seqs.size());
  std::vector<int> same(n, -1);
  std::unordered_map<std::string, int> first;
  std::function<int(int)> canon = [&](int s) -> int {
    if (same[s] >= 0) return same[s];
    const Seq& q = st.seqs[s];
    std::string key = fmt::format("{}|{}|{}|{}\n", q.parallel, q.join_from, q.join_item, q.fork_to);
    for (size_t i = 0; i < q.items.size(); ++i) {
      if (q.items[i].seq >= 0) key += fmt::format("[{}]{}", i, canon(q.items[i].seq));
      if (const auto* js = st.joins_at(s, static_cast<int>(i)))
        for (const JoinOption& jo : *js) key += fmt::format("j{}:{}:{}", i, jo.tail_end, canon(jo.block));
      if (const auto* fs = st.forks_at(s, static_cast<int>(i)))
        for (const ForkOption& fo : *fs)
          key += fmt::format("f{}:{}:{}:{}", i, fo.block_item, canon(fo.ext), canon(fo.others));
    }
    key += ops_key(cm, q);
    return same[s] = first.emplace(std::move(key), s).first->second;
  };
  for (int s = 0; s < n; ++s) canon(s);
  return same;
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

StageSizes StageSizes::window(int largest, int spread) {
  StageSizes out;
  for (int j = spread; j >= 0; --j)
    if (largest >> j >= 1 && (largest >> j) << j == largest) out.sizes.push_back(largest >> j);
  return out;
}

SeqDp::SeqDp(const cost::CostModel& cm, const Structure& st, const StageSizes& sizes, int mini_batch,
             double memory_limit, int num_devices, bool same_node)
    : cm_(cm),
      st_(st),
      sizes_(sizes.sizes),
      mbs_(sizes_.empty() ? 0 : sizes_.back()),
      mini_(mini_batch),
      num_micro_(sizes_.empty() ? 0 : mini_batch / sizes_.front()),
      n_(num_devices),
      mem_limit_(memory_limit),
      same_node_(same_node),
      cache_(sizes_.size(), std::vector<std::vector<std::vector<StageCostLite>>>(st.seqs.size())) {
  GP_ASSERT(st.seqs.size() < 65536 && num_devices < 65536, "structure too large");
  GP_ASSERT(!sizes_.empty() && sizes_.size() < 32, "stage sizes: {}", sizes_.size());
  for (size_t z = 0; z < sizes_.size(); ++z) {
    const int b = sizes_[z];
    GP_ASSERT(std::has_single_bit(static_cast<unsigned>(b)) && mini_batch % b == 0 && (z == 0 || b > sizes_[z - 1]),
              "stage size {} of mini-batch {}", b, mini_batch);
    wlog_[z] = static_cast<int8_t>(std::countr_zero(static_cast<unsigned>(b / sizes_[0])));
  }
  rcs_.reserve(sizes_.size());
  for (int b : sizes_) rcs_.emplace_back(cm, st, b, mini_batch, same_node);
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
  act_unit_.assign(cm.graph().num_ops(), std::numeric_limits<double>::infinity());
  act_dev_.assign(cm.graph().num_ops(), std::numeric_limits<double>::infinity());
  for (size_t o = 0; o < act_unit_.size(); ++o)
    for (size_t z = 0; z < sizes_.size(); ++z)
      for (int p = 1; p <= std::min(n_, sizes_[z]); p *= 2) {
        const double a = cm.saved_bytes(OpId(static_cast<int32_t>(o)), sizes_[z] / p);
        act_unit_[o] = std::min(act_unit_[o], p * a / (1 << wlog_[z]));
        act_dev_[o] = std::min(act_dev_[o], a);
      }
  mem_state_.resize(st.seqs.size());
  mem_act_.resize(st.seqs.size());
  spine_.resize(st.seqs.size());
  chain_stage_.resize(st.seqs.size());
  chain_act_.resize(st.seqs.size());
  chain_dev_.resize(st.seqs.size());
  work_lb_.resize(st.seqs.size());
}

SeqDp::Cell* SeqDp::cell(int s, int i, int d, int down, bool create) {
  s = st_.canon(s);  // identical sequences share their memo (mirror_sequences)
  GP_ASSERT(cidx_[d] >= 0, "memo: device count {} is not a candidate", d);
  // [sequence][device count][item]: base_case looks up the rests of one stage's growing ends at
  // one device count, consecutive slots.
  Slot& sl = slots_[seq_base_[s] + static_cast<size_t>(cidx_[d]) * st_.seqs[s].items.size() + i];
  if (sl.filled && sl.down == down) return &sl.cell;
  if (!sl.filled) {
    if (!create) return nullptr;
    sl.filled = true;
    sl.down = down;
    return &sl.cell;
  }
  const uint64_t key = (uint64_t(s) << 48) | (uint64_t(i) << 32) | (uint64_t(d) << 16) | uint64_t(down);
  if (create) return &overflow_[key];
  auto it = overflow_.find(key);
  return it == overflow_.end() ? nullptr : &it->second;
}

const SeqDp::Entry* SeqDp::find(int s, int i, int d, int down) {
  const Cell* c = cell(s, i, d, down, false);
  return c && c->has_entry && c->e.range.holds(tmax_) ? &c->e : nullptr;
}

void SeqDp::store(int s, int i, int d, int down, const Entry& e) {
  Cell& c = *cell(s, i, d, down, true);
  if (e.val >= 0) {
    c.has_entry = true;
    c.e = e;
  } else if (e.range.unbounded_above()) {
    c.infeasible_below = std::numeric_limits<double>::infinity();
  } else {
    c.infeasible_below = std::max(c.infeasible_below, e.range.hi);
  }
}

// A stage's cache slot (nullptr once the cache is full): per size, sequence, degree and first item
// a row of the stages [i, m) evaluated so far, grown geometrically (base_case extends a stage one
// item at a time), so only the stages the DP reaches take memory. The values are those cheap()
// and finish() compute, kept: the same stage recurs across states and targets.
inline SeqDp::StageCostLite* SeqDp::cache_slot(int s, int i, int m, int plog, int z) {
  auto& rows = cache_[z][s];
  const size_t k = st_.seqs[s].items.size(), len = static_cast<size_t>(m - i);
  if (rows.empty()) rows.resize(k * static_cast<size_t>(plogs_));
  std::vector<StageCostLite>& row = rows[static_cast<size_t>(plog) * k + i];
  if (row.size() >= len) return &row[len - 1];
  const size_t want = std::min(k - i, std::max({len, 2 * row.size(), size_t{16}}));
  if (want > row.capacity()) {
    const size_t more = (want - row.capacity()) * sizeof(StageCostLite);
    if (cache_bytes_ + more > kCacheBytes) return nullptr;
    cache_bytes_ += more;
    row.reserve(want);
  }
  row.resize(want, StageCostLite{-1, -1, 0, 0});
  return &row[len - 1];
}

inline SeqDp::StageCostLite SeqDp::stage_head(int s, int i, int m, int plog, int z) {
  s = st_.canon(s);
  StageCostLite* slot = cache_slot(s, i, m, plog, z);
  if (slot && slot->compute_tps >= 0) return *slot;
  const RangeCost::Cost c = rcs_[z].cheap(s, i, m, plog);
  const StageCostLite lite{-1, c.compute_tps, c.state, c.act};
  if (slot) *slot = lite;
  return lite;
}

void SeqDp::complete(int s, int i, int m, int plog, int z, StageCostLite* c) {
  if (c->tps >= 0) return;
  s = st_.canon(s);
  RangeCost::Cost rc{0, c->compute_tps, c->state, c->act};
  rcs_[z].finish(s, i, m, plog, &rc);
  c->tps = rc.tps;
  if (StageCostLite* slot = cache_slot(s, i, m, plog, z)) slot->tps = rc.tps;
}

SeqDp::StageCostLite SeqDp::stage(int s, int i, int m, int plog, int z) {
  StageCostLite c = stage_head(s, i, m, plog, z);
  complete(s, i, m, plog, z, &c);
  return c;
}

// `depth`: the stage's in-flight units; c.act is per micro-batch of size z (w units each).
inline bool SeqDp::fits(const StageCostLite& c, int depth, int z) const {
  return c.state + (std::min(depth, num_micro_) >> wlog_[z]) * c.act <= mem_limit_;
}

inline int SeqDp::after(int z, int succ) const {
  const int wl = wlog_[z];  // w = 2^wl units
  if (wl == 0) return std::min(succ + 1, num_micro_);  // the common case: the smallest size
  return std::min((((succ + (1 << wl) - 1) >> wl) + 1) << wl, num_micro_);
}

int SeqDp::down_of(const Seq& q, int i, int m, int down) const {
  if (q.join_item < 0 || (i <= q.join_item && q.join_item < m)) return down;
  // Feeds the join stage: at most the in-flight of a join stage of the largest size.
  return after(static_cast<int>(sizes_.size()) - 1, down);
}

inline bool SeqDp::memo_answer(const Cell& c, int* val) {
  const bool never = c.infeasible_below == std::numeric_limits<double>::infinity();
  if (never || tmax_ < c.infeasible_below) {  // infeasible here and at every smaller target
    range_.meet({-std::numeric_limits<double>::infinity(), c.infeasible_below, !never});
    *val = -1;
    return true;
  }
  if (c.has_entry && c.e.range.holds(tmax_)) {
    range_.meet(c.e.range);
    *val = c.e.val;
    return true;
  }
  return false;
}

// The minimal depth (in-flight micro-batches of its first stages) of the suffix [i, end) of
// sequence s on at most d devices, given `down` micro-batches in flight after it; -1 when no plan
// of it meets the target and fits memory. Five cases, each keeping the best in `best`. A memo
// entry from an earlier target is the answer here when the target lies in its TargetRange.
int SeqDp::go(int s, int i, int d, int down) {
  if (d < 1) return -1;
  // Identical sequences are solved once, on their representative (the answer is positional:
  // collect() maps it onto each sequence's own items).
  s = st_.canon(s);
  if (aborted_) {  // the memory probe ran out of budget: nothing more is solved
    range_.meet(TargetRange::none());
    return -1;
  }
  // What an answer at another target tells of this one (see below).
  int known_floor = -1, known_ceiling = -1;
  double floor_until = 0;
  if (const Cell* c = cell(s, i, d, down, false)) {
    if (int v; memo_answer(*c, &v)) return v;
    // The answer found at another target, where it holds at its range's lo (an unfinished
    // one's range is empty): at a smaller target this one is at least as deep, at a larger one
    // at most (a larger target admits every plan a smaller one does).
    if (target_bounds_on_ && c->has_entry && !c->e.range.empty()) {
      if (tmax_ < c->e.range.lo) known_floor = c->e.val, floor_until = c->e.range.lo;
      else if (c->e.val < num_micro_) known_ceiling = c->e.val;
    }
  }
  // Memory alone rules the state out at every target (the range is untouched: no time test), and
  // so does the compute cap (fixed for this DP). Both are kept in the memo as infeasible at every
  // target, which a later visit reads the same way (no range change).
  if (memory_rules_out(s, i, d, down) || over_cap(s, i, d)) {
    cell(s, i, d, down, true)->infeasible_below = std::numeric_limits<double>::infinity();
    return -1;
  }
  // Prune by the target: d devices cannot run more than d x T device-seconds per sample. Kept in
  // the memo as infeasible below that value (a later visit at a smaller target reads it there).
  const double per_device = work_lower_bound(s, i) / (d * (1 + 1e-9));
  if (per_device > tmax_) {
    range_.reject(per_device);
    Cell* c = cell(s, i, d, down, true);
    c->infeasible_below = std::max(c->infeasible_below, per_device);
    return -1;
  }
  ++states_;
  // The time tests this state's answer rests on: its own, then its subtree's (range_ collects
  // them from the children, memoised ones included).
  const TargetRange outer = range_;
  range_ = {};
  range_.accept(per_device);
  // No plan of the suffix is shallower than its first stages of the smallest size (in-flight
  // after(0, down)), nor than a floor known from a larger target: each case stops when it gets
  // there. A ceiling known from a smaller target (its plan still meets this one) starts the search
  // as if a plan one unit deeper had been found, so the cases' bounds skip what cannot reach it.
  // Either way the answer is what a search without them finds (keep() takes only strictly better
  // plans: the first plan to reach the optimum wins in both), wherever they hold. The floor holds
  // at targets up to floor_until: the range is cut there. The ceiling needs no cut: wherever the
  // range holds, the plan found (at most the ceiling deep) meets the target, so it holds there.
  const int floor_val = std::max(after(0, down), known_floor);
  Entry best;
  if (known_ceiling >= 0) best.val = known_ceiling + 1;
  cases(s, i, d, down, floor_val, &best);
  if (known_ceiling >= 0 && best.how == Case::none && !aborted_) {
    // The ceiling's plan was not found again: some bound of the cases assumed more than holds.
    // Searched again without it (the tests count these: none so far).
    ++ceiling_misses_;
    range_ = {};
    range_.accept(per_device);
    best = {};
    cases(s, i, d, down, floor_val, &best);
  }
  target_bounds_ += known_floor >= 0 || known_ceiling >= 0;
  if (best.val == floor_val && floor_val > after(0, down)) range_.reject(floor_until);
  best.range = range_;
  range_.meet(outer);
  store(s, i, d, down, best);
  return best.val;
}

void SeqDp::cases(int s, int i, int d, int down, int floor_val, Entry* best) {
  base_case(s, i, d, down, floor_val, best);
  if (best->val != floor_val) nested_case(s, i, d, down, floor_val, best);
  if (best->val != floor_val) join_case(s, i, d, down, floor_val, best);
  if (best->val != floor_val) merge_case(s, i, d, down, floor_val, best);
  if (best->val != floor_val) fork_case(s, i, d, down, floor_val, best);
}

namespace {
void keep(SeqDp::Entry* best, int val, SeqDp::Case how, int plog, int arg, int opt = 0, int z = 0) {
  if (val < 0 || (best->val >= 0 && val >= best->val)) return;
  *best = {val, how, static_cast<int8_t>(plog), static_cast<int8_t>(z), arg, static_cast<int16_t>(opt)};
}
// pick_size's Depth results besides {own, val}.
constexpr std::pair<int, int> kRestInfeasible{-1, -1}, kSizeOverMemory{-2, -2};
}  // namespace

template <class Head, class Full, class Depth>
SeqDp::SizePick SeqDp::pick_size(uint32_t* alive, int plog, int floor_succ, int bound, Head head, Full full,
                                 Depth depth, uint32_t* parked) {
  // Sizes ruled out for their depth floor: for good, or (`parked`) until the floor changes.
  auto drop = [&](uint32_t bits) {
    *alive &= ~bits;
    if (parked) *parked |= bits;
  };
  for (int z = 0; z < static_cast<int>(sizes_.size()); ++z) {
    if (!(*alive >> z & 1)) continue;
    if (bound >= 0 && after(z, floor_succ) >= bound) {  // neither this size nor a larger one beats `bound`
      drop(*alive & ~((1u << z) - 1));
      break;
    }
    if (++evals_ - solve_start_ > budget_ && budget_ > 0) aborted_ = true;  // memory_probe gives up
    if (aborted_) {
      range_.meet(TargetRange::none());  // an unfinished answer: never reused nor taken as memory-only
      *alive = 0;
      return {};
    }
    StageCostLite c = head(z);
    if (c.compute_tps > cap_) {  // above the DP's fixed cap: so is every larger stage of this shape
      *alive &= ~(1u << z);
      continue;
    }
    if (!within(c.compute_tps)) {  // so is every larger stage of this shape at this size
      *alive &= ~(1u << z);
      continue;
    }
    if (!fits(c, after(z, floor_succ), z)) {
      drop(1u << z);
      continue;
    }
    if (tmax_ == std::numeric_limits<double>::infinity()) {
      // Every stage meets an infinite target: its full cost (communication, all-reduce) is not
      // needed, and the answer holds at that target only (the memory probe's solve).
      range_.accept(tmax_);
    } else {
      // `full` may decline a size without a time test (a memory floor that only holds here).
      if (!full(z, &c) || !within(c.tps)) continue;
    }
    // A larger size only deepens the stage (after() grows with the size): the first that fits wins.
    const auto [own, val] = depth(z, c);
    if (own == kRestInfeasible.first) return {};
    if (own == kSizeOverMemory.first) continue;
    return {z, own, val};
  }
  return {};
}

// The sizes a stage on 2^plog devices may take: each a multiple of its device count.
uint32_t SeqDp::sizes_for(int plog) const {
  uint32_t mask = 0;
  for (size_t z = 0; z < sizes_.size(); ++z)
    if (sizes_[z] >= (1 << plog)) mask |= 1u << z;
  return mask;
}

// In a series sequence, a choice that leaves a rest of the sequence (from item j) after its part is
// at least one unit deeper than the rest, and the rest at least one unit per part deeper than
// `down` (after() only grows with the size and with what follows), so it improves on `best` only
// while best is deeper than that (rest_may_beat; with one part per rest: the part, then at least
// one stage). Skipping such choices changes no result: keep() takes only strictly better ones.
// (Parallel sequences put the rest beside, not after: always true.)
bool SeqDp::beats_with_rest(const Seq& q, int s, int j, const Entry* best, int down) {
  return q.parallel || rest_may_beat(s, j, down, best->val);
}

// base_case's rests per stage end m < k as looked up at a smaller degree (-1: infeasible), in its
// slice of known_rest_, released on return. A larger degree leaves the rest fewer devices, and a
// state's depth only grows (or it becomes infeasible) with fewer devices, at the same target. So
// where the known rest already could not beat the best, the stage end is skipped at every larger
// degree: its tests there could not change the best (skipping them only shifts where the next stage
// end fails the same compute or memory test; the rest's time tests were met into the state's range
// when it was looked up).
class SeqDp::KnownRests {
 public:
  KnownRests(SeqDp* dp, int i, int k) : dp_(dp), base_(dp->known_top_), i_(i), filled_(i) {
    dp_->known_top_ += static_cast<size_t>(k - i);
    if (dp_->known_rest_.size() < dp_->known_top_) dp_->known_rest_.resize(2 * dp_->known_top_);
  }
  ~KnownRests() { dp_->known_top_ = base_; }
  KnownRests(const KnownRests&) = delete;
  KnownRests& operator=(const KnownRests&) = delete;
  void set(int m, int rest) {
    if (filled_ < m) {  // the ends in between were never looked up
      std::fill(dp_->known_rest_.begin() + slot(filled_ + 1), dp_->known_rest_.begin() + slot(m), kUnknown);
      filled_ = m;
    }
    dp_->known_rest_[slot(m)] = rest;
  }
  // Whether the rest after m, known from a smaller degree, rules m out against `best`: infeasible,
  // or already as deep as best (series: the stage adds a unit; parallel: it runs beside the rest).
  bool cannot_beat(int m, int best, bool parallel) const {
    if (m > filled_) return false;
    const int r = dp_->known_rest_[slot(m)];
    if (r == kUnknown) return false;
    return r < 0 || (best >= 0 && (parallel ? r : dp_->after(0, r)) >= best);
  }
  // The first end in [m, stop) that cannot_beat does not rule out (stop when none).
  int first_open(int m, int stop, int best, bool parallel) const {
    while (m < stop && cannot_beat(m, best, parallel)) ++m;
    return m;
  }

 private:
  static constexpr int kUnknown = -3;
  size_t slot(int m) const { return base_ + static_cast<size_t>(m - i_ - 1); }
  SeqDp* dp_;
  size_t base_;
  int i_, filled_;  // slots of ends (i, filled_] are set (kUnknown where never looked up)
};

// Base case: items [i, m) form one stage on p = 2^plog devices at the smallest size that meets
// the target; the rest is solved recursively. Per degree, m grows until every size's compute alone
// exceeds the target, or its memory at the shallowest possible depth exceeds the limit (both only
// grow with m).
void SeqDp::base_case(int s, int i, int d, int down, int floor_val, Entry* best) {
  const Seq& q = st_.seqs[s];
  const int k = static_cast<int>(q.items.size());
  const int pcap = std::bit_width(static_cast<unsigned>(std::min(d, mbs_))) - 1;
  // A chain whose rest may need more than one stage (the greedy count only falls with m): the
  // memory test below at the rest's least in-flight can decline sizes early.
  const bool chain_floor = mem_bound_ && !q.parallel && i + 1 < k && !chain_stage_[s].empty() && chain_stage_[s][i + 1] > 1;
  // Whether a rest here may need more than one part (else rest_may_beat is the two-stage floor).
  const bool rest_lb = chain_floor || (mem_bound_ && !q.parallel && i + 1 < k && chain_stage_[s].empty() &&
                                       spine_[s].back() - spine_[s][i + 1] > mem_limit_ * (1 + 1e-9));
  KnownRests known(this, i, k);  // the rests looked up at smaller degrees (see KnownRests)
  const int* chain_stage = chain_floor ? chain_stage_[s].data() : nullptr;
  for (int plog = 0; plog <= pcap && best->val != floor_val; ++plog) {
    const int p = 1 << plog;
    // The rests' memo slots at d - p devices (go()'s first lookup, done here for the common case).
    const int rest_d = floor_cand(d - p);
    const Slot* rest_slots = rest_d >= 1 ? &slots_[seq_base_[s] + static_cast<size_t>(cidx_[rest_d]) * k] : nullptr;
    // In a series sequence a stage with a rest after it has at least after(0, down) units after
    // it, so its sizes are tested against that floor; a size that fails it (memory, or the bound)
    // is parked: it fails for every longer stage with a rest too, but may still fit as the stage
    // to the end, whose floor is `down`. So in a join block's parallel sequence: a group without
    // the join item (the last) feeds the join stage, one more unit than the group with it.
    uint32_t alive = sizes_for(plog), parked = 0;
    // A chain's rest needs some devices: the stage ends whose rest cannot fit the d - p left.
    const int fit_from = !q.parallel && d - p >= 1 ? first_rest_fitting(s, i + 1, d - p, down) : i + 1;
    int beat_for = -2, skip_to = fit_from;  // skip_to: for best->val == beat_for
    for (int m = d - p < 1 ? k : i + 1; m <= k && (alive || parked); ++m) {
      // A stage whose rest cannot be shallow enough to beat best is skipped (the rest's bound only
      // weakens as m grows; a skipped m's size tests fail the same way at the next m: compute and
      // memory only grow with the stage).
      if (m < k && alive && !q.parallel) {
        if (best->val != beat_for) {  // the first stage end whose rest may fit and beat best
          beat_for = best->val;
          skip_to = std::max(fit_from, !rest_lb ? (best->val >= 0 && best->val <= after(0, after(0, down)) ? k : i + 1)
                                                : first_rest_beating(s, i + 1, down, best->val));
        }
        if (m < skip_to) m = skip_to;
      }
      if (q.join_from >= 0 && m > q.join_from && m < k) m = k;  // the join ops share the last stage
      if (m < k && !alive) m = k;  // only the stage to the end
      if (m == k) alive |= std::exchange(parked, 0);
      if (m < k && rest_reuse_ && known.cannot_beat(m, best->val, q.parallel)) {
        // So are the ends after it up to the next one it does not rule out: nothing above changes
        // between them (best, alive and skip_to stay; the join clamp starts at join_from + 1).
        const int next = known.first_open(m + 1, q.join_from >= 0 ? std::min(k, q.join_from + 1) : k, best->val,
                                          q.parallel);
        rests_reused_ += static_cast<size_t>(next - m);
        m = next - 1;
        continue;
      }
      const bool two_stages = !q.parallel && m < k;
      // The least in-flight of the rest of a chain (0: no floor beyond after(0, down)).
      const int rest_units =
          two_stages && chain_floor && chain_stage[m] > 1 ? std::min(down + chain_stage[m], num_micro_) : 0;
      int rest = -3;  // what follows the stage, solved once for all sizes
      auto rest_of = [&] {
        if (rest != -3) return rest;
        if (m == k) return rest = q.parallel ? 0 : down;
        const Slot& sl = rest_slots[m];
        if (aborted_ || !sl.filled || sl.down != down || !memo_answer(sl.cell, &rest)) rest = go(s, m, rest_d, down);
        return rest;
      };
      const SizePick pick = pick_size(
          &alive, plog, q.parallel ? down_of(q, i, m, down) : two_stages ? after(0, down) : down, best->val,
          [&](int z) { return stage_head(s, i, m, plog, z); },
          [&](int z, StageCostLite* c) {
            // In a chain the rest needs at least its greedy stage count: a size that cannot hold
            // that much in flight fails the memory test below whatever the rest's depth (its full
            // cost and the rest are not needed).
            if (rest_units > 0 && !fits(*c, after(z, rest_units), z)) return false;
            complete(s, i, m, plog, z, c);
            return true;
          },
          [&](int z, const StageCostLite& c) -> std::pair<int, int> {
            if (q.parallel) {  // parallel: a group of branches as one stage beside the rest
              const int self = after(z, down_of(q, i, m, down));
              if (!fits(c, self, z)) return kSizeOverMemory;
              if (rest_of() < 0) return kRestInfeasible;
              return {self, std::max(self, rest)};
            }
            if (rest_of() < 0) return kRestInfeasible;  // series: this stage feeds the rest
            const int own = after(z, rest);
            if (!fits(c, own, z)) return kSizeOverMemory;
            return {own, own};
          },
          two_stages || (q.join_item >= 0 && m < k) ? &parked : nullptr);
      if (m < k && rest != -3) known.set(m, rest);
      if (pick.z < 0) continue;
      keep(best, pick.val, Case::stage, plog, m, 0, pick.z);
      if (best->val == floor_val) break;
    }
  }
}

// Nested case: item i is itself a series/parallel subgraph, split recursively on d1 devices; in a
// series sequence it runs before the rest (its `down` is the rest's depth), in a parallel one
// beside it.
void SeqDp::nested_case(int s, int i, int d, int down, int floor_val, Entry* best) {
  const Seq& q = st_.seqs[s];
  const int k = static_cast<int>(q.items.size());
  const int c = q.items[i].seq;
  if (c < 0) return;
  const int own_down = q.parallel ? down_of(q, i, i + 1, down) : down;
  if (i + 1 == k) return keep(best, go(c, 0, d, own_down), Case::nested, 0, d);
  for (int d1 = 1; d1 < d && best->val != floor_val && beats_with_rest(q, s, i + 1, best, down); ++d1) {
    if (floor_cand(d1) != d1) continue;
    const int rest = go(s, i + 1, floor_cand(d - d1), down);
    if (rest < 0) continue;
    const int mine = go(c, 0, d1, q.parallel ? own_down : rest);
    if (mine < 0) continue;
    keep(best, q.parallel ? std::max(mine, rest) : mine, Case::nested, 0, d1);
  }
}

// A part of series sequence s (a block with its join or fork ops) followed by the rest of the
// sequence from item `after`: the part on d1 devices with the rest's depth after it, the rest on
// the others (the part alone on all d when nothing follows). `part(d1, down)` is the part's depth.
template <class Part>
void SeqDp::part_then_rest(int s, int after, int d, int down, int floor_val, Case how, int opt, Entry* best,
                           Part part) {
  if (after == static_cast<int>(st_.seqs[s].items.size())) return keep(best, part(d, down), how, 0, d, opt);
  for (int d1 = 1; d1 < d && best->val != floor_val && beats_with_rest(st_.seqs[s], s, after, best, down); ++d1) {
    if (floor_cand(d1) != d1) continue;
    const int rest = go(s, after, floor_cand(d - d1), down);
    if (rest < 0) continue;
    keep(best, part(d1, rest), how, 0, d1, opt);
  }
}

// Join case (series sequences): the parallel block at item i and the ops after it up to a
// tail_end, with those ops in the last stage of one branch (JoinOption); the rest after tail_end.
void SeqDp::join_case(int s, int i, int d, int down, int floor_val, Entry* best) {
  const auto* opts = st_.joins_at(s, i);
  if (!opts) return;
  for (int o = 0; o < static_cast<int>(opts->size()) && best->val != floor_val; ++o) {
    const JoinOption& jo = (*opts)[o];
    part_then_rest(s, jo.tail_end, d, down, floor_val, Case::join, o, best,
                   [&](int d1, int dn) { return go(jo.block, 0, d1, dn); });
  }
}

std::vector<OpId> SeqDp::merge_ops(int s, int i, int x) const {
  const Seq& q = st_.seqs[s];
  const int k = static_cast<int>(q.items.size());
  std::vector<OpId> ops;
  for (int j = i; j + 1 < k; ++j) ops.insert(ops.end(), q.items[j].ops.begin(), q.items[j].ops.end());
  const Seq& c = st_.seqs[q.items[k - 1].seq];
  for (int j = 0; j < x; ++j) ops.insert(ops.end(), c.items[j].ops.begin(), c.items[j].ops.end());
  return ops;
}

SeqDp::StageCostLite SeqDp::merge_stage(int s, int i, int x, int plog, int z) {
  const uint64_t key =
      (uint64_t(st_.canon(s)) << 44) | (uint64_t(i) << 26) | (uint64_t(x) << 8) | (uint64_t(z) << 4) | uint64_t(plog);
  auto it = merge_cost_.find(key);
  if (it != merge_cost_.end()) return it->second;
  // Not a contiguous range of one sequence, so RangeCost does not apply: cost it directly.
  const std::vector<OpId> ops = merge_ops(s, i, x);
  if (mask_.empty()) mask_.assign(cm_.graph().num_ops(), 0);
  for (OpId o : ops) mask_[o.v] = 1;
  const cost::StageCost c = cost::stage_cost(cm_, ops, mask_, 1 << plog, sizes_[z], mini_, same_node_);
  for (OpId o : ops) mask_[o.v] = 0;
  const StageCostLite lite{c.tps_s, c.compute_s / sizes_[z], c.state_bytes, c.act_bytes_per_mb};
  merge_cost_.emplace(key, lite);
  return lite;
}

// Merge case (parallel sequences): the remaining branches but the last, together with the first x
// items of the last branch's series sequence, form one stage; the rest of that branch runs after
// it on the other devices. (A branch's head shares a stage with the lighter branches beside it,
// e.g. in a join block the extended branch's head with the branches that feed its join stage.)
void SeqDp::merge_case(int s, int i, int d, int down, int floor_val, Entry* best) {
  const Seq& q = st_.seqs[s];
  const int k = static_cast<int>(q.items.size());
  if (!q.parallel || i + 1 >= k) return;
  const int c = q.items[k - 1].seq;
  if (c < 0 || st_.seqs[c].parallel) return;
  const Seq& cs = st_.seqs[c];
  // The prefix stays clear of the join ops (they share the branch's last stage).
  const int xmax = cs.join_from >= 0 ? cs.join_from : static_cast<int>(cs.items.size()) - 1;
  const int others = down_of(q, i, k - 1, down);  // what follows the group of branches
  const int own_down = down_of(q, k - 1, k, down);
  const int pcap = std::bit_width(static_cast<unsigned>(std::min(d - 1, mbs_))) - 1;
  for (int plog = 0; plog <= pcap && best->val != floor_val; ++plog) {
    const int p = 1 << plog;
    uint32_t alive = sizes_for(plog);
    for (int x = 1; x <= xmax && alive; ++x) {
      int rest = -3;
      // Compute, state and activations add up over the two ranges: the breaks need no full cost.
      const SizePick pick = pick_size(
          &alive, plog, down, best->val,
          [&](int z) {
            const StageCostLite group = stage_head(s, i, k - 1, plog, z), head = stage_head(c, 0, x, plog, z);
            return StageCostLite{-1, group.compute_tps + head.compute_tps, group.state + head.state,
                                 group.act + head.act};
          },
          [&](int z, StageCostLite* cst) { return *cst = merge_stage(s, i, x, plog, z), true; },
          [&](int z, const StageCostLite& cst) -> std::pair<int, int> {
            if (rest == -3) rest = go(c, x, floor_cand(d - p), own_down);
            if (rest < 0) return kRestInfeasible;
            const int own = after(z, std::max(others, rest));
            if (!fits(cst, own, z)) return kSizeOverMemory;
            return {own, own};
          });
      if (pick.z < 0) continue;
      keep(best, pick.val, Case::merge, plog, x, 0, pick.z);
      if (best->val == floor_val) break;
    }
  }
}

// Fork case (series sequences): the ops [i, block) before a parallel block share the first stage
// of one branch (ForkOption); the rest of the sequence after the block runs on the other devices.
void SeqDp::fork_case(int s, int i, int d, int down, int floor_val, Entry* best) {
  const auto* opts = st_.forks_at(s, i);
  if (!opts) return;
  for (int o = 0; o < static_cast<int>(opts->size()) && best->val != floor_val; ++o) {
    const ForkOption& fo = (*opts)[o];
    part_then_rest(s, fo.block_item + 1, d, down, floor_val, Case::fork, o, best,
                   [&](int d1, int dn) { return fork_block(fo, d1, dn).val; });
  }
}

// Branch j with the fork ops on d1 devices (its first stage [0, m) on p of them, the rest of it
// after), the other branches on d - d1: the first stage feeds both, so its depth is one more than
// the deeper of the two.
const SeqDp::ForkPick& SeqDp::fork_block(const ForkOption& fo, int d, int down) {
  const uint64_t key = (uint64_t(st_.canon(fo.ext)) << 40) | (uint64_t(d) << 20) | uint64_t(down);
  auto it = fork_memo_.find(key);
  if (it != fork_memo_.end() && it->second.range.holds(tmax_)) {
    range_.meet(it->second.range);
    return it->second;
  }
  const TargetRange outer = range_;
  range_ = {};
  ForkPick best;
  const Seq& c = st_.seqs[fo.ext];
  const int len = static_cast<int>(c.items.size());
  for (int d1 = 1; d1 < d; ++d1) {
    if (floor_cand(d1) != d1) continue;
    const int others = go(fo.others, 0, floor_cand(d - d1), down);
    if (others < 0) continue;
    const int lo = after(0, others);  // no first stage is shallower
    if (best.val >= 0 && lo >= best.val) continue;
    const int pcap = std::bit_width(static_cast<unsigned>(std::min(d1, mbs_))) - 1;
    for (int plog = 0; plog <= pcap && best.val != lo; ++plog) {
      const int p = 1 << plog;
      uint32_t alive = sizes_for(plog);
      for (int m = d1 - p < 1 ? len : c.fork_to; m <= len && alive; ++m) {
        int rest = -3;
        const SizePick pick = pick_size(
            &alive, plog, others, best.val, [&](int z) { return stage_head(fo.ext, 0, m, plog, z); },
            [&](int z, StageCostLite* cst) { return complete(fo.ext, 0, m, plog, z, cst), true; },
            [&](int z, const StageCostLite& cst) -> std::pair<int, int> {
              if (rest == -3) rest = m < len ? go(fo.ext, m, floor_cand(d1 - p), down) : down;
              if (rest < 0) return kRestInfeasible;
              const int own = after(z, std::max(rest, others));
              if (!fits(cst, own, z)) return kSizeOverMemory;
              return {own, own};
            });
        if (pick.z < 0) continue;
        if (best.val < 0 || pick.val < best.val) best = {pick.val, d1, plog, m, pick.z};
        if (best.val == lo) break;
      }
    }
  }
  best.range = range_;
  range_.meet(outer);
  return fork_memo_[key] = best;
}

// For a part_then_rest choice (`arg`: the part's devices): collects the rest of sequence s from
// `after` and returns the part's devices and downstream depth.
std::pair<int, int> SeqDp::collect_rest(int s, int after, int d, int down, int arg, std::vector<StageChoice>* out) {
  if (after == static_cast<int>(st_.seqs[s].items.size())) return {d, down};
  const int rd = floor_cand(d - arg);
  const int rest = go(s, after, rd, down);
  collect(s, after, rd, down, out);
  return {arg, rest};
}

void SeqDp::collect(int s, int i, int d, int down, std::vector<StageChoice>* out) {
  // A memo entry that holds here may have been answered from its own entry while the entries
  // below it were replaced at other targets: go() solves such a state again (the same answer).
  const Entry* found = find(s, i, d, down);
  if (!found) {
    go(s, i, d, down);
    found = find(s, i, d, down);
  }
  GP_ASSERT(found && found->val >= 0, "collect on an unsolved state");
  const Entry e = *found;
  const Seq& q = st_.seqs[s];
  const int k = static_cast<int>(q.items.size());
  switch (e.how) {
    case Case::stage: {
      const int m = e.arg, p = 1 << e.plog;
      StageChoice sc;
      for (int j = i; j < m; ++j) sc.ops.insert(sc.ops.end(), q.items[j].ops.begin(), q.items[j].ops.end());
      sc.dp = p;
      sc.tps_s = stage(s, i, m, e.plog, e.size).tps;
      sc.mbs = sizes_[e.size];
      out->push_back(std::move(sc));
      if (m < k) collect(s, m, floor_cand(d - p), down, out);
      return;
    }
    case Case::nested: {
      const int c = q.items[i].seq;
      const int own_down = q.parallel ? down_of(q, i, i + 1, down) : down;
      if (i + 1 == k) return collect(c, 0, d, own_down, out);
      const int d1 = e.arg, rd = floor_cand(d - d1);
      const int rest = go(s, i + 1, rd, down);
      collect(s, i + 1, rd, down, out);
      collect(c, 0, d1, q.parallel ? own_down : rest, out);
      return;
    }
    case Case::join: {
      const JoinOption& jo = (*st_.joins_at(s, i))[e.opt];
      const auto [d1, part_down] = collect_rest(s, jo.tail_end, d, down, e.arg, out);
      return collect(jo.block, 0, d1, part_down, out);
    }
    case Case::merge: {
      StageChoice sc;
      sc.ops = merge_ops(s, i, e.arg);
      sc.dp = 1 << e.plog;
      sc.tps_s = merge_stage(s, i, e.arg, e.plog, e.size).tps;
      sc.mbs = sizes_[e.size];
      const int rd = floor_cand(d - sc.dp);
      out->push_back(std::move(sc));
      return collect(q.items[k - 1].seq, e.arg, rd, down_of(q, k - 1, k, down), out);
    }
    case Case::fork: {
      const ForkOption& fo = (*st_.forks_at(s, i))[e.opt];
      const auto [dblk, after_down] = collect_rest(s, fo.block_item + 1, d, down, e.arg, out);
      const ForkPick fp = fork_block(fo, dblk, after_down);
      const int len = static_cast<int>(st_.seqs[fo.ext].items.size());
      StageChoice sc;
      for (int j = 0; j < fp.m; ++j) {
        const auto& ops = st_.seqs[fo.ext].items[j].ops;
        sc.ops.insert(sc.ops.end(), ops.begin(), ops.end());
      }
      sc.dp = 1 << fp.plog;
      sc.tps_s = stage(fo.ext, 0, fp.m, fp.plog, fp.z).tps;
      sc.mbs = sizes_[fp.z];
      out->push_back(std::move(sc));
      if (fp.m < len) collect(fo.ext, fp.m, floor_cand(fp.d1 - (1 << fp.plog)), after_down, out);
      return collect(fo.others, 0, floor_cand(dblk - fp.d1), after_down, out);
    }
    case Case::none:
      break;
  }
  GP_ASSERT(false, "bad memo entry");
}

int SeqDp::solve(double target_tps, std::vector<StageChoice>* out) {
  ++solves_;
  target_ = target_tps;
  tmax_ = target_tps * (1 + 1e-12);
  range_ = {};
  aborted_ = false;
  solve_start_ = evals_;
  int v = go(st_.root, 0, n_, 0);
  if (budget_ == 0) max_solve_evals_ = std::max(max_solve_evals_, evals_ - solve_start_);
  if (aborted_) return -1;
  // No stage or suffix was rejected for its time: the search failed on memory alone, and a larger
  // target (which only admits more stages) fails the same way.
  if (v < 0 && range_.unbounded_above()) return -2;
  if (v >= 0 && out) {
    out->clear();
    collect(st_.root, 0, n_, 0, out);
  }
  return v;
}

bool minimise_target(const std::function<int(double, std::vector<StageChoice>*)>& solve_at, int n,
                     double tol, double upper, double guess, double* best_tps,
                     std::vector<StageChoice>* best, const std::function<bool()>& never_feasible,
                     const std::function<void(const std::vector<StageChoice>&)>& on_plan) {
  auto solve = [&](double t, std::vector<StageChoice>* out) {
    const int r = solve_at(t, out);
    if (r >= 0 && on_plan) on_plan(*out);
    return r;
  };
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
    // Steps of 1.25x: the first feasible target costs the most (the higher it is, the larger the
    // stages the DP must try), so overshooting the optimum by up to 2x was the search's largest cost.
    constexpr double kStep = 1.25;
    bool probed = false;
    for (double t = guess / n; t <= guess * 4; t *= kStep) {
      const int r = solve(t, &cur);
      if (r >= 0) {
        found = true;
        break;
      }
      if (r == -2) return false;  // infeasible at every target
      lo = t;
      // Two targets failed: maybe no plan fits memory at all. A bounded probe can prove it (and
      // save the rest of the doubling); it never changes the search's trajectory otherwise.
      if (!probed && t > guess / n * 1.5 && never_feasible) {
        probed = true;
        if (never_feasible()) return false;
      }
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

bool SeqDp::memory_never_fits() const {
  double need = 0;
  for (size_t o = 0; o < cm_.graph().num_ops(); ++o) {
    const OpId op(static_cast<int32_t>(o));
    double least = std::numeric_limits<double>::infinity();
    for (int b : sizes_)
      for (int p = 1; p <= std::min(n_, b); p *= 2)
        least = std::min(least, static_cast<double>(p) * cm_.saved_bytes(op, b / p));
    need += cm_.state_bytes(op) + least;
  }
  return need > n_ * mem_limit_ * (1 + 1e-9);
}

void SeqDp::prepare_memory(int s) {
  std::vector<double>& state = mem_state_[s];
  std::vector<double>& act = mem_act_[s];
  std::vector<double>& spine = spine_[s];
  const auto& items = st_.seqs[s].items;
  state.assign(items.size() + 1, 0);
  act.assign(items.size() + 1, 0);
  spine.assign(items.size() + 1, 0);
  for (size_t j = 0; j < items.size(); ++j) {
    double st = 0, a = 0;
    for (OpId op : items[j].ops) st += cm_.state_bytes(op), a += act_unit_[op.v];
    state[j + 1] = state[j] + st;
    act[j + 1] = act[j] + a;
    // A nested item's ops may spread over several stages: only single ops count.
    spine[j + 1] = spine[j] + (mem_bound_ && items[j].seq < 0 ? st + act_dev_[items[j].ops.front().v] : 0);
  }
  const Seq& q = st_.seqs[s];
  if (q.parallel || !std::all_of(items.begin(), items.end(), [](const Item& it) { return it.seq < 0; })) return;
  // A chain: pack it from its end into stages whose ops fit one device (greedy: no plan puts an op
  // in a stage nearer the end).
  const int k = static_cast<int>(items.size());
  std::vector<int>& stage = chain_stage_[s];
  stage.assign(k, 1);
  const double cap = mem_limit_ * (1 + 1e-9);
  double fill = 0;
  for (int j = k - 1, c = 1; j >= 0; --j) {
    const double x = spine[j + 1] - spine[j];
    if (fill > 0 && fill + x > cap) ++c, fill = 0;
    fill += x;
    stage[j] = c;
  }
  std::vector<double>& ca = chain_act_[s];
  ca.assign(k + 1, 0);
  for (int j = 0; j < k; ++j) ca[j + 1] = ca[j] + stage[j] * (act[j + 1] - act[j]);
}

bool SeqDp::rest_may_beat(int s, int j, int down, int best) {
  if (best < 0) return true;
  const int r = best - down - 2;  // the most parts a rest shallower than best - 1 can have
  if (r < 1) return false;
  if (spine_[s].empty()) prepare_memory(s);
  const std::vector<double>& sp = spine_[s];
  // A chain: the fewest stages exactly (greedy); otherwise the single ops' need over the limit.
  const bool may = !chain_stage_[s].empty() ? chain_stage_[s][j] <= r : sp.back() - sp[j] <= r * mem_limit_ * (1 + 1e-9);
  rest_pruned_ += !may;
  return may;
}

int SeqDp::first_rest_beating(int s, int j, int down, int best) {
  const int k = static_cast<int>(st_.seqs[s].items.size());
  if (best < 0) return j;
  const int r = best - down - 2;
  if (r < 1) return k;
  if (spine_[s].empty()) prepare_memory(s);
  int m = 0;
  if (const std::vector<int>& stage = chain_stage_[s]; !stage.empty()) {
    m = static_cast<int>(std::partition_point(stage.begin() + j, stage.end(), [&](int c) { return c > r; }) -
                         stage.begin());
  } else {
    const std::vector<double>& sp = spine_[s];
    const double from = sp.back() - r * mem_limit_ * (1 + 1e-9);  // the rest [m, k) must need at most r parts
    m = static_cast<int>(std::lower_bound(sp.begin() + j, sp.begin() + k, from) - sp.begin());
  }
  rest_pruned_ += m > j;
  return m;
}

void SeqDp::chain_devices(int s) {
  const int k = static_cast<int>(st_.seqs[s].items.size());
  const std::vector<double>& state = mem_state_[s];
  const std::vector<double>& act = mem_act_[s];
  const double cap = mem_limit_ * (1 + 1e-9), inf = std::numeric_limits<double>::infinity();
  const int top = std::clamp(num_micro_ - 1, 0, 16);  // c = top stands for "top or more stages after"
  const size_t w = static_cast<size_t>(top) + 1;
  // q[i * w + c]: the fewest devices for [i, k) whose first stage has c stages after it (a row per
  // item, so the loop over c runs on consecutive entries).
  std::vector<double> q((static_cast<size_t>(k) + 1) * w, inf);
  // next[m * w + c]: the rest [m, k) after a stage with c stages after it: q[m][c - 1], and for
  // c = top also q[m][top] (c = 0 is only the stage to the end, which has nothing after it).
  std::vector<double> next(q.size(), inf);
  std::vector<double> f(w);
  const size_t c0 = top == 0 ? 0 : 1;  // with top = 0, c = 0 means "0 or more stages after"
  for (int c = 0; c <= top; ++c) f[c] = std::min(c + 1, num_micro_);
  for (int i = k - 1; i >= 0; --i) {
    double* qi = &q[static_cast<size_t>(i) * w];
    for (int m = i + 1; m <= k; ++m) {
      const double st = state[m] - state[i];
      if (st >= cap) break;
      const double a = act[m] - act[i];
      if (m == k) {  // the stage to the end has nothing after it
        qi[0] = std::min(qi[0], std::max(1.0, f[0] * a / (cap - st)));
        continue;
      }
      const double* rest = &next[static_cast<size_t>(m) * w];
      for (size_t c = c0; c < w; ++c) {
        const double need = f[c] * a / (cap - st);
        qi[c] = std::min(qi[c], (need > 1.0 ? need : 1.0) + rest[c]);
      }
    }
    double* ni = &next[static_cast<size_t>(i) * w];
    for (size_t c = 1; c < w; ++c) ni[c] = qi[c - 1];
    ni[top] = top == 0 ? qi[0] : std::min(qi[top - 1], qi[top]);
  }
  std::vector<double>& out = chain_dev_[s];
  out.assign(k + 1, 0);
  for (int i = k - 1; i >= 0; --i) {
    out[i] = inf;
    for (size_t c = 0; c < w; ++c) out[i] = std::min(out[i], q[static_cast<size_t>(i) * w + c]);
    // A suffix needs at least what a shorter one does (drop its first op: no stage grows), so the
    // array is non-increasing in i even where rounding says otherwise (first_rest_fitting bisects it).
    out[i] = std::max(out[i], out[i + 1]);
  }
}

int SeqDp::first_rest_fitting(int s, int j, int d, int down) {
  if (down != 0 || !mem_bound_ || chain_stage_[s].empty()) return j;
  if (chain_dev_[s].empty()) chain_devices(s);
  const std::vector<double>& need = chain_dev_[s];  // non-increasing: a shorter suffix needs no more
  const double have = floor_cand(d) * (1 + 1e-9);
  if (need[j] <= have) return j;  // the common case: no stage end is ruled out
  const int m = static_cast<int>(
      std::partition_point(need.begin() + j, need.end() - 1, [&](double x) { return x > have; }) - need.begin());
  rest_pruned_ += m > j;
  return m;
}

void SeqDp::set_compute_cap(double cap) { cap_ = cap; }

// The least device-seconds per sample of items [i, end) of sequence s: per op the least over the
// stage sizes z and degrees p of p x its time at z / p over z (a plan may give each op any size),
// summed in the order RangeCost sums its per-size bound (with one size, the same value).
double SeqDp::work_lower_bound(int s, int i) {
  std::vector<long double>& w = work_lb_[s];
  if (w.empty()) {
    const auto& items = st_.seqs[s].items;
    w.assign(items.size() + 1, 0);
    long double acc = 0;
    for (size_t j = 0; j < items.size(); ++j) {
      for (OpId op : items[j].ops) {
        double lb = std::numeric_limits<double>::infinity();
        for (int z : sizes_)
          for (int pl = 0; (1 << pl) <= std::min(n_, z); ++pl)
            lb = std::min(lb, cm_.op_step_time(op, z >> pl) * (1 << pl) / z);
        acc += lb;
      }
      w[j + 1] = acc;
    }
  }
  return static_cast<double>(w.back() - w[i]);
}

// A stage on p devices computes at least its ops' least device-seconds per sample / p, so a plan
// of the suffix on d devices (sum of p <= d) has a stage computing at least work_lower_bound / d.
bool SeqDp::over_cap(int s, int i, int d) {
  return cap_ != std::numeric_limits<double>::infinity() && work_lower_bound(s, i) > d * cap_ * (1 + 1e-9);
}

bool SeqDp::memory_rules_out(int s, int i, int d, int down) {
  if (!mem_bound_) return false;
  if (mem_state_[s].empty()) prepare_memory(s);
  const std::vector<double>& state = mem_state_[s];
  const std::vector<double>& act = mem_act_[s];
  const double have = d * mem_limit_ * (1 + 1e-9);
  double need = state.back() - state[i] + after(0, down) * (act.back() - act[i]);
  // Every unit count is at most M: when even that fits, the finer chain count is not needed.
  const bool may_bind = state.back() - state[i] + num_micro_ * (act.back() - act[i]) > have;
  if (const std::vector<int>& stage = chain_stage_[s]; may_bind && !stage.empty()) {
    // Items [i, b) sit in stages at least M - down from the end (in-flight capped at M), the rest
    // in their greedy stage's: min(down + stage, M) units each.
    const int b = std::max(i, static_cast<int>(std::partition_point(stage.begin(), stage.end(), [&](int c) {
                                                return c >= num_micro_ - down;
                                              }) - stage.begin()));
    const std::vector<double>& ca = chain_act_[s];
    need = state.back() - state[i] + num_micro_ * (act[b] - act[i]) + (ca.back() - ca[b]) +
           down * (act.back() - act[b]);
  }
  bool out = need > have;
  if (!out && down == 0 && !chain_stage_[s].empty()) {
    if (chain_dev_[s].empty()) chain_devices(s);
    out = chain_dev_[s][i] > d * (1 + 1e-9);
  }
  mem_pruned_ += out;
  return out;
}

bool SeqDp::minimise(double tol, double upper, double* best_tps, std::vector<StageChoice>* best,
                     const std::function<void(const std::vector<StageChoice>&)>& on_plan, bool shallower) {
  if (memory_never_fits()) return false;
  const int k = static_cast<int>(st_.seqs[st_.root].items.size());
  const double guess = stage(st_.root, 0, k, 0, static_cast<int>(sizes_.size()) - 1).tps;
  const bool ok =
      minimise_target([this](double t, std::vector<StageChoice>* out) { return solve(t, out); }, n_,
                      tol, upper, guess, best_tps, best, [this] { return memory_probe(); }, on_plan);
  if (ok && on_plan && shallower) {
    // Slightly slower targets admit shallower pipelines (the DP returns the shallowest plan within
    // a target): the caller weighs their fill against their bottleneck.
    for (const auto& st : solve_down(*best_tps, {1.01, 1.02, 1.05, 1.1, 1.2}))
      if (!st.empty()) on_plan(st);
  }
  return ok;
}

std::vector<std::vector<StageChoice>> SeqDp::solve_down(double tps, std::initializer_list<double> factors) {
  std::vector<std::vector<StageChoice>> plans(factors.size());
  for (size_t j = factors.size(); j-- > 0;) solve(tps * factors.begin()[j], &plans[j]);  // filled when feasible
  return plans;
}

int SeqDp::solve_within(double target_tps, size_t budget) {
  budget_ = budget;
  const int v = solve(target_tps, nullptr);
  budget_ = 0;
  return aborted_ ? kOutOfBudget : v;
}

bool SeqDp::memory_probe() {
  // An infinite target with a work budget of 4x the largest solve so far: without the target's
  // pruning it can be far larger than a bounded solve when memory does not bind, so give up then.
  budget_ = probe_budget_ > 0 ? probe_budget_ : std::max<size_t>(4 * max_solve_evals_, 100000);
  const int v = solve(std::numeric_limits<double>::infinity(), nullptr);
  budget_ = 0;
  ++probes_;
  if (aborted_) ++probes_aborted_;
  return !aborted_ && v < 0;
}

namespace {

// The per-stage-size DP after the one-size search at m found its optimum `*tps` (`ok`).
bool mixed_sizes(SeqDp& mixed, bool ok, double tol, double* tps,
                 const std::function<void(const std::vector<StageChoice>&)>& on_plan) {
  std::vector<StageChoice> st;
  if (ok) {
    // The shallower plans first (solve_down: the answers at larger targets bound those at smaller
    // ones), then whether a smaller size lets some stage fit below the optimum.
    const auto plans = mixed.solve_down(*tps, {1.0, 1.01, 1.02, 1.05, 1.1, 1.2});
    if (mixed.solve(*tps * (1 - 2 * tol), &st) < 0) {
      for (const auto& p : plans)
        if (!p.empty()) on_plan(p);
      return true;
    }
  }
  double t = 0;
  if (!mixed.minimise(tol, ok ? *tps : 0, &t, &st, on_plan)) return ok;
  *tps = ok ? std::min(*tps, t) : t;
  return true;
}

void add_stats(const SeqDp& dp, SearchStats* stats) {
  if (!stats) return;
  stats->states += dp.states_explored();
  stats->solves += dp.solves();
  stats->evals += dp.evals();
  stats->memory_pruned += dp.memory_pruned();
  stats->target_bounds += dp.target_bounds();
  stats->ceiling_misses += dp.ceiling_misses();
}

}  // namespace

bool size_may_beat(const cost::CostModel& cm, const Structure& st, const SizeSearch& ss, double cap, size_t budget,
                   SearchStats* stats) {
  const StageSizes sizes = ss.size_spread > 0 && ss.micro_batch > 1 ? StageSizes::window(ss.micro_batch, ss.size_spread)
                                                                    : StageSizes::uniform(ss.micro_batch);
  SeqDp dp(cm, st, sizes, ss.mini_batch, ss.memory_limit, ss.num_devices, ss.same_node);
  if (dp.memory_never_fits()) return false;
  dp.set_compute_cap(cap);
  const int v = dp.solve_within(std::numeric_limits<double>::infinity(), budget);
  add_stats(dp, stats);
  return v >= 0 || v == SeqDp::kOutOfBudget;  // no proof within the budget: search the size
}

bool search_size(const cost::CostModel& cm, const Structure& st, const SizeSearch& ss, double* tps,
                 const std::function<void(const std::vector<StageChoice>&)>& on_plan, SearchStats* stats) {
  SeqDp dp(cm, st, ss.micro_batch, ss.mini_batch, ss.memory_limit, ss.num_devices, ss.same_node);
  std::vector<StageChoice> best;
  // With per-stage sizes the shallower plans above the optimum come from the mixed DP (its space
  // holds the one-size plans; at each target it returns the shallowest).
  const bool mixed_after = ss.size_spread > 0 && ss.micro_batch > 1;
  const bool ok = dp.minimise(ss.tol, 0, tps, &best, on_plan, !mixed_after);
  add_stats(dp, stats);
  if (!mixed_after) return ok;
  SeqDp mixed(cm, st, StageSizes::window(ss.micro_batch, ss.size_spread), ss.mini_batch, ss.memory_limit,
              ss.num_devices, ss.same_node);
  const bool r = mixed_sizes(mixed, ok, ss.tol, tps, on_plan);
  add_stats(mixed, stats);
  return r;
}

}  // namespace gp::planner::detail
