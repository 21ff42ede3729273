// A directed graph over dense node ids 0..n-1 and the generic DAG algorithms the IR, planner and
// scheduler share. Any node type adapts by numbering its nodes (for ir::Graph: models::to_dag).
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace gp::graph {

/// Adjacency-list digraph. Parallel edges are ignored by add_edge (set semantics).
class Dag {
 public:
  Dag() = default;
  explicit Dag(int n) : succ_(n), pred_(n) {}
  int size() const { return static_cast<int>(succ_.size()); }
  int add_node();
  void add_edge(int u, int v);  // no-op if already present
  /// Adds many edges at once in O(n + m + edges.size()) (add_edge scans adjacency lists).
  void add_edges(const std::vector<std::pair<int, int>>& edges);
  bool has_edge(int u, int v) const;
  const std::vector<int>& succs(int u) const { return succ_[u]; }
  const std::vector<int>& preds(int u) const { return pred_[u]; }
  size_t num_edges() const;
  std::vector<int> sources() const;
  std::vector<int> sinks() const;
  bool operator==(const Dag&) const = default;

 private:
  friend Dag induced_subgraph(const Dag& g, const std::vector<int>& nodes);
  std::vector<std::vector<int>> succ_, pred_;
};

/// Kahn's algorithm, the one copy: among ready nodes the smallest key(u) first, ties (and an empty
/// key) by smallest id. Returns the nodes it placed: all of them unless a cycle blocks the rest.
std::vector<int> kahn_order(const Dag& g, const std::function<int64_t(int)>& key = {});
/// Kahn order (smallest id first among ready nodes); nullopt if the graph has a cycle.
std::optional<std::vector<int>> topo_order(const Dag& g);
/// A cycle as a node list (first == last omitted) if one exists, else empty.
std::vector<int> find_cycle(const Dag& g);
/// Renders a find_cycle() result as "3 -> 5 -> 3" for error messages ("" for an empty list).
std::string describe_cycle(const std::vector<int>& cycle);

/// The one bitset transitive closure: row(u) is the bitset of the nodes reachable from u (u itself
/// included), following successors (descendants) or predecessors (ancestors). Exact on cyclic
/// graphs too. Each row remembers its span of non-zero words, so on a topologically numbered DAG
/// the rows cost about half of n*n/64 words to build and to count.
class Reachability {
 public:
  enum class Direction { descendants, ancestors };
  explicit Reachability(const Dag& g, Direction dir = Direction::descendants);
  bool reaches(int u, int v) const { return row(u)[v / 64] >> (v % 64) & 1; }
  /// Number of nodes reachable from u, u itself included.
  int reach_count(int u) const;
  /// u's row: words() 64-bit words, bit v set iff v is reachable from u.
  const uint64_t* row(int u) const { return bits_.data() + words_ * static_cast<size_t>(u); }
  size_t words() const { return words_; }

 private:
  void close_in_order(const Dag& g, Direction dir, const std::vector<int>& order);
  void close_by_search(const Dag& g, Direction dir);
  size_t words_ = 0;
  std::vector<uint64_t> bits_;
  std::vector<size_t> lo_, hi_;  // row u's non-zero words lie in [lo_[u], hi_[u])
};

/// A node set S is convex iff no path leaves S and re-enters it.
bool is_convex(const Dag& g, const std::vector<int>& nodes);
Dag transitive_reduction(const Dag& g);
/// The subgraph induced by `nodes` (distinct ids): node i of the result is nodes[i].
Dag induced_subgraph(const Dag& g, const std::vector<int>& nodes);
/// Component index per node (weakly connected), numbered in order of each component's first node.
std::vector<int> weak_components(const Dag& g, int* count = nullptr);
/// Immediate dominators from a single source (idom[source] = source; -1 if unreachable).
std::vector<int> dominators(const Dag& g, int source);
std::vector<int> post_dominators(const Dag& g, int sink);

}  // namespace gp::graph
