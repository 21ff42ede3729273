// `cpu` preset calibration: op timings through runtime::time_op (LibTorch, one thread), fitted so the
// cost model's roofline reproduces them; the loopback link through profile_links; a per-machine cache.
#include "profiler/calibrate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <thread>
#include <tuple>

#include <fmt/ranges.h>

#include "cost/cost_model.h"
#include "profiler/profiler.h"
#include "runtime/exec/op_timing.h"
#include "runtime/launch/link_bench.h"
#include "runtime/launch/pass_bench.h"
#include "support/error.h"
#include "support/stats.h"

namespace gp::profiler {
namespace {

namespace fs = std::filesystem;

struct Timed {
  ir::Graph graph;
  OpId op;
  int64_t batch = 0;
  double seconds = 0;           // forward + backward, median of the repeats
  double fwd_s = 0, bwd_s = 0;  // each's median
};

/// x [per_sample] -> relu (so the measured op's input requires grad, as inside a stage) -> the op
/// (`out_features`: a linear's outputs, an attention's heads).
ir::Graph one_op(const std::string& name, ir::Shape per_sample, ir::OpKind kind, int64_t out_features) {
  ir::ModelBuilder b(name);
  std::string x = b.input("x", std::move(per_sample));
  std::string pre = b.unary("pre", ir::OpKind::relu, x);
  std::string y = kind == ir::OpKind::linear      ? b.linear("op", pre, out_features)
                  : kind == ir::OpKind::attention ? b.op("op", kind, {pre}, {{"heads", out_features}})
                  : kind == ir::OpKind::add       ? b.op("op", kind, {pre, b.unary("pre2", ir::OpKind::gelu, x)})
                                                  : b.unary("op", kind, pre);
  b.output(y);
  return ir::Graph::build(b.build(), "calibration");
}

/// The memory-bound kinds whose fixed time per call and pace per element calibrate_cpu measures (step
/// 1b): the transformers', CNNs' and MLPs' elementwise ops, norms, reductions and losses.
constexpr std::array kKindsTimed = {ir::OpKind::relu,    ir::OpKind::add,          ir::OpKind::mul,
                                    ir::OpKind::gelu,    ir::OpKind::sigmoid,      ir::OpKind::tanh,
                                    ir::OpKind::softmax, ir::OpKind::layernorm,    ir::OpKind::mean,
                                    ir::OpKind::concat,  ir::OpKind::cross_entropy};
/// The batches each is timed at: 1 K, 32 K and 512 K floats per tensor (4 KB in the L1 cache, 128 KB in
/// the L2, 2 MB beyond it; cross_entropy 1/16 of that).
constexpr std::array<int64_t, 3> kKindBatches = {1, 32, 512};

/// One op of `kind` on 16 x 64 floats per sample (1024; cross_entropy: 64 logits and a label), its
/// inputs through a relu (so they require grad, as inside a stage).
ir::Graph kind_op(ir::OpKind kind) {
  ir::ModelBuilder b("kind");
  const bool loss = kind == ir::OpKind::cross_entropy;
  std::string x = b.input("x", loss ? ir::Shape{64} : ir::Shape{16, 64});
  std::string pre = b.unary("pre", ir::OpKind::relu, x);
  std::vector<std::string> in{pre};
  if (kind == ir::OpKind::add || kind == ir::OpKind::mul || kind == ir::OpKind::concat)
    in.push_back(b.unary("pre2", ir::OpKind::relu, x));
  if (loss) in.push_back(b.input("label", {}, ir::DType::i64));
  Json attrs = Json::object();
  if (kind == ir::OpKind::concat || kind == ir::OpKind::mean) attrs["axis"] = 1;
  b.output(b.op("op", kind, in, attrs));
  return ir::Graph::build(b.build(), "calibration");
}

/// Step 6b times the attention in sequence, the one op of many kernels and intermediate tensors (the
/// memory-bound kinds and the linear, each inserted 4 times among the blocks of a residual chain,
/// measured -35..+24 us per call that moved by 15-30 us between two calibrations a minute apart; the
/// reference chains' fit prices them), at 1 K and 32 K floats per tensor (beyond that the extra holds:
/// the op alone leaves the L2 too), in a chain of kChainOps.
constexpr std::array<int64_t, 2> kChainBatches = {1, 32};
constexpr int kChainOps = 8;

/// x [16, 64] -> linear 64 -> `ops` attentions of 4 heads -> mean over the 16 -> linear 10 ->
/// cross_entropy: a chain trained as a step runs it, each op's output the next one's input.
ir::Graph attention_chain(int ops) {
  ir::ModelBuilder b("chain");
  // A linear first, so that every op after it has its backward to compute.
  std::string x = b.linear("pre", b.input("x", {16, 64}), 64);
  for (int i = 0; i < ops; ++i) x = b.op(fmt::format("op{}", i), ir::OpKind::attention, {x}, {{"heads", 4}});
  std::string y = b.linear("fc", b.op("pool", ir::OpKind::mean, {x}, {{"axis", 1}}), 10);
  b.output(b.op("loss", ir::OpKind::cross_entropy, {y, b.input("label", {}, ir::DType::i64)}));
  return ir::Graph::build(b.build(), "calibration");
}

/// x [16, 64] -> `blocks` residual blocks (linear 64, gelu, add, layer norm) -> mean over the 16 ->
/// linear 10 -> cross_entropy: the model whose stage passes step 8 times at 1 and kPassBlocks blocks.
ir::Graph pass_chain(int blocks) {
  ir::ModelBuilder b("passes");
  std::string x = b.input("x", {16, 64});
  for (int i = 0; i < blocks; ++i) {
    std::string h = b.unary(fmt::format("g{}", i), ir::OpKind::gelu, b.linear(fmt::format("l{}", i), x, 64));
    x = b.unary(fmt::format("n{}", i), ir::OpKind::layernorm, b.op(fmt::format("a{}", i), ir::OpKind::add, {x, h}));
  }
  std::string y = b.linear("fc", b.op("pool", ir::OpKind::mean, {x}, {{"axis", 1}}), 10);
  b.output(b.op("loss", ir::OpKind::cross_entropy, {y, b.input("label", {}, ir::DType::i64)}));
  return ir::Graph::build(b.build(), "calibration");
}
constexpr int kPassBlocks = 4;
constexpr int kPassRounds = 5;

/// `t`, timings of `g` at `batches`, as Timed records of `op`.
std::vector<Timed> as_timed(const ir::Graph& g, OpId op, const std::vector<int64_t>& batches,
                            const std::vector<runtime::OpTiming>& t) {
  std::vector<Timed> out;
  for (size_t i = 0; i < batches.size(); ++i)
    out.push_back({g, op, batches[i], t[i].fwd_s + t[i].bwd_s, t[i].fwd_s, t[i].bwd_s});
  return out;
}

/// The op named `name` of `g` timed alone at each batch.
std::vector<Timed> time_all(const ir::Graph& g, const std::vector<int64_t>& batches, const CalibrateOptions& o,
                            const std::string& name = "op") {
  const OpId op = g.find(name);
  return as_timed(g, op, batches, runtime::time_op(g, op, batches, o.warmup, o.repeats, /*cpu_clock=*/true));
}

std::string utc_now() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

double roofline_s(const Timed& t, const cost::DeviceSpec& d) {
  cost::OpTime r = cost::roofline_time(cost::op_work(t.graph, t.op), t.graph.costs(t.op), d, false, t.batch);
  return r.fwd_s + r.bwd_s;
}

double log_error(const std::vector<Timed>& pts, const cost::DeviceSpec& d) {
  double e = 0;
  for (const Timed& t : pts) e += std::pow(std::log(roofline_s(t, d) / t.seconds), 2);
  return e;
}

/// The value in [lo, hi] of one device figure (set by `set`) at which the roofline best reproduces
/// `pts`: golden section on its log, least squares on log error.
template <class Set>
double fit_log_param(const std::vector<Timed>& pts, cost::DeviceSpec d, double lo, double hi, Set set) {
  lo = std::log(lo), hi = std::log(hi);
  const double g = (std::sqrt(5.0) - 1) / 2;
  auto err = [&](double x) {
    set(d, std::exp(x));
    return log_error(pts, d);
  };
  for (int i = 0; i < 80; ++i) {
    double a = hi - g * (hi - lo), b = lo + g * (hi - lo);
    if (err(a) < err(b)) hi = b;
    else lo = a;
  }
  return std::exp(0.5 * (lo + hi));
}

cost::DeviceSpec device_of(const cost::CpuCalibration& k) {
  cost::DeviceSpec d;
  d.name = "calibration";
  d.memory_bytes = 1;
  d.peak_flops_f32 = d.peak_flops_f16 = k.gemm_flops;
  d.mem_bandwidth_Bps = k.mem_bandwidth_Bps;
  d.kernel_overhead_s = k.kernel_overhead_s;
  d.kind_overhead_s = k.kind_overhead_s;
  d.kind_pace = k.kind_pace;
  d.efficiency = cost::calibrated_efficiency(k);
  return d;
}

void say(std::ostream* progress, const std::string& line) {
  if (progress) *progress << "calibrating: " << line << "\n" << std::flush;
}

/// Linear layers of 64, 256 and 1024 features on [B, 4, h] (as in a transformer: a batch of
/// sequences) at 4..1024 rows, and on [B, h] at 1 row: the timings of calibrate_cpu's step 2.
std::vector<Timed> measure_gemms(const CalibrateOptions& o) {
  std::vector<Timed> out;
  for (int64_t h : {64, 256, 1024}) {
    for (Timed& t : time_all(one_op("gemm", {h}, ir::OpKind::linear, h), {1}, o)) out.push_back(std::move(t));
    // Up to 1024 rows: a transformer's projections at a micro-batch of 16-32 sequences run there, and
    // the fit's peak from 256 rows at most was 10-12% below what they reach (issue 35).
    for (Timed& t : time_all(one_op("gemm", {4, h}, ir::OpKind::linear, h), {1, 4, 16, 64, 256}, o))
      out.push_back(std::move(t));
  }
  return out;
}

/// (rows, flops, seconds - 2 overheads) per GEMM timing, for fit_gemm_overhead.
std::vector<std::array<double, 3>> gemm_points(const std::vector<Timed>& gemm, double overhead_s) {
  std::vector<std::array<double, 3>> pts;
  for (const Timed& t : gemm) {
    const ir::OpCosts& c = t.graph.costs(t.op);
    double rows = static_cast<double>(t.batch) * (t.graph.op(t.op).output_shape.size() == 3 ? 4 : 1);
    double y = t.seconds - 2 * overhead_s;
    if (y > 0) pts.push_back({rows, t.batch * (c.fwd_flops + c.bwd_flops), y});
  }
  return pts;
}

/// GFLOP/s of a timing (forward + backward flops over its time).
double gflops(const Timed& t) {
  const ir::OpCosts& c = t.graph.costs(t.op);
  return static_cast<double>(t.batch) * (c.fwd_flops + c.bwd_flops) / t.seconds / 1e9;
}

/// A reference chain of calibrate_cpu's step 6 and the batches it is trained at.
struct Chain {
  ir::Graph graph;
  std::vector<int64_t> batches;
};

/// The reference chains of calibrate_cpu's step 6.
std::vector<Chain> sequence_chains() {
  std::vector<Chain> out;
  {
    ir::ModelBuilder b("small_ops");
    std::string x = b.input("x", {8, 64});
    for (int i = 0; i < 16; ++i) {
      std::string h = b.unary(fmt::format("g{}", i), ir::OpKind::gelu, b.linear(fmt::format("l{}", i), x, 64));
      x = b.op(fmt::format("a{}", i), ir::OpKind::add, {x, h});
    }
    b.output(x);
    // At 64 samples each op's activations are 128 KB (6 MB over the chain's 48 ops, beyond the
    // 512 KB L2): a step's activations leave the caches as its weights do (method 4).
    out.push_back({ir::Graph::build(b.build(), "calibration"), {1, 8, 64}});
  }
  {
    ir::ModelBuilder b("large_weights");
    std::string x = b.input("x", {4, 1024});
    for (int i = 0; i < 8; ++i) {
      x = b.linear(fmt::format("l{}", i), x, 1024);
      if (i < 7) x = b.unary(fmt::format("r{}", i), ir::OpKind::relu, x);
    }
    b.output(x);
    out.push_back({ir::Graph::build(b.build(), "calibration"), {1, 8}});
  }
  return out;
}

/// Solves the n x n system (n <= 3) in the augmented rows m[0..n) by Gauss-Jordan elimination with
/// partial pivoting: afterwards unknown a is m[a][3] / m[a][a]. False where a pivot is 0 (singular).
bool solve_augmented(double (&m)[3][4], size_t n) {
  for (size_t col = 0; col < n; ++col) {
    size_t p = col;
    for (size_t i = col + 1; i < n; ++i)
      if (std::abs(m[i][col]) > std::abs(m[p][col])) p = i;
    std::swap(m[col], m[p]);
    if (!(std::abs(m[col][col]) > 0)) return false;
    for (size_t i = 0; i < n; ++i)
      if (i != col) {
        const double f = m[i][col] / m[col][col];
        for (size_t j = col; j < 4; ++j) m[i][j] -= f * m[col][j];
      }
  }
  return true;
}

/// Non-negative weighted least squares of y = sum_j x_j b_j over (x, y, w) rows, for up to 3 unknowns:
/// the best fit over every subset of them held free (the others 0) whose solution is non-negative
/// (with 3 unknowns, trying all 7 subsets is exact).
std::array<double, 3> nnls3(const std::vector<std::pair<std::array<double, 3>, std::array<double, 2>>>& rows) {
  std::array<double, 3> best{};
  double best_err = 0;
  for (const auto& [x, yw] : rows) best_err += yw[1] * yw[0] * yw[0];  // all zero
  for (int mask = 1; mask < 8; ++mask) {
    std::vector<int> free;
    for (int j = 0; j < 3; ++j)
      if (mask & (1 << j)) free.push_back(j);
    const size_t n = free.size();
    double m[3][4] = {};
    for (const auto& [x, yw] : rows)
      for (size_t a = 0; a < n; ++a) {
        for (size_t b = 0; b < n; ++b) m[a][b] += yw[1] * x[free[a]] * x[free[b]];
        m[a][3] += yw[1] * x[free[a]] * yw[0];
      }
    if (!solve_augmented(m, n)) continue;
    std::array<double, 3> b{};
    for (size_t a = 0; a < n; ++a) b[free[a]] = m[a][3] / m[a][a];
    if (std::any_of(b.begin(), b.end(), [](double v) { return v < 0 || !std::isfinite(v); })) continue;
    double err = 0;
    for (const auto& [x, yw] : rows) {
      const double r = yw[0] - (x[0] * b[0] + x[1] * b[1] + x[2] * b[2]);
      err += yw[1] * r * r;
    }
    if (err < best_err) best_err = err, best = b;
  }
  return best;
}

/// `chain_s`: forward + backward of each of sequence_chains() at each of its batches, in order. Sets
/// k's sequence_overhead_s, sequence_s_per_weight_byte and sequence_s_per_activation_byte.
void fit_in_sequence(cost::CpuCalibration& k, const std::vector<double>& chain_s, std::ostream* progress) {
  cost::DeviceSpec d = device_of(k);
  d.kind_in_sequence = k.kind_in_sequence;  // what the kinds' chains measured; the fit takes the rest
  // Per timing: (calls (forward and backward), weight bytes touched, activation bytes touched) and
  // (extra seconds over the roofline, the weight 1 / the roofline's seconds squared).
  std::vector<std::pair<std::array<double, 3>, std::array<double, 2>>> rows;
  std::vector<std::string> said;
  size_t next = 0;
  for (const auto& [g, batches] : sequence_chains()) {
    for (int64_t batch : batches) {
      double alone = 0, weights = 0, acts = 0;
      for (OpId id : g.op_ids()) {
        const cost::OpWork w = cost::op_work(g, id);
        const ir::OpCosts& c = g.costs(id);
        const cost::OpTime r = cost::roofline_time(w, c, d, false, batch);
        alone += r.fwd_s + r.bwd_s;
        weights += 2.0 * static_cast<double>(c.weight_read_bytes) + static_cast<double>(c.param_bytes);
        acts += 3.0 * cost::activation_bytes(w, c, batch);  // forward 1, backward 2
      }
      const double measured = chain_s.at(next++);
      rows.push_back(
          {{2.0 * static_cast<double>(g.num_ops()), weights, acts}, {measured - alone, 1 / (alone * alone)}});
      said.push_back(
          fmt::format("{} b={} {:.2f} ms ({:.2f}x its ops alone)", g.name(), batch, measured * 1e3, measured / alone));
    }
  }
  // Least squares of extra = calls x c + weight bytes x s_w + activation bytes x s_a relative to each
  // timing's roofline time, every figure non-negative (the model never runs ops faster in sequence).
  const std::array<double, 3> f = nnls3(rows);
  k.sequence_overhead_s = f[0];
  k.sequence_s_per_weight_byte = f[1];
  k.sequence_s_per_activation_byte = f[2];
  say(progress, fmt::format("ops in sequence: {}; fitted {:.2f} us more per call, {:.3f} ns per weight byte "
                            "touched ({:.1f} GB/s), {:.3f} ns per activation byte",
                            fmt::join(said, ", "), f[0] * 1e6, f[1] * 1e9, f[1] > 0 ? 1e-9 / f[1] : 0.0, f[2] * 1e9));
}

}  // namespace

std::pair<double, double> fit_gemm(const std::vector<std::array<double, 3>>& pts) {
  // y = a x + c f, f = flops per row; weights 1/y^2. a = 1/P, c = N0/P.
  double sxx = 0, sxf = 0, sff = 0, sxy = 0, sfy = 0;
  std::vector<double> rows;
  for (const auto& [r, x, y] : pts) {
    GP_CHECK(r > 0 && x > 0 && y > 0, "calibration: a GEMM timing is not positive (rows {}, {} FLOPs, {} s)", r, x, y);
    double f = x / r, w = 1 / (y * y);
    sxx += w * x * x, sxf += w * x * f, sff += w * f * f, sxy += w * x * y, sfy += w * f * y;
    rows.push_back(r);
  }
  std::sort(rows.begin(), rows.end());
  GP_CHECK(std::unique(rows.begin(), rows.end()) - rows.begin() >= 2,
           "calibration: need GEMM timings at two or more row counts to fit");
  double det = sxx * sff - sxf * sxf;
  double a = (sxy * sff - sfy * sxf) / det, c = (sxx * sfy - sxf * sxy) / det;
  if (c < 0 || !(a > 0)) {  // N0 = 0: through the origin in x alone
    a = sxy / sxx;
    c = 0;
  }
  GP_CHECK(a > 0, "calibration: GEMM time does not grow with its FLOPs; the machine is too noisy to measure");
  return {1 / a, c / a};
}

std::array<double, 3> fit_gemm_overhead(const std::vector<std::array<double, 3>>& pts) {
  // Weighted (1/y^2) least squares of y = a x + c f + e over (x, f, 1): the 3x3 normal equations.
  double m[3][4] = {};
  for (const auto& [r, x, y] : pts) {
    GP_CHECK(r > 0 && x > 0 && y > 0, "calibration: a GEMM timing is not positive (rows {}, {} FLOPs, {} s)", r, x, y);
    const double v[3] = {x, x / r, 1.0}, w = 1 / (y * y);
    for (int i = 0; i < 3; ++i) {
      for (int j = 0; j < 3; ++j) m[i][j] += w * v[i] * v[j];
      m[i][3] += w * v[i] * y;
    }
  }
  if (solve_augmented(m, 3)) {
    double a = m[0][3] / m[0][0], c = m[1][3] / m[1][1], e = m[2][3] / m[2][2];
    if (a > 0 && c >= 0 && e >= 0 && std::isfinite(a + c + e)) return {1 / a, c / a, e};
  }
  auto [peak, n0] = fit_gemm(pts);
  return {peak, n0, 0.0};
}

std::pair<double, std::vector<cost::PacePoint>> fit_kind_pace(const std::array<std::array<double, 3>, 3>& pts,
                                                              double kernel_overhead_s) {
  // (Plain names, not structured bindings: clang 14 does not let the lambda below capture those.)
  const double n1 = pts[0][0], f1 = pts[0][1], b1 = pts[0][2];
  const double n2 = pts[1][0], f2 = pts[1][1], b2 = pts[1][2];
  const double n3 = pts[2][0], f3 = pts[2][1], b3 = pts[2][2];
  GP_CHECK(0 < n1 && n1 < n2 && n2 < n3, "calibration: kind timings at {}, {}, {} elements: not increasing", n1, n2,
           n3);
  // Forward and backward apart: the fixed time c and the pace e between the two smaller sizes, then the
  // larger's pace beyond c; every figure at least 0 (noise can make a difference negative).
  auto part = [&](double t1, double t2, double t3) {
    const double e12 = std::max(0.0, (t2 - t1) / (n2 - n1));
    const double c = std::max(0.0, t1 - n1 * e12);
    return std::array<double, 3>{c, e12, std::max(0.0, (t3 - c) / n3)};
  };
  const std::array<double, 3> f = part(f1, f2, f3), b = part(b1, b2, b3);
  return {std::max(0.0, (f[0] + b[0]) / 2 - kernel_overhead_s), {{n2, f[1], b[1]}, {n3, f[2], b[2]}}};
}

std::pair<double, double> fit_attention_figures(const std::vector<std::array<double, 3>>& pts) {
  // Minimize sum ((u C + 2 v + o - t) / t)^2 over u >= 1, v >= 0: the 2 x 2 normal equations, and
  // where their solution leaves the bounds the better of u = 1 (best v) and v = 0 (best u).
  double m[3][4] = {};
  for (const auto& [c, o, t] : pts) {
    GP_CHECK(c > 0 && t > 0, "calibration: an attention timing is not positive ({} s, roofline {} s)", t, c);
    const double v[2] = {c, 2.0}, w = 1 / (t * t);
    for (int i = 0; i < 2; ++i) {
      for (int j = 0; j < 2; ++j) m[i][j] += w * v[i] * v[j];
      m[i][3] += w * v[i] * (t - o);
    }
  }
  double u = 0, v = -1;
  if (solve_augmented(m, 2)) u = m[0][3] / m[0][0], v = m[1][3] / m[1][1];
  if (!(u >= 1) || !(v >= 0) || !std::isfinite(u + v)) {
    double vn = 0, vd = 0, un = 0, ud = 0;
    for (const auto& [c, o, t] : pts) {
      vn += 2 * (t - c - o) / (t * t), vd += 4 / (t * t);
      un += c * (t - o) / (t * t), ud += c * c / (t * t);
    }
    const double v1 = std::max(0.0, vn / vd), u0 = std::max(1.0, un / ud);
    auto err = [&](double uu, double vv) {
      double e = 0;
      for (const auto& [c, o, t] : pts) e += std::pow((uu * c + 2 * vv + o - t) / t, 2);
      return e;
    };
    std::tie(u, v) = err(1.0, v1) <= err(u0, 0.0) ? std::pair{1.0, v1} : std::pair{u0, 0.0};
  }
  return {std::clamp(1 / u, 1e-3, 1.0), v};
}

namespace {

/// One pass of calibrate_cpu's op measurements (its steps 1-6): every timing its fits read.
struct OpPass {
  Timed tiny;                                                  // 1. a relu of 16 floats
  std::vector<Timed> kinds;                                    // 1b. kKindsTimed at kKindBatches
  std::vector<Timed> gemm, mem, att;                           // 2-4.
  std::vector<runtime::OptimizerTiming> opt_large, opt_small;  // 5. {sgd, adam} each
  std::vector<double> chains;  // 6. forward + backward of each sequence chain at each of its batches
  // 6b. At kChainBatches: attention_chain without attentions, with kChainOps, and one of them alone.
  std::vector<Timed> chain_base, attn_chain, attn_alone;
};

/// The parameter sets of step 5: `count` linears of `width` (a weight and a bias each).
ir::Graph linears(int count, int64_t width) {
  ir::ModelBuilder b("optimizer");
  std::string x = b.input("x", {width});
  for (int i = 0; i < count; ++i) x = b.linear(fmt::format("l{}", i), x, width);
  b.output(x);
  return ir::Graph::build(b.build(), "calibration");
}

OpPass measure_ops(const CalibrateOptions& o) {
  OpPass p;
  CalibrateOptions many = o;
  many.repeats = std::max(o.repeats, 21);
  p.tiny = time_all(one_op("overhead", {16}, ir::OpKind::relu, 0), {1}, many).front();
  for (ir::OpKind kind : kKindsTimed)
    for (Timed& t : time_all(kind_op(kind), {kKindBatches.begin(), kKindBatches.end()}, many))
      p.kinds.push_back(std::move(t));
  p.gemm = measure_gemms(o);
  for (ir::OpKind kind : {ir::OpKind::add, ir::OpKind::gelu, ir::OpKind::layernorm})
    for (Timed& t : time_all(one_op("mem", {64, 256}, kind, 0), {1, 8, 64}, o)) p.mem.push_back(std::move(t));
  for (auto [seq, hidden] : {std::pair<int64_t, int64_t>{16, 64}, {32, 128}, {64, 256}})
    for (Timed& t : time_all(one_op("attn", {seq, hidden}, ir::OpKind::attention, 4), {1, 4, 16, 32}, o))
      p.att.push_back(std::move(t));
  auto step_times = [&](const ir::Graph& g) {
    return runtime::time_optimizers(g, {"sgd", "adam"}, o.warmup, std::max(o.repeats, 3), /*cpu_clock=*/true, "cpu");
  };
  p.opt_large = step_times(linears(16, 256));
  p.opt_small = step_times(linears(64, 16));
  for (const auto& [g, batches] : sequence_chains())
    for (const runtime::OpTiming& t : runtime::time_model(g, batches, o.warmup, o.repeats, /*cpu_clock=*/true))
      p.chains.push_back(t.fwd_s + t.bwd_s);
  const std::vector<int64_t> cb(kChainBatches.begin(), kChainBatches.end());
  auto whole = [&](const ir::Graph& g) {
    return as_timed(g, g.find("loss"), cb, runtime::time_model(g, cb, o.warmup, o.repeats, /*cpu_clock=*/true));
  };
  p.chain_base = whole(attention_chain(0));
  const ir::Graph chain = attention_chain(kChainOps);
  p.attn_chain = whole(chain);
  p.attn_alone = time_all(chain, cb, o, "op1");  // its input comes from one like it
  return p;
}

/// Every timing's median over `passes` (which measured the same things in the same order).
OpPass median_pass(const std::vector<OpPass>& passes) {
  OpPass m = passes.front();
  auto each = [&](auto get) {
    std::vector<double> v;
    for (const OpPass& p : passes) v.push_back(get(p));
    return median(std::move(v));
  };
  m.tiny.seconds = each([](const OpPass& p) { return p.tiny.seconds; });
  for (auto field : {&OpPass::kinds, &OpPass::gemm, &OpPass::mem, &OpPass::att, &OpPass::chain_base,
                     &OpPass::attn_chain, &OpPass::attn_alone})
    for (size_t i = 0; i < (m.*field).size(); ++i)
      for (auto part : {&Timed::seconds, &Timed::fwd_s, &Timed::bwd_s})
        (m.*field)[i].*part = each([&](const OpPass& p) { return (p.*field).at(i).*part; });
  for (auto field : {&OpPass::opt_large, &OpPass::opt_small})
    for (size_t i = 0; i < (m.*field).size(); ++i)
      (m.*field)[i].step_s = each([&](const OpPass& p) { return (p.*field).at(i).step_s; });
  for (size_t i = 0; i < m.chains.size(); ++i) m.chains[i] = each([&](const OpPass& p) { return p.chains.at(i); });
  return m;
}

/// The attention figures of calibrate_cpu's step 4 (fit_attention_figures) from `att` and k's GEMM
/// and memory figures.
void fit_attention(const std::vector<Timed>& att, cost::CpuCalibration& k) {
  k.attention_efficiency = 1;
  k.attention_overhead_s = 0;
  const cost::DeviceSpec d = device_of(k);
  cost::DeviceSpec bare = d;
  bare.kernel_overhead_s = 0;
  std::vector<std::array<double, 3>> pts;
  for (const Timed& t : att) {
    const double c = roofline_s(t, bare);
    pts.push_back({c, roofline_s(t, d) - c, t.seconds});
  }
  std::tie(k.attention_efficiency, k.attention_overhead_s) = fit_attention_figures(pts);
}

/// Steps 1-6's figures fitted to the timings `m` (median_pass).
void fit_ops(const OpPass& m, cost::CpuCalibration& k, std::ostream* progress) {
  // 1. Per-op overhead: a 16-element relu, forward + backward = 2 overheads.
  k.kernel_overhead_s = m.tiny.seconds / 2;
  say(progress,
      fmt::format("per-op overhead {:.1f} us (relu of 16 floats, forward + backward)", k.kernel_overhead_s * 1e6));

  // 1b. Each memory-bound kind's own fixed time per call: a call of 1024 floats, forward + backward,
  // beyond the relu's two overheads (its 4-12 KB take well under a microsecond at any rate). On this
  // VM these ops cost 1-4.4x the relu per call (a gelu's erf, a layernorm's statistics, backward's
  // extra kernels); without this the roofline priced a small transformer's ops (hidden 64) at
  // 0.67-0.71x what they measured, at every batch from 1 to 32 (issue 35).
  // Timed at three sizes (method 7): a fixed time per call from the two smaller and, at the two larger,
  // the pace per element beyond it (fit_kind_pace): an add's backward passes its gradient through
  // (0.1 ns per element) where its forward streams three tensors, a gelu's erf costs 1-2 ns, and
  // beyond the L2 cache the pace slows.
  k.kind_overhead_s.clear();
  k.kind_pace.clear();
  std::vector<std::string> kinds_said;
  for (size_t i = 0; i + kKindBatches.size() <= m.kinds.size(); i += kKindBatches.size()) {
    const Timed& first = m.kinds[i];
    const ir::OpKind kind = first.graph.op(first.op).kind;
    const double elems = cost::op_work(first.graph, first.op).elems;
    std::array<std::array<double, 3>, 3> pts{};
    for (size_t j = 0; j < kKindBatches.size(); ++j) {
      const Timed& t = m.kinds[i + j];
      pts[j] = {static_cast<double>(t.batch) * elems, t.fwd_s, t.bwd_s};
    }
    std::tie(k.kind_overhead_s[kind], k.kind_pace[kind]) = fit_kind_pace(pts, k.kernel_overhead_s);
    const auto& pace = k.kind_pace[kind];
    kinds_said.push_back(fmt::format("{} {:.1f} us + {:.2f}/{:.2f} ns per element ({:.2f}/{:.2f} beyond the L2)",
                                     ir::to_string(kind), k.kind_overhead_s[kind] * 1e6, pace.front().fwd_s * 1e9,
                                     pace.front().bwd_s * 1e9, pace.back().fwd_s * 1e9, pace.back().bwd_s * 1e9));
  }
  say(progress, fmt::format("per call beyond it, forward/backward: {}", fmt::join(kinds_said, ", ")));

  // 2. GEMM: linear layers of 64, 256 and 1024 features, 1..1024 rows. The third term: what a
  // linear's call costs beyond the relu's bare dispatch (bias, the backward's two GEMMs and its
  // autograd node); it decides small models (issue 35).
  for (size_t i = 0; i < m.gemm.size(); i += 6) {
    const Timed& widest = m.gemm.at(i + 5);  // 256 samples of 4 rows: 1024 rows
    const int64_t h = widest.graph.op(widest.op).output_shape.back();
    say(progress, fmt::format("linear {}x{} at 1..1024 rows: {:.1f} GFLOP/s at 1024 rows", h, h, gflops(widest)));
  }
  const std::array<double, 3> f = fit_gemm_overhead(gemm_points(m.gemm, k.kernel_overhead_s));
  k.gemm_flops = f[0];
  k.gemm_n0_rows = f[1];
  k.gemm_overhead_s = f[2] / 2;  // per call, forward or backward
  say(progress, fmt::format("GEMM fit: {:.1f} GFLOP/s, half of it at N0 = {:.1f} rows, {:.1f} us more per call "
                            "than the bare per-op overhead",
                            k.gemm_flops / 1e9, k.gemm_n0_rows, k.gemm_overhead_s * 1e6));

  // 3. Memory-bound ops of a transformer layer on [64, 256] floats per sample (64 KB .. 4 MB calls).
  // The kinds timed in step 1b keep their pace; the bandwidth prices the others (batchnorm, dropout,
  // pooling, ...), fitted to these timings as if they were not.
  cost::DeviceSpec unpaced = device_of(k);
  unpaced.kind_pace.clear();
  k.mem_bandwidth_Bps = fit_log_param(m.mem, unpaced, 1e8, 1e13,
                                      [](cost::DeviceSpec& d, double v) { d.mem_bandwidth_Bps = v; });
  say(progress, fmt::format("memory-bound ops (add, gelu, layernorm): {:.2f} GB/s", k.mem_bandwidth_Bps / 1e9));

  // 4. Attention (projections, batched QK^T and PV, softmax) of 16 x 64, 32 x 128 and 64 x 256
  // sequences with 4 heads: the fraction of the GEMM curve it reaches and the op's fixed extra time
  // per call (fit_attention).
  fit_attention(m.att, k);
  say(progress, fmt::format("attention: {:.2f} of the GEMM curve, {:.1f} us more per call", k.attention_efficiency,
                            k.attention_overhead_s * 1e6));

  // 5. The runtime's optimizer steps (make_optimizer: SGD with momentum, Adam) over two parameter sets:
  // 1.05 M parameters in 32 tensors (sixteen 256 x 256 linears) and 17 K in 128 (sixty-four 16 x 16
  // linears): on the CPU the optimizers' multi-tensor ops loop over the tensors, so a step costs per
  // parameter and per tensor (a model of many small tensors, biases and norms, pays mostly the
  // second). The bandwidth estimate (2 x the state's bytes at mem_bandwidth_Bps) was 3.7x short of a
  // measured Adam step on this machine (issue 35). t = params x a + tensors x c through both sets.
  auto solve = [&](size_t i, double& per_param, double& per_tensor) {
    const double p1 = static_cast<double>(m.opt_large[i].params), t1 = 32,
                 p2 = static_cast<double>(m.opt_small[i].params), t2 = 128;
    const double det = p1 * t2 - p2 * t1;
    per_param = (m.opt_large[i].step_s * t2 - m.opt_small[i].step_s * t1) / det;
    per_tensor = (p1 * m.opt_small[i].step_s - p2 * m.opt_large[i].step_s) / det;
    if (per_tensor < 0 || per_param <= 0) {  // noise: per parameter alone, as before
      per_param = m.opt_large[i].step_s / p1;
      per_tensor = 0;
    }
  };
  solve(0, k.sgd_step_s_per_param, k.sgd_step_s_per_tensor);
  solve(1, k.adam_step_s_per_param, k.adam_step_s_per_tensor);
  say(progress, fmt::format("optimizer step: SGD {:.2f} ms per million parameters + {:.1f} us per tensor, Adam "
                            "{:.2f} ms + {:.1f} us (sixteen 256 x 256 linears: SGD {:.2f} ms, Adam {:.2f} ms; "
                            "sixty-four 16 x 16: {:.2f} ms, {:.2f} ms)",
                            k.sgd_step_s_per_param * 1e9, k.sgd_step_s_per_tensor * 1e6, k.adam_step_s_per_param * 1e9,
                            k.adam_step_s_per_tensor * 1e6, m.opt_large[0].step_s * 1e3, m.opt_large[1].step_s * 1e3,
                            m.opt_small[0].step_s * 1e3, m.opt_small[1].step_s * 1e3));

  // 6. Ops in sequence: two reference chains trained as a step runs them (runtime::time_model: forward
  // to the loss, backward) against the sum of their ops' roofline times with the figures above, which
  // reproduce each op timed alone. Many small ops (16 residual blocks of linear 64, gelu, add on 8 x 64
  // floats per sample: 256 KB of weights; at 64 samples 6 MB of activations) and a few large ones (8
  // linears 1024 x 1024 on 4 x 1024 per sample: 32 MB of weights, as much in gradients, beyond the
  // caches): the extra time of each = calls x sequence_overhead_s + weight bytes touched x
  // sequence_s_per_weight_byte + activation bytes touched x sequence_s_per_activation_byte (issue 35:
  // a 2-sample micro-batch of a 256-wide transformer measured 1.15-1.23x its ops timed alone; a
  // 64-wide one's ops at 32 samples 1.16x forward, 1.08x backward).
  //
  // 6b, first (method 8): the attention's own extra per call in sequence, forward and backward apart,
  // at 1 K and 32 K floats per tensor: a chain of 8 of them less the same chain without them, over 8,
  // less one of them timed alone (which the figures above reproduce). Timed alone, its dozen kernels'
  // intermediate tensors are recycled hot in the L2 cache; in a step they are not (2-core VM,
  // 2026-12-04, a 4-head attention on 32 x 16 x 64 floats in chains of 8: +46..+134 us forward and
  // +29..+336 us backward over 435-500 and 780-940 alone, in five measurements). The reference chains
  // below have no attention: a small transformer trained 1.2-1.35x what its ops cost alone while the
  // fit found nothing to add. Signed (a kind may run faster in a step than alone).
  k.kind_in_sequence.clear();
  std::vector<cost::PacePoint>& pts = k.kind_in_sequence[ir::OpKind::attention];
  for (size_t j = 0; j < kChainBatches.size(); ++j) {
    const Timed &chain = m.attn_chain.at(j), &base = m.chain_base.at(j), &alone = m.attn_alone.at(j);
    pts.push_back({static_cast<double>(chain.batch) * cost::op_work(alone.graph, alone.op).elems,
                   (chain.fwd_s - base.fwd_s) / kChainOps - alone.fwd_s,
                   (chain.bwd_s - base.bwd_s) / kChainOps - alone.bwd_s});
  }
  say(progress, fmt::format("in sequence, us more per call forward/backward at 32 K floats: attention {:+.1f}/{:+.1f}",
                            pts.back().fwd_s * 1e6, pts.back().bwd_s * 1e6));
  fit_in_sequence(k, m.chains, progress);
}

}  // namespace

CalibrationResult calibrate_cpu(const CalibrateOptions& o, std::ostream* progress) {
  auto t0 = std::chrono::steady_clock::now();
  runtime::set_torch_threads(1);  // as each training worker runs
  CalibrationResult res;
  cost::CpuCalibration& k = res.calibration;
  k.cpu_model = cost::local_cpu_model();
  k.cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  k.torch_version = runtime::torch_version();
  k.measured_at = utc_now();
  k.method = kCalibrationMethod;

  // The op timings of steps 1-6 are taken in `o.passes` passes spread over the calibration (between
  // the link measurements, which run in other processes) and each fitted from its median over them:
  // this VM's cores run in fast and slow blocks of 0.5-5 s, and one pass of ~4 s could fall in one
  // block for its GEMMs and another for its per-call costs (issue 35: three calibrations within a
  // minute priced one plan 0.0135-0.0148 s).
  std::vector<OpPass> passes;
  auto pass = [&] {
    auto p0 = std::chrono::steady_clock::now();
    passes.push_back(measure_ops(o));
    const OpPass& p = passes.back();
    say(progress, fmt::format("op timings, pass {} of {}: relu {:.1f} us, linear 1024x1024 at 1024 rows {:.1f} "
                              "GFLOP/s, Adam over 1.05 M parameters {:.2f} ms ({:.1f} s)",
                              passes.size(), o.passes, p.tiny.seconds / 2 * 1e6, gflops(p.gemm.back()),
                              p.opt_large.at(1).step_s * 1e3,
                              std::chrono::duration<double>(std::chrono::steady_clock::now() - p0).count()));
  };
  GP_CHECK(o.passes >= 1, "calibration: passes must be at least 1, got {}", o.passes);
  // A third of the passes before the idle link, a third between it and the busy one, the rest after.
  auto passes_until = [&](int thirds) {
    const int upto = std::max(1, o.passes * thirds / 3);
    while (static_cast<int>(passes.size()) < upto) pass();
  };
  passes_until(1);

  // 7. The loopback link between two worker processes.
  if (o.links) {
    cost::Profile p;
    LinkOptions lo;
    lo.sizes_bytes = {4096, 65536, 262144, 1 << 20, 4 << 20};
    lo.repeats = 21;  // the median of these per size (profile_links); of 7, the fitted idle latency moved
                      // 138-817 us and the bandwidth 1.8-6.9 GB/s between three calibrations (issue 35)
    profile_links(p, lo, progress);
    k.link_latency_s = p.p2p->latency_s;
    k.link_bandwidth_Bps = p.p2p->bandwidth_Bps;
    k.lockstep = p.lockstep.value_or(1);
    if (p.allreduce && p.allreduce->bandwidth_Bps > 0) k.allreduce_bandwidth_Bps = p.allreduce->bandwidth_Bps;
    passes_until(2);
    // Again with both workers computing between messages (LinkBenchOptions::busy): inside a step every
    // core runs a worker, and Gloo's threads wait for a core (2-core VM: 0.12-0.19 ms per message
    // idle, 0.78-0.98 ms busy with the receives posted ahead; 2.7-4.2 ms posted late). The wait does
    // not grow with the message: the busy link keeps the idle bandwidth and takes as its latency the
    // mean over the sizes of a message's extra time less its transfer.
    runtime::LinkBenchOptions bo;
    bo.sizes_bytes = {4096, 65536, 262144, 1 << 20};
    bo.repeats = 40;  // the mean of these per size (20 until method 3)
    bo.lockstep_rounds = 0;
    bo.busy = true;
    // The all-reduce likewise: its extra time less the transfer, per latency of the 2-rank Gloo ring.
    // (Fitting its bandwidth here as well was tried: over four calibrations it moved 1.3-3.6 GB/s,
    // more than the idle all-reduce's with 21 repeats, 0.8-1.0 GB/s but for one 2.2; issue 35.)
    double wait = 0, ring = 0;
    // A message's CPU time at its two ends in the hand-off rounds: a time per message and per byte,
    // each fitted to the sizes (relative least squares, non-negative).
    std::vector<std::pair<std::array<double, 3>, std::array<double, 2>>> send_rows, recv_rows;
    for (const runtime::LinkSample& s : runtime::run_link_bench(bo, progress).samples) {
      const double bytes = static_cast<double>(s.bytes);
      wait += std::max(0.0, s.p2p_s - bytes / k.link_bandwidth_Bps);
      ring += std::max(0.0, s.allreduce_s - bytes / k.reduce_bandwidth_Bps()) / cost::ring_latencies(2, bytes, true);
      if (s.send_cpu_s > 0) send_rows.push_back({{1, bytes, 0}, {s.send_cpu_s, 1 / (s.send_cpu_s * s.send_cpu_s)}});
      if (s.recv_cpu_s > 0) recv_rows.push_back({{1, bytes, 0}, {s.recv_cpu_s, 1 / (s.recv_cpu_s * s.recv_cpu_s)}});
    }
    const double n = static_cast<double>(bo.sizes_bytes.size());
    k.busy_link_latency_s = std::max(k.link_latency_s, wait / n);
    k.busy_allreduce_latency_s = ring / n;
    const std::array<double, 3> send_fit = nnls3(send_rows), recv_fit = nnls3(recv_rows);
    k.busy_message_cpu = {send_fit[0], send_fit[1], recv_fit[0], recv_fit[1]};
    say(progress, fmt::format("the link while every core computes: {:.1f} us per message (idle: {:.1f} us); "
                              "an all-reduce after computing: {:.1f} us per ring step; a message's CPU time "
                              "{:.1f} us + {:.3f} ns/B sending, {:.1f} us + {:.3f} ns/B receiving",
                              k.busy_link_latency_s * 1e6, k.link_latency_s * 1e6, k.busy_allreduce_latency_s * 1e6,
                              k.busy_message_cpu.send_s * 1e6, k.busy_message_cpu.send_s_per_byte * 1e9,
                              k.busy_message_cpu.recv_s * 1e6, k.busy_message_cpu.recv_s_per_byte * 1e9));
  }
  while (static_cast<int>(passes.size()) < o.passes) pass();
  const OpPass m = median_pass(passes);
  fit_ops(m, k, progress);

  // 8. A stage's passes: what the runtime spends on each forward and backward action beyond its ops
  // (its input feed, the loss read back, the memory meter, the autograd engine's start, and each
  // op kind's first call in a pass after the other pass ran). The intercept of a pass's CPU time
  // over the model's size: pass_chain at 1 and kPassBlocks blocks, trained as a one-stage plan at
  // micro-batch 2 (runtime::time_stage_passes), kPassRounds rounds in turn, medians. Last: training
  // in this process installs the runtime's counting allocator, which the op timings above run without.
  {
    const ir::Graph one = pass_chain(1), many = pass_chain(kPassBlocks);
    std::vector<double> f1, b1, fn, bn;
    for (int r = 0; r < kPassRounds; ++r) {
      const runtime::PassTiming a = runtime::time_stage_passes(one, 2, 16, 6, 4);
      const runtime::PassTiming z = runtime::time_stage_passes(many, 2, 16, 6, 4);
      f1.push_back(a.fwd_s), b1.push_back(a.bwd_s), fn.push_back(z.fwd_s), bn.push_back(z.bwd_s);
    }
    const double n = kPassBlocks;
    auto intercept = [&](double at1, double atn) { return std::max(0.0, (n * at1 - atn) / (n - 1)); };
    k.pass_fwd_s = intercept(median(f1), median(fn));
    k.pass_bwd_s = intercept(median(b1), median(bn));
    say(progress, fmt::format("a stage's passes: forward {:.1f} us at 1 block, {:.1f} us at {}; backward {:.1f} "
                              "and {:.1f} us; fitted {:.1f} us per forward and {:.1f} us per backward beyond "
                              "their ops",
                              median(f1) * 1e6, median(fn) * 1e6, kPassBlocks, median(b1) * 1e6, median(bn) * 1e6,
                              k.pass_fwd_s * 1e6, k.pass_bwd_s * 1e6));
  }
  k.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  cost::DeviceSpec d = device_of(k);
  auto record = [&](const std::vector<Timed>& v) {
    for (const Timed& t : v)
      res.points.push_back({fmt::format("{} {} b={}", ir::to_string(t.graph.op(t.op).kind),
                                        ir::shape_str(t.graph.op(t.op).output_shape), t.batch),
                            t.seconds, roofline_s(t, d)});
  };
  record({m.tiny});
  record(m.kinds);
  record(m.gemm);
  record(m.mem);
  record(m.att);
  return res;
}

std::string calibration_cache_file() {
  return cost::calibration_cache_path(cost::local_cpu_model(),
                                      static_cast<int>(std::max(1u, std::thread::hardware_concurrency())),
                                      runtime::torch_version());
}

std::optional<cost::CpuCalibration> cached_calibration() {
  std::string path = calibration_cache_file();
  std::error_code ec;
  if (path.empty() || !fs::exists(path, ec)) return std::nullopt;
  try {
    return cost::calibration_from_json(read_json_file(path), path);
  } catch (const UserError&) {
    return std::nullopt;
  }
}

cost::CpuCalibration cached_or_calibrate(bool refresh, std::ostream* progress) {
  std::string path = calibration_cache_file();
  std::error_code ec;
  if (!refresh && !path.empty() && fs::exists(path, ec)) {
    try {
      // A calibration measured another way (issue 35: before the per-call overheads, the optimizer per
      // tensor, ops in sequence, the optimizer with cold caches) is measured again.
      cost::CpuCalibration c = cost::calibration_from_json(read_json_file(path), path);
      if (c.method == kCalibrationMethod) return c;
      if (progress)
        *progress << fmt::format(
            "calibration cache was measured by method {}, this build measures by method {}: "
            "measuring again\n",
            c.method, kCalibrationMethod);
    } catch (const UserError& e) {
      if (progress) *progress << "calibration cache unreadable, measuring again: " << e.what() << "\n";
    }
  }
  if (progress)
    *progress << fmt::format(
                     "calibrating the cpu preset on this machine (a few seconds, once; cached in {}; "
                     "GRAPHPIPE_CALIBRATION=refresh measures again)\n",
                     path.empty() ? "nothing: no HOME or XDG_CACHE_HOME" : path)
              << std::flush;
  cost::CpuCalibration k = calibrate_cpu(CalibrateOptions{}, progress).calibration;
  if (!path.empty()) {
    fs::create_directories(fs::path(path).parent_path(), ec);
    try {
      write_json_file(path, cost::calibration_to_json(k));
    } catch (const UserError& e) {
      if (progress) *progress << "calibration not cached: " << e.what() << "\n";
    }
  }
  return k;
}

}  // namespace gp::profiler
