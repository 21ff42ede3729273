// run_planner: the outer loops (micro-batch sizes, binary search on the target TPS), impossible-
// request errors, device placement, and the plan's predictions.
#include "planner/planner.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdio>
#include <limits>
#include <numeric>

#include "planner/engine.h"

namespace gp::planner {

using detail::StageChoice;

std::vector<std::string> planner_names() { return {"graphpipe", "pipedream", "piper"}; }

namespace {

constexpr double kTol = 1e-3;  // relative tolerance of the binary search on the target TPS

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
    throw UserError(fmt::format("op \"{}\" alone needs {} (weights, gradients, optimizer state and "
                                "activations at micro-batch 1); devices have {}",
                                worst_op, gb(worst), gb(limit)));
  throw UserError(fmt::format("model \"{}\" needs {} per device at micro-batch 1 even spread over "
                              "all {} devices ({} of weights+gradients+optimizer state, {} of "
                              "activations per sample); devices have {}",
                              g.name(), gb((state + act) / n), n, gb(state), gb(act), gb(limit)));
}

struct Found {
  int mbs = 0;
  double tps = std::numeric_limits<double>::infinity();
  std::vector<StageChoice> stages;
};

}  // namespace

// Defined in assemble.cpp.
namespace detail {
plan::Plan assemble(const cost::CostModel& cm, const std::vector<StageChoice>& stages, int mbs,
                    int mini_batch, double memory_limit, std::vector<std::string>* explain);
}

PlanReport run_planner_report(const cost::CostModel& cm, const PlannerOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  const ir::Graph& g = cm.graph();
  const int n = cm.cluster().num_devices();
  GP_CHECK(opt.mini_batch >= 1, "--batch: mini-batch size must be >= 1, got {}", opt.mini_batch);
  auto names = planner_names();
  GP_CHECK(std::find(names.begin(), names.end(), opt.planner) != names.end(),
           "--planner: unknown planner \"{}\" (valid: graphpipe, pipedream, piper)", opt.planner);
  GP_CHECK(opt.memory_limit_bytes >= 0, "--memory-limit must be >= 0");
  GP_CHECK(opt.time_limit_s > 0, "--time-limit must be > 0 s, got {}", opt.time_limit_s);
  const double limit = opt.memory_limit_bytes > 0 ? opt.memory_limit_bytes : cm.cluster().device.memory_bytes;
  // Before placement the planner cannot know which links a stage uses: it assumes intra-node links
  // only when the whole cluster is one node (conservative elsewhere); the final plan is re-costed.
  const bool same_node = n <= cm.cluster().devices_per_node;
  const auto deadline = t0 + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                 std::chrono::duration<double>(opt.time_limit_s));

  std::vector<int> mbs_cands;
  for (int m = 1; m <= opt.mini_batch; m *= 2)
    if (opt.mini_batch % m == 0) mbs_cands.push_back(m);

  PlanReport rep;
  detail::Structure sp, chain;
  if (opt.planner == "graphpipe") sp = detail::sp_structure(cm, &rep.sp_note);
  if (opt.planner != "piper") chain = detail::chain_structure(cm);

  // GraphPipe keeps two candidates: the SP DP's plan and the best chain plan (sequential pipelines
  // the SP DP cannot express, e.g. a stage cutting through a parallel block). The chain search is
  // exactly PipeDream's, so after both are placed and re-costed GraphPipe is never predicted worse.
  Found best, best_chain;
  size_t explored = 0;
  for (int mbs : mbs_cands) {
    Found f, c;
    f.mbs = c.mbs = mbs;
    bool ok = false, cok = false;
    if (opt.planner == "graphpipe") {
      detail::SeqDp dp(cm, sp, mbs, opt.mini_batch, limit, n, same_node);
      ok = dp.minimise(kTol, 0, &f.tps, &f.stages);
    }
    if (opt.planner != "piper") {
      detail::SeqDp cdp(cm, chain, mbs, opt.mini_batch, limit, n, same_node);
      cok = cdp.minimise(kTol, 0, &c.tps, &c.stages);
    } else {
      size_t k = 0;
      ok = detail::piper_minimise(cm, mbs, opt.mini_batch, limit, n, same_node, deadline,
                                  opt.time_limit_s, kTol, &f.tps, &f.stages, &k);
      explored = std::max(explored, k);
    }
    if (opt.planner == "pipedream") std::swap(f, c), std::swap(ok, cok);
    double shown = std::min(ok ? f.tps : 1e300, cok ? c.tps : 1e300);
    int shown_stages = ok && (!cok || f.tps <= c.tps) ? static_cast<int>(f.stages.size())
                                                      : static_cast<int>(c.stages.size());
    rep.per_micro_batch.push_back({mbs, ok || cok ? shown : 0, ok || cok ? shown_stages : 0});
    if (ok && f.tps < best.tps * (1 - 1e-9)) best = std::move(f);
    if (cok && c.tps < best_chain.tps * (1 - 1e-9)) best_chain = std::move(c);
    double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (opt.progress && el > 1.0)
      std::fprintf(stderr, "%s: micro-batch %d done (%.1f s)\n", opt.planner.c_str(), mbs, el);
  }
  if (best.stages.empty() && best_chain.stages.empty()) impossible(cm, n, limit);

  std::vector<std::string> explain;
  double chain_best = 0;
  if (!best.stages.empty())
    rep.plan = detail::assemble(cm, best.stages, best.mbs, opt.mini_batch, limit,
                                opt.explain ? &explain : nullptr);
  if (!best_chain.stages.empty()) {
    std::vector<std::string> cexplain;
    plan::Plan cp = detail::assemble(cm, best_chain.stages, best_chain.mbs, opt.mini_batch, limit,
                                     opt.explain ? &cexplain : nullptr);
    chain_best = cp.predicted.bottleneck_tps_s;
    if (best.stages.empty() || cp.predicted.bottleneck_tps_s < rep.plan.predicted.bottleneck_tps_s) {
      rep.plan = std::move(cp);
      explain = std::move(cexplain);
      if (opt.planner == "graphpipe") explain.push_back("the best plan is a sequential pipeline");
      best = best_chain;
    }
  }
  rep.plan.planner = opt.planner;
  rep.plan.search_time_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (opt.explain) {
    rep.explain = std::move(explain);
    std::string alt;
    for (const auto& c : rep.per_micro_batch)
      alt += c.bottleneck_tps_s > 0 ? fmt::format(" {}: {:.4g} ms/sample ({} stages);", c.micro_batch,
                                                 c.bottleneck_tps_s * 1e3, c.num_stages)
                                    : fmt::format(" {}: does not fit memory;", c.micro_batch);
    rep.explain.push_back(fmt::format("micro-batch {} chosen: best bottleneck per micro-batch size:{}",
                                      best.mbs, alt));
    if (opt.planner == "graphpipe") {
      rep.explain.push_back("graph: " + rep.sp_note);
      if (chain_best > 0)
        rep.explain.push_back(fmt::format("best sequential (chain) plan in the same search: {:.4g} ms/sample",
                                          chain_best * 1e3));
    }
    if (opt.planner == "piper") rep.explain.push_back(fmt::format("piper explored {} downsets", explored));
  }
  (void)g;
  return rep;
}

plan::Plan run_planner(const cost::CostModel& cm, const PlannerOptions& opt) {
  return run_planner_report(cm, opt).plan;
}

}  // namespace gp::planner
