#include "graph/series_parallel.h"

#include <algorithm>
#include <bit>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "graph/sp_detail.h"
#include "support/error.h"

namespace gp::graph {

std::vector<int> SpTree::leaves(int t) const {
  std::vector<int> out, stack{t};
  while (!stack.empty()) {
    const SpNode& n = nodes.at(stack.back());
    stack.pop_back();
    if (n.kind == SpNode::Kind::leaf) out.push_back(n.node);
    else stack.insert(stack.end(), n.children.begin(), n.children.end());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string SpTree::to_string() const {
  if (root < 0) return "()";
  std::string out;
  // Iterative pre-order walk; a closing marker ends a composite node's parenthesis.
  std::vector<std::pair<int, bool>> stack{{root, false}};  // (tree node, is a closing marker)
  std::vector<bool> first_child{true};
  while (!stack.empty()) {
    auto [t, closing] = stack.back();
    stack.pop_back();
    if (closing) {
      out += ')';
      first_child.pop_back();
      continue;
    }
    if (!first_child.back()) out += ", ";
    first_child.back() = false;
    const SpNode& n = nodes.at(t);
    if (n.kind == SpNode::Kind::leaf) {
      out += std::to_string(n.node);
      continue;
    }
    out += n.kind == SpNode::Kind::series ? "S(" : "P(";
    first_child.push_back(true);
    stack.push_back({t, true});
    for (auto it = n.children.rbegin(); it != n.children.rend(); ++it) stack.push_back({*it, false});
  }
  return out;
}

namespace {

using detail::Part;

// Searches a prime part (connected, no series cut) for an induced N: a<c, b<c, b<d with a||b,
// a||d, c||d. Such a part always contains one (series-parallel orders are exactly the N-free
// ones); the search is bounded so a huge part only costs a bounded amount of work.
std::string describe_prime_part(const Part& part) {
  const Reachability desc(part.dag), anc(part.dag, Reachability::Direction::ancestors);
  const int k = part.dag.size();
  const size_t words = desc.words();
  int64_t budget = 50'000'000;  // word operations
  std::vector<uint64_t> a_set(words), d_set(words), a_free(words);
  auto cmp_clear = [&](uint64_t* dst, int x) {  // dst &= ~(anc(x) | desc(x))
    for (size_t w = 0; w < words; ++w) dst[w] &= ~(anc.row(x)[w] | desc.row(x)[w]);
  };
  auto first_bit = [&](const uint64_t* s) {
    for (size_t w = 0; w < words; ++w)
      if (s[w]) return static_cast<int>(w * 64) + std::countr_zero(s[w]);
    return -1;
  };
  std::vector<int> found;
  for (int b = 0; b < k && found.empty() && budget > 0; ++b) {
    for (int c = b + 1; c < k && found.empty() && budget > 0; ++c) {
      if (!desc.reaches(b, c)) continue;
      budget -= static_cast<int64_t>(4 * words);
      std::copy(desc.row(b), desc.row(b) + words, d_set.begin());  // d: b<d, d||c
      cmp_clear(d_set.data(), c);
      if (first_bit(d_set.data()) < 0) continue;
      std::copy(anc.row(c), anc.row(c) + words, a_set.begin());  // a: a<c, a||b
      cmp_clear(a_set.data(), b);
      if (first_bit(a_set.data()) < 0) continue;
      for (size_t w = 0; w < words && found.empty() && budget > 0; ++w)
        for (uint64_t bits = d_set[w]; bits && budget > 0; bits &= bits - 1) {
          const int d = static_cast<int>(w * 64) + std::countr_zero(bits);
          budget -= static_cast<int64_t>(2 * words);
          a_free = a_set;  // a||d
          cmp_clear(a_free.data(), d);
          if (int a = first_bit(a_free.data()); a >= 0) {
            found = {part.ids[a], part.ids[b], part.ids[c], part.ids[d]};
            break;
          }
        }
    }
  }
  std::string where = fmt::format("a block of {} nodes that is neither a series nor a parallel composition", k);
  if (k <= 16) {
    std::vector<int> sorted = part.ids;
    std::sort(sorted.begin(), sorted.end());
    where = fmt::format("block {{{}}}, which is neither a series nor a parallel composition", fmt::join(sorted, ","));
  }
  if (found.empty()) return fmt::format("graph is not series-parallel: {}", where);
  std::vector<int> sorted = found;
  std::sort(sorted.begin(), sorted.end());
  return fmt::format(
      "nodes {{{}}} form an N-shaped (non-series-parallel) subgraph: {} and {} reach {}, {} reaches "
      "{}, {} and {} are independent (in {})",
      fmt::join(sorted, ","), found[0], found[1], found[2], found[1], found[3], found[0], found[3], where);
}

}  // namespace

SpResult sp_decompose(const Dag& g) {
  SpResult result;
  if (!topo_order(g)) {
    result.failure = "graph has a cycle: " + describe_cycle(find_cycle(g));
    return result;
  }
  SpTree tree;
  if (g.size() == 0) {
    result.tree = tree;
    return result;
  }
  // Work list of (part, tree node to fill). Every part is a module of the order (outside nodes
  // relate to all of it alike) and convex, so reachability inside its induced subgraph equals
  // reachability in g: weak components give the parallel split, series_blocks the series split.
  struct Item {
    Part part;
    int tree_node;
  };
  tree.nodes.emplace_back();
  tree.root = 0;
  std::vector<Item> work;
  work.push_back({detail::whole_graph(g), 0});
  while (!work.empty()) {
    Item item = std::move(work.back());
    work.pop_back();
    const Part& part = item.part;
    if (part.dag.size() == 1) {
      tree.nodes[item.tree_node] = SpNode{SpNode::Kind::leaf, part.ids[0], {}};
      continue;
    }
    SpNode::Kind kind = SpNode::Kind::parallel;
    auto parts = detail::parallel_parts(part);
    if (parts.size() == 1) {
      kind = SpNode::Kind::series;
      parts = detail::series_blocks(part.dag);
    }
    if (parts.size() == 1) {
      result.failure = describe_prime_part(part);
      return result;
    }
    tree.nodes[item.tree_node].kind = kind;
    for (const auto& local_nodes : parts) {
      const int child = static_cast<int>(tree.nodes.size());
      tree.nodes.emplace_back();
      tree.nodes[item.tree_node].children.push_back(child);
      work.push_back({detail::sub_part(part, local_nodes), child});
    }
  }
  result.tree = std::move(tree);
  return result;
}

}  // namespace gp::graph
