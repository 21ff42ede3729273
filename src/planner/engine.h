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
#include "planner/dp_bounds.h"
#include "planner/dp_memo.h"
#include "planner/dp_types.h"
#include "planner/range_cost.h"
#include "planner/sp_structure.h"
#include "planner/stage_costs.h"

namespace gp::planner::detail {

/// A stage the DP chose.
struct StageChoice {
  std::vector<OpId> ops;
  int dp = 1;
  double tps_s = 0;  // under the DP's placement assumption
  int mbs = 0;       // its micro-batch size (0: the plan's, the size assemble() is given)
};

/// What one solve at a target found (minimise_target's contract).
struct SolveResult {
  enum class Kind : int8_t {
    plan,            // a plan whose every stage TPS is <= the target: `depth` is its depth
    no_plan,         // no plan at this target
    never_feasible,  // no plan at any target: memory alone rules every plan out (the search stops)
  };
  Kind kind = Kind::no_plan;
  int depth = 0;  // with a plan: its pipeline depth (in-flight units, see StageSizes); else 0
  static SolveResult plan(int depth) { return {Kind::plan, depth}; }
  static SolveResult no_plan() { return {Kind::no_plan, 0}; }
  static SolveResult never_feasible() { return {Kind::never_feasible, 0}; }
  bool found() const { return kind == Kind::plan; }
  bool operator==(const SolveResult&) const = default;
};

/// Binary search on the target TPS (the paper's outer loop): `solve(T, out)` finds a plan with
/// every stage TPS <= T (filling `out`), none at T, or none at any target (stop). `never_feasible`
/// (optional) is asked once, after the second failed target, whether no plan fits at any target;
/// `on_plan` (optional) sees the plan of every feasible solve. Finds the smallest feasible target within relative
/// tolerance `tol`; false when no plan fits memory (or none beats `upper` when upper > 0).
bool minimise_target(const std::function<SolveResult(double, std::vector<StageChoice>*)>& solve, int n, double tol,
                     double upper, double guess, double* best_tps, std::vector<StageChoice>* best,
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
plan::Plan assemble(const cost::CostModel& cm, const std::vector<StageChoice>& choices, int mbs, int mini_batch,
                    double memory_limit, Order order, std::vector<std::string>* explain);

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

/// The DP for one structure and a set of stage micro-batch sizes (one, or a window: each stage
/// takes the smallest that meets the target). Stage costs are cached across targets (StageCosts);
/// memo entries are kept across targets with the TargetRange over which they hold (Memo); the
/// bounds that skip states and stage ends without changing a result are in Bounds.
class SeqDp {
 public:
  SeqDp(const cost::CostModel& cm, const Structure& st, int micro_batch, int mini_batch, double memory_limit,
        int num_devices, bool same_node)
      : SeqDp(cm, st, StageSizes::uniform(micro_batch), mini_batch, memory_limit, num_devices, same_node) {}
  SeqDp(const cost::CostModel& cm, const Structure& st, const StageSizes& sizes, int mini_batch, double memory_limit,
        int num_devices, bool same_node);

  /// The plan of min pipeline depth (in micro-batches) with every stage's TPS <= target; no_plan
  /// when there is none; never_feasible when there is none without any stage being rejected for
  /// its time (memory alone: infeasible at every target): minimise_target's contract. With a plan
  /// `out` (if given) receives its stages.
  SolveResult solve(double target_tps, std::vector<StageChoice>* out);
  /// What solve_within found.
  enum class Budgeted : int8_t {
    plan,           // a plan meets the target
    no_plan,        // none does
    out_of_budget,  // the budget ran out before an answer
  };
  /// solve() without the stages, within a work budget (stage evaluations; 0: none).
  Budgeted solve_within(double target_tps, size_t budget);
  /// Solves at tps x each factor, from the largest down (each solve then finds the answers of the
  /// one before as floors, see go()): the plans found, by factor (empty where none).
  std::vector<std::vector<StageChoice>> solve_down(double tps, std::initializer_list<double> factors);
  /// Smallest memory-feasible TPS found by binary search (relative tolerance `tol`); returns false
  /// when no plan fits memory at any target. `upper` bounds the search (skip when the best is not
  /// below it).
  /// `on_plan` (optional) sees every plan a solve of the search finds (one per feasible target).
  /// `shallower` (with on_plan): also solve at 1-20% above the optimum for shallower plans.
  bool minimise(double tol, double upper, double* best_tps, std::vector<StageChoice>* best,
                const std::function<void(const std::vector<StageChoice>&)>& on_plan = {}, bool shallower = true);

  /// Bounds::memory_never_fits: no plan fits memory at any target.
  bool memory_never_fits() const { return bounds_.memory_never_fits(); }
  /// Bounds::memory_rules_out: no plan of the state (s, i, d, down) fits memory at any target.
  bool memory_rules_out(int s, int i, int d, int down) { return bounds_.memory_rules_out(s, i, d, down); }

  /// What the solves so far cost and what the bounds cut.
  const DpStats& stats() const { return stats_; }
  size_t states_explored() const { return stats_.states; }
  /// States memory_rules_out answered (all solves).
  size_t memory_pruned() const { return stats_.memory_pruned; }
  /// Times the rest bound (rest_may_beat, first_rest_beating) cut more than the two-stage floor.
  size_t rest_pruned() const { return stats_.rest_pruned; }
  /// Stage ends base_case skipped because the rest after them, looked up at a smaller degree of the
  /// same state (more devices left for it), already could not beat the state's best (all solves).
  size_t rests_reused() const { return stats_.rests_reused; }
  size_t solves() const { return stats_.solves; }
  /// States solved with a floor or a ceiling from another target's answer (go()), and the
  /// ceilings whose plan the search did not find again (searched again without: 0 unless some
  /// bound of the cases is wrong).
  size_t target_bounds() const { return stats_.target_bounds; }
  size_t ceiling_misses() const { return stats_.ceiling_misses; }
  size_t evals() const { return stats_.evals; }
  /// memory_probe calls, and how many of them ran out of budget.
  size_t probes() const { return stats_.probes; }
  size_t probes_aborted() const { return stats_.probes_aborted; }

  /// Test switches: the search must be the same without each of these.
  /// Rest reuse across degrees (Bounds::KnownRests).
  void set_rest_reuse(bool on) { switches_.rest_reuse = on; }
  /// Floors and ceilings from other targets' answers (go()).
  void set_target_bounds(bool on) { switches_.target_bounds = on; }
  /// Bounds::memory_rules_out.
  void set_memory_bound(bool on) { bounds_.set_memory_bound(on); }
  /// Fixes the memory probe's work budget (stage evaluations; 0: 4x the largest solve so far).
  /// For tests that must cover a probe running out of budget.
  void set_probe_budget(size_t evals) { work_.probe_budget = evals; }
  /// A cap on every stage's compute per sample (`compute_tps`), for the whole life of this DP:
  /// stages above it are never taken (a target-independent test, so memo entries stay valid).
  /// With it, solve(inf) answers "is there a plan whose every stage computes at most `cap` per
  /// sample?" (see beats_bound). Not meant for DPs that also search targets.
  void set_compute_cap(double cap) { bounds_.set_compute_cap(cap); }

 private:
  // A stage size for one stage shape (base, merge or fork stage): the smallest size that meets the
  // target and fits memory at the stage's own depth. `alive`: the sizes still worth trying for
  // larger stages of this shape (a size whose compute exceeds the target, or whose memory at the
  // shallowest depth `floor_succ` allows does not fit, is dropped: both only grow with the stage;
  // so are the sizes whose shallowest depth is not below `bound`, the best value so far, -1: none).
  struct SizePick {
    int z = -1;            // -1: no size works for this stage
    int own = 0, val = 0;  // the stage's in-flight and the state's value
  };
  // What a stage of one size gives its state (pick_size's `depth`).
  struct SizedDepth {
    enum class Kind : int8_t {
      fits,             // `own` in flight, the state `val` deep
      over_memory,      // this size does not fit at its depth: try the next
      rest_infeasible,  // what follows has no plan: no size works
    } kind = Kind::fits;
    int own = 0, val = 0;
  };
  template <class Head, class Full, class Depth>
  SizePick pick_size(uint32_t* alive, int plog, int floor_succ, int bound, Head head, Full full, Depth depth,
                     uint32_t* parked = nullptr);
  uint32_t sizes_for(int plog) const;  // the sizes (bits) a stage on 2^plog devices may take
  // `depth`: the stage's in-flight units; c.act is per micro-batch of size z (w units each).
  bool fits(const StageCostLite& c, int depth, int z) const {
    return c.state + (std::min(depth, units_.num_micro()) >> units_.wlog(z)) * c.act <= mem_limit_;
  }
  int after(int z, int succ) const { return units_.after(z, succ); }
  // A state's answer at the current target from its cell, if there is one (its range is met
  // into range_).
  bool memo_answer(const Memo::Cell& c, int* val);
  bool beats_with_rest(const Seq& q, int s, int j, const Entry* best, int down);
  int go(int s, int i, int d, int down);
  // The five cases in turn, each keeping what beats `best`, until one reaches floor_val; each
  // case's collect_* (beside it) turns its choice back into stages.
  void cases(int s, int i, int d, int down, int floor_val, Entry* best);
  void base_case(int s, int i, int d, int down, int floor_val, Entry* best);
  void collect_stage(int s, int i, int d, int down, const StageCut& c, std::vector<StageChoice>* out);
  void nested_case(int s, int i, int d, int down, int floor_val, Entry* best);
  void collect_nested(int s, int i, int d, int down, const NestedSplit& c, std::vector<StageChoice>* out);
  void join_case(int s, int i, int d, int down, int floor_val, Entry* best);
  void collect_join(int s, int i, int d, int down, const JoinPart& c, std::vector<StageChoice>* out);
  void merge_case(int s, int i, int d, int down, int floor_val, Entry* best);
  void collect_merge(int s, int i, int d, int down, const MergeCut& c, std::vector<StageChoice>* out);
  void fork_case(int s, int i, int d, int down, int floor_val, Entry* best);
  void collect_fork(int s, int i, int d, int down, const ForkPart& c, std::vector<StageChoice>* out);
  template <class Part, class Make>
  void part_then_rest(int s, int after, int d, int down, int floor_val, Entry* best, Part part, Make make);
  // For a part_then_rest choice (`devices`: the part's): collects the rest of sequence s from
  // `after` and returns the part's devices and downstream depth.
  std::pair<int, int> collect_rest(int s, int after, int d, int down, int devices, std::vector<StageChoice>* out);
  // The fork option's ops and block (ext and others) on d devices with `down` after the block:
  // its minimal depth (memoised across targets with its TargetRange, with how it is reached).
  struct ForkBlock {
    int val = kNoPlan, d1 = 0, plog = 0, m = 0,
        z = 0;  // branch j (with the fork ops) on d1 devices, first stage [0, m) at size z
    TargetRange range;
  };
  const ForkBlock& fork_block(const ForkOption& fo, int d, int down);
  // The downstream depth of group [i, m) of parallel sequence q given the block's `down`.
  int down_of(const Seq& q, int i, int m, int down) const;
  int floor_cand(int d) const { return d <= 0 ? 0 : floor_cand_[d]; }
  void collect(int s, int i, int d, int down, std::vector<StageChoice>* out);
  // One solve at an infinite target within a work budget: true when it proves that no plan fits
  // memory at any target; false when a plan exists or the budget ran out.
  bool memory_probe();
  // A time test of value v against the target (see TargetRange): true when v passes.
  bool within(double v) {
    if (v > tmax_) return range_.reject(v), false;
    range_.accept(v);
    return true;
  }

  const cost::CostModel& cm_;
  const Structure& st_;
  SizeUnits units_;
  int n_;
  double mem_limit_;
  std::vector<int> floor_cand_;  // largest candidate device count <= d
  DpStats stats_;
  Memo memo_;
  StageCosts costs_;
  Bounds bounds_;
  std::unordered_map<uint64_t, ForkBlock> fork_memo_;  // kept across targets, like the memo
  struct {
    bool rest_reuse = true, target_bounds = true;
  } switches_;
  // Stage evaluations at the current solve's start, the largest per solve, the current solve's
  // budget (0: unbounded), the memory probe's (0: see set_probe_budget); aborted: the budget ran out.
  struct {
    size_t solve_start = 0, max_solve_evals = 0, budget = 0, probe_budget = 0;
    bool aborted = false;
  } work_;
  double tmax_ = 0;  // the target with its rounding slack: a value v passes the target when v <= tmax_
  // The time tests of the computation under way (the state being solved and its subtree so far).
  TargetRange range_;
};

/// One micro-batch size's search, as the planner runs it.
struct SizeSearch {
  int micro_batch = 1;  // the outer size m
  int size_spread = 0;  // stages may take m, m/2, ..., m / 2^spread (0: one size per plan)
  int mini_batch = 1;
  double memory_limit = 0;
  int num_devices = 1;
  bool same_node = false;
  double tol = 1e-3;  // relative tolerance of the binary search on the target
};
/// What a size's search cost (bench/planner_scale).
struct SearchStats {
  size_t states = 0, solves = 0, evals = 0;
  size_t memory_pruned = 0;                      // states SeqDp::memory_rules_out answered
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
