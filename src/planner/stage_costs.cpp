// The planner DP's stage costs (stage_costs.h).
#include "planner/stage_costs.h"

#include <algorithm>
#include <bit>

namespace gp::planner::detail {

StageCosts::StageCosts(const cost::CostModel& cm, const Structure& st, const SizeUnits& units, int mini_batch,
                       int num_devices, bool same_node)
    : cm_(cm),
      st_(st),
      units_(units),
      mini_(mini_batch),
      same_node_(same_node),
      plogs_(std::bit_width(static_cast<unsigned>(std::min(num_devices, units.largest())))),
      cache_(units.sizes().size(), std::vector<std::vector<std::vector<StageCostLite>>>(st.seqs.size())) {
  rcs_.reserve(units.sizes().size());
  for (int b : units.sizes()) rcs_.emplace_back(cm, st, b, mini_batch, same_node);
}

std::vector<OpId> StageCosts::merge_ops(int s, int i, int x) const {
  const Seq& q = st_.seqs[s];
  const int k = static_cast<int>(q.items.size());
  std::vector<OpId> ops;
  for (int j = i; j + 1 < k; ++j) ops.insert(ops.end(), q.items[j].ops.begin(), q.items[j].ops.end());
  const Seq& c = st_.seqs[q.items[k - 1].seq];
  for (int j = 0; j < x; ++j) ops.insert(ops.end(), c.items[j].ops.begin(), c.items[j].ops.end());
  return ops;
}

StageCostLite StageCosts::merge(int s, int i, int x, int plog, int z) {
  const uint64_t key = (uint64_t(st_.canon(s)) << 44) | (uint64_t(i) << 26) | (uint64_t(x) << 8) | (uint64_t(z) << 4) |
                       uint64_t(plog);
  auto it = merge_cost_.find(key);
  if (it != merge_cost_.end()) return it->second;
  // Not a contiguous range of one sequence, so RangeCost does not apply: cost it directly.
  const std::vector<OpId> ops = merge_ops(s, i, x);
  if (mask_.empty()) mask_.assign(cm_.graph().num_ops(), 0);
  for (OpId o : ops) mask_[o.v] = 1;
  const int b = units_.size(z);
  const cost::StageCost c = cost::stage_cost(cm_, ops, mask_, 1 << plog, b, mini_, same_node_);
  for (OpId o : ops) mask_[o.v] = 0;
  const StageCostLite lite{c.tps_s, c.compute_s / b, c.state_bytes, c.act_bytes_per_mb};
  merge_cost_.emplace(key, lite);
  return lite;
}

}  // namespace gp::planner::detail
