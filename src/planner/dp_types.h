// Internal: the value types of the planner's DP (engine.h): the target ranges memo entries hold
// over, the stage sizes in in-flight units, a stage's costs, the typed choice of each DP case, memo
// entries and the DP's statistics.
#pragma once
#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <variant>
#include <vector>

namespace gp::planner::detail {

/// A state's depth when no plan of it meets the target and fits memory.
inline constexpr int kNoPlan = -1;

/// The targets over which one DP computation (a state and everything below it) runs exactly the
/// same way: every time test it made (a value v against the target: accepted when v <= target,
/// rejected when v > target) comes out the same for any target in [lo, hi). Its answer, and how it
/// is reached, is then the same there too, so a memo entry is reused across the binary search's
/// targets while the target lies in its range. Targets here are the solve's `tmax` (the target
/// with its rounding slack).
struct TargetRange {
  double lo = -std::numeric_limits<double>::infinity();  // the largest value accepted
  double hi = std::numeric_limits<double>::infinity();   // the smallest value rejected, if any
  bool rejected = false;                                 // some test was rejected for time
  static TargetRange none() {                            // holds nowhere (an unfinished computation)
    return {std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(), true};
  }
  bool holds(double t) const { return lo <= t && (!rejected || t < hi); }
  /// Holds at no target (none(): an unfinished computation).
  bool empty() const { return rejected && hi <= lo; }
  /// No test was rejected for time: a larger target changes nothing.
  bool unbounded_above() const { return !rejected; }
  void accept(double v) { lo = std::max(lo, v); }
  void reject(double v) { hi = std::min(hi, v), rejected = true; }
  void meet(const TargetRange& o) {
    lo = std::max(lo, o.lo);
    if (o.rejected) reject(o.hi);
  }
};

/// The stage sizes of one DP (StageSizes: powers of two, ascending, each dividing the mini-batch)
/// and the in-flight units they are counted in (the smallest size's samples).
class SizeUnits {
 public:
  SizeUnits(const std::vector<int>& sizes, int mini_batch);
  const std::vector<int>& sizes() const { return sizes_; }
  int count() const { return static_cast<int>(sizes_.size()); }
  int size(int z) const { return sizes_[z]; }
  int largest() const { return sizes_.back(); }
  /// The mini-batch in units.
  int num_micro() const { return num_micro_; }
  /// Size z is 2^wlog(z) units.
  int wlog(int z) const { return wlog_[z]; }
  /// In-flight units of a stage of size z whose successors hold `succ` units (plan::required_in_flight
  /// in units: w x (1 + ceil(succ / w)), w = 2^wlog(z)), capped at the mini-batch.
  int after(int z, int succ) const {
    const int wl = wlog_[z];
    if (wl == 0) return std::min(succ + 1, num_micro_);  // the common case: the smallest size
    return std::min((((succ + (1 << wl) - 1) >> wl) + 1) << wl, num_micro_);
  }

 private:
  std::vector<int> sizes_;
  int8_t wlog_[32] = {};
  int num_micro_ = 0;
};

/// A stage's costs as the DP tests them (tps < 0: its communication terms not computed yet).
struct StageCostLite {
  double tps = -1, compute_tps = 0, state = 0, act = 0;
};

/// How a state's best plan starts: one struct per DP case (see docs/planner.md), in Entry::how.
/// Base case: items [i, end) form one stage on 2^plog devices at stage size `size` (an index
/// into the sizes); the rest of the sequence follows on the other devices.
struct StageCut {
  int32_t end = 0;
  int8_t plog = 0, size = 0;
};
/// Nested case: item i (a nested sequence) split recursively on `devices` (all of the state's
/// when it is the last item), the rest of the sequence on the others.
struct NestedSplit {
  int32_t devices = 0;
};
/// Join case (series): join option `option` of item i on `devices`, the rest after it on the others.
struct JoinPart {
  int32_t devices = 0;
  int16_t option = 0;
};
/// Merge case (parallel): items [i, k-1) and the first `head` items of the last item's sequence as
/// one stage on 2^plog devices at size `size`; the rest of that sequence on the others.
struct MergeCut {
  int32_t head = 0;
  int8_t plog = 0, size = 0;
};
/// Fork case (series): fork option `option` at item i, its block on `devices`, the rest of the
/// sequence after the block on the others.
struct ForkPart {
  int32_t devices = 0;
  int16_t option = 0;
};
/// std::monostate: no plan.
using Choice = std::variant<std::monostate, StageCut, NestedSplit, JoinPart, MergeCut, ForkPart>;

/// One memo entry: the best depth of a state and how it is reached.
struct Entry {
  int32_t val = kNoPlan;  // else min depth (in-flight, in units of the smallest size)
  Choice how;
  TargetRange range;  // the targets at which this entry is the state's answer
  bool found() const { return !std::holds_alternative<std::monostate>(how); }
};

/// What one DP's solves cost and what its bounds cut (all solves).
struct DpStats {
  size_t states = 0, solves = 0;
  size_t evals = 0;                              // stage evaluations
  size_t memory_pruned = 0;                      // states Bounds::memory_rules_out answered
  size_t rest_pruned = 0;                        // times the rest bound cut more than the two-stage floor
  size_t rests_reused = 0;                       // stage ends skipped for a rest known at a smaller degree
  size_t target_bounds = 0, ceiling_misses = 0;  // states solved with a floor or ceiling; ceilings not found again
  size_t probes = 0, probes_aborted = 0;         // memory probes, and those that ran out of budget
};

inline SizeUnits::SizeUnits(const std::vector<int>& sizes, int mini_batch)
    : sizes_(sizes), num_micro_(sizes.empty() ? 0 : mini_batch / sizes.front()) {
  for (size_t z = 0; z < sizes_.size() && z < 32 && sizes_[0] > 0; ++z)
    wlog_[z] = static_cast<int8_t>(std::countr_zero(static_cast<unsigned>(sizes_[z] / sizes_[0])));
}

}  // namespace gp::planner::detail
