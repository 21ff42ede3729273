// run_planner: the outer loops (micro-batch sizes, binary search on the target TPS), impossible-
// request errors, device placement, and the plan's predictions.
#include "planner/planner.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <numeric>
#include <optional>

#include "plan/schedule_kind.h"
#include "planner/assemble.h"
#include "planner/engine.h"
#include "planner/piper.h"
#include "planner/timeline.h"
#include "schedule/schedule.h"
#include "sim/sim.h"

namespace gp::planner {

using detail::StageChoice;

std::optional<PlannerKind> find_planner_kind(std::string_view name) {
  for (const PlannerKindInfo& k : kPlannerKinds)
    if (name == k.name) return k.kind;
  return std::nullopt;
}

std::vector<std::string> planner_names() {
  std::vector<std::string> out;
  for (const PlannerKindInfo& k : kPlannerKinds) out.emplace_back(k.name);
  return out;
}

std::string planner_kind_names(std::string_view sep) {
  std::string out;
  for (const PlannerKindInfo& k : kPlannerKinds) out += (out.empty() ? "" : std::string(sep)) + k.name;
  return out;
}

std::string planner_kind_help(std::string_view what) {
  std::string out = std::string(what) + ": " + planner_kind_names(" | ");
  for (const PlannerKindInfo& k : kPlannerKinds) out += std::string("\n  ") + k.name + ": " + k.help;
  return out;
}

namespace {

constexpr double kTol = 1e-3;  // relative tolerance of the binary search on the target TPS
// GraphPipe's SP DP at micro-batch size m lets each stage take m, m/2, ..., m / 2^kSizeSpread
// (per-stage micro-batch sizes, paper section 5); the outer loop over m covers the rest.
constexpr int kSizeSpread = 2;
// Each planner's best few final plans of each kind (by the estimate) are scored by the simulator.
constexpr int kShortlist = 3;
// Relative margin of the bounds that skip a search: the DP's costs (prefix sums) and the placed
// plan's (cost::stage_cost) agree to ~1e-12; the shortlist compares estimates to 1e-9.
constexpr double kBoundMargin = 1e-6;
// The least work budget of a size-bound proof (stage evaluations; about 10 ms).
constexpr size_t kProofMinBudget = 100000;

std::string gb(double bytes) { return fmt::format("{:.1f} GB", bytes / 1e9); }

[[noreturn]] void impossible(const cost::CostModel& cm, int n, double limit) {
  const ir::Graph& g = cm.graph();
  double state = 0, act = 0, worst = 0;
  std::string worst_op;
  for (size_t i = 0; i < g.num_ops(); ++i) {
    OpId op(static_cast<int32_t>(i));
    state += cm.state_bytes(op);
    act += cm.saved_bytes(op, 1);
    double one = cm.state_bytes(op) + cm.saved_bytes(op, 1);
    if (one > worst) worst = one, worst_op = g.op(op).name;
  }
  if (worst > limit)
    throw UserError(
        fmt::format("op \"{}\" alone needs {} (weights, gradients, optimizer state and "
                    "activations at micro-batch 1); devices have {}",
                    worst_op, gb(worst), gb(limit)));
  throw UserError(
      fmt::format("model \"{}\" needs {} per device at micro-batch 1 even spread over "
                  "all {} devices ({} of weights+gradients+optimizer state, {} of "
                  "activations per sample); devices have {}",
                  g.name(), gb((state + act) / n), n, gb(state), gb(act), gb(limit)));
}

// GraphPipe's two kinds of candidate (the baselines have one, kChain).
enum Kind { kSp = 0, kChain = 1 };

// A placed, re-costed plan one search found, with what it takes to assemble it again.
struct Cand {
  int mbs = 0;
  std::vector<StageChoice> stages;
  detail::Order order = detail::Order::dag;
  plan::Plan plan;
  double simulated_s = 0;  // sim::simulate's iteration time (shortlisted plans only)
};

// Smaller predicted iteration time; ties: the smaller bottleneck.
bool better(const plan::Plan& a, const plan::Plan& b) {
  const double ta = a.predicted.iteration_time_s, tb = b.predicted.iteration_time_s;
  if (ta < tb * (1 - 1e-9)) return true;
  if (tb < ta * (1 - 1e-9)) return false;
  return a.predicted.bottleneck_tps_s < b.predicted.bottleneck_tps_s * (1 - 1e-9);
}

// The best kShortlist distinct plans of one kind over all sizes and targets, by the estimate. The
// same whatever order the sizes are searched in: between equal estimates, and for the same plan
// found at two sizes, the smaller size first (what searching sizes in ascending order gives).
struct Shortlist {
  std::vector<Cand> plans;  // best first
  double simulate_s = 0;    // wall time spent simulating them
  void offer(const Cand& c) {
    for (Cand& o : plans)
      if (o.plan.stages == c.plan.stages) {
        if (c.mbs < o.mbs) o = c;  // the same plan, the same estimate: its position holds
        return;
      }
    auto at = std::find_if(plans.begin(), plans.end(), [&](const Cand& o) {
      return better(c.plan, o.plan) || (!better(o.plan, c.plan) && c.mbs < o.mbs);
    });
    if (at - plans.begin() >= kShortlist) return;
    plans.insert(at, c);
    if (plans.size() > static_cast<size_t>(kShortlist)) plans.pop_back();
  }
  bool full() const { return plans.size() == static_cast<size_t>(kShortlist); }
  // Every plan predicted above this is left out (strictly: better() compares to 1e-9).
  double worst_s() const { return plans.back().plan.predicted.iteration_time_s; }
};

// Scores a shortlist with the discrete-event simulator (the schedule the plans are made for, as the
// runtime runs it, with network contention) and returns the plan it simulates fastest (ties: the
// estimate's order).
Cand simulate_shortlist(const cost::CostModel& cm, Shortlist& sl) {
  GP_ASSERT(!sl.plans.empty(), "empty shortlist");
  const auto t0 = std::chrono::steady_clock::now();
  size_t best = 0;
  for (size_t i = 0; i < sl.plans.size(); ++i) {
    Cand& c = sl.plans[i];
    c.simulated_s = sim::simulate(c.plan, detail::plan_schedule(c.plan), cm, {.events = false}).iteration_time_s;
    if (c.simulated_s < sl.plans[best].simulated_s * (1 - 1e-9)) best = i;
  }
  sl.simulate_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return sl.plans[best];
}

// One explain clause: a kind's shortlist, estimated and simulated.
std::string shortlist_note(const Shortlist& sl, const std::string& kind) {
  std::string s = fmt::format("simulator: {}'s best {} plans by the estimate (predicted / simulated):", kind,
                              sl.plans.size());
  for (const Cand& c : sl.plans)
    s += fmt::format(" {:.4g} / {:.4g} ms (micro-batch {}, {} stages);", c.plan.predicted.iteration_time_s * 1e3,
                     c.simulated_s * 1e3, c.mbs, c.plan.stages.size());
  return s + fmt::format(" the fastest simulated is kept ({:.3g} s to simulate)", sl.simulate_s);
}

// The --explain lines about the search: every size's best plan, the DP's optima, GraphPipe's
// candidates, each shortlist's predicted and simulated times, Piper's coarse graph.
void explain_search(PlanReport& rep, const PlannerOptions& opt, int chosen_mbs, bool sp_won,
                    const Shortlist (&shortlist)[2]) {
  const std::optional<PlannerKind> planner = find_planner_kind(opt.planner);
  const bool graphpipe = planner == PlannerKind::graphpipe, piper = planner == PlannerKind::piper;
  std::string alt;
  for (const auto& c : rep.per_micro_batch) {
    std::string cut;
    for (const std::string& k : c.cut) cut += (cut.empty() ? "" : ", ") + k;
    alt += c.pruned
               ? fmt::format(" {}: skipped (no plan of it can predict below the shortlist's worst);", c.micro_batch)
           : c.bottleneck_tps_s > 0
               ? fmt::format(" {}: {:.4g} ms/sample, iteration {:.4g} ms ({} stages){};", c.micro_batch,
                             c.bottleneck_tps_s * 1e3, c.iteration_time_s * 1e3, c.num_stages,
                             cut.empty() ? "" : fmt::format(", {} skipped", cut))
               : fmt::format(" {}: {};", c.micro_batch,
                             cut.empty() ? "does not fit memory" : fmt::format("no plan found, {} skipped", cut));
  }
  rep.explain.push_back(
      fmt::format("micro-batch {} chosen (the simulator's pick among the best plans by "
                  "predicted iteration time); best plan per micro-batch size:{}",
                  chosen_mbs, alt));
  std::string dp;
  for (const auto& c : rep.per_micro_batch)
    if (c.search_tps_s > 0) dp += fmt::format(" {}: {:.6g} ms/sample;", c.micro_batch, c.search_tps_s * 1e3);
  rep.explain.push_back(
      "DP optimum per micro-batch size (the search's own bottleneck, before placement "
      "re-costs each stage on its links):" +
      dp);
  if (graphpipe) {
    rep.explain.push_back("graph: " + rep.sp_note);
    std::string cands;
    for (const auto& c : rep.plan.search.candidates)
      cands += fmt::format(
          "{}{}: iteration {:.4g} ms predicted, {:.4g} ms simulated, {:.1f} samples/s "
          "predicted, {} stages, depth {}, micro-batch {}",
          cands.empty() ? "" : "; ", c.name, c.iteration_time_s * 1e3, c.simulated_iteration_time_s * 1e3,
          c.throughput_samples_per_s, c.num_stages, c.depth, c.micro_batch_size);
    rep.explain.push_back(fmt::format(
        "search: {} won ({}; the series-parallel DP's plan is kept unless the sequential "
        "candidate simulates faster by more than {:g}%) -- {}",
        rep.plan.search.winner,
        sp_won ? "its simulated iteration time is no worse, within the tolerance" : "the chain plan simulates faster",
        kTol * 100, cands));
  }
  for (int kind : {kSp, kChain})
    if (!shortlist[kind].plans.empty())
      rep.explain.push_back(shortlist_note(shortlist[kind], kind == kSp ? "sp" : graphpipe ? "chain" : opt.planner));
  if (piper) {
    const plan::PiperCoarsening& pc = rep.plan.piper;
    rep.explain.push_back(
        fmt::format("piper: DP over {} downsets ({} stage splits; budget {} for --time-limit {:g} s) of a graph "
                    "coarsened from {} ops to {} nodes: {}",
                    pc.downsets, pc.splits, pc.split_budget, opt.time_limit_s, pc.ops, pc.nodes, pc.graph));
  }
}

// What the options and the cluster fix for the whole search (checked first: bad input is a
// UserError before any work).
struct Setup {
  std::chrono::steady_clock::time_point t0, deadline;
  int n = 0;         // devices
  double limit = 0;  // usable memory per device (minus the reserve)
  bool same_node = false;
  std::vector<int> mbs_cands;  // micro-batch sizes to search
  bool graphpipe = false, piper = false;
};

Setup check_options(const cost::CostModel& cm, const PlannerOptions& opt) {
  Setup su;
  su.t0 = std::chrono::steady_clock::now();
  const ir::Graph& g = cm.graph();
  const int n = su.n = cm.cluster().num_devices();
  GP_CHECK(opt.mini_batch >= 1 && opt.mini_batch <= kMaxMiniBatch,
           "--batch: mini-batch size must be in [1, {}], got {}", kMaxMiniBatch, opt.mini_batch);
  GP_CHECK(n <= kMaxDevices, "--devices: the planner handles at most {} devices, got {}", kMaxDevices, n);
  GP_CHECK(g.num_ops() <= kMaxOps, "model \"{}\" has {} ops; the planner handles at most {}", g.name(), g.num_ops(),
           kMaxOps);
  GP_CHECK(find_planner_kind(opt.planner).has_value(), "--planner: unknown planner \"{}\" (valid: {})", opt.planner,
           planner_kind_names(", "));
  GP_CHECK(plan::find_schedule_kind(opt.schedule).has_value(), "--schedule: unknown schedule \"{}\" (valid: {})",
           opt.schedule, plan::schedule_kind_names());
  GP_CHECK(opt.memory_limit_bytes >= 0 && std::isfinite(opt.memory_limit_bytes),
           "--memory-limit must be >= 0 and finite");
  GP_CHECK(opt.time_limit_s > 0 && opt.time_limit_s <= kMaxTimeLimitS, "--time-limit must be in (0, {}] s, got {}",
           kMaxTimeLimitS, opt.time_limit_s);
  su.limit = cm.usable_memory_bytes(opt.memory_limit_bytes);  // minus the device reserve
  GP_CHECK(su.limit > 0,
           "--memory-limit {:.3g} GB leaves nothing for tensors: {} reserves {:.3g} GB per device for "
           "the runtime's context, workspaces and fragmentation (docs/cost-model.md, \"Memory\")",
           (opt.memory_limit_bytes > 0 ? opt.memory_limit_bytes : cm.cluster().device.memory_bytes) / 1e9,
           cm.cluster().name, cm.cluster().device.memory_reserve_bytes / 1e9);
  // Before placement the planner cannot know which links a stage uses: it assumes intra-node links
  // only when the whole cluster is one node (conservative elsewhere); the final plan is re-costed.
  su.same_node = n <= cm.cluster().devices_per_node;
  su.deadline = su.t0 + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(opt.time_limit_s));
  for (int m = 1; m <= opt.mini_batch; m *= 2)
    if (opt.mini_batch % m == 0) su.mbs_cands.push_back(m);
  GP_CHECK(opt.micro_batch >= 0, "--micro-batch: must be >= 1, got {}", opt.micro_batch);
  if (opt.micro_batch > 0) {
    GP_CHECK(opt.mini_batch % opt.micro_batch == 0, "--micro-batch: {} does not divide the mini-batch (--batch {})",
             opt.micro_batch, opt.mini_batch);
    GP_CHECK(std::has_single_bit(static_cast<unsigned>(opt.micro_batch)),
             "--micro-batch: must be a power of two (the planners replicate stages over power-of-two "
             "device counts that divide it), got {}",
             opt.micro_batch);
    su.mbs_cands = {opt.micro_batch};
  }
  su.graphpipe = find_planner_kind(opt.planner) == PlannerKind::graphpipe;
  su.piper = find_planner_kind(opt.planner) == PlannerKind::piper;
  return su;
}

// The planner, chosen once: the searches it runs per micro-batch size, each over its own space,
// reporting every plan it finds (to `on_plan`) and its optimal bottleneck (`tps`). Not movable:
// the searches refer to the structures held beside them.
using OnPlan = std::function<void(const std::vector<StageChoice>&)>;
struct Search {
  Kind kind;            // GraphPipe's "sp" or "chain" candidate (baselines: one, kChain)
  detail::Order order;  // how its plans are assembled
  // `stats`: what the search cost (the DPs' stage evaluations and solves; Piper leaves it).
  std::function<bool(int mbs, double* tps, const OnPlan& on_plan, detail::SearchStats* stats)> run;
  // Whether the search at mbs may find a plan predicted below iteration_s (false: provably none,
  // detail::size_may_beat, within `budget` stage evaluations); empty: no such proof (Piper).
  std::function<bool(int mbs, double iteration_s, size_t budget)> may_beat;
};
struct Searches {
  std::vector<Search> list;
  detail::Structure sp, chain;
  detail::PiperGraph piper_graph;
  int spread = 0;  // per-stage size spread of the SP DP (0 with --micro-batch)
  Searches(const cost::CostModel& cm, const PlannerOptions& opt, const Setup& su, std::string* sp_note);
  Searches(const Searches&) = delete;
  Searches& operator=(const Searches&) = delete;
};

Searches::Searches(const cost::CostModel& cm, const PlannerOptions& opt, const Setup& su, std::string* sp_note) {
  // Per-stage sizes for the SP DP unless --micro-batch fixes them; the chain DP (PipeDream's
  // search, GraphPipe's chain candidate) keeps one size per plan.
  spread = opt.micro_batch > 0 ? 0 : kSizeSpread;
  auto size_search = [&opt, &su](int mbs, int size_spread) {
    return detail::SizeSearch{mbs, size_spread, opt.mini_batch, su.limit, su.n, su.same_node, kTol};
  };
  auto seq_dp = [&cm, size_search](const detail::Structure& st, int size_spread) {
    return [&cm, size_search, st_ptr = &st, size_spread](int mbs, double* tps, const OnPlan& on_plan,
                                                         detail::SearchStats* stats) {
      return detail::search_size(cm, *st_ptr, size_search(mbs, size_spread), tps, on_plan, stats);
    };
  };
  // A plan predicted below iteration_s has every stage's compute per sample below iteration_s / B
  // (timeline_floor_s); the margin covers the rounding between the DP's and the placed costs.
  auto bound = [&cm, &opt, size_search](const detail::Structure& st, int size_spread) {
    return [&cm, &opt, size_search, st_ptr = &st, size_spread](int mbs, double iteration_s, size_t budget) {
      return detail::size_may_beat(cm, *st_ptr, size_search(mbs, size_spread),
                                   iteration_s / opt.mini_batch * (1 + kBoundMargin), budget);
    };
  };
  if (su.graphpipe) {
    sp = detail::sp_structure(cm, sp_note);
    list.push_back({kSp, detail::Order::dag, seq_dp(sp, spread), bound(sp, spread)});
  }
  if (!su.piper) {
    chain = detail::chain_structure(cm);
    // GraphPipe's chain candidate runs as a DAG; PipeDream's declares its chain edges.
    list.push_back(
        {kChain, su.graphpipe ? detail::Order::chain : detail::Order::chain_edges, seq_dp(chain, 0), bound(chain, 0)});
    return;
  }
  piper_graph = detail::piper_graph(
      cm, detail::piper_split_budget(opt.time_limit_s, su.n, static_cast<int>(su.mbs_cands.size())), su.deadline,
      opt.time_limit_s);
  list.push_back({kChain, detail::Order::chain_edges,
                  [this, &cm, &opt, &su](int mbs, double* tps, const OnPlan& on_plan, detail::SearchStats*) {
                    std::vector<StageChoice> best;
                    if (!detail::piper_solve(cm, piper_graph, mbs, opt.mini_batch, su.limit, su.n, su.same_node,
                                             su.deadline, opt.time_limit_s, kTol, tps, &best))
                      return false;
                    on_plan(best);
                    return true;
                  }});
}

// A lower bound on any plan's iteration at micro-batch mbs: M x its slowest stage's micro-batch
// time >= B x (the ops' cheapest device-seconds per sample) / N.
double iteration_lower_bound(const cost::CostModel& cm, const PlannerOptions& opt, const Setup& su, int mbs,
                             int spread) {
  const ir::Graph& g = cm.graph();
  double work = 0;
  for (size_t o = 0; o < g.num_ops(); ++o) {
    double w = std::numeric_limits<double>::infinity();
    for (int b : detail::StageSizes::window(mbs, spread).sizes)  // any stage size at m
      for (int p = 1; p <= std::min(su.n, b); p *= 2)
        w = std::min(w, p * cm.op_step_time(OpId(static_cast<int32_t>(o)), b / p) / b);
    work += w;
  }
  return opt.mini_batch * work / su.n;
}

// The search across micro-batch sizes. Per size each planner's DP minimises the bottleneck TPS;
// GraphPipe keeps two candidates: the SP DP's plan and the best chain plan (sequential pipelines
// the SP DP cannot express, e.g. a stage cutting through a parallel block; placed like PipeDream's
// but run as a DAG). Across sizes every planner ranks its plans by the predicted iteration time
// (the recurrence of timeline.h over the plan's schedule, so pipeline fill counts: one micro-batch of B samples has no
// pipelining at all), keeps each kind's best kShortlist, and picks among them by sim::simulate
// (which adds network contention), GraphPipe's SP plan unless the chain's is faster.
class SizeSweep {
 public:
  SizeSweep(const cost::CostModel& cm, const PlannerOptions& opt, const Setup& su, const Searches& se, PlanReport& rep)
      : cm_(cm), opt_(opt), su_(su), se_(se), rep_(rep) {}

  void run() {
    std::vector<char> done(su_.mbs_cands.size(), 0);
    for (size_t step = 0; step < su_.mbs_cands.size(); ++step) {
      const size_t at = next_size(done);
      done[at] = 1;
      search_size(su_.mbs_cands[at]);
    }
    std::sort(rep_.per_micro_batch.begin(), rep_.per_micro_batch.end(),
              [](const auto& a, const auto& b) { return a.micro_batch < b.micro_batch; });
    // The final ranking is the simulator's: each kind's shortlist is simulated, its fastest kept.
    for (int kind : {kSp, kChain})
      if (!shortlist[kind].plans.empty()) best_of[kind] = simulate_shortlist(cm_, shortlist[kind]);
  }

  // GraphPipe returns its SP plan unless the chain candidate is faster by more than the search's
  // tolerance (the same stages placed in another order can differ by less): predicted times during
  // the search, simulated ones once the shortlists are scored.
  bool sp_wins() const {
    auto time_of = [](const Cand& c) { return c.simulated_s > 0 ? c.simulated_s : c.plan.predicted.iteration_time_s; };
    return best_of[kSp] && (!best_of[kChain] || time_of(*best_of[kChain]) >= time_of(*best_of[kSp]) * (1 - kTol));
  }

  std::string kind_name(Kind kind) const { return kind == kSp ? "sp" : su_.graphpipe ? "chain" : opt_.planner; }

  // The best plan of each kind over all sizes: GraphPipe's "sp" and "chain" candidates (one kind,
  // the planner's own, for the baselines); after run(), the simulator's pick.
  std::optional<Cand> best_of[2];
  Shortlist shortlist[2];

 private:
  // The order sizes are searched in (the result does not depend on it, see Shortlist): the middle
  // size first, then always the unsearched size nearest the best plan's so far (the larger of two
  // equally near), so that good plans fill the shortlists early and the bounds skip the rest.
  size_t next_size(const std::vector<char>& done) const {
    const std::optional<Cand>& overall = sp_wins() ? best_of[kSp] : best_of[kChain];
    const auto& cands = su_.mbs_cands;
    const int from = static_cast<int>(overall ? std::find(cands.begin(), cands.end(), overall->mbs) - cands.begin()
                                              : static_cast<std::ptrdiff_t>(cands.size() / 2));
    size_t pick = cands.size();
    for (size_t j = 0; j < cands.size(); ++j)
      if (!done[j] &&
          (pick == cands.size() || std::abs(static_cast<int>(j) - from) <= std::abs(static_cast<int>(pick) - from)))
        pick = j;
    return pick;
  }

  // Whether search sr must run at mbs: once its kind's shortlist is full, a size none of whose
  // plans can predict below the shortlist's worst adds nothing to it (the size-wide work bound,
  // then size_may_beat's DP with a compute cap). Exact: the shortlists are what searching every
  // size gives.
  bool worth_searching(const Search& sr, int mbs) const {
    const Shortlist& sl = shortlist[sr.kind];
    if (!bound_sizes_ || !sl.full()) return true;
    const double worst = sl.worst_s();
    const int spread = sr.kind == kSp ? se_.spread : 0;
    if (iteration_lower_bound(cm_, opt_, su_, mbs, spread) > worst * (1 + kBoundMargin)) return false;
    // A proof that fails costs as much as it could have saved at a size worth searching: it gets
    // twice an average solve of the kind's searches so far.
    const detail::SearchStats& done = spent_[sr.kind];
    const size_t budget = std::max<size_t>(kProofMinBudget, done.solves ? 2 * done.evals / done.solves : 0);
    return !sr.may_beat || sr.may_beat(mbs, worst, budget);
  }

  // Every plan a search finds at mbs (one per feasible target of its binary search: the smallest
  // bottleneck, and shallower pipelines at larger targets) is placed and re-costed; the smallest
  // predicted iteration time (bubble included) wins, per kind.
  void search_size(int mbs) {
    std::optional<Cand> here[2];
    auto seen = [&](Kind kind, detail::Order order) {
      return [&, kind, order](const std::vector<StageChoice>& st) { offer(mbs, kind, order, st, here[kind]); };
    };
    double search_tps = 0;
    PlanReport::Candidate rc{mbs, 0, 0, 0, 0};
    for (const Search& sr : se_.list) {
      if (!worth_searching(sr, mbs)) {
        rc.cut.push_back(kind_name(sr.kind));
        continue;
      }
      double tps = 0;
      if (sr.run(mbs, &tps, seen(sr.kind, sr.order), &spent_[sr.kind]))
        search_tps = search_tps == 0 ? tps : std::min(search_tps, tps);
    }
    // Data parallelism, offered to every kind: the whole model as one stage on p devices, for each
    // power of two p that divides mbs. The DPs minimise the bottleneck stage, as if the pipeline ran
    // full; with few micro-batches a step is the sum of its stages, and a stage split that lowers
    // the bottleneck can run slower than no split at all (the 4-branch mmt on 2 cores at one
    // micro-batch of 32: the DPs' 2-stage plans 13.11 ms predicted, one stage on both cores 12.4).
    if (opt_.whole_model) {
      std::vector<StageChoice> whole{StageChoice{cm_.graph().op_ids(), 1, 0, 0}};
      for (const Search& sr : se_.list)
        if (std::find(rc.cut.begin(), rc.cut.end(), kind_name(sr.kind)) == rc.cut.end())
          for (whole[0].dp = 1; whole[0].dp <= su_.n && mbs % whole[0].dp == 0; whole[0].dp *= 2)
            offer(mbs, sr.kind, sr.order, whole, here[sr.kind], /*searched=*/false);
    }
    rc.search_tps_s = search_tps;
    rc.pruned = rc.cut.size() == se_.list.size();
    const Cand* top = nullptr;
    for (int kind : {kSp, kChain}) {
      if (!here[kind]) continue;
      if (!top || better(here[kind]->plan, top->plan)) top = &*here[kind];
      if (!best_of[kind] || better(here[kind]->plan, best_of[kind]->plan)) best_of[kind] = here[kind];
    }
    if (top) {
      rc.bottleneck_tps_s = top->plan.predicted.bottleneck_tps_s;
      rc.iteration_time_s = top->plan.predicted.iteration_time_s;
      rc.num_stages = static_cast<int>(top->plan.stages.size());
    }
    rep_.per_micro_batch.push_back(rc);
    double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - su_.t0).count();
    if (opt_.progress && el > 1.0)
      std::fprintf(stderr, "%s: micro-batch %d done (%zu of %zu sizes, %.1f s)%s\n", opt_.planner.c_str(), mbs,
                   rep_.per_micro_batch.size(), su_.mbs_cands.size(), el,
                   rc.pruned ? ", skipped (no plan of it can enter the shortlists)"
                   : top     ? ""
                             : ", no plan fits memory at this size");
  }

  // One plan a search found: placed and re-costed. The DP checks state + in-flight activations; the
  // placed plan's peak also holds the transient buffers and the gradients sent upstream
  // (cost::stage_memory). A plan whose own prediction does not fit is never returned.
  // `searched`: a plan a DP found (counted in the error when none fits), not one offered beside them.
  void offer(int mbs, Kind kind, detail::Order order, const std::vector<StageChoice>& st, std::optional<Cand>& here,
             bool searched = true) {
    Cand c;
    c.mbs = mbs;
    c.plan = detail::assemble_for(cm_, st, mbs, opt_.mini_batch, su_.limit, order, opt_.schedule, nullptr);
    const auto& peaks = c.plan.predicted.peak_memory_bytes;
    if (!peaks.empty() && *std::max_element(peaks.begin(), peaks.end()) > su_.limit * (1 + 1e-9)) {
      rep_.over_memory += searched;
      return;
    }
    c.stages = st;
    c.order = order;
    shortlist[kind].offer(c);
    if (!here || better(c.plan, here->plan)) here = std::move(c);
  }

  const cost::CostModel& cm_;
  const PlannerOptions& opt_;
  const Setup& su_;
  const Searches& se_;
  PlanReport& rep_;
  const bool bound_sizes_ = opt_.bound_sizes;
  detail::SearchStats spent_[2];  // per kind: what its searches cost (the proofs' budget)
};

// The chosen plan placed once more (with --explain's notes), and what the plan file records of the
// search: the planner, Piper's coarse graph, GraphPipe's candidates and winner.
void record_plan(const cost::CostModel& cm, const PlannerOptions& opt, const Setup& su, const Searches& se,
                 const SizeSweep& sw, const Cand& best, bool sp_won, PlanReport& rep) {
  std::vector<std::string> explain;
  rep.plan = detail::assemble_for(cm, best.stages, best.mbs, opt.mini_batch, su.limit, best.order, opt.schedule,
                                  opt.explain ? &explain : nullptr);
  if (best.stages.size() == 1)
    explain.push_back(fmt::format("the best plan is {}: the whole model as one stage on {} device(s)",
                                  best.stages[0].dp > 1 ? "data parallel" : "no pipeline", best.stages[0].dp));
  else if (su.graphpipe && best.order == detail::Order::chain)
    explain.push_back("the best plan is a sequential pipeline (a chain of stages, run as a DAG)");
  rep.plan.planner = opt.planner;
  if (su.piper) rep.plan.piper = se.piper_graph.coarsening;
  if (su.graphpipe) {
    rep.plan.search.winner = sp_won ? "sp" : "chain";
    for (int kind : {kSp, kChain}) {
      if (!sw.best_of[kind]) continue;
      const plan::Plan& cp = sw.best_of[kind]->plan;
      rep.candidate_plans.push_back(cp);
      rep.plan.search.candidates.push_back({kind == kSp ? "sp" : "chain", sw.best_of[kind]->mbs,
                                            static_cast<int>(cp.stages.size()), plan::pipeline_depth(cp),
                                            cp.predicted.iteration_time_s, cp.predicted.throughput_samples_per_s,
                                            cp.predicted.bottleneck_tps_s, sw.best_of[kind]->simulated_s});
    }
  }
  rep.plan.search_time_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - su.t0).count();
  if (opt.explain) {
    rep.explain = std::move(explain);
    explain_search(rep, opt, best.mbs, sp_won, sw.shortlist);
  }
}

}  // namespace

PlanReport run_planner_report(const cost::CostModel& cm, const PlannerOptions& opt) {
  const Setup su = check_options(cm, opt);
  PlanReport rep;
  const Searches searches(cm, opt, su, &rep.sp_note);
  SizeSweep sweep(cm, opt, su, searches, rep);
  sweep.run();
  const bool sp_won = sweep.sp_wins();
  const std::optional<Cand>& best = sp_won ? sweep.best_of[kSp] : sweep.best_of[kChain];
  if (!best && rep.over_memory > 0)
    throw UserError(
        fmt::format("no plan of {} fits {:.3g} GB per device: the search found {} whose weights, gradients, optimizer "
                    "state and in-flight activations fit, but not with their transient buffers and the gradients "
                    "they send (docs/cost-model.md, \"Memory\"); use more devices or a larger --memory-limit",
                    cm.graph().name(), su.limit / 1e9, rep.over_memory));
  if (!best) impossible(cm, su.n, su.limit);
  record_plan(cm, opt, su, searches, sweep, *best, sp_won, rep);
  return rep;
}

plan::Plan run_planner(const cost::CostModel& cm, const PlannerOptions& opt) {
  return run_planner_report(cm, opt).plan;
}

}  // namespace gp::planner
