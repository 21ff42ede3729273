// Internal to gp_graph: algorithms on the subgraph induced by a node subset of a Dag, in time linear
// in the subset's edges. Shared by sp_decompose and sp_ize, which both recurse on convex subsets.
#pragma once
#include <cstdint>
#include <vector>

#include "graph/dag.h"

namespace gp::graph::detail {

/// Graph node -> index inside the current subset (-1 outside). One array reused for every subset
/// so entering a subset costs O(|subset|), not O(n).
class SubsetIndex {
 public:
  explicit SubsetIndex(int n) : local_(n, -1) {}
  void enter(const std::vector<int>& nodes);
  void leave(const std::vector<int>& nodes);
  int operator[](int u) const { return local_[u]; }
  bool contains(int u) const { return local_[u] >= 0; }

 private:
  std::vector<int> local_;
};

/// Weakly connected components of the entered subset `nodes`; each sorted, ordered by first node.
std::vector<std::vector<int>> subset_components(const Dag& g, const SubsetIndex& idx,
                                                const std::vector<int>& nodes);

/// A topological order of the entered subset (FIFO Kahn over `nodes` in the given order).
std::vector<int> subset_topo_order(const Dag& g, const SubsetIndex& idx,
                                   const std::vector<int>& nodes);

/// The finest series split of the entered subset, given its topological order `order`: position i
/// is a cut iff every node before it reaches every node from it on. Returns the blocks in order
/// (one block = no series cut).
std::vector<std::vector<int>> series_blocks(const Dag& g, const SubsetIndex& idx,
                                            const std::vector<int>& order);

/// Reachability inside the entered subset, as bitsets over positions in `order` (a topological
/// order of the subset, entered as `idx.enter(order)` so idx[u] is u's position). desc(i) / anc(i)
/// include i itself.
class SubsetClosure {
 public:
  SubsetClosure(const Dag& g, const SubsetIndex& idx, const std::vector<int>& order);
  int size() const { return k_; }
  size_t words() const { return words_; }
  const uint64_t* desc(int i) const { return desc_.data() + words_ * i; }
  const uint64_t* anc(int i) const { return anc_.data() + words_ * i; }
  bool reaches(int i, int j) const { return desc(i)[j / 64] >> (j % 64) & 1; }
  int desc_count(int i) const;
  int anc_count(int i) const;

 private:
  int k_;
  size_t words_;
  std::vector<uint64_t> desc_, anc_;
};

}  // namespace gp::graph::detail
