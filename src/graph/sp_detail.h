// Internal to gp_graph: the pieces sp_decompose and sp_ize share. They work on "topologically
// numbered" DAGs (every edge u->v has u < v); induced subgraphs on ascending node lists stay so.
#pragma once
#include <vector>

#include "graph/dag.h"

namespace gp::graph::detail {

/// A node set being decomposed: its induced subgraph (topologically numbered) and, per local
/// node, the node id in the caller's graph. Recursing on induced subgraphs (not on subsets of the
/// whole graph) means an edge is scanned only until its endpoints land in different parts.
struct Part {
  Dag dag;
  std::vector<int> ids;
};

/// The whole of g, renumbered in topological order. g must be acyclic.
Part whole_graph(const Dag& g);
/// The part induced by `local_nodes` (ascending local ids of `part`).
Part sub_part(const Part& part, const std::vector<int>& local_nodes);

/// Weakly connected components, each ascending, ordered by their smallest *global* id.
std::vector<std::vector<int>> parallel_parts(const Part& part);

/// The finest series split of a topologically numbered connected DAG: position i is a cut iff
/// every node before it reaches every node from it on. Blocks in order; one block = no cut.
std::vector<std::vector<int>> series_blocks(const Dag& g);

}  // namespace gp::graph::detail
