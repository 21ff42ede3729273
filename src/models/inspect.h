// Inspecting a model for `graphpipe model info`: totals, op counts per kind, the branch structure
// from the series-parallel tree, and a Graphviz rendering with one cluster per parallel branch.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "graph/dag.h"
#include "graph/series_parallel.h"
#include "ir/model.h"

namespace gp::models {

/// The op-to-op DAG of a graph: node i is OpId(i) (graph inputs are not nodes).
graph::Dag to_dag(const ir::Graph& g);

/// The graph's SP tree; when the graph is not series-parallel, the tree of its SP-ized form.
struct SpStructure {
  bool series_parallel = true;  // false: `tree` is of graph::sp_ize(to_dag(g))
  std::string failure;          // why the original graph is not SP
  graph::SpTree tree;
  /// Widths (child counts) of the parallel nodes on the root's series spine (the root itself, or
  /// the root series' children), in order; e.g. {4} for mmt, {4, 4, ...} for inception.
  std::vector<int> spine_parallel_widths() const;
  int max_parallel_width() const;  // 1 for a chain
};
SpStructure sp_structure(const ir::Graph& g);

/// A few lines such as "series of 3: [parallel of 4 branches x 65 ops] -> 2 ops -> loss";
/// repeated patterns are folded ("[...] x 9").
std::string describe_structure(const ir::Graph& g, const SpStructure& sp);

struct ModelSummary {
  std::string name;
  size_t num_ops = 0;
  size_t num_inputs = 0;
  int64_t params = 0;
  int64_t param_bytes = 0;
  double fwd_flops = 0;    // per sample
  double bwd_flops = 0;    // per sample
  double saved_bytes = 0;  // activation bytes saved for backward, per sample
  std::map<std::string, int> ops_per_kind;
};
ModelSummary summarize(const ir::Graph& g);

/// Graphviz source: nodes are ops ("name\nkind"), clusters are parallel branches (nested).
std::string to_dot(const ir::Graph& g, const SpStructure& sp);

/// "1,234,567"
std::string thousands(int64_t v);
/// Human units: si(1.23e9, "FLOP") = "1.23 GFLOP"; si(45.6e6, "B") = "45.6 MB".
std::string si(double v, const std::string& unit);

}  // namespace gp::models
