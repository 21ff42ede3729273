// The series-parallel structure of the op graph as the DP's sequences (sp_structure.h).
#include "planner/sp_structure.h"

#include <algorithm>
#include <functional>
#include <string>
#include <unordered_map>
#include <utility>

#include "graph/series_parallel.h"
#include "plan/plan.h"

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
  return fmt::format("{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}", cm.signature(op), cm.state_bytes(op), c.params, c.param_bytes,
                     c.fwd_flops, c.bwd_flops, c.input_bytes, c.weight_read_bytes, c.output_bytes, c.saved_bytes,
                     cm.graph().preds(op).size());
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

}  // namespace gp::planner::detail
