// Internal: the planner DP's stage costs (engine.h): ranges of a sequence's items through
// RangeCost, cached across states and targets, and the merge case's stages costed directly.
#pragma once
#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "cost/cost_model.h"
#include "planner/dp_types.h"
#include "planner/range_cost.h"
#include "planner/sp_structure.h"

namespace gp::planner::detail {

class StageCosts {
 public:
  StageCosts(const cost::CostModel& cm, const Structure& st, const SizeUnits& units, int mini_batch, int num_devices,
             bool same_node);
  /// Items [i, m) of sequence s on 2^plog devices at stage size z, without the communication and
  /// all-reduce terms (tps < 0: the compute and memory tests come first); complete() fills them in.
  StageCostLite head(int s, int i, int m, int plog, int z) {
    s = st_.canon(s);
    StageCostLite* slot = cache_slot(s, i, m, plog, z);
    if (slot && slot->compute_tps >= 0) return *slot;
    const RangeCost::Cost c = rcs_[z].cheap(s, i, m, plog);
    const StageCostLite lite{-1, c.compute_tps, c.state, c.act};
    if (slot) *slot = lite;
    return lite;
  }
  void complete(int s, int i, int m, int plog, int z, StageCostLite* c) {
    if (c->tps >= 0) return;
    s = st_.canon(s);
    RangeCost::Cost rc{0, c->compute_tps, c->state, c->act};
    rcs_[z].finish(s, i, m, plog, &rc);
    c->tps = rc.tps;
    if (StageCostLite* slot = cache_slot(s, i, m, plog, z)) slot->tps = rc.tps;
  }
  /// head() and complete() in one.
  StageCostLite full(int s, int i, int m, int plog, int z) {
    StageCostLite c = head(s, i, m, plog, z);
    complete(s, i, m, plog, z, &c);
    return c;
  }
  /// The ops of a merge stage: items [i, k-1) of parallel sequence s and items [0, x) of its last
  /// item's sequence.
  std::vector<OpId> merge_ops(int s, int i, int x) const;
  /// Their cost (cached: independent of the target).
  StageCostLite merge(int s, int i, int x, int plog, int z);

 private:
  StageCostLite* cache_slot(int s, int i, int m, int plog, int z);

  const cost::CostModel& cm_;
  const Structure& st_;
  const SizeUnits& units_;
  int mini_;
  bool same_node_;
  int plogs_ = 1;               // number of power-of-two degrees
  std::vector<RangeCost> rcs_;  // per size
  std::unordered_map<uint64_t, StageCostLite> merge_cost_;
  std::vector<char> mask_;  // scratch for merge(): the ops of the stage being costed
  // The stage-cost cache: per size and sequence, rows [plog * k + i] holding the stages [i, m) at
  // [m - i - 1], grown on demand to at most kCacheBytes in all (cheap part first, compute_tps < 0:
  // empty; tps once completed).
  static constexpr size_t kCacheBytes = size_t{512} << 20;
  std::vector<std::vector<std::vector<std::vector<StageCostLite>>>> cache_;
  size_t cache_bytes_ = 0;
};

// A stage's cache slot (nullptr once the cache is full): per size, sequence, degree and first item
// a row of the stages [i, m) evaluated so far, grown geometrically (base_case extends a stage one
// item at a time), so only the stages the DP reaches take memory. The values are those head()
// and complete() compute, kept: the same stage recurs across states and targets.
inline StageCostLite* StageCosts::cache_slot(int s, int i, int m, int plog, int z) {
  auto& rows = cache_[z][s];
  const size_t k = st_.seqs[s].items.size(), len = static_cast<size_t>(m - i);
  if (rows.empty()) rows.resize(k * static_cast<size_t>(plogs_));
  std::vector<StageCostLite>& row = rows[static_cast<size_t>(plog) * k + i];
  if (row.size() >= len) return &row[len - 1];
  const size_t want = std::min(k - i, std::max({len, 2 * row.size(), size_t{16}}));
  if (want > row.capacity()) {
    const size_t more = (want - row.capacity()) * sizeof(StageCostLite);
    if (cache_bytes_ + more > kCacheBytes) return nullptr;
    cache_bytes_ += more;
    row.reserve(want);
  }
  row.resize(want, StageCostLite{-1, -1, 0, 0});
  return &row[len - 1];
}

}  // namespace gp::planner::detail
