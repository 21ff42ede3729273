// Test helpers for gp_graph: small graph builders (grid, DenseNet-like block, random DAGs) and
// brute-force oracles (closure, induced N, optimal SP-ization) to check the fast algorithms against.
#pragma once
#include <algorithm>
#include <bit>
#include <cstdint>
#include <functional>
#include <numeric>
#include <random>
#include <unordered_map>
#include <utility>
#include <vector>

#include "graph/dag.h"
#include "graph/series_parallel.h"

namespace gp::graph::testing {

inline Dag make_dag(int n, std::initializer_list<std::pair<int, int>> edges) {
  Dag g(n);
  for (auto [u, v] : edges) g.add_edge(u, v);
  return g;
}

/// rows x cols grid, node r*cols+c, edges right and down.
inline Dag grid_dag(int rows, int cols) {
  Dag g(rows * cols);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) {
      if (c + 1 < cols) g.add_edge(r * cols + c, r * cols + c + 1);
      if (r + 1 < rows) g.add_edge(r * cols + c, (r + 1) * cols + c);
    }
  return g;
}

/// A DenseNet dense block of `layers` layers: feature f0 (the input, node 0); layer k normalises
/// every earlier feature separately (per-chunk BN-ReLU, as memory-efficient DenseNet does), and its
/// conv reads all of those, producing feature f_k; a final concat reads every feature.
inline Dag densenet_block(int layers) {
  Dag g(1);
  std::vector<int> features{0};
  for (int k = 1; k <= layers; ++k) {
    std::vector<int> norms;
    for (int f : features) {
      int n = g.add_node();
      g.add_edge(f, n);
      norms.push_back(n);
    }
    int conv = g.add_node();
    for (int n : norms) g.add_edge(n, conv);
    features.push_back(conv);
  }
  int concat = g.add_node();
  for (int f : features) g.add_edge(f, concat);
  return g;
}

/// Random DAG: each pair i<j (in a hidden random order) gets an edge with probability p.
inline Dag random_dag(int n, double p, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int> label(n);
  std::iota(label.begin(), label.end(), 0);
  std::shuffle(label.begin(), label.end(), rng);
  std::bernoulli_distribution edge(p);
  Dag g(n);
  for (int i = 0; i < n; ++i)
    for (int j = i + 1; j < n; ++j)
      if (edge(rng)) g.add_edge(label[i], label[j]);
  return g;
}

/// closure[u][v]: v reachable from u (u included), by DFS, independent of Reachability.
inline std::vector<std::vector<bool>> closure(const Dag& g) {
  std::vector<std::vector<bool>> out(g.size(), std::vector<bool>(g.size(), false));
  for (int u = 0; u < g.size(); ++u) {
    std::vector<int> stack{u};
    out[u][u] = true;
    while (!stack.empty()) {
      int x = stack.back();
      stack.pop_back();
      for (int y : g.succs(x))
        if (!out[u][y]) {
          out[u][y] = true;
          stack.push_back(y);
        }
    }
  }
  return out;
}

/// Does the order contain an induced N (a<c, b<c, b<d; a||b, a||d, c||d)? O(n^4).
inline bool has_induced_n(const Dag& g) {
  auto r = closure(g);
  const int n = g.size();
  auto ind = [&](int x, int y) { return x != y && !r[x][y] && !r[y][x]; };
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b)
      for (int c = 0; c < n; ++c)
        for (int d = 0; d < n; ++d)
          if (a != c && b != c && b != d && r[a][c] && r[b][c] && r[b][d] && ind(a, b) && ind(a, d) && ind(c, d))
            return true;
  return false;
}

/// Maximum number of independent pairs any SP supergraph of g keeps (exhaustive over downsets,
/// memoised on node bitmasks; fine up to ~14 nodes). The root of an SP-ization of a connected set
/// is a series cut Down;Up with Down a downset; a disconnected set is best kept parallel.
inline int64_t optimal_kept_pairs(const Dag& g) {
  const int n = g.size();
  auto r = closure(g);
  std::vector<uint32_t> anc(n, 0), cmp(n, 0);
  for (int u = 0; u < n; ++u)
    for (int v = 0; v < n; ++v)
      if (r[v][u]) {
        anc[u] |= 1u << v;
        cmp[u] |= 1u << v;
        cmp[v] |= 1u << u;
      }
  std::unordered_map<uint32_t, int64_t> memo;
  std::function<int64_t(uint32_t)> opt = [&](uint32_t mask) -> int64_t {
    if (std::popcount(mask) <= 1) return 0;
    if (auto it = memo.find(mask); it != memo.end()) return it->second;
    // Comparability component of the lowest node.
    uint32_t comp = mask & -mask, frontier = comp;
    while (frontier) {
      int u = std::countr_zero(frontier);
      frontier &= frontier - 1;
      uint32_t add = cmp[u] & mask & ~comp;
      comp |= add;
      frontier |= add;
    }
    int64_t best = 0;
    if (comp != mask) {
      uint32_t rest = mask & ~comp;
      best = opt(comp) + opt(rest) + int64_t{std::popcount(comp)} * std::popcount(rest);
    } else {
      for (uint32_t down = (mask - 1) & mask; down; down = (down - 1) & mask) {
        bool is_downset = true;
        for (uint32_t b = down; b && is_downset; b &= b - 1)
          is_downset = (anc[std::countr_zero(b)] & mask & ~down) == 0;
        if (is_downset) best = std::max(best, opt(down) + opt(mask & ~down));
      }
    }
    memo[mask] = best;
    return best;
  };
  return opt(n == 32 ? ~0u : (1u << n) - 1);
}

/// The DAG a tree describes: series children i -> i+1, all leaves to all leaves.
inline Dag dag_from_tree(const SpTree& t, int n) {
  Dag g(n);
  for (const SpNode& node : t.nodes)
    if (node.kind == SpNode::Kind::series)
      for (size_t i = 0; i + 1 < node.children.size(); ++i)
        for (int u : t.leaves(node.children[i]))
          for (int v : t.leaves(node.children[i + 1])) g.add_edge(u, v);
  return g;
}

}  // namespace gp::graph::testing
