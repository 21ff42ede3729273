// Internal: the planner DP's bounds (engine.h): proofs that a state has no plan (memory, a compute
// cap, the work lower bound), the depth floors of a series sequence's rest, and the rests base_case
// learnt at smaller degrees. None changes a result: each only skips what cannot be (or beat) one.
#pragma once
#include <cstddef>
#include <limits>
#include <optional>
#include <vector>

#include "cost/cost_model.h"
#include "planner/dp_types.h"
#include "planner/sp_structure.h"

namespace gp::planner::detail {

class Bounds {
 public:
  Bounds(const cost::CostModel& cm, const Structure& st, const SizeUnits& units, int num_devices, double memory_limit,
         DpStats* stats);

  /// A proof, before any solve, that no plan fits memory at any target: every op sits in one stage
  /// of p devices, each holding the stage's state and at least one micro-batch of its activations,
  /// so the n devices together hold at least, per op, the least over the stage sizes z and degrees p
  /// of state + p x activations at z / p; more than n x the limit rules every plan out.
  bool memory_never_fits() const;
  /// The same proof for one state (s, i, d, down), in O(log items) after a pass per sequence: a
  /// plan's stages' p devices together hold, per op, its state and at least `units` of its
  /// activations at its cheapest size and degree (`act_unit_`), where `units` is the in-flight of
  /// the op's stage: at least after(0, down) = min(down + 1, M) (its successors hold at least
  /// `down`), and in a chain (a series sequence of single ops) at least min(down + j, M) for the
  /// j-th stage from the end. There, since each stage's ops (state + one micro-batch of activations)
  /// must fit one device, packing the chain greedily from its end into stages that fit gives every
  /// op the smallest j any plan can give it. More than d x the limit in all rules out every plan of
  /// the state at every target.
  bool memory_rules_out(int s, int i, int d, int down);
  /// In series sequence s, can a choice whose rest starts at item j (the part before it, then the
  /// rest with `down` after it) be shallower than `best`? Every part of a series plan adds at least
  /// one unit of depth, and each part holds its single-op items in one stage, which must fit one
  /// device: a rest needing r parts is at least min(down + r, M) deep.
  bool rest_may_beat(int s, int j, int down, int best);
  /// The first m >= j at which rest_may_beat holds (k when none): the bound only weakens as m grows.
  int first_rest_beating(int s, int j, int down, int best);
  /// The first m >= j at which a chain's rest [m, end) may fit `devices` devices (a candidate
  /// count; down = 0 only), k when none: a stage [i, m) before it has no plan, and the bound only
  /// weakens as m grows.
  int first_rest_fitting(int s, int j, int devices, int down);
  /// The least device-seconds per sample of the suffix [i, end) of sequence s: per op, the least
  /// over every stage size and degree (each op of a plan may take any). A plan of the suffix on d
  /// devices with every stage's compute per sample at most T exists only if this is at most d x T.
  double work_lower_bound(int s, int i);
  /// A suffix whose work_lower_bound exceeds d x the compute cap has a stage above it.
  bool over_cap(int s, int i, int d);
  double compute_cap() const { return cap_; }
  void set_compute_cap(double cap) { cap_ = cap; }
  bool memory_bound() const { return mem_bound_; }
  void set_memory_bound(bool on) { mem_bound_ = on; }
  /// Chains only (empty otherwise, or before the sequence's first memory test): per item its
  /// greedy stage index from the end (non-increasing).
  const std::vector<int>& chain_stages(int s) const { return chain_stage_[s]; }
  /// The single-op items' memory need of items [j, end) of sequence s over one device's limit
  /// (after the sequence's first memory test): a rest from j may need more than one part.
  bool spine_over_limit(int s, int j) const { return spine_[s].back() - spine_[s][j] > mem_limit_ * (1 + 1e-9); }

  class KnownRests;

 private:
  void prepare_memory(int s);  // fills mem_state_, mem_act_ and spine_ of sequence s
  // A relaxed DP over the chain s (down = 0): a stage [i, m) whose first stage has c stages after it
  // holds at least f = min(c + 1, M) units in flight, so its p devices satisfy p x (limit - state) >=
  // f x its ops' act_unit_ (each device holds the whole state and its share of the activations),
  // and p >= 1; the least sum of p over the stages (p continuous, in-flight counts past 16 stages
  // taken as 16's) is a lower bound on the devices of every plan of the suffix.
  void chain_devices(int s);

  const cost::CostModel& cm_;
  const Structure& st_;
  const SizeUnits& units_;
  int n_;
  double mem_limit_;
  DpStats* stats_;
  bool mem_bound_ = true;
  // memory_rules_out's data: per op, the least bytes per in-flight unit any stage of it holds over
  // its p devices (min over sizes z and degrees p of p x activations at z / p, divided by the units
  // per micro-batch of size z); per sequence (filled on first use), prefix sums over its items of
  // the ops' state bytes and of act_unit_.
  std::vector<double> act_unit_;
  std::vector<std::vector<double>> mem_state_, mem_act_;
  // rest_may_beat's data: per op, the least activation bytes per device of one micro-batch (min over
  // sizes and degrees); per sequence, prefix sums over its single-op items of state + that.
  std::vector<double> act_dev_;
  std::vector<std::vector<double>> spine_;
  // Chains only (empty otherwise): per item its greedy stage index from the end (non-increasing),
  // and prefix sums of index x act_unit_.
  std::vector<std::vector<int>> chain_stage_;
  std::vector<std::vector<double>> chain_act_;
  // Chains only, with nothing after them (down = 0): per item i the fewest devices any plan of the
  // suffix [i, end) needs for memory (chain_devices).
  std::vector<std::vector<double>> chain_dev_;
  // set_compute_cap's cap.
  double cap_ = std::numeric_limits<double>::infinity();
  // work_lower_bound's per-sequence prefix sums (filled on first use).
  std::vector<std::vector<long double>> work_lb_;
  // KnownRests' slices: one per active base_case call (the DP's recursion nests them),
  // [top, top + k - i), filled lazily up to the largest end seen.
  std::vector<std::optional<int>> known_rest_;
  size_t known_top_ = 0;
};

/// base_case's rests per stage end m < k as looked up at a smaller degree (kNoPlan: infeasible), in
/// its slice of the bounds' storage, released on return. A larger degree leaves the rest fewer
/// devices, and a state's depth only grows (or it becomes infeasible) with fewer devices, at the same
/// target. So where the known rest already could not beat the best, the stage end is skipped at
/// every larger degree: its tests there could not change the best (skipping them only shifts where
/// the next stage end fails the same compute or memory test; the rest's time tests were met into
/// the state's range when it was looked up).
class Bounds::KnownRests {
 public:
  KnownRests(Bounds* b, int i, int k) : b_(b), base_(b->known_top_), i_(i), filled_(i) {
    b_->known_top_ += static_cast<size_t>(k - i);
    if (b_->known_rest_.size() < b_->known_top_) b_->known_rest_.resize(2 * b_->known_top_);
  }
  ~KnownRests() { b_->known_top_ = base_; }
  KnownRests(const KnownRests&) = delete;
  KnownRests& operator=(const KnownRests&) = delete;
  void set(int m, int rest) {
    if (filled_ < m) {  // the ends in between were never looked up
      std::fill(b_->known_rest_.begin() + slot(filled_ + 1), b_->known_rest_.begin() + slot(m), std::nullopt);
      filled_ = m;
    }
    b_->known_rest_[slot(m)] = rest;
  }
  // Whether the rest after m, known from a smaller degree, rules m out against `best`: infeasible,
  // or already as deep as best (series: the stage adds a unit; parallel: it runs beside the rest).
  bool cannot_beat(int m, int best, bool parallel) const {
    if (m > filled_) return false;
    const std::optional<int>& r = b_->known_rest_[slot(m)];
    if (!r) return false;
    return *r < 0 || (best >= 0 && (parallel ? *r : b_->units_.after(0, *r)) >= best);
  }
  // The first end in [m, stop) that cannot_beat does not rule out (stop when none).
  int first_open(int m, int stop, int best, bool parallel) const {
    while (m < stop && cannot_beat(m, best, parallel)) ++m;
    return m;
  }

 private:
  size_t slot(int m) const { return base_ + static_cast<size_t>(m - i_ - 1); }
  Bounds* b_;
  size_t base_;
  int i_, filled_;  // slots of ends (i, filled_] are set (nullopt where never looked up)
};

}  // namespace gp::planner::detail
