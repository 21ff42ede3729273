// graphpipe.profile/1: op signatures, interpolated lookup, and strict JSON reading/writing.
#include "cost/profile.h"

#include <algorithm>
#include <cmath>

namespace gp::cost {
namespace {

constexpr const char* kFormat = "graphpipe.profile/1";

std::string typed_shape(ir::DType t, const ir::Shape& s) {
  return fmt::format("{}{}", ir::to_string(t), ir::shape_str(s));
}

std::vector<double> times_from_json(const JsonAt& j, size_t n) {
  j.expect_array();
  if (j.size() != n) j.fail(fmt::format("has {} entries, expected {} (one per batch)", j.size(), n));
  std::vector<double> out;
  for (size_t i = 0; i < n; ++i) {
    JsonAt t = j.at(i);
    double v = t.num();
    if (!std::isfinite(v) || v < 0)
      t.fail(fmt::format("must be a non-negative time in seconds, found {}", t.json().dump()));
    out.push_back(v);
  }
  return out;
}

LinkFit link_fit_from_json(const JsonAt& j) {
  j.expect_object();
  LinkFit f;
  JsonAt lat = j.at("latency_s"), bw = j.at("bandwidth_Bps");
  f.latency_s = lat.num();
  f.bandwidth_Bps = bw.num();
  if (!std::isfinite(f.latency_s) || f.latency_s < 0)
    lat.fail(fmt::format("must be a non-negative number, found {}", lat.json().dump()));
  if (!std::isfinite(f.bandwidth_Bps) || f.bandwidth_Bps <= 0)
    bw.fail(fmt::format("must be a positive number, found {}", bw.json().dump()));
  return f;
}

Json link_fit_to_json(const LinkFit& f) { return {{"latency_s", f.latency_s}, {"bandwidth_Bps", f.bandwidth_Bps}}; }

Json context_to_json(const ContextTiming& c) {
  return {{"batches", c.batches},
          {"model_fwd_s", c.model_fwd_s},
          {"model_bwd_s", c.model_bwd_s},
          {"ops_fwd_s", c.ops_fwd_s},
          {"ops_bwd_s", c.ops_bwd_s}};
}

ContextTiming context_from_json(const JsonAt& j) {
  j.expect_object();
  ContextTiming c;
  JsonAt batches = j.at("batches");
  c.batches = batches.i64_list();
  if (c.batches.empty()) batches.fail("must list at least one batch size");
  for (size_t k = 0; k < c.batches.size(); ++k)
    if (c.batches[k] < 1 || (k > 0 && c.batches[k] <= c.batches[k - 1]))
      batches.at(k).fail(fmt::format("batches must be >= 1 and strictly ascending, found {}", c.batches[k]));
  c.model_fwd_s = times_from_json(j.at("model_fwd_s"), c.batches.size());
  c.model_bwd_s = times_from_json(j.at("model_bwd_s"), c.batches.size());
  c.ops_fwd_s = times_from_json(j.at("ops_fwd_s"), c.batches.size());
  c.ops_bwd_s = times_from_json(j.at("ops_bwd_s"), c.batches.size());
  return c;
}

std::map<std::string, OptimizerStep> optimizer_from_json(const JsonAt& j) {
  j.expect_object();
  std::map<std::string, OptimizerStep> out;
  for (const auto& item : j.json().items()) {
    const std::string& name = item.key();
    JsonAt o = j.at(name.c_str());
    if (name != "sgd" && name != "adam") o.fail("unknown optimizer (valid: sgd, adam)");
    o.expect_object();
    OptimizerStep st;
    st.params = o.at("params").i64();
    if (st.params < 1) o.at("params").fail(fmt::format("must be >= 1, found {}", st.params));
    JsonAt step = o.at("step_s");
    st.step_s = step.num();
    if (!std::isfinite(st.step_s) || st.step_s < 0)
      step.fail(fmt::format("must be a non-negative time in seconds, found {}", step.json().dump()));
    out.emplace(name, st);
  }
  return out;
}

double lockstep_from_json(const JsonAt& j) {
  j.expect_object();
  if (j.at("ranks").i64() != 2) j.at("ranks").fail("only 2-rank lockstep factors are measured");
  JsonAt f = j.at("factor");
  double v = f.num();
  if (!std::isfinite(v) || v <= 0) f.fail(fmt::format("must be a positive ratio, found {}", f.json().dump()));
  return v;
}

}  // namespace

std::pair<double, double> ContextTiming::factor(int64_t b) const {
  auto ratio = [](double model, double ops) { return ops > 0 ? model / ops : 1.0; };
  auto at = [&](size_t k) {
    return std::make_pair(ratio(model_fwd_s[k], ops_fwd_s[k]), ratio(model_bwd_s[k], ops_bwd_s[k]));
  };
  if (batches.empty()) return {1.0, 1.0};
  if (b <= batches.front()) return at(0);
  if (b >= batches.back()) return at(batches.size() - 1);
  size_t hi = std::lower_bound(batches.begin(), batches.end(), b) - batches.begin();
  auto [f0, b0] = at(hi - 1);
  auto [f1, b1] = at(hi);
  double t = static_cast<double>(b - batches[hi - 1]) / static_cast<double>(batches[hi] - batches[hi - 1]);
  return {f0 + t * (f1 - f0), b0 + t * (b1 - b0)};
}

std::string op_signature(const ir::Graph& g, OpId id) {
  const ir::Op& op = g.op(id);
  std::string ins;
  for (const std::string& name : op.inputs) {
    if (!ins.empty()) ins += ",";
    OpId src = g.find(name);
    if (src.valid()) {
      ins += typed_shape(g.op(src).dtype, g.op(src).output_shape);
    } else {
      const ir::Input* in = g.find_input(name);
      GP_ASSERT(in != nullptr, "op {} reads unknown tensor {}", op.name, name);
      ins += typed_shape(in->dtype, in->shape);
    }
  }
  return fmt::format("{}({})->{} {}", ir::to_string(op.kind), ins, typed_shape(op.dtype, op.output_shape),
                     op.attrs.dump());
}

BatchFit fit_batch_curve(const std::vector<int64_t>& batches, const std::vector<double>& times) {
  GP_ASSERT(batches.size() == times.size(), "{} batches, {} times", batches.size(), times.size());
  // Minimise sum ((a + A b_i) / t_i - 1)^2: linear least squares in u_i = 1/t_i and b_i u_i,
  // with times in units of the largest one (and u capped) so that no sum overflows.
  double scale = 0;
  for (double t : times) scale = std::max(scale, t);
  BatchFit f;
  if (!(scale > 0) || !std::isfinite(scale)) return f;  // no positive (finite) time
  double suu = 0, sbuu = 0, sbbuu = 0, su = 0, sbu = 0;
  for (size_t i = 0; i < batches.size(); ++i) {
    if (!(times[i] > 0)) continue;
    double u = std::min(scale / times[i], 1e100), b = static_cast<double>(batches[i]);
    suu += u * u, sbuu += b * u * u, sbbuu += b * b * u * u, su += u, sbu += b * u;
  }
  double det = suu * sbbuu - sbuu * sbuu;
  if (det > 1e-9 * suu * sbbuu) {
    f.fixed_s = (su * sbbuu - sbu * sbuu) / det;
    f.per_sample_s = (suu * sbu - sbuu * su) / det;
  }
  if (!(det > 1e-9 * suu * sbbuu) || f.fixed_s < 0) {  // one batch, or the fit wants a < 0
    f.fixed_s = 0;
    f.per_sample_s = sbu / sbbuu;
  } else if (f.per_sample_s < 0) {  // time falls with the batch: the best constant
    f.fixed_s = su / suu;
    f.per_sample_s = 0;
  }
  f.fixed_s *= scale;
  f.per_sample_s *= scale;
  return f;
}

namespace {

/// t at batch b beyond the measured range: the fit scaled through the edge point (b_edge, t_edge).
double extrapolate(const BatchFit& fit, double b, double b_edge, double t_edge) {
  double at_edge = fit.at(b_edge);
  return at_edge > 0 ? t_edge * fit.at(b) / at_edge : t_edge;
}

}  // namespace

std::optional<ProfileTime> Profile::estimate(const std::string& signature, int64_t b) const {
  GP_ASSERT(b >= 1, "batch must be >= 1, got {}", b);
  auto it = ops.find(signature);
  if (it == ops.end()) return std::nullopt;
  const OpMeasurement& m = it->second;
  if (m.batches.empty()) return std::nullopt;
  if (b < m.batches.front() || b > m.batches.back()) {
    size_t edge = b < m.batches.front() ? 0 : m.batches.size() - 1;
    double bd = static_cast<double>(b), be = static_cast<double>(m.batches[edge]);
    return ProfileTime{extrapolate(fit_batch_curve(m.batches, m.fwd_s), bd, be, m.fwd_s[edge]),
                       extrapolate(fit_batch_curve(m.batches, m.bwd_s), bd, be, m.bwd_s[edge]), true};
  }
  // First measured batch >= b; exact hits return the measurement itself.
  size_t hi = std::lower_bound(m.batches.begin(), m.batches.end(), b) - m.batches.begin();
  if (m.batches[hi] == b) return ProfileTime{m.fwd_s[hi], m.bwd_s[hi], false};
  size_t lo = hi - 1;
  double t = static_cast<double>(b - m.batches[lo]) / static_cast<double>(m.batches[hi] - m.batches[lo]);
  return ProfileTime{m.fwd_s[lo] + t * (m.fwd_s[hi] - m.fwd_s[lo]), m.bwd_s[lo] + t * (m.bwd_s[hi] - m.bwd_s[lo]),
                     false};
}

std::optional<std::pair<double, double>> Profile::lookup(const std::string& signature, int64_t b) const {
  auto e = estimate(signature, b);
  if (!e) return std::nullopt;
  return std::make_pair(e->fwd_s, e->bwd_s);
}

Json profile_to_json(const Profile& p) {
  Json ops = Json::array();
  for (const auto& [sig, m] : p.ops) {
    ops.push_back(
        {{"signature", m.signature}, {"kind", m.kind}, {"batches", m.batches}, {"fwd_s", m.fwd_s}, {"bwd_s", m.bwd_s}});
  }
  Json j = {{"format", kFormat}, {"device", p.device}, {"ops", ops}};
  if (p.p2p) j["p2p"] = link_fit_to_json(*p.p2p);
  if (p.allreduce) j["allreduce"] = link_fit_to_json(*p.allreduce);
  if (p.lockstep) j["lockstep"] = {{"ranks", 2}, {"factor", *p.lockstep}};
  if (p.context) j["context"] = context_to_json(*p.context);
  for (const auto& [name, st] : p.optimizer) j["optimizer"][name] = {{"params", st.params}, {"step_s", st.step_s}};
  return j;
}

Profile profile_from_json(const Json& json, const std::string& file) { return profile_from_json(JsonAt(json, file)); }

Profile profile_from_json(const JsonAt& j) {
  expect_format(j, kFormat);
  Profile p;
  p.device = j.at("device").str();
  JsonAt ops = j.at("ops");
  for (size_t i = 0; i < ops.size(); ++i) {
    JsonAt o = ops.at(i);
    o.expect_object();
    OpMeasurement m;
    m.signature = o.at("signature").str();
    if (m.signature.empty()) o.at("signature").fail("must not be empty");
    m.kind = o.at("kind").str();
    try {
      ir::op_kind_from_string(m.kind);
    } catch (const UserError& e) {
      o.at("kind").fail(e.what());
    }
    JsonAt batches = o.at("batches");
    m.batches = batches.i64_list();
    if (m.batches.empty()) batches.fail("must list at least one batch size");
    for (size_t k = 0; k < m.batches.size(); ++k) {
      if (m.batches[k] < 1) batches.at(k).fail(fmt::format("batch must be >= 1, found {}", m.batches[k]));
      if (k > 0 && m.batches[k] <= m.batches[k - 1])
        batches.at(k).fail(
            fmt::format("batches must be strictly ascending, found {} after {}", m.batches[k], m.batches[k - 1]));
    }
    m.fwd_s = times_from_json(o.at("fwd_s"), m.batches.size());
    m.bwd_s = times_from_json(o.at("bwd_s"), m.batches.size());
    if (p.ops.count(m.signature)) o.at("signature").fail(fmt::format("duplicate signature \"{}\"", m.signature));
    p.ops.emplace(m.signature, std::move(m));
  }
  if (j.has("p2p")) p.p2p = link_fit_from_json(j.at("p2p"));
  if (j.has("allreduce")) p.allreduce = link_fit_from_json(j.at("allreduce"));
  if (j.has("lockstep")) p.lockstep = lockstep_from_json(j.at("lockstep"));
  if (j.has("context")) p.context = context_from_json(j.at("context"));
  if (j.has("optimizer")) p.optimizer = optimizer_from_json(j.at("optimizer"));
  return p;
}

Profile load_profile(const std::string& path) { return profile_from_json(read_json_file(path), path); }

void save_profile(const std::string& path, const Profile& p) { write_json_file(path, profile_to_json(p)); }

}  // namespace gp::cost
