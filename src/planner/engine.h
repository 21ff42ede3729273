// Internal: the memoised dynamic program shared by GraphPipe (over the series-parallel structure)
// and PipeDream (over one topological chain), for one micro-batch size and one target TPS.
#pragma once
#include <cstdint>
#include <algorithm>
#include <functional>
#include <limits>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cost/cost_model.h"
#include "plan/plan.h"
#include "planner/range_cost.h"

namespace gp::planner::detail {

/// One element of a sequence: a single op, or a nested sequence (with all ops under it).
struct Item {
  int seq = -1;               // nested sequence index, or -1 for a single op
  std::vector<OpId> ops;      // every op under this item
  double work_s = 0;          // fwd+bwd time at batch 1 (for sorting parallel branches)
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

/// A stage the DP chose.
struct StageChoice {
  std::vector<OpId> ops;
  int dp = 1;
  double tps_s = 0;   // under the DP's placement assumption
  int mbs = 0;        // its micro-batch size (0: the plan's, the size assemble() is given)
};

/// Binary search on the target TPS (the paper's outer loop): `solve(T, out)` returns the depth of
/// a plan with every stage TPS <= T, -1, or -2 (no plan at any target: stop). `never_feasible`
/// (optional) is asked once, after the second failed target, whether no plan fits at any target;
/// `on_plan` (optional) sees the plan of every feasible solve. Finds the smallest feasible target within relative
/// tolerance `tol`; false when no plan fits memory (or none beats `upper` when upper > 0).
bool minimise_target(const std::function<int(double, std::vector<StageChoice>*)>& solve, int n,
                     double tol, double upper, double guess, double* best_tps,
                     std::vector<StageChoice>* best,
                     const std::function<bool()>& never_feasible = {},
                     const std::function<void(const std::vector<StageChoice>&)>& on_plan = {});

/// How assemble() orders the stages and declares stage edges.
enum class Order {
  dag,          // a stage DAG: topological order, edges from op edges only (GraphPipe's SP plans)
  chain,        // the choices' order (a linearisation), edges from op edges only
  chain_edges,  // the choices' order plus declared edges k -> k+1: a sequential pipeline (baselines)
};

/// From the DP's stage choices to a placed, re-costed plan with its predictions (assemble.cpp).
/// `mbs`: the micro-batch size of every stage whose choice has none of its own.
plan::Plan assemble(const cost::CostModel& cm, const std::vector<StageChoice>& choices, int mbs,
                    int mini_batch, double memory_limit, Order order, std::vector<std::string>* explain);

/// Candidate device counts: all of 1..n for n <= 64, else powers of two and multiples of n/32.
std::vector<int> device_candidates(int n);

/// The stage micro-batch sizes one DP may choose from (the schedule configuration, paper section 5):
/// powers of two, ascending, each dividing the mini-batch. In-flight counts are kept in units of
/// the smallest (`sizes[0]` samples), so stages of different sizes compose; with one size the unit
/// is a micro-batch.
struct StageSizes {
  std::vector<int> sizes;
  static StageSizes uniform(int micro_batch) { return {{micro_batch}}; }
  /// `largest` and the sizes below it down to largest / 2^spread (at least 1).
  static StageSizes window(int largest, int spread);
};

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
  static TargetRange none() {  // holds nowhere (an unfinished computation)
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

/// The DP for one structure and a set of stage micro-batch sizes (one, or a window: each stage
/// takes the smallest that meets the target). Stage costs are cached across targets; memo entries
/// are kept across targets with the TargetRange over which they hold.
class SeqDp {
 public:
  /// How a state's best plan starts (the DP's three cases, see docs/planner.md).
  enum class Case : int8_t {
    none,    // infeasible
    stage,   // items [i, arg) form one stage on 2^plog devices
    nested,  // item i is split recursively on arg devices
    join,    // join option `opt` of item i on arg devices
    merge,   // parallel: items [i, k-1) and items [0, arg) of the last item's sequence on 2^plog
    fork,    // fork option `opt` at item i; its block on arg devices
  };
  /// One memo entry: the best depth of a state and how it is reached.
  struct Entry {
    int32_t val = -1;   // -1 infeasible; else min depth (in-flight, in units of the smallest size)
    Case how = Case::none;
    int8_t plog = 0;
    int8_t size = 0;    // the stage's size (index into the sizes) for stage and merge
    int32_t arg = 0;    // m (stage) or device count (nested, join)
    int16_t opt = 0;    // join option index
    TargetRange range;  // the targets at which this entry is the state's answer
  };

  SeqDp(const cost::CostModel& cm, const Structure& st, int micro_batch, int mini_batch,
        double memory_limit, int num_devices, bool same_node)
      : SeqDp(cm, st, StageSizes::uniform(micro_batch), mini_batch, memory_limit, num_devices, same_node) {}
  SeqDp(const cost::CostModel& cm, const Structure& st, const StageSizes& sizes, int mini_batch,
        double memory_limit, int num_devices, bool same_node);

  /// Min pipeline depth (in micro-batches) with every stage's TPS <= target, -1 when infeasible,
  /// -2 when infeasible without any stage being rejected for its time (memory alone: infeasible at
  /// every target). On success `out` (if given) receives the stages.
  int solve(double target_tps, std::vector<StageChoice>* out);
  /// solve() without the stages, within a work budget (stage evaluations; 0: none):
  /// kOutOfBudget when it ran out before an answer.
  int solve_within(double target_tps, size_t budget);
  /// Solves at tps x each factor, from the largest down (each solve then finds the answers of the
  /// one before as floors, see go()): the plans found, by factor (empty where none).
  std::vector<std::vector<StageChoice>> solve_down(double tps, std::initializer_list<double> factors);
  static constexpr int kOutOfBudget = -3;
  /// Smallest memory-feasible TPS found by binary search (relative tolerance `tol`); returns false
  /// when no plan fits memory at any target. `upper` bounds the search (skip when the best is not
  /// below it).
  /// `on_plan` (optional) sees every plan a solve of the search finds (one per feasible target).
  /// `shallower` (with on_plan): also solve at 1-20% above the optimum for shallower plans.
  bool minimise(double tol, double upper, double* best_tps, std::vector<StageChoice>* best,
                const std::function<void(const std::vector<StageChoice>&)>& on_plan = {}, bool shallower = true);

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

  size_t states_explored() const { return states_; }
  /// States memory_rules_out answered (all solves).
  size_t memory_pruned() const { return mem_pruned_; }
  /// Times the rest bound (rest_may_beat, first_rest_beating) cut more than the two-stage floor.
  size_t rest_pruned() const { return rest_pruned_; }
  /// Stage ends base_case skipped because the rest after them, looked up at a smaller degree of the
  /// same state (more devices left for it), already could not beat the state's best (all solves).
  size_t rests_reused() const { return rests_reused_; }
  /// Switches that reuse off (tests: the search must be the same without it).
  void set_rest_reuse(bool on) { rest_reuse_ = on; }
  size_t solves() const { return solves_; }
  /// States solved with a floor or a ceiling from another target's answer (go()), and the
  /// ceilings whose plan the search did not find again (searched again without: 0 unless some
  /// bound of the cases is wrong).
  size_t target_bounds() const { return target_bounds_; }
  size_t ceiling_misses() const { return ceiling_misses_; }
  /// Switches the floors and ceilings off (tests: the search must be the same without them).
  void set_target_bounds(bool on) { target_bounds_on_ = on; }
  size_t evals() const { return evals_; }
  /// memory_probe calls, and how many of them ran out of budget.
  size_t probes() const { return probes_; }
  /// Fixes the memory probe's work budget (stage evaluations; 0: 4x the largest solve so far).
  /// For tests that must cover a probe running out of budget.
  void set_probe_budget(size_t evals) { probe_budget_ = evals; }
  size_t probes_aborted() const { return probes_aborted_; }
  /// Switches memory_rules_out off (tests: the search must be the same without it).
  void set_memory_bound(bool on) { mem_bound_ = on; }
  /// A cap on every stage's compute per sample (`compute_tps`), for the whole life of this DP:
  /// stages above it are never taken (a target-independent test, so memo entries stay valid).
  /// With it, solve(inf) answers "is there a plan whose every stage computes at most `cap` per
  /// sample?" (see beats_bound). Not meant for DPs that also search targets.
  void set_compute_cap(double cap);

 private:
  struct StageCostLite {
    double tps = -1, compute_tps = 0, state = 0, act = 0;  // tps < 0: not computed yet
  };
  int plogs_ = 1;  // number of power-of-two degrees
  // Costs of items [i, m) of sequence s on 2^plog devices at stage size z (index into sizes_).
  StageCostLite stage(int s, int i, int m, int plog, int z);
  // stage() without the communication/all-reduce terms (tps < 0 until computed: the compute and
  // memory tests come first); complete() fills them in. Both cached (cache_slot).
  StageCostLite stage_head(int s, int i, int m, int plog, int z);
  void complete(int s, int i, int m, int plog, int z, StageCostLite* c);
  // In-flight units of a stage of size z whose successors hold `succ` units (plan::required_in_flight
  // in units: w x (1 + ceil(succ / w)), w = sizes_[z] / sizes_[0]), capped at the mini-batch.
  int after(int z, int succ) const;
  // A stage size for one stage shape (base, merge or fork stage): the smallest size that meets the
  // target and fits memory at the stage's own depth. `alive`: the sizes still worth trying for
  // larger stages of this shape (a size whose compute exceeds the target, or whose memory at the
  // shallowest depth `floor_succ` allows does not fit, is dropped: both only grow with the stage;
  // so are the sizes whose shallowest depth is not below `bound`, the best value so far, -1: none).
  struct SizePick {
    int z = -1;          // -1: no size works for this stage
    int own = 0, val = 0;  // the stage's in-flight and the state's value
  };
  template <class Head, class Full, class Depth>
  SizePick pick_size(uint32_t* alive, int plog, int floor_succ, int bound, Head head, Full full, Depth depth,
                     uint32_t* parked = nullptr);
  uint32_t sizes_for(int plog) const;  // the sizes (bits) a stage on 2^plog devices may take
  // What the memo knows of one state (s, i, d, down), kept across targets: the targets below which
  // it is infeasible (an infeasible answer at target T whose TargetRange ends at hi holds at every
  // target below hi: a smaller target only rejects more, so nothing becomes feasible; +inf when
  // memory alone rules it out), and its last feasible answer with the range where it holds.
  struct Cell {
    double infeasible_below = -std::numeric_limits<double>::infinity();
    bool has_entry = false;
    Entry e;
  };
  // The memo: one dense slot per (sequence, item, device count) holding the first `down` stored
  // (the common case), other `down` values in an overflow hash map.
  // The state's cell (nullptr when none yet; `create`: make one).
  Cell* cell(int s, int i, int d, int down, bool create);
  // A state's answer at the current target from its cell, if there is one (its range is met
  // into range_).
  bool memo_answer(const Cell& c, int* val);
  // The state's feasible answer at the current target, if the memo has it.
  const Entry* find(int s, int i, int d, int down);
  // Records a state's answer at the current target.
  void store(int s, int i, int d, int down, const Entry& e);
  bool fits(const StageCostLite& c, int depth, int z) const;
  bool beats_with_rest(const Seq& q, int s, int j, const Entry* best, int down);
  // rest_may_beat: in series sequence s, can a choice whose rest starts at item j (the part before
  // it, then the rest with `down` after it) be shallower than `best`? Every part of a series plan
  // adds at least one unit of depth, and each part holds its single-op items in one stage, which
  // must fit one device: a rest needing r parts is at least min(down + r, M) deep.
  bool rest_may_beat(int s, int j, int down, int best);
  // The first m >= j at which rest_may_beat holds (k when none): the bound only weakens as m grows.
  int first_rest_beating(int s, int j, int down, int best);
  void prepare_memory(int s);  // fills mem_state_, mem_act_ and spine_ of sequence s
  // The first m >= j at which a chain's rest [m, end) may fit d devices (chain_dev_; down = 0 only),
  // k when none: a stage [i, m) before it has no plan, and the bound only weakens as m grows.
  int first_rest_fitting(int s, int j, int d, int down);
  class KnownRests;  // base_case's rests per stage end (rest reuse across degrees)
  int go(int s, int i, int d, int down);
  // The five cases in turn, each keeping what beats `best`, until one reaches floor_val.
  void cases(int s, int i, int d, int down, int floor_val, Entry* best);
  void base_case(int s, int i, int d, int down, int floor_val, Entry* best);
  void nested_case(int s, int i, int d, int down, int floor_val, Entry* best);
  void join_case(int s, int i, int d, int down, int floor_val, Entry* best);
  void merge_case(int s, int i, int d, int down, int floor_val, Entry* best);
  void fork_case(int s, int i, int d, int down, int floor_val, Entry* best);
  template <class Part>
  void part_then_rest(int s, int after, int d, int down, int floor_val, Case how, int opt, Entry* best, Part part);
  // The fork option's ops and block (ext and others) on d devices with `down` after the block:
  // its minimal depth (memoised across targets with its TargetRange, with how it is reached).
  struct ForkPick {
    int val = -1, d1 = 0, plog = 0, m = 0, z = 0;  // branch j (with the fork ops) on d1 devices, first stage [0, m) at size z
    TargetRange range;
  };
  const ForkPick& fork_block(const ForkOption& fo, int d, int down);
  // The ops of a merge stage: items [i, k-1) of parallel sequence s and items [0, x) of its last
  // item's sequence; their cost (cached: independent of the target).
  std::vector<OpId> merge_ops(int s, int i, int x) const;
  StageCostLite merge_stage(int s, int i, int x, int plog, int z);
  // The downstream depth of group [i, m) of parallel sequence q given the block's `down`.
  int down_of(const Seq& q, int i, int m, int down) const;
  int floor_cand(int d) const { return d <= 0 ? 0 : floor_cand_[d]; }
  void collect(int s, int i, int d, int down, std::vector<StageChoice>* out);
  std::pair<int, int> collect_rest(int s, int after, int d, int down, int arg, std::vector<StageChoice>* out);

  const cost::CostModel& cm_;
  const Structure& st_;
  std::vector<int> sizes_;  // the stage sizes (StageSizes), ascending
  int8_t wlog_[32] = {};    // size z is 2^wlog_[z] units (sizes_[0] samples each)
  int mbs_, mini_, num_micro_, n_;  // mbs_: the largest size; num_micro_: mini-batch in units
  double mem_limit_;
  bool same_node_;
  std::vector<int> floor_cand_;  // largest candidate device count <= d
  double target_ = 0;
  double tmax_ = 0;  // target_ with its rounding slack: a value v passes the target when v <= tmax_
  struct Slot {
    bool filled = false;
    int32_t down = 0;
    Cell cell;
  };
  std::vector<int> cidx_;          // per device count 0..n: index among the memo's counts, or -1
  int ncounts_ = 0;
  std::vector<size_t> seq_base_;   // first slot of each sequence
  std::vector<Slot> slots_;
  std::unordered_map<uint64_t, Cell> overflow_;
  std::vector<RangeCost> rcs_;  // per size
  std::unordered_map<uint64_t, StageCostLite> merge_cost_;
  std::unordered_map<uint64_t, ForkPick> fork_memo_;  // kept across targets, like the memo
  std::vector<char> mask_;  // scratch for merge_stage: the ops of the stage being costed
  // The stage-cost cache: per size and sequence, rows [plog * k + i] holding the stages [i, m) at
  // [m - i - 1], grown on demand to at most kCacheBytes in all (cheap part first, compute_tps < 0:
  // empty; tps once completed).
  static constexpr size_t kCacheBytes = size_t{512} << 20;
  std::vector<std::vector<std::vector<std::vector<StageCostLite>>>> cache_;
  size_t cache_bytes_ = 0;
  StageCostLite* cache_slot(int s, int i, int m, int plog, int z);
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
  // A relaxed DP over the chain s (down = 0): a stage [i, m) whose first stage has c stages after it
  // holds at least f = min(c + 1, M) units in flight, so its p devices satisfy p x (limit - state) >=
  // f x its ops' act_unit_ (each device holds the whole state and its share of the activations),
  // and p >= 1; the least sum of p over the stages (p continuous, in-flight counts past 16 stages
  // taken as 16's) is a lower bound on the devices of every plan of the suffix.
  void chain_devices(int s);
  size_t mem_pruned_ = 0, rest_pruned_ = 0, rests_reused_ = 0;
  bool rest_reuse_ = true;
  // base_case's rests per stage end, kept for its larger degrees: one slice per active call
  // (go() recursion nests them), [top, top + k - i), filled lazily up to the largest end seen.
  std::vector<int> known_rest_;
  size_t known_top_ = 0;
  bool mem_bound_ = true;
  // set_compute_cap's cap (a suffix whose work_lower_bound exceeds d x cap has a stage above it).
  double cap_ = std::numeric_limits<double>::infinity();
  // The least device-seconds per sample of the suffix [i, end) of sequence s: per op, the least
  // over every stage size and degree (each op of a plan may take any), from per-sequence prefix
  // sums (work_lb_, filled on first use). A plan of the suffix on d devices with every stage's
  // compute per sample at most T exists only if this is at most d x T.
  std::vector<std::vector<long double>> work_lb_;
  double work_lower_bound(int s, int i);
  bool over_cap(int s, int i, int d);
  // One solve at an infinite target within a work budget: true when it proves that no plan fits
  // memory at any target; false when a plan exists or the budget ran out.
  bool memory_probe();
  size_t states_ = 0, solves_ = 0, target_bounds_ = 0, ceiling_misses_ = 0;
  bool target_bounds_on_ = true;
  // Stage evaluations (all solves), at the current solve's start, the largest per solve, and the
  // current solve's budget (0: unbounded); aborted_: the budget ran out.
  size_t evals_ = 0, solve_start_ = 0, max_solve_evals_ = 0, budget_ = 0;
  size_t probes_ = 0, probes_aborted_ = 0, probe_budget_ = 0;
  bool aborted_ = false;
  // The time tests of the computation under way (the state being solved and its subtree so far).
  TargetRange range_;
  // A time test of value v against the target (see TargetRange): true when v passes.
  bool within(double v) {
    if (v > tmax_) return range_.reject(v), false;
    range_.accept(v);
    return true;
  }
};

/// One micro-batch size's search, as the planner runs it.
struct SizeSearch {
  int micro_batch = 1;   // the outer size m
  int size_spread = 0;   // stages may take m, m/2, ..., m / 2^spread (0: one size per plan)
  int mini_batch = 1;
  double memory_limit = 0;
  int num_devices = 1;
  bool same_node = false;
  double tol = 1e-3;     // relative tolerance of the binary search on the target
};
/// What a size's search cost (bench/planner_scale).
struct SearchStats {
  size_t states = 0, solves = 0, evals = 0;
  size_t memory_pruned = 0;  // states SeqDp::memory_rules_out answered
  size_t target_bounds = 0, ceiling_misses = 0;  // SeqDp::target_bounds, ceiling_misses
};
/// The one-size DP's binary search at m; with size_spread > 0 and m > 1 also the per-stage-size DP
/// over the window (see docs/planner.md, "Per-stage micro-batch sizes"), which is not binary
/// searched from scratch: it is solved just below the one-size optimum T (a plan there means a
/// smaller size lets some stage fit memory: it then runs its own binary search) and at T x 1,
/// 1.01, 1.02, 1.05, 1.1, 1.2. Every plan found goes to `on_plan`; `*tps` gets the smallest
/// bottleneck. False when no plan fits memory.
bool search_size(const cost::CostModel& cm, const Structure& st, const SizeSearch& ss, double* tps,
                 const std::function<void(const std::vector<StageChoice>&)>& on_plan, SearchStats* stats = nullptr);

/// Whether search_size's space at this size (the one-size plans and, with size_spread, the
/// per-stage-size ones) holds a plan, fitting memory, whose every stage computes at most `cap`
/// seconds per sample. Every plan's predicted iteration time is at least mini-batch x each stage's
/// compute per sample (a stage runs its micro-batches one after another: timeline.h), so when this
/// is false no plan of the size predicts below mini-batch x cap. One DP solve with the cap and no
/// target (SeqDp::set_compute_cap), within `budget` stage evaluations (0: none; out of budget, the
/// answer is true: no proof); `stats` (optional) gets its cost.
bool size_may_beat(const cost::CostModel& cm, const Structure& st, const SizeSearch& ss, double cap, size_t budget = 0,
                   SearchStats* stats = nullptr);

}  // namespace gp::planner::detail
