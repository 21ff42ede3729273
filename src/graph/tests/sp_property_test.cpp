// Property tests (rapidcheck): random SP graphs decompose into a canonical tree with the same
// closure; sp_decompose agrees with a brute-force N search; sp_ize only adds ordering and always
// yields an SP graph; the DAG algorithms agree with brute-force definitions.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include "graph/series_parallel.h"
#include "graph/tests/graph_test_util.h"

namespace gp::graph {
namespace {

using testing::closure;

// Builds a random SP graph: start from n singletons and repeatedly compose two fragments in series
// (all sinks of the first -> all sources of the second, plus a random transitive shortcut) or in
// parallel, then relabel the nodes by a random permutation.
Dag random_sp_graph(int n, const std::vector<uint32_t>& choices, uint32_t perm_seed) {
  struct Fragment {
    std::vector<int> nodes, sources, sinks;
  };
  std::vector<Fragment> frags;
  for (int i = 0; i < n; ++i) frags.push_back({{i}, {i}, {i}});
  Dag g(n);
  size_t next = 0;
  auto choice = [&] { return next < choices.size() ? choices[next++] : 0u; };
  while (frags.size() > 1) {
    const uint32_t f = static_cast<uint32_t>(frags.size());
    uint32_t i = choice() % f, j = choice() % (f - 1);
    if (j >= i) ++j;
    const uint32_t kind = choice();
    Fragment a = frags[i], b = frags[j];
    Fragment merged;
    merged.nodes = a.nodes;
    merged.nodes.insert(merged.nodes.end(), b.nodes.begin(), b.nodes.end());
    if (kind % 2 == 0) {
      for (int s : a.sinks)
        for (int t : b.sources) g.add_edge(s, t);
      if (kind % 4 == 0)  // a shortcut implied by transitivity
        g.add_edge(a.nodes[kind / 4 % a.nodes.size()], b.nodes[kind / 8 % b.nodes.size()]);
      merged.sources = a.sources;
      merged.sinks = b.sinks;
    } else {
      merged.sources = a.sources;
      merged.sources.insert(merged.sources.end(), b.sources.begin(), b.sources.end());
      merged.sinks = a.sinks;
      merged.sinks.insert(merged.sinks.end(), b.sinks.begin(), b.sinks.end());
    }
    frags.erase(frags.begin() + std::max(i, j));
    frags.erase(frags.begin() + std::min(i, j));
    frags.push_back(std::move(merged));
  }
  std::vector<int> perm(n);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(perm_seed));
  Dag out(n);
  for (int u = 0; u < n; ++u)
    for (int v : g.succs(u)) out.add_edge(perm[u], perm[v]);
  return out;
}

void check_canonical(const SpTree& t, int n) {
  RC_ASSERT(t.root >= 0);
  RC_ASSERT(t.leaves(t.root).size() == static_cast<size_t>(n));
  std::vector<int> all(n);
  std::iota(all.begin(), all.end(), 0);
  RC_ASSERT(t.leaves(t.root) == all);  // every node exactly once
  for (const SpNode& node : t.nodes) {
    if (node.kind == SpNode::Kind::leaf) {
      RC_ASSERT(node.children.empty());
      continue;
    }
    RC_ASSERT(node.children.size() >= 2u);
    for (int c : node.children) RC_ASSERT(t.nodes[c].kind != node.kind);
  }
}

RC_GTEST_PROP(SpProperty, RandomSpGraphsDecomposeWithTheSameClosure, ()) {
  const int n = *rc::gen::inRange(1, 40);
  const auto choices = *rc::gen::container<std::vector<uint32_t>>(3 * n, rc::gen::arbitrary<uint32_t>());
  const Dag g = random_sp_graph(n, choices, *rc::gen::arbitrary<uint32_t>());
  const SpResult r = sp_decompose(g);
  RC_ASSERT(r.tree.has_value());
  check_canonical(*r.tree, n);
  RC_ASSERT(closure(testing::dag_from_tree(*r.tree, n)) == closure(g));
  RC_ASSERT(sp_ize(g) == g);
}

RC_GTEST_PROP(SpProperty, DecomposeSucceedsIffNoInducedN, ()) {
  const int n = *rc::gen::inRange(1, 9);
  const Dag g = testing::random_dag(n, *rc::gen::inRange(0, 101) / 100.0, *rc::gen::arbitrary<uint32_t>());
  const SpResult r = sp_decompose(g);
  RC_ASSERT(r.tree.has_value() == !testing::has_induced_n(g));
  if (r.tree) {
    check_canonical(*r.tree, n);
    RC_ASSERT(closure(testing::dag_from_tree(*r.tree, n)) == closure(g));
  } else {
    RC_ASSERT(r.failure.find("N-shaped") != std::string::npos);
  }
}

RC_GTEST_PROP(SpProperty, SpIzeOnlyAddsOrderingAndIsSp, ()) {
  const int n = *rc::gen::inRange(1, 60);
  const Dag g = testing::random_dag(n, *rc::gen::inRange(0, 41) / 100.0, *rc::gen::arbitrary<uint32_t>());
  const Dag h = sp_ize(g);
  RC_ASSERT(h.size() == g.size());
  for (int u = 0; u < n; ++u)
    for (int v : g.succs(u)) RC_ASSERT(h.has_edge(u, v));  // supergraph
  RC_ASSERT(topo_order(h).has_value());
  const auto before = closure(g), after = closure(h);
  for (int u = 0; u < n; ++u)
    for (int v = 0; v < n; ++v)
      if (before[u][v]) RC_ASSERT(after[u][v]);  // every original ordering kept
  const SpResult r = sp_decompose(h);
  RC_ASSERT(r.tree.has_value());
  check_canonical(*r.tree, n);
  RC_ASSERT(independent_pairs(h) <= independent_pairs(g));
  if (sp_decompose(g).tree) RC_ASSERT(h == g);
  if (n <= 12) RC_ASSERT(independent_pairs(h) <= testing::optimal_kept_pairs(g));
}

RC_GTEST_PROP(DagProperty, AlgorithmsMatchDefinitions, ()) {
  const int n = *rc::gen::inRange(1, 25);
  const Dag g = testing::random_dag(n, *rc::gen::inRange(0, 51) / 100.0, *rc::gen::arbitrary<uint32_t>());
  const auto r = closure(g);
  const Reachability reach(g);
  for (int u = 0; u < n; ++u)
    for (int v = 0; v < n; ++v) RC_ASSERT(reach.reaches(u, v) == r[u][v]);

  // Transitive reduction: same closure, a subgraph, and no edge implied by a longer path.
  const Dag tr = transitive_reduction(g);
  RC_ASSERT(closure(tr) == r);
  for (int u = 0; u < n; ++u)
    for (int v : tr.succs(u)) {
      RC_ASSERT(g.has_edge(u, v));
      for (int w : tr.succs(u)) RC_ASSERT(w == v || !r[w][v]);
    }

  // Convexity of a random subset against its definition.
  const auto mask = *rc::gen::container<std::vector<bool>>(n, rc::gen::arbitrary<bool>());
  std::vector<int> set;
  for (int u = 0; u < n; ++u)
    if (mask[u]) set.push_back(u);
  bool convex = true;
  for (int a : set)
    for (int b : set)
      for (int w = 0; w < n; ++w)
        if (!mask[w] && r[a][w] && r[w][b]) convex = false;
  RC_ASSERT(is_convex(g, set) == convex);

  // Dominators from node 0: d dominates v iff v is unreachable from 0 once d is removed.
  auto reachable_without = [&](int removed) {
    std::vector<bool> seen(n, false);
    if (removed == 0) return seen;
    std::vector<int> stack{0};
    seen[0] = true;
    while (!stack.empty()) {
      int x = stack.back();
      stack.pop_back();
      for (int y : g.succs(x))
        if (y != removed && !seen[y]) {
          seen[y] = true;
          stack.push_back(y);
        }
    }
    return seen;
  };
  const std::vector<int> idom = dominators(g, 0);
  std::vector<std::vector<bool>> dominates(n);  // dominates[d][v]
  for (int d = 0; d < n; ++d) {
    auto seen = reachable_without(d);
    dominates[d].resize(n);
    for (int v = 0; v < n; ++v) dominates[d][v] = r[0][v] && (v == d || !seen[v]);
  }
  for (int v = 0; v < n; ++v) {
    if (!r[0][v]) {
      RC_ASSERT(idom[v] == -1);
      continue;
    }
    if (v == 0) {
      RC_ASSERT(idom[v] == 0);
      continue;
    }
    // The immediate dominator: a strict dominator that every other strict dominator dominates.
    const int d = idom[v];
    RC_ASSERT(d >= 0 && d != v && dominates[d][v]);
    for (int e = 0; e < n; ++e)
      if (e != v && dominates[e][v]) RC_ASSERT(dominates[e][d]);
  }
}

}  // namespace
}  // namespace gp::graph
