#include "graph/subset.h"

#include <algorithm>
#include <bit>

#include "support/error.h"

namespace gp::graph::detail {

void SubsetIndex::enter(const std::vector<int>& nodes) {
  for (int i = 0; i < static_cast<int>(nodes.size()); ++i) local_[nodes[i]] = i;
}

void SubsetIndex::leave(const std::vector<int>& nodes) {
  for (int u : nodes) local_[u] = -1;
}

std::vector<std::vector<int>> subset_components(const Dag& g, const SubsetIndex& idx,
                                                const std::vector<int>& nodes) {
  std::vector<int> sorted = nodes;
  std::sort(sorted.begin(), sorted.end());
  std::vector<char> seen(nodes.size(), 0);
  std::vector<std::vector<int>> comps;
  for (int root : sorted) {
    if (seen[idx[root]]) continue;
    seen[idx[root]] = 1;
    std::vector<int> comp{root};
    for (size_t qi = 0; qi < comp.size(); ++qi) {
      int u = comp[qi];
      for (const auto* adj : {&g.succs(u), &g.preds(u)})
        for (int v : *adj)
          if (idx.contains(v) && !seen[idx[v]]) {
            seen[idx[v]] = 1;
            comp.push_back(v);
          }
    }
    std::sort(comp.begin(), comp.end());
    comps.push_back(std::move(comp));
  }
  return comps;
}

std::vector<int> subset_topo_order(const Dag& g, const SubsetIndex& idx,
                                   const std::vector<int>& nodes) {
  std::vector<int> indeg(nodes.size(), 0);
  std::vector<int> order;
  order.reserve(nodes.size());
  for (int u : nodes) {
    for (int p : g.preds(u))
      if (idx.contains(p)) ++indeg[idx[u]];
    if (indeg[idx[u]] == 0) order.push_back(u);
  }
  for (size_t qi = 0; qi < order.size(); ++qi)
    for (int v : g.succs(order[qi]))
      if (idx.contains(v) && --indeg[idx[v]] == 0) order.push_back(v);
  GP_ASSERT(order.size() == nodes.size(), "subset of {} nodes has a cycle", nodes.size());
  return order;
}

std::vector<std::vector<int>> series_blocks(const Dag& g, const SubsetIndex& idx,
                                            const std::vector<int>& order) {
  // Sweep the cut through the topological order. P = sinks of the prefix, Q = sources of the
  // suffix. Every prefix node reaches some node of P and every suffix node is reached from some
  // node of Q, and a path from p in P to q in Q must be the single edge p->q (the node after p is
  // in the suffix, and q has no suffix predecessor). So the cut is valid iff the number of P->Q
  // edges, `cross`, equals |P|*|Q|. Each node enters/leaves P and Q once, each time scanning its
  // edges: O(|S| + edges) overall.
  const int k = static_cast<int>(order.size());
  std::vector<int> rem_preds(k, 0);  // predecessors still in the suffix
  std::vector<char> in_p(k, 0), in_q(k, 0);
  int64_t p_size = 0, q_size = 0, cross = 0;
  for (int u : order) {
    for (int p : g.preds(u))
      if (idx.contains(p)) ++rem_preds[idx[u]];
    if (rem_preds[idx[u]] == 0) {
      in_q[idx[u]] = 1;
      ++q_size;
    }
  }
  auto count_in = [&](const std::vector<int>& adj, const std::vector<char>& set) {
    int64_t c = 0;
    for (int v : adj)
      if (idx.contains(v) && set[idx[v]]) ++c;
    return c;
  };
  std::vector<std::vector<int>> blocks(1);
  for (int i = 0; i < k; ++i) {
    const int x = order[i];
    blocks.back().push_back(x);
    if (i == k - 1) break;
    // x moves from the suffix (where it is a source) to the prefix (where it is a sink).
    GP_ASSERT(in_q[idx[x]], "node {} is not a source of the suffix", x);
    in_q[idx[x]] = 0;
    --q_size;
    cross -= count_in(g.preds(x), in_p);
    for (int p : g.preds(x))
      if (idx.contains(p) && in_p[idx[p]]) {
        in_p[idx[p]] = 0;
        --p_size;
        cross -= count_in(g.succs(p), in_q);
      }
    in_p[idx[x]] = 1;
    ++p_size;  // x's successors all still have x as a suffix predecessor: none is in Q yet
    for (int q : g.succs(x))
      if (idx.contains(q) && --rem_preds[idx[q]] == 0) {
        in_q[idx[q]] = 1;
        ++q_size;
        cross += count_in(g.preds(q), in_p);
      }
    if (cross == p_size * q_size) blocks.emplace_back();
  }
  return blocks;
}

SubsetClosure::SubsetClosure(const Dag& g, const SubsetIndex& idx, const std::vector<int>& order)
    : k_(static_cast<int>(order.size())), words_((order.size() + 63) / 64) {
  desc_.assign(words_ * k_, 0);
  anc_.assign(words_ * k_, 0);
  for (int i = k_ - 1; i >= 0; --i) {
    GP_ASSERT(idx[order[i]] == i, "SubsetClosure: subset not entered in topological order");
    uint64_t* row = desc_.data() + words_ * i;
    row[i / 64] |= uint64_t{1} << (i % 64);
    for (int v : g.succs(order[i]))
      if (idx.contains(v)) {
        const uint64_t* s = desc(idx[v]);
        for (size_t w = 0; w < words_; ++w) row[w] |= s[w];
      }
  }
  for (int i = 0; i < k_; ++i) {
    uint64_t* row = anc_.data() + words_ * i;
    row[i / 64] |= uint64_t{1} << (i % 64);
    for (int p : g.preds(order[i]))
      if (idx.contains(p)) {
        const uint64_t* s = anc(idx[p]);
        for (size_t w = 0; w < words_; ++w) row[w] |= s[w];
      }
  }
}

int SubsetClosure::desc_count(int i) const {
  int c = 0;
  for (size_t w = 0; w < words_; ++w) c += std::popcount(desc(i)[w]);
  return c;
}

int SubsetClosure::anc_count(int i) const {
  int c = 0;
  for (size_t w = 0; w < words_; ++w) c += std::popcount(anc(i)[w]);
  return c;
}

}  // namespace gp::graph::detail
