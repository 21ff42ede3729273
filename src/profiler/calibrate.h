// The `cpu` preset's self-calibration: a short measurement of this machine with LibTorch, as the
// training workers use it (one intra-op thread, forward and backward through the runtime's ops,
// timed with the thread's CPU clock so that other jobs on a shared machine do not count):
// per-op overhead, the GEMM rate and its N0, the bandwidth of memory-bound ops, and the loopback
// link between two processes. The figures are fitted so that the cost model's roofline reproduces
// the measured op times (docs/cost-model.md, "The calibrated cpu preset"), and cached per machine.
#pragma once
#include <array>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "cost/calibration.h"
#include "ir/model.h"

namespace gp::profiler {

struct CalibrateOptions {
  int warmup = 1;
  int repeats = 2;    // the median of these is used per op and batch (and pass)
  int passes = 9;     // passes over the op timings, spread over the calibration; the median of each is fitted
  bool links = true;  // measure the loopback link (spawns two `link-worker` processes of this binary)
};

/// One measured op time and what the roofline predicts for it with the fitted figures.
struct CalibrationPoint {
  std::string what;  // "linear 512x512 rows=64"
  double measured_s = 0;
  double fitted_s = 0;
};

struct CalibrationResult {
  cost::CpuCalibration calibration;
  std::vector<CalibrationPoint> points;  // every op timing the fit used
};

/// The revision of calibrate_cpu's measurement: a cached calibration of another revision is measured
/// again. 2: the optimizer step timed with caches evicted and the finiteness check a step runs
/// (issue 35). 3: the link between computing cores measured with the workers pinned as training pins
/// them (40 rounds per size), the idle link with 21 repeats per size. 4: that link with its receives
/// posted before computing, as a stage posts them; the op timings in 3 passes, their medians fitted;
/// a time per activation byte in sequence. 5: each memory-bound kind's own fixed time per call
/// (kind_overhead_s); attention also at 16 x 64, its two figures fitted together by least squares
/// (fit_attention_figures); 9 short passes (1 + 2 calls per timing) for 3 long ones (2 + 7 calls).
/// 6: the all-reduce through shared memory, as `train` reduces between ranks of one host since
/// `--local-all-reduce shm` (Gloo's loopback ring measured 5-10x longer).
/// 7: each memory-bound kind (and relu) also at 32 K and 512 K elements, its pace per element
/// (fit_kind_pace, DeviceSpec::kind_pace).
/// 8: each kind's own extra time per call in sequence (kind_in_sequence) from chains of 8 ops of it,
/// before the reference chains' fit.
/// 9: a message's CPU time at both ends on the busy link (hand-off rounds; cost::MessageCpu).
/// 10: the hand-off rounds as a chain (each step right after a receive, as a stage's), their steps'
/// CPU time against the same step back to back: what a message costs the computing after it counts;
/// and a stage's passes, the runtime's fixed time per forward and backward action (pass_fwd_s).
inline constexpr int kCalibrationMethod = 10;

/// Measures this machine; progress lines ("calibrating: ...") go to `progress` when not null.
CalibrationResult calibrate_cpu(const CalibrateOptions& o, std::ostream* progress);

/// The fit of the GEMM rate: least squares on relative error of y = x / P + r0 / P, where for each
/// timing x = its FLOPs and r0 = its FLOPs per row times N0 (the roofline's compute term with
/// e(N) = N / (N + N0)). Points are (rows, flops, seconds without the per-op overhead). Returns
/// {P, N0}; N0 is clamped at 0. UserError when fewer than two row counts were measured.
std::pair<double, double> fit_gemm(const std::vector<std::array<double, 3>>& rows_flops_seconds);

/// The same fit with a third term, a fixed time per forward + backward (the linear's kernels and
/// autograd beyond the per-op overhead already taken off): y = x / P + r0 / P + c. Returns
/// {P, N0, c}; where the three-term fit gives a negative N0 or c, fit_gemm's {P, N0} and c = 0.
std::array<double, 3> fit_gemm_overhead(const std::vector<std::array<double, 3>>& rows_flops_seconds);

/// A memory-bound kind's figures (method 7) from its timings at three call sizes, (elements of its
/// largest tensor per call, forward s, backward s), elements increasing: forward and backward apart,
/// the fixed time per call c from the two smaller (the line through them, at least 0) and the pace
/// (t - c) / elements at the two larger. Returns {the kind's time per call beyond kernel_overhead_s
/// (the mean of forward's and backward's c less it, at least 0), the pace at the two larger sizes}.
/// With them the roofline reproduces the three timings (pace_at interpolates between the two and
/// holds the nearer outside them). UserError where the sizes are not increasing.
std::pair<double, std::vector<cost::PacePoint>> fit_kind_pace(const std::array<std::array<double, 3>, 3>& pts,
                                                              double kernel_overhead_s);

/// The attention fit of calibrate_cpu (method 5): points (C, o, t), where t is a timing, C its
/// roofline time at the full GEMM curve without overheads and o the roofline's per-op overheads; fits
/// t = u C + 2 c_att + o by least squares on relative error with u >= 1 and c_att >= 0, both terms
/// together (linear in both), and returns {e = 1 / u (the fraction of the GEMM curve attention
/// reaches, at most 1), c_att (its fixed time per forward or backward call)}. The coordinate descent
/// on log error it replaces stopped anywhere along their valley: 197-392 us per call at e 0.80-1.00
/// in three calibrations within minutes (issue 35). UserError where a point is not positive.
std::pair<double, double> fit_attention_figures(const std::vector<std::array<double, 3>>& c_o_seconds);

/// This machine's cache file for the LibTorch it was built with ("" when no cache directory).
std::string calibration_cache_file();

/// This machine's cached calibration, if there is a readable one.
std::optional<cost::CpuCalibration> cached_calibration();

/// The cached calibration of this machine, or (none cached, or `refresh`) a fresh measurement
/// saved there. Used by `--cluster cpu`; progress goes to `progress`.
cost::CpuCalibration cached_or_calibrate(bool refresh, std::ostream* progress);

}  // namespace gp::profiler
