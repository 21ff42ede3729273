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

Json link_fit_to_json(const LinkFit& f) {
  return {{"latency_s", f.latency_s}, {"bandwidth_Bps", f.bandwidth_Bps}};
}

}  // namespace

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
  return fmt::format("{}({})->{} {}", ir::to_string(op.kind), ins,
                     typed_shape(op.dtype, op.output_shape), op.attrs.dump());
}

std::optional<std::pair<double, double>> Profile::lookup(const std::string& signature,
                                                         int64_t b) const {
  auto it = ops.find(signature);
  if (it == ops.end()) return std::nullopt;
  const OpMeasurement& m = it->second;
  if (m.batches.empty() || b < m.batches.front() || b > m.batches.back()) return std::nullopt;
  // First measured batch >= b; exact hits return the measurement itself.
  size_t hi = std::lower_bound(m.batches.begin(), m.batches.end(), b) - m.batches.begin();
  if (m.batches[hi] == b) return std::make_pair(m.fwd_s[hi], m.bwd_s[hi]);
  size_t lo = hi - 1;
  double t = static_cast<double>(b - m.batches[lo]) / static_cast<double>(m.batches[hi] - m.batches[lo]);
  return std::make_pair(m.fwd_s[lo] + t * (m.fwd_s[hi] - m.fwd_s[lo]),
                        m.bwd_s[lo] + t * (m.bwd_s[hi] - m.bwd_s[lo]));
}

Json profile_to_json(const Profile& p) {
  Json ops = Json::array();
  for (const auto& [sig, m] : p.ops) {
    ops.push_back({{"signature", m.signature},
                   {"kind", m.kind},
                   {"batches", m.batches},
                   {"fwd_s", m.fwd_s},
                   {"bwd_s", m.bwd_s}});
  }
  Json j = {{"format", kFormat}, {"device", p.device}, {"ops", ops}};
  if (p.p2p) j["p2p"] = link_fit_to_json(*p.p2p);
  if (p.allreduce) j["allreduce"] = link_fit_to_json(*p.allreduce);
  return j;
}

Profile profile_from_json(const Json& json, const std::string& file) {
  return profile_from_json(JsonAt(json, file));
}

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
        batches.at(k).fail(fmt::format("batches must be strictly ascending, found {} after {}",
                                       m.batches[k], m.batches[k - 1]));
    }
    m.fwd_s = times_from_json(o.at("fwd_s"), m.batches.size());
    m.bwd_s = times_from_json(o.at("bwd_s"), m.batches.size());
    if (p.ops.count(m.signature))
      o.at("signature").fail(fmt::format("duplicate signature \"{}\"", m.signature));
    p.ops.emplace(m.signature, std::move(m));
  }
  if (j.has("p2p")) p.p2p = link_fit_from_json(j.at("p2p"));
  if (j.has("allreduce")) p.allreduce = link_fit_from_json(j.at("allreduce"));
  return p;
}

Profile load_profile(const std::string& path) { return profile_from_json(read_json_file(path), path); }

void save_profile(const std::string& path, const Profile& p) { write_json_file(path, profile_to_json(p)); }

}  // namespace gp::cost
