// Internal: the series-parallel structure the planner's DP runs over (GraphPipe paper, section 5):
// the op graph as nested series and parallel sequences, with the shared-boundary (join / fork)
// options and the mirror-image sequences the DP solves once. PipeDream's chain is one sequence.
#pragma once
#include <string>
#include <vector>

#include "cost/cost_model.h"

namespace gp::planner::detail {

/// One element of a sequence: a single op, or a nested sequence (with all ops under it).
struct Item {
  int seq = -1;           // nested sequence index, or -1 for a single op
  std::vector<OpId> ops;  // every op under this item
  double work_s = 0;      // fwd+bwd time at batch 1 (for sorting parallel branches)
};

/// A series sequence runs its items in order; a parallel one has mutually independent items.
/// Parallel items are kept sorted by work (descending), so a "contiguous group" is canonical.
struct Seq {
  bool parallel = false;
  std::vector<Item> items;
  // A branch extended by the ops after its parallel block (series only, see JoinOption): items
  // [join_from, k) are those ops, and they share the sequence's last stage, so no stage ends
  // strictly between join_from and k. -1: an ordinary sequence.
  int join_from = -1;
  // The parallel block of a JoinOption: item `join_item` is the extended branch (its last stage
  // holds the join); every other item feeds that stage, so it has one more micro-batch in flight
  // after it than the block as a whole. -1: an ordinary parallel sequence.
  int join_item = -1;
  // A branch extended at its front by the ops before its parallel block (see ForkOption): items
  // [0, fork_to) are those ops and share the sequence's first stage. -1: an ordinary sequence.
  int fork_to = -1;
};

/// The paper's shared boundary node (section 5: "the sink node of G1 coincides with the source
/// node of G2"), for the join side: in a series sequence, the ops right after a parallel block
/// (the concat, head and loss that join its branches) may share a stage with the end of one
/// branch. Item i of the series sequence is the parallel block; the option replaces it and items
/// (i, tail_end) by the parallel sequence `block`: the other branches in their order, then branch
/// j followed by those ops (its last item, `join_item`).
struct JoinOption {
  int tail_end = 0;  // items (i, tail_end) of the series sequence are absorbed
  int block = 0;     // the virtual parallel sequence
};

/// The fork side of the shared boundary node: in a series sequence, the single ops right before a
/// parallel block (items [h, block_item), the op that feeds every branch) may share a stage with
/// the start of one branch j. The option replaces items [h, block_item] by: the series sequence
/// `ext` (those ops, then branch j's items; its first stage holds the ops and a head of branch j)
/// and, beside the rest of branch j, the parallel sequence `others` (the block without branch j),
/// which the first stage feeds.
struct ForkOption {
  int block_item = 0;
  int ext = 0;
  int others = 0;
};

struct Structure {
  std::vector<Seq> seqs;
  int root = 0;
  // Per series sequence s and item i: the join options of item i (empty for most).
  std::vector<std::vector<std::vector<JoinOption>>> joins;
  // Per series sequence s and item h: the fork options whose ops start at item h.
  std::vector<std::vector<std::vector<ForkOption>>> forks;
  // Per sequence: a sequence identical to it for the DP (mirror_sequences), whose answers it
  // shares; empty: none shared.
  std::vector<int> same_as;
  int canon(int s) const { return same_as.empty() ? s : same_as[s]; }
  const std::vector<JoinOption>* joins_at(int s, int i) const {
    if (joins.empty() || joins[s].empty() || joins[s][i].empty()) return nullptr;
    return &joins[s][i];
  }
  const std::vector<ForkOption>* forks_at(int s, int i) const {
    if (static_cast<int>(forks.size()) <= s || forks[s].empty() || forks[s][i].empty()) return nullptr;
    return &forks[s][i];
  }
};

/// The SP decomposition of the op graph (after SP-ization when it is not SP), as sequences.
/// `note` says whether SP-ization was needed and how much parallelism it kept.
Structure sp_structure(const cost::CostModel& cm, std::string* note);
/// Adds the join options (see JoinOption) and fork options (see ForkOption) of every parallel block
/// of a series sequence, with tails / heads of up to `max_ops` single ops, one per set of
/// mirror-image branches (same ops, costs and edges); the extended branches get their own in turn.
/// Returns how many options were added.
int add_boundary_options(Structure& st, const cost::CostModel& cm, int max_ops);
constexpr int kMaxJoinTail = 4;
/// Per sequence, a representative of the sequences identical to it for the DP (Structure::same_as):
/// the same items (nested ones identical in turn), join and fork options (likewise), op costs, and
/// edges (inside by position, outside producers relabelled by first use, with their sizes). The
/// DP's answer for a state depends on nothing else, so identical sequences share memo entries and
/// stage costs, and the stages are mapped back to each sequence's own ops by position (e.g. mmt's
/// identical branches are solved once). Empty when the graph has shared parameters.
std::vector<int> mirror_sequences(const Structure& st, const cost::CostModel& cm);

/// One series sequence of all ops in topological (OpId) order: PipeDream's linearisation.
Structure chain_structure(const cost::CostModel& cm);

}  // namespace gp::planner::detail
