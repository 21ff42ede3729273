// graphpipe.calibration/1 files, the per-machine cache path, and the process-wide calibration source.
#include "cost/calibration.h"

#include <cctype>
#include <cmath>
#include <cstdlib>

namespace gp::cost {
namespace {

constexpr const char* kFormat = "graphpipe.calibration/1";

double positive(const JsonAt& j) {
  double v = j.num();
  if (!std::isfinite(v) || v <= 0) j.fail(fmt::format("must be a positive number, found {}", j.json().dump()));
  return v;
}

double finite(const JsonAt& j) {
  double v = j.num();
  if (!std::isfinite(v)) j.fail(fmt::format("must be a finite number, found {}", j.json().dump()));
  return v;
}

double non_negative(const JsonAt& j) {
  double v = j.num();
  if (!std::isfinite(v) || v < 0) j.fail(fmt::format("must be a non-negative number, found {}", j.json().dump()));
  return v;
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::string slug(const std::string& s) {
  std::string out;
  for (char ch : s) {
    if (std::isalnum(static_cast<unsigned char>(ch))) out += static_cast<char>(std::tolower(ch));
    else if (ch == '.') out += '.';
    else if (!out.empty() && out.back() != '-') out += '-';
  }
  while (!out.empty() && out.back() == '-') out.pop_back();
  return out.empty() ? "unknown" : out;
}

/// The op kind a member's key names (`v`: the member, for the error).
ir::OpKind kind_key(const JsonAt& v, const std::string& key) {
  try {
    return ir::op_kind_from_string(key);
  } catch (const UserError& e) {
    v.fail(fmt::format("is not an op kind: {}", e.what()));
  }
}

CalibrationSource& source() {
  static CalibrationSource s;
  return s;
}

}  // namespace

Json message_cpu_to_json(const MessageCpu& m) {
  return {{"send_s", m.send_s},
          {"send_s_per_byte", m.send_s_per_byte},
          {"recv_s", m.recv_s},
          {"recv_s_per_byte", m.recv_s_per_byte}};
}

MessageCpu message_cpu_from_json(const JsonAt& j) {
  j.expect_object();
  return {non_negative(j.at("send_s")), non_negative(j.at("send_s_per_byte")), non_negative(j.at("recv_s")),
          non_negative(j.at("recv_s_per_byte"))};
}

Json kind_overheads_to_json(const std::map<ir::OpKind, double>& m) {
  Json j = Json::object();
  for (const auto& [k, v] : m) j[ir::to_string(k)] = v;
  return j;
}

std::map<ir::OpKind, double> kind_overheads_from_json(const JsonAt& j) {
  j.expect_object();
  std::map<ir::OpKind, double> m;
  for (const auto& item : j.json().items()) {
    JsonAt v = j.at(item.key().c_str());
    m[kind_key(v, item.key())] = non_negative(v);
  }
  return m;
}

Json kind_pace_to_json(const std::map<ir::OpKind, std::vector<PacePoint>>& m) {
  Json j = Json::object();
  for (const auto& [k, points] : m) {
    Json list = Json::array();
    for (const PacePoint& p : points) list.push_back({p.elems, p.fwd_s, p.bwd_s});
    j[ir::to_string(k)] = list;
  }
  return j;
}

std::map<ir::OpKind, std::vector<PacePoint>> kind_pace_from_json(const JsonAt& j, bool signed_times) {
  j.expect_object();
  std::map<ir::OpKind, std::vector<PacePoint>> m;
  for (const auto& item : j.json().items()) {
    JsonAt list = j.at(item.key().c_str());
    const ir::OpKind k = kind_key(list, item.key());
    if (!list.json().is_array() || list.json().empty())
      list.fail(
          fmt::format("must be a non-empty list of [elements, forward s, backward s], found {}", list.json().dump()));
    std::vector<PacePoint>& points = m[k];
    for (size_t i = 0; i < list.json().size(); ++i) {
      JsonAt p = list.at(i);
      if (!p.json().is_array() || p.json().size() != 3)
        p.fail(fmt::format("must be [elements, forward s, backward s], found {}", p.json().dump()));
      auto time = [&](size_t at) { return signed_times ? finite(p.at(at)) : non_negative(p.at(at)); };
      PacePoint pt{positive(p.at(size_t{0})), time(1), time(2)};
      if (!points.empty() && pt.elems <= points.back().elems)
        p.at(size_t{0}).fail(
            fmt::format("must be larger than the point before it ({}), found {}", points.back().elems, pt.elems));
      points.push_back(pt);
    }
  }
  return m;
}

EfficiencyTable calibrated_efficiency(const CpuCalibration& k) {
  EfficiencyTable t;
  t.source = fmt::format("calibrated on this machine ({}): GEMM N0 = {:.3g} rows, attention at {:.3g} of it",
                         k.measured_at, k.gemm_n0_rows, k.attention_efficiency);
  EfficiencyCurve gemm{1.0, k.gemm_n0_rows};
  EfficiencyCurve attention{k.attention_efficiency, k.gemm_n0_rows};
  gemm.overhead_s = k.gemm_overhead_s;
  attention.overhead_s = k.attention_overhead_s;
  t.f32 = {gemm, attention, gemm, EfficiencyCurve{0.25}};
  t.f16 = t.f32;
  return t;
}

Json calibration_to_json(const CpuCalibration& c) {
  Json j = {{"format", kFormat},
            {"cpu_model", c.cpu_model},
            {"cores", c.cores},
            {"torch_version", c.torch_version},
            {"measured_at", c.measured_at},
            {"method", c.method},
            {"seconds", c.seconds},
            {"gemm_flops", c.gemm_flops},
            {"gemm_n0_rows", c.gemm_n0_rows},
            {"attention_efficiency", c.attention_efficiency},
            {"mem_bandwidth_Bps", c.mem_bandwidth_Bps},
            {"kernel_overhead_s", c.kernel_overhead_s},
            {"gemm_overhead_s", c.gemm_overhead_s},
            {"attention_overhead_s", c.attention_overhead_s},
            {"optimizer_step_s_per_param", {{"sgd", c.sgd_step_s_per_param}, {"adam", c.adam_step_s_per_param}}},
            {"link", {{"bandwidth_Bps", c.link_bandwidth_Bps}, {"latency_s", c.link_latency_s}}},
            {"lockstep", c.lockstep}};
  j["optimizer_step_s_per_tensor"] = {{"sgd", c.sgd_step_s_per_tensor}, {"adam", c.adam_step_s_per_tensor}};
  if (c.allreduce_bandwidth_Bps > 0) j["link"]["allreduce_bandwidth_Bps"] = c.allreduce_bandwidth_Bps;
  j["in_sequence"] = {{"overhead_s", c.sequence_overhead_s}, {"s_per_weight_byte", c.sequence_s_per_weight_byte}};
  if (c.sequence_s_per_activation_byte > 0)
    j["in_sequence"]["s_per_activation_byte"] = c.sequence_s_per_activation_byte;
  if (c.pass_fwd_s > 0 || c.pass_bwd_s > 0) j["pass"] = {{"fwd_s", c.pass_fwd_s}, {"bwd_s", c.pass_bwd_s}};
  if (!c.kind_overhead_s.empty()) j["kind_overhead_s"] = kind_overheads_to_json(c.kind_overhead_s);
  if (!c.kind_pace.empty()) j["kind_pace"] = kind_pace_to_json(c.kind_pace);
  if (!c.kind_in_sequence.empty()) j["kind_in_sequence"] = kind_pace_to_json(c.kind_in_sequence);
  if (c.busy_link_latency_s > 0)
    j["busy_link"] = {{"latency_s", c.busy_link_latency_s}, {"allreduce_latency_s", c.busy_allreduce_latency_s}};
  if (c.busy_link_latency_s > 0 && c.busy_message_cpu.any())
    j["busy_link"]["cpu"] = message_cpu_to_json(c.busy_message_cpu);
  return j;
}

CpuCalibration calibration_from_json(const Json& json, const std::string& file) {
  JsonAt j(json, file);
  expect_format(j, kFormat);
  CpuCalibration c;
  c.cpu_model = j.at("cpu_model").str();
  int64_t cores = j.at("cores").i64();
  if (cores < 1 || cores > 1'000'000) j.at("cores").fail(fmt::format("must be in [1, 1000000], found {}", cores));
  c.cores = static_cast<int>(cores);
  c.torch_version = j.at("torch_version").str();
  c.measured_at = j.str_or("measured_at", "");
  c.method = j.has("method") ? static_cast<int>(j.at("method").i64()) : 0;
  c.seconds = j.has("seconds") ? non_negative(j.at("seconds")) : 0;
  c.gemm_flops = positive(j.at("gemm_flops"));
  c.gemm_n0_rows = non_negative(j.at("gemm_n0_rows"));
  if (j.has("attention_efficiency")) {
    c.attention_efficiency = positive(j.at("attention_efficiency"));
    if (c.attention_efficiency > 1)
      j.at("attention_efficiency").fail(fmt::format("must be in (0, 1], found {}", c.attention_efficiency));
  }
  c.mem_bandwidth_Bps = positive(j.at("mem_bandwidth_Bps"));
  c.kernel_overhead_s = non_negative(j.at("kernel_overhead_s"));
  // Optional (calibrations before issue 35 have neither): 0 = no extra per-call cost.
  c.gemm_overhead_s = j.has("gemm_overhead_s") ? non_negative(j.at("gemm_overhead_s")) : 0;
  c.attention_overhead_s = j.has("attention_overhead_s") ? non_negative(j.at("attention_overhead_s")) : 0;
  if (j.has("optimizer_step_s_per_param")) {  // caches written before it: the bandwidth estimate
    JsonAt o = j.at("optimizer_step_s_per_param");
    o.expect_object();
    c.sgd_step_s_per_param = non_negative(o.at("sgd"));
    c.adam_step_s_per_param = non_negative(o.at("adam"));
  }
  if (j.has("optimizer_step_s_per_tensor")) {
    JsonAt o = j.at("optimizer_step_s_per_tensor");
    o.expect_object();
    c.sgd_step_s_per_tensor = non_negative(o.at("sgd"));
    c.adam_step_s_per_tensor = non_negative(o.at("adam"));
  }
  JsonAt link = j.at("link");
  link.expect_object();
  c.link_bandwidth_Bps = positive(link.at("bandwidth_Bps"));
  c.link_latency_s = non_negative(link.at("latency_s"));
  if (link.has("allreduce_bandwidth_Bps")) c.allreduce_bandwidth_Bps = positive(link.at("allreduce_bandwidth_Bps"));
  c.lockstep = j.has("lockstep") ? positive(j.at("lockstep")) : 1;
  if (j.has("busy_link")) {
    JsonAt busy = j.at("busy_link");
    busy.expect_object();
    c.busy_link_latency_s = non_negative(busy.at("latency_s"));
    c.busy_allreduce_latency_s = non_negative(busy.at("allreduce_latency_s"));
    if (busy.has("cpu")) c.busy_message_cpu = message_cpu_from_json(busy.at("cpu"));
  }
  if (j.has("in_sequence")) {
    JsonAt q = j.at("in_sequence");
    q.expect_object();
    c.sequence_overhead_s = non_negative(q.at("overhead_s"));
    c.sequence_s_per_weight_byte = non_negative(q.at("s_per_weight_byte"));
    if (q.has("s_per_activation_byte")) c.sequence_s_per_activation_byte = non_negative(q.at("s_per_activation_byte"));
  }
  if (j.has("pass")) {
    JsonAt q = j.at("pass");
    q.expect_object();
    c.pass_fwd_s = non_negative(q.at("fwd_s"));
    c.pass_bwd_s = non_negative(q.at("bwd_s"));
  }
  if (j.has("kind_overhead_s")) c.kind_overhead_s = kind_overheads_from_json(j.at("kind_overhead_s"));
  if (j.has("kind_pace")) c.kind_pace = kind_pace_from_json(j.at("kind_pace"));
  if (j.has("kind_in_sequence")) c.kind_in_sequence = kind_pace_from_json(j.at("kind_in_sequence"), true);
  return c;
}

std::string calibration_cache_dir() {
  if (std::string d = env("GRAPHPIPE_CACHE_DIR"); !d.empty()) return d;
  if (std::string d = env("XDG_CACHE_HOME"); !d.empty()) return d + "/graphpipe";
  if (std::string d = env("HOME"); !d.empty()) return d + "/.cache/graphpipe";
  return "";
}

std::string calibration_cache_path(const std::string& cpu_model, int cores, const std::string& torch_version) {
  std::string dir = calibration_cache_dir();
  if (dir.empty()) return "";
  return fmt::format("{}/cpu-calibration-{}-{}c-torch{}.json", dir, slug(cpu_model), cores, slug(torch_version));
}

std::string calibration_env() { return env("GRAPHPIPE_CALIBRATION"); }

void set_calibration_source(CalibrationSource s) { source() = std::move(s); }

const std::optional<CpuCalibration>& active_calibration() {
  static const std::optional<CpuCalibration> active = []() -> std::optional<CpuCalibration> {
    std::string e = calibration_env();
    if (e == "off") return std::nullopt;
    if (!e.empty() && e != "refresh") {
      CpuCalibration c = calibration_from_json(read_json_file(e), e);
      return c;
    }
    if (source()) return source()();
    return std::nullopt;
  }();
  return active;
}

}  // namespace gp::cost
