// SP-ization: make a DAG node-series-parallel by adding ordering edges, losing as few independent
// node pairs as we can.
//
// Method. Any SP order on a node set S is either a parallel composition (then S's weak components
// are already independent) or a series composition Down;Up, where Down is a downset of S (closed
// under predecessors) and every node of Down precedes every node of Up. So we recurse exactly like
// sp_decompose: split S into weak components (parallel) or at its natural series cuts (series)
// when it has them. A prime S (connected, no natural cut) has to be cut: we pick a downset Down,
// add edges sinks(Down) -> sources(Up), and recurse on Down and Up. S is a module of the order
// (every outside node relates to all of S alike), so the new edges only order pairs inside S, and
// the pairs lost are exactly the independent pairs (d, u) with d in Down and u in Up:
//     lost(Down) = |Down|*|Up| - #{comparable pairs d < u}.
// Choosing Down: every prefix of a topological order is a downset, and along an order
//     cross(i+1) = cross(i) + (desc(t_i) - 1) - (anc(t_i) - 1)
// (counts within S), so all prefixes of one order are scored in O(|S|). We score the prefixes of
// six orders (plain Kahn; by depth; by height; by desc-anc; by fewest ancestors; by most
// descendants), take the best, then hill-climb by moving single nodes across the cut (a minimal
// node of Up into Down or a maximal node of Down into Up) while that lowers lost(Down). Greedy per
// cut, so not optimal in general, but exact on the small cases in the tests.
#include <algorithm>
#include <cstdlib>
#include <functional>
#include <queue>

#include "graph/series_parallel.h"
#include "graph/subset.h"
#include "support/error.h"

namespace gp::graph {
namespace {

using detail::SubsetClosure;
using detail::SubsetIndex;

struct Cut {
  std::vector<char> in_down;  // by position in the subset's topological order
  int64_t lost = 0;
};

// Kahn's algorithm on the subset (positions 0..k-1 of `order`), smallest key first.
std::vector<int> keyed_order(const Dag& g, const SubsetIndex& idx, const std::vector<int>& order,
                             const std::function<int64_t(int)>& key) {
  const int k = static_cast<int>(order.size());
  std::vector<int> indeg(k, 0), out;
  using Entry = std::pair<int64_t, int>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> ready;
  for (int i = 0; i < k; ++i) {
    for (int p : g.preds(order[i]))
      if (idx.contains(p)) ++indeg[i];
    if (indeg[i] == 0) ready.push({key(i), i});
  }
  while (!ready.empty()) {
    int i = ready.top().second;
    ready.pop();
    out.push_back(i);
    for (int v : g.succs(order[i]))
      if (idx.contains(v) && --indeg[idx[v]] == 0) ready.push({key(idx[v]), idx[v]});
  }
  return out;
}

// The subset must be entered as idx.enter(order) with `order` topological.
Cut choose_cut(const Dag& g, const SubsetIndex& idx, const std::vector<int>& order) {
  const int k = static_cast<int>(order.size());
  const SubsetClosure cl(g, idx, order);
  std::vector<int64_t> desc(k), anc(k), depth(k, 0), height(k, 0);
  for (int i = 0; i < k; ++i) {
    desc[i] = cl.desc_count(i);
    anc[i] = cl.anc_count(i);
    for (int p : g.preds(order[i]))
      if (idx.contains(p)) depth[i] = std::max(depth[i], depth[idx[p]] + 1);
  }
  for (int i = k - 1; i >= 0; --i)
    for (int s : g.succs(order[i]))
      if (idx.contains(s)) height[i] = std::max(height[i], height[idx[s]] + 1);

  const std::vector<std::function<int64_t(int)>> keys = {
      [](int i) { return i; },
      [&](int i) { return depth[i]; },
      [&](int i) { return -height[i]; },
      [&](int i) { return anc[i] - desc[i]; },
      [&](int i) { return anc[i]; },
      [&](int i) { return -desc[i]; },
  };
  int64_t best_lost = -1, best_balance = 0;
  std::vector<int> best_order;
  int best_prefix = 0;
  for (const auto& key : keys) {
    const std::vector<int> ord = keyed_order(g, idx, order, key);
    int64_t cross = 0;
    for (int i = 0; i + 1 < k; ++i) {
      cross += (desc[ord[i]] - 1) - (anc[ord[i]] - 1);
      const int64_t down = i + 1, up = k - down;
      const int64_t lost = down * up - cross, balance = std::abs(down - up);
      if (best_lost < 0 || lost < best_lost || (lost == best_lost && balance < best_balance)) {
        best_lost = lost;
        best_balance = balance;
        best_order = ord;
        best_prefix = i + 1;
      }
    }
  }
  Cut cut{std::vector<char>(k, 0), best_lost};
  for (int i = 0; i < best_prefix; ++i) cut.in_down[best_order[i]] = 1;

  // Hill-climb. For x minimal in Up, moving it down changes lost by
  //   +(|Up| - desc(x)) [new pairs with Up]  -(|Down| - anc(x) + 1) [pairs with Down gone];
  // symmetrically for x maximal in Down.
  // up_preds[i] / down_succs[i]: predecessors of i in Up / successors of i in Down, for every i.
  std::vector<int> up_preds(k, 0), down_succs(k, 0);
  int64_t n_down = best_prefix, n_up = k - best_prefix;
  for (int i = 0; i < k; ++i)
    for (int s : g.succs(order[i]))
      if (idx.contains(s)) {
        if (cut.in_down[idx[s]]) ++down_succs[i];
        if (!cut.in_down[i]) ++up_preds[idx[s]];
      }
  for (int step = 0; step < 4 * k; ++step) {
    int64_t best_delta = 0;
    int best_x = -1;
    for (int x = 0; x < k; ++x) {
      int64_t delta;
      if (!cut.in_down[x] && up_preds[x] == 0 && n_up > 1)
        delta = n_up - desc[x] - n_down + anc[x] - 1;
      else if (cut.in_down[x] && down_succs[x] == 0 && n_down > 1)
        delta = n_down - anc[x] - n_up + desc[x] - 1;
      else
        continue;
      if (delta < best_delta) {
        best_delta = delta;
        best_x = x;
      }
    }
    if (best_x < 0) break;
    const bool to_down = !cut.in_down[best_x];
    cut.in_down[best_x] = to_down;
    n_down += to_down ? 1 : -1;
    n_up -= to_down ? 1 : -1;
    cut.lost += best_delta;
    for (int s : g.succs(order[best_x]))
      if (idx.contains(s)) up_preds[idx[s]] += to_down ? -1 : 1;
    for (int p : g.preds(order[best_x]))
      if (idx.contains(p)) down_succs[idx[p]] += to_down ? 1 : -1;
  }
  GP_ASSERT(cut.lost > 0, "a prime block must lose at least one pair, got {}", cut.lost);
  return cut;
}

}  // namespace

Dag sp_ize(const Dag& g) {
  GP_CHECK(topo_order(g).has_value(), "cannot make a cyclic graph series-parallel: cycle {}",
           describe_cycle(find_cycle(g)));
  Dag h = g;
  SubsetIndex idx(g.size());
  std::vector<std::vector<int>> work(1);
  for (int u = 0; u < g.size(); ++u) work[0].push_back(u);
  while (!work.empty()) {
    std::vector<int> nodes = std::move(work.back());
    work.pop_back();
    if (nodes.size() <= 1) continue;
    idx.enter(nodes);
    auto parts = detail::subset_components(h, idx, nodes);
    if (parts.size() == 1) {
      const std::vector<int> order = detail::subset_topo_order(h, idx, nodes);
      parts = detail::series_blocks(h, idx, order);
      if (parts.size() == 1) {
        idx.leave(nodes);
        idx.enter(order);
        const Cut cut = choose_cut(h, idx, order);
        const int k = static_cast<int>(order.size());
        std::vector<int> down, up, down_sinks, up_sources;
        for (int i = 0; i < k; ++i) {
          const bool d = cut.in_down[i];
          (d ? down : up).push_back(order[i]);
          bool boundary = true;  // no successor in Down (for Down) / predecessor in Up (for Up)
          for (int v : d ? h.succs(order[i]) : h.preds(order[i]))
            if (idx.contains(v) && cut.in_down[idx[v]] == d) boundary = false;
          if (boundary) (d ? down_sinks : up_sources).push_back(order[i]);
        }
        for (int s : down_sinks)
          for (int t : up_sources) h.add_edge(s, t);
        parts = {std::move(down), std::move(up)};
        nodes = order;
      }
    }
    idx.leave(nodes);
    for (auto& part : parts) work.push_back(std::move(part));
  }
  return h;
}

int64_t independent_pairs(const Dag& g) {
  GP_CHECK(topo_order(g).has_value(), "independent_pairs needs an acyclic graph: cycle {}",
           describe_cycle(find_cycle(g)));
  const Reachability reach(g);
  const int64_t n = g.size();
  int64_t comparable = 0;
  for (int u = 0; u < g.size(); ++u) comparable += reach.reach_count(u) - 1;
  return n * (n - 1) / 2 - comparable;
}

}  // namespace gp::graph
