// The planner DP's searches (engine.h): the binary search on the target, the memory probe, and
// one micro-batch size's search as the planner runs it.
#include "planner/engine.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

namespace gp::planner::detail {

std::vector<int> device_candidates(int n) {
  std::vector<int> out;
  if (n <= 64) {
    for (int d = 1; d <= n; ++d) out.push_back(d);
    return out;
  }
  int g = std::max(1, n / 32);
  for (int d = 1; d <= n; ++d)
    if (std::has_single_bit(static_cast<unsigned>(d)) || d % g == 0) out.push_back(d);
  return out;
}

StageSizes StageSizes::window(int largest, int spread) {
  StageSizes out;
  for (int j = spread; j >= 0; --j)
    if (largest >> j >= 1 && (largest >> j) << j == largest) out.sizes.push_back(largest >> j);
  return out;
}

bool minimise_target(const std::function<SolveResult(double, std::vector<StageChoice>*)>& solve_at, int n, double tol,
                     double upper, double guess, double* best_tps, std::vector<StageChoice>* best,
                     const std::function<bool()>& never_feasible,
                     const std::function<void(const std::vector<StageChoice>&)>& on_plan) {
  auto solve = [&](double t, std::vector<StageChoice>* out) {
    const SolveResult r = solve_at(t, out);
    if (r.found() && on_plan) on_plan(*out);
    return r;
  };
  auto bottleneck = [](const std::vector<StageChoice>& p) {
    double b = 0;
    for (const auto& s : p) b = std::max(b, s.tps_s);
    return b;
  };
  std::vector<StageChoice> cur;
  double hi = 0, lo = 0;
  bool found = false;
  // Start from the whole model's single-device time spread over n devices and double: a finite
  // target lets the DP prune every stage slower than it (compute only grows with a stage).
  if (guess > 0) {
    // Steps of 1.25x: the first feasible target costs the most (the higher it is, the larger the
    // stages the DP must try), so overshooting the optimum by up to 2x was the search's largest cost.
    constexpr double kStep = 1.25;
    bool probed = false;
    for (double t = guess / n; t <= guess * 4; t *= kStep) {
      const SolveResult r = solve(t, &cur);
      if (r.found()) {
        found = true;
        break;
      }
      if (r.kind == SolveResult::Kind::never_feasible) return false;  // infeasible at every target
      lo = t;
      // Two targets failed: maybe no plan fits memory at all. A bounded probe can prove it (and
      // save the rest of the doubling); it never changes the search's trajectory otherwise.
      if (!probed && t > guess / n * 1.5 && never_feasible) {
        probed = true;
        if (never_feasible()) return false;
      }
    }
  }
  if (!found && !solve(std::numeric_limits<double>::infinity(), &cur).found()) return false;
  hi = bottleneck(cur);
  if (upper > 0 && hi >= upper) {
    if (!solve(upper * (1 - tol), &cur).found()) return false;
    hi = bottleneck(cur);
  }
  *best = cur;
  if (lo == 0) {
    lo = hi / (4.0 * n);
    while (solve(lo, &cur).found()) {  // the guess was not a lower bound: move it down
      *best = cur;
      hi = bottleneck(cur);
      lo = hi / (4.0 * n);
    }
  }
  while (hi > lo * (1 + tol)) {
    double mid = std::sqrt(lo * hi);
    if (solve(mid, &cur).found()) {
      *best = cur;
      hi = bottleneck(cur);
    } else {
      lo = mid;
    }
  }
  *best_tps = hi;
  return true;
}

bool SeqDp::minimise(double tol, double upper, double* best_tps, std::vector<StageChoice>* best,
                     const std::function<void(const std::vector<StageChoice>&)>& on_plan, bool shallower) {
  if (memory_never_fits()) return false;
  const int k = static_cast<int>(st_.seqs[st_.root].items.size());
  const double guess = costs_.full(st_.root, 0, k, 0, units_.count() - 1).tps;
  const bool ok = minimise_target([this](double t, std::vector<StageChoice>* out) { return solve(t, out); }, n_, tol,
                                  upper, guess, best_tps, best, [this] { return memory_probe(); }, on_plan);
  if (ok && on_plan && shallower) {
    // Slightly slower targets admit shallower pipelines (the DP returns the shallowest plan within
    // a target): the caller weighs their fill against their bottleneck.
    for (const auto& st : solve_down(*best_tps, {1.01, 1.02, 1.05, 1.1, 1.2}))
      if (!st.empty()) on_plan(st);
  }
  return ok;
}

std::vector<std::vector<StageChoice>> SeqDp::solve_down(double tps, std::initializer_list<double> factors) {
  std::vector<std::vector<StageChoice>> plans(factors.size());
  for (size_t j = factors.size(); j-- > 0;) solve(tps * factors.begin()[j], &plans[j]);  // filled when feasible
  return plans;
}

SeqDp::Budgeted SeqDp::solve_within(double target_tps, size_t budget) {
  work_.budget = budget;
  const SolveResult v = solve(target_tps, nullptr);
  work_.budget = 0;
  return work_.aborted ? Budgeted::out_of_budget : v.found() ? Budgeted::plan : Budgeted::no_plan;
}

bool SeqDp::memory_probe() {
  // An infinite target with a work budget of 4x the largest solve so far: without the target's
  // pruning it can be far larger than a bounded solve when memory does not bind, so give up then.
  work_.budget = work_.probe_budget > 0 ? work_.probe_budget : std::max<size_t>(4 * work_.max_solve_evals, 100000);
  const SolveResult v = solve(std::numeric_limits<double>::infinity(), nullptr);
  work_.budget = 0;
  ++stats_.probes;
  if (work_.aborted) ++stats_.probes_aborted;
  return !work_.aborted && !v.found();
}

namespace {

// The per-stage-size DP after the one-size search at m found its optimum `*tps` (`ok`).
bool mixed_sizes(SeqDp& mixed, bool ok, double tol, double* tps,
                 const std::function<void(const std::vector<StageChoice>&)>& on_plan) {
  std::vector<StageChoice> st;
  if (ok) {
    // The shallower plans first (solve_down: the answers at larger targets bound those at smaller
    // ones), then whether a smaller size lets some stage fit below the optimum.
    const auto plans = mixed.solve_down(*tps, {1.0, 1.01, 1.02, 1.05, 1.1, 1.2});
    if (!mixed.solve(*tps * (1 - 2 * tol), &st).found()) {
      for (const auto& p : plans)
        if (!p.empty()) on_plan(p);
      return true;
    }
  }
  double t = 0;
  if (!mixed.minimise(tol, ok ? *tps : 0, &t, &st, on_plan)) return ok;
  *tps = ok ? std::min(*tps, t) : t;
  return true;
}

void add_stats(const SeqDp& dp, SearchStats* stats) {
  if (!stats) return;
  stats->states += dp.states_explored();
  stats->solves += dp.solves();
  stats->evals += dp.evals();
  stats->memory_pruned += dp.memory_pruned();
  stats->target_bounds += dp.target_bounds();
  stats->ceiling_misses += dp.ceiling_misses();
}

}  // namespace

bool size_may_beat(const cost::CostModel& cm, const Structure& st, const SizeSearch& ss, double cap, size_t budget,
                   SearchStats* stats) {
  const StageSizes sizes = ss.size_spread > 0 && ss.micro_batch > 1 ? StageSizes::window(ss.micro_batch, ss.size_spread)
                                                                    : StageSizes::uniform(ss.micro_batch);
  SeqDp dp(cm, st, sizes, ss.mini_batch, ss.memory_limit, ss.num_devices, ss.same_node);
  if (dp.memory_never_fits()) return false;
  dp.set_compute_cap(cap);
  const SeqDp::Budgeted v = dp.solve_within(std::numeric_limits<double>::infinity(), budget);
  add_stats(dp, stats);
  return v != SeqDp::Budgeted::no_plan;  // out of budget: no proof, search the size
}

bool search_size(const cost::CostModel& cm, const Structure& st, const SizeSearch& ss, double* tps,
                 const std::function<void(const std::vector<StageChoice>&)>& on_plan, SearchStats* stats) {
  SeqDp dp(cm, st, ss.micro_batch, ss.mini_batch, ss.memory_limit, ss.num_devices, ss.same_node);
  std::vector<StageChoice> best;
  // With per-stage sizes the shallower plans above the optimum come from the mixed DP (its space
  // holds the one-size plans; at each target it returns the shallowest).
  const bool mixed_after = ss.size_spread > 0 && ss.micro_batch > 1;
  const bool ok = dp.minimise(ss.tol, 0, tps, &best, on_plan, !mixed_after);
  add_stats(dp, stats);
  if (!mixed_after) return ok;
  SeqDp mixed(cm, st, StageSizes::window(ss.micro_batch, ss.size_spread), ss.mini_batch, ss.memory_limit,
              ss.num_devices, ss.same_node);
  const bool r = mixed_sizes(mixed, ok, ss.tol, tps, on_plan);
  add_stats(mixed, stats);
  return r;
}

}  // namespace gp::planner::detail
