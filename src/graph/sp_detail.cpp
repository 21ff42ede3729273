#include "graph/sp_detail.h"

#include <algorithm>

#include "support/error.h"

namespace gp::graph::detail {

Part whole_graph(const Dag& g) {
  auto order = topo_order(g);
  GP_ASSERT(order.has_value(), "whole_graph needs an acyclic graph");
  return Part{induced_subgraph(g, *order), *order};
}

Part sub_part(const Part& part, const std::vector<int>& local_nodes) {
  Part out{induced_subgraph(part.dag, local_nodes), {}};
  out.ids.reserve(local_nodes.size());
  for (int u : local_nodes) out.ids.push_back(part.ids[u]);
  return out;
}

std::vector<std::vector<int>> parallel_parts(const Part& part) {
  int count = 0;
  const std::vector<int> comp = weak_components(part.dag, &count);
  std::vector<std::vector<int>> parts(count);
  for (int u = 0; u < part.dag.size(); ++u) parts[comp[u]].push_back(u);
  auto min_id = [&](const std::vector<int>& p) {
    int m = part.ids[p[0]];
    for (int u : p) m = std::min(m, part.ids[u]);
    return m;
  };
  std::sort(parts.begin(), parts.end(), [&](const auto& a, const auto& b) { return min_id(a) < min_id(b); });
  return parts;
}

std::vector<std::vector<int>> series_blocks(const Dag& g) {
  // Sweep the cut through the topological numbering. P = sinks of the prefix, Q = sources of the
  // suffix. Every prefix node reaches some node of P and every suffix node is reached from some
  // node of Q, and a path from p in P to q in Q must be the single edge p->q (the node after p is
  // in the suffix, and q has no suffix predecessor). So the cut is valid iff the number of P->Q
  // edges, `cross`, equals |P|*|Q|. Each node enters/leaves P and Q once, each time scanning its
  // edges: O(n + m) overall.
  const int k = g.size();
  std::vector<int> rem_preds(k);  // predecessors still in the suffix
  std::vector<char> in_p(k, 0), in_q(k, 0);
  int64_t p_size = 0, q_size = 0, cross = 0;
  for (int u = 0; u < k; ++u) {
    rem_preds[u] = static_cast<int>(g.preds(u).size());
    if (rem_preds[u] == 0) {
      in_q[u] = 1;
      ++q_size;
    }
  }
  auto count_in = [](const std::vector<int>& adj, const std::vector<char>& set) {
    int64_t c = 0;
    for (int v : adj) c += set[v];
    return c;
  };
  std::vector<std::vector<int>> blocks(1);
  for (int x = 0; x < k; ++x) {
    blocks.back().push_back(x);
    if (x == k - 1) break;
    // x moves from the suffix (where it is a source) to the prefix (where it is a sink).
    GP_ASSERT(in_q[x], "node {} is not a source of the suffix: graph not topologically numbered", x);
    in_q[x] = 0;
    --q_size;
    cross -= count_in(g.preds(x), in_p);
    for (int p : g.preds(x))
      if (in_p[p]) {
        in_p[p] = 0;
        --p_size;
        cross -= count_in(g.succs(p), in_q);
      }
    in_p[x] = 1;
    ++p_size;  // x's successors all still have x as a suffix predecessor: none is in Q yet
    for (int q : g.succs(x))
      if (--rem_preds[q] == 0) {
        in_q[q] = 1;
        ++q_size;
        cross += count_in(g.preds(q), in_p);
      }
    if (cross == p_size * q_size) blocks.emplace_back();
  }
  return blocks;
}

}  // namespace gp::graph::detail
