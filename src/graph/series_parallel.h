// Series-parallel decomposition of a DAG's nodes into an SP tree (series / parallel / leaf), and
// SP-ization: adding ordering edges so that any DAG becomes series-parallel.
#pragma once
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "graph/dag.h"

namespace gp::graph {

/// A node of an SP tree. Leaves hold one graph node. A series node runs its children in order
/// (every node of child i precedes every node of child i+1 in the transitive closure); a parallel
/// node's children are mutually independent (no edges between them). Children are indices into
/// SpTree::nodes; series/parallel nodes have >= 2 children; a series node's children are never
/// series nodes and a parallel node's children are never parallel nodes (canonical form).
struct SpNode {
  enum class Kind { leaf, series, parallel };
  Kind kind = Kind::leaf;
  int node = -1;              // the graph node, for a leaf
  std::vector<int> children;  // for series / parallel
  bool operator==(const SpNode&) const = default;
};

struct SpTree {
  std::vector<SpNode> nodes;
  int root = -1;
  /// The graph nodes under tree node t, in ascending id order.
  std::vector<int> leaves(int t) const;
  /// Rendering like "S(0, P(1, 2), 3)" for tests and `model info`.
  std::string to_string() const;
};

/// Decomposition result: a tree, or (for a non-SP graph) a message naming where it fails.
struct SpResult {
  std::optional<SpTree> tree;
  std::string failure;  // e.g. "nodes {1,2,3,4} form an N-shaped (non-series-parallel) subgraph"
};

/// Decomposes g (nodes, not edges, are the leaves; edges implied by transitivity are ignored).
/// Multiple sources/sinks are fine: components are composed in parallel.
SpResult sp_decompose(const Dag& g);

/// Returns a supergraph of g (same nodes, extra edges only) that is node-series-parallel, so that
/// every topological order of the result is one of g's. Keeps as much parallelism as it can.
Dag sp_ize(const Dag& g);

/// An SP tree for any DAG: g's own when g is series-parallel, else that of sp_ize(g). The one
/// "decompose, else SP-ize" of the planners and `model info`.
struct SpDecomposition {
  SpTree tree;
  std::string failure;         // why g is not series-parallel; "" when it is
  std::optional<Dag> sp_ized;  // the SP-ized supergraph the tree is of, when g was not SP
  bool series_parallel() const { return !sp_ized.has_value(); }
};
SpDecomposition sp_decompose_or_ize(const Dag& g);

/// A parallelism measure for SP-ization reports: the number of unordered node pairs {u, v}
/// with neither reaching the other (independent pairs).
int64_t independent_pairs(const Dag& g);

}  // namespace gp::graph
