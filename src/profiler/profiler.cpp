// Op profiling: one timing per distinct op signature and batch size, via runtime::time_op.
#include "profiler/profiler.h"

#include <fmt/ranges.h>
#include <algorithm>
#include <map>
#include <set>

#include "cost/cost_model.h"
#include "runtime/launch/link_bench.h"
#include "runtime/exec/op_timing.h"
#include "support/error.h"

namespace gp::profiler {

std::string describe_op(const ir::Graph& g, OpId id) {
  const ir::Op& op = g.op(id);
  std::string ins;
  for (const std::string& name : op.inputs) {
    OpId src = g.find(name);
    const ir::Shape& s = src.valid() ? g.op(src).output_shape : g.find_input(name)->shape;
    ins += (ins.empty() ? "" : ", ") + ir::shape_str(s);
  }
  return fmt::format("{} {} -> {}", ir::to_string(op.kind), ins, ir::shape_str(op.output_shape));
}

std::string describe_device(int threads, const std::string& device) {
  if (device != "cpu") return runtime::accelerator_description(device);
  // plan::prediction_scope matches a profile to this machine by this "cpu: MODEL (" prefix.
  return fmt::format("cpu: {} ({} thread{})", cost::local_cpu_model(), threads, threads == 1 ? "" : "s");
}

std::vector<int64_t> parse_batches(const std::string& text, const std::string& flag) {
  std::vector<int64_t> out;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    std::string item = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    size_t used = 0;
    int64_t v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    GP_CHECK(used == item.size() && !item.empty() && v >= 1,
             "{}: \"{}\" is not a list of positive integers like 1,2,4,8 (bad item \"{}\")", flag, text, item);
    out.push_back(v);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

cost::Profile profile_graph(const ir::Graph& g, const ProfileOptions& opt, std::ostream* progress) {
  GP_CHECK(!opt.batches.empty(), "--batches: need at least one batch size");
  std::vector<int64_t> batches = opt.batches;
  std::sort(batches.begin(), batches.end());
  batches.erase(std::unique(batches.begin(), batches.end()), batches.end());
  GP_CHECK(batches.front() >= 1, "--batches: batch sizes must be >= 1, found {}", batches.front());
  runtime::set_torch_threads(opt.threads);

  // The first op of each signature represents all ops sharing it.
  std::vector<std::pair<std::string, OpId>> todo;
  std::set<std::string> seen;
  for (size_t i = 0; i < g.num_ops(); ++i) {
    OpId id(static_cast<int32_t>(i));
    std::string sig = cost::op_signature(g, id);
    if (seen.insert(sig).second) todo.emplace_back(std::move(sig), id);
  }
  cost::Profile p;
  p.device = describe_device(opt.threads, opt.device);
  for (size_t k = 0; k < todo.size(); ++k) {
    const auto& [sig, id] = todo[k];
    if (progress)
      *progress << fmt::format("[{}/{}] {} b={} ...", k + 1, todo.size(), describe_op(g, id), fmt::join(batches, ","))
                << std::flush;
    std::vector<runtime::OpTiming> t = runtime::time_op(g, id, batches, opt.warmup, opt.repeats, opt.cpu_clock,
                                                        opt.device);
    cost::OpMeasurement m{sig, ir::to_string(g.op(id).kind), batches, {}, {}};
    for (const auto& x : t) {
      m.fwd_s.push_back(x.fwd_s);
      m.bwd_s.push_back(x.bwd_s);
    }
    if (progress)
      *progress << fmt::format(" fwd {:.3g} ms bwd {:.3g} ms at b={}\n", m.fwd_s.back() * 1e3, m.bwd_s.back() * 1e3,
                               batches.back());
    p.ops.emplace(sig, std::move(m));
  }
  if (opt.context) {
    ProfileOptions sorted = opt;
    sorted.batches = batches;
    profile_context(g, sorted, p, progress);
  }
  return p;
}

void profile_context(const ir::Graph& g, const ProfileOptions& opt, cost::Profile& p, std::ostream* progress) {
  cost::ContextTiming c;
  c.batches = opt.batches;
  const int repeats = std::min(opt.repeats, kContextRepeats);
  if (progress)
    *progress << fmt::format("[model] {} ops in sequence, b={} ...", g.num_ops(), fmt::join(c.batches, ","))
              << std::flush;
  std::vector<runtime::OpTiming> whole = runtime::time_model(g, c.batches, 1, repeats, opt.cpu_clock, opt.device);
  std::vector<std::string> sigs;
  for (OpId id : g.op_ids()) sigs.push_back(cost::op_signature(g, id));
  for (size_t k = 0; k < c.batches.size(); ++k) {
    double fwd = 0, bwd = 0;
    for (size_t i = 0; i < sigs.size(); ++i) {
      auto t = p.lookup(sigs[i], c.batches[k]);
      GP_ASSERT(t.has_value(), "op {} was not profiled", g.op(OpId(static_cast<int32_t>(i))).name);
      fwd += t->first;
      bwd += t->second;
    }
    c.model_fwd_s.push_back(whole[k].fwd_s);
    c.model_bwd_s.push_back(whole[k].bwd_s);
    c.ops_fwd_s.push_back(fwd);
    c.ops_bwd_s.push_back(bwd);
  }
  p.context = c;
  auto [ff, bf] = c.factor(c.batches.back());
  if (progress)
    *progress << fmt::format(" in sequence / alone at b={}: fwd {:.2f}, bwd {:.2f}\n", c.batches.back(), ff, bf);
  const std::vector<std::string> names{"sgd", "adam"};
  const std::vector<runtime::OptimizerTiming> steps = runtime::time_optimizers(g, names, opt.warmup, opt.repeats,
                                                                               opt.cpu_clock, opt.device);
  for (size_t k = 0; k < names.size(); ++k) {
    const runtime::OptimizerTiming& t = steps[k];
    if (t.params == 0) continue;  // nothing to step
    p.optimizer[names[k]] = {t.params, t.step_s};
    if (progress)
      *progress << fmt::format("[optimizer] {} step over {} parameters: {:.3g} ms\n", names[k], t.params,
                               t.step_s * 1e3);
  }
}

void cap_by_larger_sizes(std::vector<std::pair<double, double>>& pts) {
  std::sort(pts.begin(), pts.end());
  for (size_t i = pts.size(); i-- > 1;) pts[i - 1].second = std::min(pts[i - 1].second, pts[i].second);
}

cost::LinkFit fit_link(const std::vector<std::pair<double, double>>& pts, const std::string& what) {
  std::set<double> sizes;
  for (auto& [x, y] : pts) sizes.insert(x);
  GP_CHECK(sizes.size() >= 2, "{}: need measurements at two or more message sizes to fit, found {}", what,
           sizes.size());
  // Weighted by 1/seconds^2 (least squares on relative error): sizes span 4 orders of magnitude,
  // and plain least squares would let the largest message decide the latency.
  double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (auto& [x, y] : pts) {
    GP_CHECK(y > 0, "{}: measured time {} s at {} bytes is not positive", what, y, x);
    double w = 1 / (y * y);
    sw += w, sx += w * x, sy += w * y, sxx += w * x * x, sxy += w * x * y;
  }
  double slope = (sw * sxy - sx * sy) / (sw * sxx - sx * sx);
  double intercept = (sy - slope * sx) / sw;
  if (intercept < 0) {  // through the origin
    intercept = 0;
    slope = sxy / sxx;
  }
  GP_CHECK(slope > 0, "{}: time does not grow with message size (slope {:.3g} s/byte); measure larger sizes", what,
           slope);
  return {intercept, 1.0 / slope};
}

cost::LinkFit fit_link_medians(std::vector<std::pair<double, double>> medians,
                               std::vector<std::pair<double, double>> fastest, const std::string& what,
                               std::ostream* progress) {
  cap_by_larger_sizes(medians);
  try {
    return fit_link(medians, what);
  } catch (const UserError& e) {
    if (progress) *progress << fmt::format("[links] {}: fitting the fastest repeats instead\n", e.what());
    cap_by_larger_sizes(fastest);
    return fit_link(fastest, what);
  }
}

void profile_links(cost::Profile& p, const LinkOptions& o, std::ostream* progress) {
  runtime::LinkBenchOptions bo;
  bo.sizes_bytes = o.sizes_bytes;
  bo.warmup = o.warmup;
  bo.repeats = o.repeats;
  bo.timeout_s = o.timeout_s;
  runtime::LinkBenchResult r = runtime::run_link_bench(bo, progress);
  using Points = std::vector<std::pair<double, double>>;
  Points p2p, ar, p2p_fastest, ar_fastest;
  for (const auto& s : r.samples) {
    const double x = static_cast<double>(s.bytes);
    p2p.emplace_back(x, s.p2p_s);
    ar.emplace_back(x, s.allreduce_s);
    p2p_fastest.emplace_back(x, s.p2p_fastest_s);
    ar_fastest.emplace_back(x, s.allreduce_fastest_s);
  }
  p.p2p = fit_link_medians(p2p, p2p_fastest, "profile --links (p2p)", progress);
  p.allreduce = fit_link_medians(ar, ar_fastest, "profile --links (all-reduce)", progress);
  if (r.lockstep_factor > 0) p.lockstep = r.lockstep_factor;
  if (progress)
    *progress << fmt::format(
                     "[links] fit: p2p latency {:.1f} us, bandwidth {:.2f} GB/s; all-reduce (2 ranks) "
                     "latency {:.1f} us, bandwidth {:.2f} GB/s\n",
                     p.p2p->latency_s * 1e6, p.p2p->bandwidth_Bps / 1e9, p.allreduce->latency_s * 1e6,
                     p.allreduce->bandwidth_Bps / 1e9)
              << std::flush;
}

}  // namespace gp::profiler
