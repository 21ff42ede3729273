#include "graph/dag.h"

#include <algorithm>
#include <bit>
#include <functional>
#include <queue>

#include "support/error.h"

namespace gp::graph {

int Dag::add_node() {
  succ_.emplace_back();
  pred_.emplace_back();
  return size() - 1;
}

void Dag::add_edge(int u, int v) {
  GP_ASSERT(u >= 0 && u < size() && v >= 0 && v < size(), "edge {}->{} out of range (n={})", u, v, size());
  if (has_edge(u, v)) return;
  succ_[u].push_back(v);
  pred_[v].push_back(u);
}

void Dag::add_edges(const std::vector<std::pair<int, int>>& edges) {
  std::vector<std::vector<int>> by_source(size());
  for (auto [u, v] : edges) {
    GP_ASSERT(u >= 0 && u < size() && v >= 0 && v < size(), "edge {}->{} out of range (n={})", u, v, size());
    by_source[u].push_back(v);
  }
  std::vector<char> present(size(), 0);
  for (int u = 0; u < size(); ++u) {
    if (by_source[u].empty()) continue;
    for (int v : succ_[u]) present[v] = 1;
    for (int v : by_source[u])
      if (!present[v]) {
        present[v] = 1;
        succ_[u].push_back(v);
        pred_[v].push_back(u);
      }
    for (int v : succ_[u]) present[v] = 0;
  }
}

bool Dag::has_edge(int u, int v) const {
  // Scan the shorter of the two adjacency lists.
  if (succ_[u].size() <= pred_[v].size()) return std::find(succ_[u].begin(), succ_[u].end(), v) != succ_[u].end();
  return std::find(pred_[v].begin(), pred_[v].end(), u) != pred_[v].end();
}

size_t Dag::num_edges() const {
  size_t m = 0;
  for (const auto& s : succ_) m += s.size();
  return m;
}

std::vector<int> Dag::sources() const {
  std::vector<int> out;
  for (int u = 0; u < size(); ++u)
    if (pred_[u].empty()) out.push_back(u);
  return out;
}

std::vector<int> Dag::sinks() const {
  std::vector<int> out;
  for (int u = 0; u < size(); ++u)
    if (succ_[u].empty()) out.push_back(u);
  return out;
}

std::vector<int> kahn_order(const Dag& g, const std::function<int64_t(int)>& key) {
  const int n = g.size();
  std::vector<int> indeg(n);
  using Entry = std::pair<int64_t, int>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> ready;
  auto push = [&](int u) { ready.push({key ? key(u) : 0, u}); };
  for (int u = 0; u < n; ++u) {
    indeg[u] = static_cast<int>(g.preds(u).size());
    if (indeg[u] == 0) push(u);
  }
  std::vector<int> order;
  order.reserve(n);
  while (!ready.empty()) {
    int u = ready.top().second;
    ready.pop();
    order.push_back(u);
    for (int v : g.succs(u))
      if (--indeg[v] == 0) push(v);
  }
  return order;
}

std::optional<std::vector<int>> topo_order(const Dag& g) {
  std::vector<int> order = kahn_order(g);
  if (static_cast<int>(order.size()) != g.size()) return std::nullopt;
  return order;
}

std::vector<int> find_cycle(const Dag& g) {
  // Iterative DFS with colours; a back edge u->v closes the cycle v ... u on the DFS stack.
  const int n = g.size();
  enum Colour : char { white, grey, black };
  std::vector<Colour> colour(n, white);
  std::vector<int> parent(n, -1);
  std::vector<std::pair<int, size_t>> stack;  // (node, next successor index)
  for (int root = 0; root < n; ++root) {
    if (colour[root] != white) continue;
    stack.push_back({root, 0});
    colour[root] = grey;
    while (!stack.empty()) {
      auto& [u, i] = stack.back();
      if (i == g.succs(u).size()) {
        colour[u] = black;
        stack.pop_back();
        continue;
      }
      int v = g.succs(u)[i++];
      if (colour[v] == grey) {
        std::vector<int> cycle;
        for (int w = u; w != v; w = parent[w]) cycle.push_back(w);
        cycle.push_back(v);
        std::reverse(cycle.begin(), cycle.end());
        return cycle;
      }
      if (colour[v] == white) {
        colour[v] = grey;
        parent[v] = u;
        stack.push_back({v, 0});
      }
    }
  }
  return {};
}

namespace {

const std::vector<int>& next_nodes(const Dag& g, int u, Reachability::Direction dir) {
  return dir == Reachability::Direction::descendants ? g.succs(u) : g.preds(u);
}

}  // namespace

Reachability::Reachability(const Dag& g, Direction dir) : words_((static_cast<size_t>(g.size()) + 63) / 64) {
  const int n = g.size();
  bits_.assign(words_ * n, 0);
  lo_.assign(n, words_);
  hi_.assign(n, 0);
  // A topologically numbered graph (every edge u->v has u < v, as sp_ize's parts are) needs no sort.
  bool numbered = true;
  for (int u = 0; u < n && numbered; ++u)
    for (int v : g.succs(u)) numbered = numbered && u < v;
  std::optional<std::vector<int>> order;
  if (numbered) {
    order.emplace(n);
    for (int u = 0; u < n; ++u) (*order)[u] = u;
  } else {
    order = topo_order(g);
  }
  if (!order) {
    close_by_search(g, dir);
    return;
  }
  // Each node's row is built after the rows it ORs in: successors first for descendants.
  if (dir == Direction::descendants) std::reverse(order->begin(), order->end());
  close_in_order(g, dir, *order);
}

void Reachability::close_in_order(const Dag& g, Direction dir, const std::vector<int>& order) {
  for (int u : order) {
    uint64_t* r = bits_.data() + words_ * u;
    const size_t own = static_cast<size_t>(u) / 64;
    r[own] |= uint64_t{1} << (u % 64);
    size_t lo = own, hi = own + 1;
    for (int v : next_nodes(g, u, dir)) {
      const uint64_t* s = row(v);
      for (size_t w = lo_[v]; w < hi_[v]; ++w) r[w] |= s[w];
      lo = std::min(lo, lo_[v]);
      hi = std::max(hi, hi_[v]);
    }
    lo_[u] = lo;
    hi_[u] = hi;
  }
}

void Reachability::close_by_search(const Dag& g, Direction dir) {
  // Cyclic graph: one BFS per node (O(n*(n+m))), still exact.
  std::vector<int> queue;
  for (int u = 0; u < g.size(); ++u) {
    uint64_t* r = bits_.data() + words_ * u;
    queue.assign(1, u);
    r[u / 64] |= uint64_t{1} << (u % 64);
    for (size_t qi = 0; qi < queue.size(); ++qi)
      for (int v : next_nodes(g, queue[qi], dir))
        if (!(r[v / 64] >> (v % 64) & 1)) {
          r[v / 64] |= uint64_t{1} << (v % 64);
          queue.push_back(v);
        }
    lo_[u] = 0;
    hi_[u] = words_;
  }
}

int Reachability::reach_count(int u) const {
  int count = 0;
  for (size_t w = lo_[u]; w < hi_[u]; ++w) count += std::popcount(row(u)[w]);
  return count;
}

bool is_convex(const Dag& g, const std::vector<int>& nodes) {
  // Walk forward from every edge that leaves the set; re-entering it means a path S -> out -> S.
  std::vector<char> in_set(g.size(), 0), seen(g.size(), 0);
  for (int u : nodes) {
    GP_ASSERT(u >= 0 && u < g.size(), "is_convex: node {} out of range (n={})", u, g.size());
    in_set[u] = 1;
  }
  std::vector<int> queue;
  for (int u : nodes)
    for (int v : g.succs(u))
      if (!in_set[v] && !seen[v]) {
        seen[v] = 1;
        queue.push_back(v);
      }
  for (size_t qi = 0; qi < queue.size(); ++qi)
    for (int v : g.succs(queue[qi])) {
      if (in_set[v]) return false;
      if (!seen[v]) {
        seen[v] = 1;
        queue.push_back(v);
      }
    }
  return true;
}

std::string describe_cycle(const std::vector<int>& cycle) {
  if (cycle.empty()) return "";
  std::string out;
  for (int u : cycle) out += std::to_string(u) + " -> ";
  return out + std::to_string(cycle.front());
}

Dag transitive_reduction(const Dag& g) {
  auto order = topo_order(g);
  GP_CHECK(order.has_value(), "transitive reduction needs an acyclic graph, found cycle {}",
           describe_cycle(find_cycle(g)));
  const Reachability reach(g);
  std::vector<int> pos(g.size());
  for (int i = 0; i < g.size(); ++i) pos[(*order)[i]] = i;
  // Keep u->v iff no earlier (in topological order) kept successor of u already reaches v: a
  // successor that reaches v always precedes v in topological order.
  Dag out(g.size());
  std::vector<int> succs;
  for (int u = 0; u < g.size(); ++u) {
    succs = g.succs(u);
    std::sort(succs.begin(), succs.end(), [&](int a, int b) { return pos[a] < pos[b]; });
    std::vector<int> kept;
    for (int v : succs) {
      bool implied = std::any_of(kept.begin(), kept.end(), [&](int w) { return reach.reaches(w, v); });
      if (!implied) kept.push_back(v);
    }
    std::sort(kept.begin(), kept.end());
    for (int v : kept) out.add_edge(u, v);
  }
  return out;
}

Dag induced_subgraph(const Dag& g, const std::vector<int>& nodes) {
  std::vector<int> local(g.size(), -1);
  for (int i = 0; i < static_cast<int>(nodes.size()); ++i) {
    GP_ASSERT(nodes[i] >= 0 && nodes[i] < g.size() && local[nodes[i]] == -1,
              "induced_subgraph: bad or repeated node {}", nodes[i]);
    local[nodes[i]] = i;
  }
  // g has no parallel edges, so neither has the result: fill the lists directly.
  Dag out(static_cast<int>(nodes.size()));
  for (int i = 0; i < out.size(); ++i)
    for (int v : g.succs(nodes[i]))
      if (local[v] >= 0) {
        out.succ_[i].push_back(local[v]);
        out.pred_[local[v]].push_back(i);
      }
  return out;
}

std::vector<int> weak_components(const Dag& g, int* count) {
  std::vector<int> comp(g.size(), -1);
  int c = 0;
  std::vector<int> queue;
  for (int root = 0; root < g.size(); ++root) {
    if (comp[root] != -1) continue;
    comp[root] = c;
    queue.assign(1, root);
    for (size_t qi = 0; qi < queue.size(); ++qi) {
      int u = queue[qi];
      for (const auto* adj : {&g.succs(u), &g.preds(u)})
        for (int v : *adj)
          if (comp[v] == -1) {
            comp[v] = c;
            queue.push_back(v);
          }
    }
    ++c;
  }
  if (count) *count = c;
  return comp;
}

namespace {

Dag reversed(const Dag& g) {
  Dag r(g.size());
  for (int u = 0; u < g.size(); ++u)
    for (int v : g.succs(u)) r.add_edge(v, u);
  return r;
}

}  // namespace

std::vector<int> dominators(const Dag& g, int source) {
  // Cooper, Harvey & Kennedy, "A Simple, Fast Dominance Algorithm" (2001): iterate
  // idom(b) = intersect of processed predecessors, in reverse postorder, to a fixed point
  // (one pass on a DAG).
  const int n = g.size();
  GP_ASSERT(source >= 0 && source < n, "dominators: source {} out of range (n={})", source, n);
  std::vector<int> postorder, rpo_index(n, -1);
  {
    std::vector<char> seen(n, 0);
    std::vector<std::pair<int, size_t>> stack{{source, 0}};
    seen[source] = 1;
    while (!stack.empty()) {
      auto& [u, i] = stack.back();
      if (i == g.succs(u).size()) {
        postorder.push_back(u);
        stack.pop_back();
        continue;
      }
      int v = g.succs(u)[i++];
      if (!seen[v]) {
        seen[v] = 1;
        stack.push_back({v, 0});
      }
    }
  }
  std::vector<int> rpo(postorder.rbegin(), postorder.rend());
  for (int i = 0; i < static_cast<int>(rpo.size()); ++i) rpo_index[rpo[i]] = i;
  std::vector<int> idom(n, -1);
  idom[source] = source;
  auto intersect = [&](int a, int b) {
    while (a != b) {
      while (rpo_index[a] > rpo_index[b]) a = idom[a];
      while (rpo_index[b] > rpo_index[a]) b = idom[b];
    }
    return a;
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (int b : rpo) {
      if (b == source) continue;
      int new_idom = -1;
      for (int p : g.preds(b)) {
        if (rpo_index[p] == -1 || idom[p] == -1) continue;
        new_idom = new_idom == -1 ? p : intersect(p, new_idom);
      }
      if (new_idom != idom[b]) {
        idom[b] = new_idom;
        changed = true;
      }
    }
  }
  return idom;
}

std::vector<int> post_dominators(const Dag& g, int sink) { return dominators(reversed(g), sink); }

}  // namespace gp::graph
