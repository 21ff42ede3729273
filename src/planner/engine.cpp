// The DP over sequences (GraphPipe paper, section 5: base / series / parallel cases). Each case's
// search is followed by its collect_* (the stages of the choice it records).
#include "planner/engine.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <utility>
#include <variant>

namespace gp::planner::detail {

namespace {

// The stage sizes, checked: powers of two, ascending, each dividing the mini-batch.
const std::vector<int>& checked_sizes(const StageSizes& sizes, int mini_batch, const Structure& st, int num_devices) {
  const std::vector<int>& z = sizes.sizes;
  GP_ASSERT(st.seqs.size() < 65536 && num_devices < 65536, "structure too large");
  GP_ASSERT(!z.empty() && z.size() < 32, "stage sizes: {}", z.size());
  for (size_t j = 0; j < z.size(); ++j)
    GP_ASSERT(std::has_single_bit(static_cast<unsigned>(z[j])) && mini_batch % z[j] == 0 && (j == 0 || z[j] > z[j - 1]),
              "stage size {} of mini-batch {}", z[j], mini_batch);
  return z;
}

// Device counts a state can have: the candidates and n itself (the root's).
std::vector<int> memo_counts(int n) {
  std::vector<int> counts = device_candidates(n);
  counts.push_back(n);
  return counts;
}

// Takes a choice that is strictly shallower than `best`.
void keep(Entry* best, int val, const Choice& how) {
  if (val < 0 || (best->val >= 0 && val >= best->val)) return;
  *best = {val, how, {}};
}

}  // namespace

SeqDp::SeqDp(const cost::CostModel& cm, const Structure& st, const StageSizes& sizes, int mini_batch,
             double memory_limit, int num_devices, bool same_node)
    : cm_(cm),
      st_(st),
      units_(checked_sizes(sizes, mini_batch, st, num_devices), mini_batch),
      n_(num_devices),
      mem_limit_(memory_limit),
      memo_(st, num_devices, memo_counts(num_devices)),
      costs_(cm, st, units_, mini_batch, num_devices, same_node),
      bounds_(cm, st, units_, num_devices, memory_limit, &stats_) {
  floor_cand_.assign(n_ + 1, 0);
  auto cands = device_candidates(n_);
  for (int d = 1, c = 0; d <= n_; ++d) {
    while (c + 1 < static_cast<int>(cands.size()) && cands[c + 1] <= d) ++c;
    floor_cand_[d] = cands[c];
  }
}

int SeqDp::down_of(const Seq& q, int i, int m, int down) const {
  if (q.join_item < 0 || (i <= q.join_item && q.join_item < m)) return down;
  // Feeds the join stage: at most the in-flight of a join stage of the largest size.
  return after(units_.count() - 1, down);
}

inline bool SeqDp::memo_answer(const Memo::Cell& c, int* val) {
  const bool never = c.infeasible_below == std::numeric_limits<double>::infinity();
  if (never || tmax_ < c.infeasible_below) {  // infeasible here and at every smaller target
    range_.meet({-std::numeric_limits<double>::infinity(), c.infeasible_below, !never});
    *val = kNoPlan;
    return true;
  }
  if (c.has_entry && c.e.range.holds(tmax_)) {
    range_.meet(c.e.range);
    *val = c.e.val;
    return true;
  }
  return false;
}

// The minimal depth (in-flight micro-batches of its first stages) of the suffix [i, end) of
// sequence s on at most d devices, given `down` micro-batches in flight after it; kNoPlan when no plan
// of it meets the target and fits memory. Five cases, each keeping the best in `best`. A memo
// entry from an earlier target is the answer here when the target lies in its TargetRange.
int SeqDp::go(int s, int i, int d, int down) {
  if (d < 1) return kNoPlan;
  // Identical sequences are solved once, on their representative (the answer is positional:
  // collect() maps it onto each sequence's own items).
  s = st_.canon(s);
  if (work_.aborted) {  // the memory probe ran out of budget: nothing more is solved
    range_.meet(TargetRange::none());
    return kNoPlan;
  }
  // What an answer at another target tells of this one (see below).
  int known_floor = -1, known_ceiling = -1;
  double floor_until = 0;
  if (const Memo::Cell* c = memo_.cell(s, i, d, down, false)) {
    if (int v; memo_answer(*c, &v)) return v;
    // The answer found at another target, where it holds at its range's lo (an unfinished
    // one's range is empty): at a smaller target this one is at least as deep, at a larger one
    // at most (a larger target admits every plan a smaller one does).
    if (switches_.target_bounds && c->has_entry && !c->e.range.empty()) {
      if (tmax_ < c->e.range.lo) known_floor = c->e.val, floor_until = c->e.range.lo;
      else if (c->e.val < units_.num_micro()) known_ceiling = c->e.val;
    }
  }
  // Memory alone rules the state out at every target (the range is untouched: no time test), and
  // so does the compute cap (fixed for this DP). Both are kept in the memo as infeasible at every
  // target, which a later visit reads the same way (no range change).
  if (bounds_.memory_rules_out(s, i, d, down) || bounds_.over_cap(s, i, d)) {
    memo_.cell(s, i, d, down, true)->infeasible_below = std::numeric_limits<double>::infinity();
    return kNoPlan;
  }
  // Prune by the target: d devices cannot run more than d x T device-seconds per sample. Kept in
  // the memo as infeasible below that value (a later visit at a smaller target reads it there).
  const double per_device = bounds_.work_lower_bound(s, i) / (d * (1 + 1e-9));
  if (per_device > tmax_) {
    range_.reject(per_device);
    Memo::Cell* c = memo_.cell(s, i, d, down, true);
    c->infeasible_below = std::max(c->infeasible_below, per_device);
    return kNoPlan;
  }
  ++stats_.states;
  // The time tests this state's answer rests on: its own, then its subtree's (range_ collects
  // them from the children, memoised ones included).
  const TargetRange outer = range_;
  range_ = {};
  range_.accept(per_device);
  // No plan of the suffix is shallower than its first stages of the smallest size (in-flight
  // after(0, down)), nor than a floor known from a larger target: each case stops when it gets
  // there. A ceiling known from a smaller target (its plan still meets this one) starts the search
  // as if a plan one unit deeper had been found, so the cases' bounds skip what cannot reach it.
  // Either way the answer is what a search without them finds (keep() takes only strictly better
  // plans: the first plan to reach the optimum wins in both), wherever they hold. The floor holds
  // at targets up to floor_until: the range is cut there. The ceiling needs no cut: wherever the
  // range holds, the plan found (at most the ceiling deep) meets the target, so it holds there.
  const int floor_val = std::max(after(0, down), known_floor);
  Entry best;
  if (known_ceiling >= 0) best.val = known_ceiling + 1;
  cases(s, i, d, down, floor_val, &best);
  if (known_ceiling >= 0 && !best.found() && !work_.aborted) {
    // The ceiling's plan was not found again: some bound of the cases assumed more than holds.
    // Searched again without it (the tests count these: none so far).
    ++stats_.ceiling_misses;
    range_ = {};
    range_.accept(per_device);
    best = {};
    cases(s, i, d, down, floor_val, &best);
  }
  stats_.target_bounds += known_floor >= 0 || known_ceiling >= 0;
  if (best.val == floor_val && floor_val > after(0, down)) range_.reject(floor_until);
  best.range = range_;
  range_.meet(outer);
  memo_.store(s, i, d, down, best);
  return best.val;
}

void SeqDp::cases(int s, int i, int d, int down, int floor_val, Entry* best) {
  base_case(s, i, d, down, floor_val, best);
  if (best->val != floor_val) nested_case(s, i, d, down, floor_val, best);
  if (best->val != floor_val) join_case(s, i, d, down, floor_val, best);
  if (best->val != floor_val) merge_case(s, i, d, down, floor_val, best);
  if (best->val != floor_val) fork_case(s, i, d, down, floor_val, best);
}

template <class Head, class Full, class Depth>
SeqDp::SizePick SeqDp::pick_size(uint32_t* alive, int plog, int floor_succ, int bound, Head head, Full full,
                                 Depth depth, uint32_t* parked) {
  // Sizes ruled out for their depth floor: for good, or (`parked`) until the floor changes.
  auto drop = [&](uint32_t bits) {
    *alive &= ~bits;
    if (parked) *parked |= bits;
  };
  for (int z = 0; z < units_.count(); ++z) {
    if (!(*alive >> z & 1)) continue;
    if (bound >= 0 && after(z, floor_succ) >= bound) {  // neither this size nor a larger one beats `bound`
      drop(*alive & ~((1u << z) - 1));
      break;
    }
    if (++stats_.evals - work_.solve_start > work_.budget && work_.budget > 0)
      work_.aborted = true;  // memory_probe gives up
    if (work_.aborted) {
      range_.meet(TargetRange::none());  // an unfinished answer: never reused nor taken as memory-only
      *alive = 0;
      return {};
    }
    StageCostLite c = head(z);
    if (c.compute_tps > bounds_.compute_cap()) {  // above the DP's fixed cap: so is every larger stage of this shape
      *alive &= ~(1u << z);
      continue;
    }
    if (!within(c.compute_tps)) {  // so is every larger stage of this shape at this size
      *alive &= ~(1u << z);
      continue;
    }
    if (!fits(c, after(z, floor_succ), z)) {
      drop(1u << z);
      continue;
    }
    if (tmax_ == std::numeric_limits<double>::infinity()) {
      // Every stage meets an infinite target: its full cost (communication, all-reduce) is not
      // needed, and the answer holds at that target only (the memory probe's solve).
      range_.accept(tmax_);
    } else {
      // `full` may decline a size without a time test (a memory floor that only holds here).
      if (!full(z, &c) || !within(c.tps)) continue;
    }
    // A larger size only deepens the stage (after() grows with the size): the first that fits wins.
    const SizedDepth r = depth(z, c);
    if (r.kind == SizedDepth::Kind::rest_infeasible) return {};
    if (r.kind == SizedDepth::Kind::over_memory) continue;
    return {z, r.own, r.val};
  }
  return {};
}

// The sizes a stage on 2^plog devices may take: each a multiple of its device count.
uint32_t SeqDp::sizes_for(int plog) const {
  uint32_t mask = 0;
  for (int z = 0; z < units_.count(); ++z)
    if (units_.size(z) >= (1 << plog)) mask |= 1u << z;
  return mask;
}

// In a series sequence, a choice that leaves a rest of the sequence (from item j) after its part is
// at least one unit deeper than the rest, and the rest at least one unit per part deeper than
// `down` (after() only grows with the size and with what follows), so it improves on `best` only
// while best is deeper than that (rest_may_beat; with one part per rest: the part, then at least
// one stage). Skipping such choices changes no result: keep() takes only strictly better ones.
// (Parallel sequences put the rest beside, not after: always true.)
bool SeqDp::beats_with_rest(const Seq& q, int s, int j, const Entry* best, int down) {
  return q.parallel || bounds_.rest_may_beat(s, j, down, best->val);
}

// Base case: items [i, m) form one stage on p = 2^plog devices at the smallest size that meets
// the target; the rest is solved recursively. Per degree, m grows until every size's compute alone
// exceeds the target, or its memory at the shallowest possible depth exceeds the limit (both only
// grow with m).
void SeqDp::base_case(int s, int i, int d, int down, int floor_val, Entry* best) {
  const Seq& q = st_.seqs[s];
  const int k = static_cast<int>(q.items.size());
  const int pcap = std::bit_width(static_cast<unsigned>(std::min(d, units_.largest()))) - 1;
  // A chain whose rest may need more than one stage (the greedy count only falls with m): the
  // memory test below at the rest's least in-flight can decline sizes early.
  const std::vector<int>& chain_stages = bounds_.chain_stages(s);
  const bool chain_floor = bounds_.memory_bound() && !q.parallel && i + 1 < k && !chain_stages.empty() &&
                           chain_stages[i + 1] > 1;
  // Whether a rest here may need more than one part (else rest_may_beat is the two-stage floor).
  const bool rest_lb = chain_floor || (bounds_.memory_bound() && !q.parallel && i + 1 < k && chain_stages.empty() &&
                                       bounds_.spine_over_limit(s, i + 1));
  Bounds::KnownRests known(&bounds_, i, k);  // the rests looked up at smaller degrees (see KnownRests)
  const int* chain_stage = chain_floor ? chain_stages.data() : nullptr;
  for (int plog = 0; plog <= pcap && best->val != floor_val; ++plog) {
    const int p = 1 << plog;
    // The rests' memo slots at d - p devices (go()'s first lookup, done here for the common case).
    const int rest_d = floor_cand(d - p);
    const Memo::Slot* rest_slots = rest_d >= 1 ? memo_.row(s, rest_d) : nullptr;
    // In a series sequence a stage with a rest after it has at least after(0, down) units after
    // it, so its sizes are tested against that floor; a size that fails it (memory, or the bound)
    // is parked: it fails for every longer stage with a rest too, but may still fit as the stage
    // to the end, whose floor is `down`. So in a join block's parallel sequence: a group without
    // the join item (the last) feeds the join stage, one more unit than the group with it.
    uint32_t alive = sizes_for(plog), parked = 0;
    // A chain's rest needs some devices: the stage ends whose rest cannot fit the d - p left.
    const int fit_from = !q.parallel && d - p >= 1 ? bounds_.first_rest_fitting(s, i + 1, floor_cand(d - p), down)
                                                   : i + 1;
    std::optional<int> beat_for;  // the best value skip_to was found for
    int skip_to = fit_from;
    for (int m = d - p < 1 ? k : i + 1; m <= k && (alive || parked); ++m) {
      // A stage whose rest cannot be shallow enough to beat best is skipped (the rest's bound only
      // weakens as m grows; a skipped m's size tests fail the same way at the next m: compute and
      // memory only grow with the stage).
      if (m < k && alive && !q.parallel) {
        if (beat_for != best->val) {  // the first stage end whose rest may fit and beat best
          beat_for = best->val;
          skip_to = std::max(fit_from, !rest_lb ? (best->val >= 0 && best->val <= after(0, after(0, down)) ? k : i + 1)
                                                : bounds_.first_rest_beating(s, i + 1, down, best->val));
        }
        if (m < skip_to) m = skip_to;
      }
      if (q.join_from >= 0 && m > q.join_from && m < k) m = k;  // the join ops share the last stage
      if (m < k && !alive) m = k;                               // only the stage to the end
      if (m == k) alive |= std::exchange(parked, 0);
      if (m < k && switches_.rest_reuse && known.cannot_beat(m, best->val, q.parallel)) {
        // So are the ends after it up to the next one it does not rule out: nothing above changes
        // between them (best, alive and skip_to stay; the join clamp starts at join_from + 1).
        const int next = known.first_open(m + 1, q.join_from >= 0 ? std::min(k, q.join_from + 1) : k, best->val,
                                          q.parallel);
        stats_.rests_reused += static_cast<size_t>(next - m);
        m = next - 1;
        continue;
      }
      const bool two_stages = !q.parallel && m < k;
      // The least in-flight of the rest of a chain (0: no floor beyond after(0, down)).
      const int rest_units = two_stages && chain_floor && chain_stage[m] > 1
                                 ? std::min(down + chain_stage[m], units_.num_micro())
                                 : 0;
      std::optional<int> rest;  // what follows the stage, solved once for all sizes
      auto rest_of = [&] {
        if (rest) return *rest;
        if (m == k) return *(rest = q.parallel ? 0 : down);
        const Memo::Slot& sl = rest_slots[m];
        int v = 0;
        if (work_.aborted || !sl.filled || sl.down != down || !memo_answer(sl.cell, &v)) v = go(s, m, rest_d, down);
        return *(rest = v);
      };
      const SizePick pick = pick_size(
          &alive, plog,
          q.parallel   ? down_of(q, i, m, down)
          : two_stages ? after(0, down)
                       : down,
          best->val, [&](int z) { return costs_.head(s, i, m, plog, z); },
          [&](int z, StageCostLite* c) {
            // In a chain the rest needs at least its greedy stage count: a size that cannot hold
            // that much in flight fails the memory test below whatever the rest's depth (its full
            // cost and the rest are not needed).
            if (rest_units > 0 && !fits(*c, after(z, rest_units), z)) return false;
            costs_.complete(s, i, m, plog, z, c);
            return true;
          },
          [&](int z, const StageCostLite& c) -> SizedDepth {
            if (q.parallel) {  // parallel: a group of branches as one stage beside the rest
              const int self = after(z, down_of(q, i, m, down));
              if (!fits(c, self, z)) return {SizedDepth::Kind::over_memory};
              if (rest_of() < 0) return {SizedDepth::Kind::rest_infeasible};
              return {SizedDepth::Kind::fits, self, std::max(self, *rest)};
            }
            if (rest_of() < 0) return {SizedDepth::Kind::rest_infeasible};  // series: this stage feeds the rest
            const int own = after(z, *rest);
            if (!fits(c, own, z)) return {SizedDepth::Kind::over_memory};
            return {SizedDepth::Kind::fits, own, own};
          },
          two_stages || (q.join_item >= 0 && m < k) ? &parked : nullptr);
      if (m < k && rest) known.set(m, *rest);
      if (pick.z < 0) continue;
      keep(best, pick.val, StageCut{m, static_cast<int8_t>(plog), static_cast<int8_t>(pick.z)});
      if (best->val == floor_val) break;
    }
  }
}

void SeqDp::collect_stage(int s, int i, int d, int down, const StageCut& c, std::vector<StageChoice>* out) {
  const Seq& q = st_.seqs[s];
  const int k = static_cast<int>(q.items.size());
  const int m = c.end, p = 1 << c.plog;
  StageChoice sc;
  for (int j = i; j < m; ++j) sc.ops.insert(sc.ops.end(), q.items[j].ops.begin(), q.items[j].ops.end());
  sc.dp = p;
  sc.tps_s = costs_.full(s, i, m, c.plog, c.size).tps;
  sc.mbs = units_.size(c.size);
  out->push_back(std::move(sc));
  if (m < k) collect(s, m, floor_cand(d - p), down, out);
}

// Nested case: item i is itself a series/parallel subgraph, split recursively on d1 devices; in a
// series sequence it runs before the rest (its `down` is the rest's depth), in a parallel one
// beside it.
void SeqDp::nested_case(int s, int i, int d, int down, int floor_val, Entry* best) {
  const Seq& q = st_.seqs[s];
  const int k = static_cast<int>(q.items.size());
  const int c = q.items[i].seq;
  if (c < 0) return;
  const int own_down = q.parallel ? down_of(q, i, i + 1, down) : down;
  if (i + 1 == k) return keep(best, go(c, 0, d, own_down), NestedSplit{d});
  for (int d1 = 1; d1 < d && best->val != floor_val && beats_with_rest(q, s, i + 1, best, down); ++d1) {
    if (floor_cand(d1) != d1) continue;
    const int rest = go(s, i + 1, floor_cand(d - d1), down);
    if (rest < 0) continue;
    const int mine = go(c, 0, d1, q.parallel ? own_down : rest);
    if (mine < 0) continue;
    keep(best, q.parallel ? std::max(mine, rest) : mine, NestedSplit{d1});
  }
}

void SeqDp::collect_nested(int s, int i, int d, int down, const NestedSplit& c, std::vector<StageChoice>* out) {
  const Seq& q = st_.seqs[s];
  const int k = static_cast<int>(q.items.size());
  const int inner = q.items[i].seq;
  const int own_down = q.parallel ? down_of(q, i, i + 1, down) : down;
  if (i + 1 == k) return collect(inner, 0, d, own_down, out);
  const int d1 = c.devices, rd = floor_cand(d - d1);
  const int rest = go(s, i + 1, rd, down);
  collect(s, i + 1, rd, down, out);
  collect(inner, 0, d1, q.parallel ? own_down : rest, out);
}

// A part of series sequence s (a block with its join or fork ops) followed by the rest of the
// sequence from item `after`: the part on d1 devices with the rest's depth after it, the rest on
// the others (the part alone on all d when nothing follows). `part(d1, down)` is the part's depth,
// `make(d1)` the choice that records it.
template <class Part, class Make>
void SeqDp::part_then_rest(int s, int after, int d, int down, int floor_val, Entry* best, Part part, Make make) {
  if (after == static_cast<int>(st_.seqs[s].items.size())) return keep(best, part(d, down), make(d));
  for (int d1 = 1; d1 < d && best->val != floor_val && beats_with_rest(st_.seqs[s], s, after, best, down); ++d1) {
    if (floor_cand(d1) != d1) continue;
    const int rest = go(s, after, floor_cand(d - d1), down);
    if (rest < 0) continue;
    keep(best, part(d1, rest), make(d1));
  }
}

std::pair<int, int> SeqDp::collect_rest(int s, int after, int d, int down, int devices, std::vector<StageChoice>* out) {
  if (after == static_cast<int>(st_.seqs[s].items.size())) return {d, down};
  const int rd = floor_cand(d - devices);
  const int rest = go(s, after, rd, down);
  collect(s, after, rd, down, out);
  return {devices, rest};
}

// Join case (series sequences): the parallel block at item i and the ops after it up to a
// tail_end, with those ops in the last stage of one branch (JoinOption); the rest after tail_end.
void SeqDp::join_case(int s, int i, int d, int down, int floor_val, Entry* best) {
  const auto* opts = st_.joins_at(s, i);
  if (!opts) return;
  for (int o = 0; o < static_cast<int>(opts->size()) && best->val != floor_val; ++o) {
    const JoinOption& jo = (*opts)[o];
    part_then_rest(
        s, jo.tail_end, d, down, floor_val, best, [&](int d1, int dn) { return go(jo.block, 0, d1, dn); },
        [o](int d1) {
          return JoinPart{d1, static_cast<int16_t>(o)};
        });
  }
}

void SeqDp::collect_join(int s, int i, int d, int down, const JoinPart& c, std::vector<StageChoice>* out) {
  const JoinOption& jo = (*st_.joins_at(s, i))[c.option];
  const auto [d1, part_down] = collect_rest(s, jo.tail_end, d, down, c.devices, out);
  collect(jo.block, 0, d1, part_down, out);
}

// Merge case (parallel sequences): the remaining branches but the last, together with the first x
// items of the last branch's series sequence, form one stage; the rest of that branch runs after
// it on the other devices. (A branch's head shares a stage with the lighter branches beside it,
// e.g. in a join block the extended branch's head with the branches that feed its join stage.)
void SeqDp::merge_case(int s, int i, int d, int down, int floor_val, Entry* best) {
  const Seq& q = st_.seqs[s];
  const int k = static_cast<int>(q.items.size());
  if (!q.parallel || i + 1 >= k) return;
  const int c = q.items[k - 1].seq;
  if (c < 0 || st_.seqs[c].parallel) return;
  const Seq& cs = st_.seqs[c];
  // The prefix stays clear of the join ops (they share the branch's last stage).
  const int xmax = cs.join_from >= 0 ? cs.join_from : static_cast<int>(cs.items.size()) - 1;
  const int others = down_of(q, i, k - 1, down);  // what follows the group of branches
  const int own_down = down_of(q, k - 1, k, down);
  const int pcap = std::bit_width(static_cast<unsigned>(std::min(d - 1, units_.largest()))) - 1;
  for (int plog = 0; plog <= pcap && best->val != floor_val; ++plog) {
    const int p = 1 << plog;
    uint32_t alive = sizes_for(plog);
    for (int x = 1; x <= xmax && alive; ++x) {
      std::optional<int> rest;
      // Compute, state and activations add up over the two ranges: the breaks need no full cost.
      const SizePick pick = pick_size(
          &alive, plog, down, best->val,
          [&](int z) {
            const StageCostLite group = costs_.head(s, i, k - 1, plog, z), head = costs_.head(c, 0, x, plog, z);
            return StageCostLite{-1, group.compute_tps + head.compute_tps, group.state + head.state,
                                 group.act + head.act};
          },
          [&](int z, StageCostLite* cst) { return *cst = costs_.merge(s, i, x, plog, z), true; },
          [&](int z, const StageCostLite& cst) -> SizedDepth {
            if (!rest) rest = go(c, x, floor_cand(d - p), own_down);
            if (*rest < 0) return {SizedDepth::Kind::rest_infeasible};
            const int own = after(z, std::max(others, *rest));
            if (!fits(cst, own, z)) return {SizedDepth::Kind::over_memory};
            return {SizedDepth::Kind::fits, own, own};
          });
      if (pick.z < 0) continue;
      keep(best, pick.val, MergeCut{x, static_cast<int8_t>(plog), static_cast<int8_t>(pick.z)});
      if (best->val == floor_val) break;
    }
  }
}

void SeqDp::collect_merge(int s, int i, int d, int down, const MergeCut& c, std::vector<StageChoice>* out) {
  const Seq& q = st_.seqs[s];
  const int k = static_cast<int>(q.items.size());
  StageChoice sc;
  sc.ops = costs_.merge_ops(s, i, c.head);
  sc.dp = 1 << c.plog;
  sc.tps_s = costs_.merge(s, i, c.head, c.plog, c.size).tps;
  sc.mbs = units_.size(c.size);
  const int rd = floor_cand(d - sc.dp);
  out->push_back(std::move(sc));
  collect(q.items[k - 1].seq, c.head, rd, down_of(q, k - 1, k, down), out);
}

// Fork case (series sequences): the ops [i, block) before a parallel block share the first stage
// of one branch (ForkOption); the rest of the sequence after the block runs on the other devices.
void SeqDp::fork_case(int s, int i, int d, int down, int floor_val, Entry* best) {
  const auto* opts = st_.forks_at(s, i);
  if (!opts) return;
  for (int o = 0; o < static_cast<int>(opts->size()) && best->val != floor_val; ++o) {
    const ForkOption& fo = (*opts)[o];
    part_then_rest(
        s, fo.block_item + 1, d, down, floor_val, best, [&](int d1, int dn) { return fork_block(fo, d1, dn).val; },
        [o](int d1) {
          return ForkPart{d1, static_cast<int16_t>(o)};
        });
  }
}

void SeqDp::collect_fork(int s, int i, int d, int down, const ForkPart& c, std::vector<StageChoice>* out) {
  const ForkOption& fo = (*st_.forks_at(s, i))[c.option];
  const auto [dblk, after_down] = collect_rest(s, fo.block_item + 1, d, down, c.devices, out);
  const ForkBlock fp = fork_block(fo, dblk, after_down);
  const int len = static_cast<int>(st_.seqs[fo.ext].items.size());
  StageChoice sc;
  for (int j = 0; j < fp.m; ++j) {
    const auto& ops = st_.seqs[fo.ext].items[j].ops;
    sc.ops.insert(sc.ops.end(), ops.begin(), ops.end());
  }
  sc.dp = 1 << fp.plog;
  sc.tps_s = costs_.full(fo.ext, 0, fp.m, fp.plog, fp.z).tps;
  sc.mbs = units_.size(fp.z);
  out->push_back(std::move(sc));
  if (fp.m < len) collect(fo.ext, fp.m, floor_cand(fp.d1 - (1 << fp.plog)), after_down, out);
  collect(fo.others, 0, floor_cand(dblk - fp.d1), after_down, out);
}

// Branch j with the fork ops on d1 devices (its first stage [0, m) on p of them, the rest of it
// after), the other branches on d - d1: the first stage feeds both, so its depth is one more than
// the deeper of the two.
const SeqDp::ForkBlock& SeqDp::fork_block(const ForkOption& fo, int d, int down) {
  const uint64_t key = (uint64_t(st_.canon(fo.ext)) << 40) | (uint64_t(d) << 20) | uint64_t(down);
  auto it = fork_memo_.find(key);
  if (it != fork_memo_.end() && it->second.range.holds(tmax_)) {
    range_.meet(it->second.range);
    return it->second;
  }
  const TargetRange outer = range_;
  range_ = {};
  ForkBlock best;
  const Seq& c = st_.seqs[fo.ext];
  const int len = static_cast<int>(c.items.size());
  for (int d1 = 1; d1 < d; ++d1) {
    if (floor_cand(d1) != d1) continue;
    const int others = go(fo.others, 0, floor_cand(d - d1), down);
    if (others < 0) continue;
    const int lo = after(0, others);  // no first stage is shallower
    if (best.val >= 0 && lo >= best.val) continue;
    const int pcap = std::bit_width(static_cast<unsigned>(std::min(d1, units_.largest()))) - 1;
    for (int plog = 0; plog <= pcap && best.val != lo; ++plog) {
      const int p = 1 << plog;
      uint32_t alive = sizes_for(plog);
      for (int m = d1 - p < 1 ? len : c.fork_to; m <= len && alive; ++m) {
        std::optional<int> rest;
        const SizePick pick = pick_size(
            &alive, plog, others, best.val, [&](int z) { return costs_.head(fo.ext, 0, m, plog, z); },
            [&](int z, StageCostLite* cst) { return costs_.complete(fo.ext, 0, m, plog, z, cst), true; },
            [&](int z, const StageCostLite& cst) -> SizedDepth {
              if (!rest) rest = m < len ? go(fo.ext, m, floor_cand(d1 - p), down) : down;
              if (*rest < 0) return {SizedDepth::Kind::rest_infeasible};
              const int own = after(z, std::max(*rest, others));
              if (!fits(cst, own, z)) return {SizedDepth::Kind::over_memory};
              return {SizedDepth::Kind::fits, own, own};
            });
        if (pick.z < 0) continue;
        if (best.val < 0 || pick.val < best.val) best = {pick.val, d1, plog, m, pick.z};
        if (best.val == lo) break;
      }
    }
  }
  best.range = range_;
  range_.meet(outer);
  return fork_memo_[key] = best;
}

void SeqDp::collect(int s, int i, int d, int down, std::vector<StageChoice>* out) {
  // A memo entry that holds here may have been answered from its own entry while the entries
  // below it were replaced at other targets: go() solves such a state again (the same answer).
  const Entry* found = memo_.find(s, i, d, down, tmax_);
  if (!found) {
    go(s, i, d, down);
    found = memo_.find(s, i, d, down, tmax_);
  }
  GP_ASSERT(found && found->val >= 0, "collect on an unsolved state");
  const Choice how = found->how;  // a copy: collecting below may replace memo entries
  if (const auto* c = std::get_if<StageCut>(&how)) return collect_stage(s, i, d, down, *c, out);
  if (const auto* c = std::get_if<NestedSplit>(&how)) return collect_nested(s, i, d, down, *c, out);
  if (const auto* c = std::get_if<JoinPart>(&how)) return collect_join(s, i, d, down, *c, out);
  if (const auto* c = std::get_if<MergeCut>(&how)) return collect_merge(s, i, d, down, *c, out);
  if (const auto* c = std::get_if<ForkPart>(&how)) return collect_fork(s, i, d, down, *c, out);
  GP_ASSERT(false, "bad memo entry");
}

SolveResult SeqDp::solve(double target_tps, std::vector<StageChoice>* out) {
  ++stats_.solves;
  tmax_ = target_tps * (1 + 1e-12);
  range_ = {};
  work_.aborted = false;
  work_.solve_start = stats_.evals;
  int v = go(st_.root, 0, n_, 0);
  if (work_.budget == 0) work_.max_solve_evals = std::max(work_.max_solve_evals, stats_.evals - work_.solve_start);
  if (work_.aborted) return SolveResult::no_plan();
  // No stage or suffix was rejected for its time: the search failed on memory alone, and a larger
  // target (which only admits more stages) fails the same way.
  if (v < 0) return range_.unbounded_above() ? SolveResult::never_feasible() : SolveResult::no_plan();
  if (out) {
    out->clear();
    collect(st_.root, 0, n_, 0, out);
  }
  return SolveResult::plan(v);
}

}  // namespace gp::planner::detail
