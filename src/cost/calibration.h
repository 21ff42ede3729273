// The `cpu` preset's calibration: figures measured on this machine with LibTorch (by
// profiler::calibrate_cpu, `graphpipe calibrate`) and cached as plain JSON
// (graphpipe.calibration/1) per machine, so that `--cluster cpu` predicts this machine without a
// profile. This file is LibTorch-free: the planning libraries only read the cached figures.
// See docs/cost-model.md ("The calibrated cpu preset").
#pragma once
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "cost/cost_model.h"
#include "cost/efficiency.h"
#include "support/json.h"

namespace gp::cost {

/// One LibTorch thread's rates on this machine, in the cost model's own terms (the roofline of
/// docs/cost-model.md reproduces the measured op times with them).
struct CpuCalibration {
  std::string cpu_model;             // /proc/cpuinfo "model name"
  int cores = 0;                     // hardware threads seen by the process
  std::string torch_version;         // LibTorch the figures were measured with
  std::string measured_at;           // UTC date and time
  int method = 0;                    // the revision of calibrate's measurement (profiler::kCalibrationMethod); 0: older
  double seconds = 0;                // how long the measurement took
  double gemm_flops = 0;             // asymptotic fp32 GEMM rate of one thread (FLOP/s): the peak
  double gemm_n0_rows = 0;           // rows per call at which a GEMM reaches half of it
  double attention_efficiency = 1;   // attention ops reach this fraction of the GEMM curve
  double mem_bandwidth_Bps = 0;      // effective bandwidth of memory-bound ops (add, gelu, layernorm)
  double kernel_overhead_s = 0;      // per op call, forward or backward (dispatch + autograd)
  double gemm_overhead_s = 0;        // a linear's call costs this much more (its extra kernels); 0: none fitted
  double attention_overhead_s = 0;   // likewise an attention op's call
  double sgd_step_s_per_param = 0;   // the runtime's optimizer step per parameter (SGD with momentum); 0: not measured
  double adam_step_s_per_param = 0;  // likewise Adam
  double sgd_step_s_per_tensor = 0;  // and per parameter tensor on top (SGD with momentum); 0: not measured
  double adam_step_s_per_tensor = 0;
  double link_bandwidth_Bps = 0;  // loopback p2p between two processes (c10d Gloo)
  double link_latency_s = 0;
  // A 2-rank all-reduce between idle processes: bytes / (time - latency); 0: not measured.
  double allreduce_bandwidth_Bps = 0;
  // The same link while every core computes (a training step's messages between busy workers), at the
  // idle bandwidth: a message's latency, and a 2-rank all-reduce's per ring step right after both
  // computed. 0: not measured.
  double busy_link_latency_s = 0;
  double busy_allreduce_latency_s = 0;
  // On the same busy link, a message's CPU time at both ends, from hand-off rounds
  // (runtime::LinkBenchOptions::busy); 0: not measured (before method 9).
  MessageCpu busy_message_cpu;
  double lockstep = 1;  // two cores computing in lockstep: the slower's pace / one core's
  // Ops run one after another, as in a training step (runtime::time_model), cost more than each timed
  // alone: a fixed time per call (the autograd graph and the runtime's bookkeeping across many ops)
  // and a time per weight byte touched (weights and their gradients that left the caches since their
  // last use). Fitted to two reference chains; 0: not measured.
  double sequence_overhead_s = 0;
  double sequence_s_per_weight_byte = 0;
  double sequence_s_per_activation_byte = 0;
  // What a stage's forward and backward pass cost the runtime once per micro-batch beyond their ops
  // (runtime::time_stage_passes: the intercept of a small model's passes over its size; the input
  // feed, the loss read back, the memory meter, the autograd engine's start, each op kind's first call
  // in a pass); 0: not measured (before method 10).
  double pass_fwd_s = 0, pass_bwd_s = 0;
  // Per memory-bound op kind: a call's fixed time beyond kernel_overhead_s (DeviceSpec::kind_overhead_s);
  // empty: not measured (before method 5).
  std::map<ir::OpKind, double> kind_overhead_s;
  // The same kinds' pace per element at three call sizes (DeviceSpec::kind_pace); empty: not measured
  // (before method 7).
  std::map<ir::OpKind, std::vector<PacePoint>> kind_pace;
  // Per kind, a call's extra time inside a step at two call sizes (DeviceSpec::kind_in_sequence);
  // empty: not measured (before method 8).
  std::map<ir::OpKind, std::vector<PacePoint>> kind_in_sequence;
  bool operator==(const CpuCalibration&) const = default;
  /// The all-reduce's bandwidth: measured, else the link's.
  double reduce_bandwidth_Bps() const {
    return allreduce_bandwidth_Bps > 0 ? allreduce_bandwidth_Bps : link_bandwidth_Bps;
  }
};

/// The calibrated efficiency: the measured GEMM rate is the peak (emax 1) and N0 its half-rate rows,
/// for GEMMs and convolutions; attention gets the same curve scaled by attention_efficiency (emax);
/// memory-bound ops ("other") keep the flat 0.25 of the peak for compute (their bandwidth term
/// decides them).
EfficiencyTable calibrated_efficiency(const CpuCalibration& k);

/// The `cpu` preset for `devices` workers (0: one per core) on this machine with calibration `k`
/// (nullptr: the fixed figures); with 2+ workers the rates are also divided by k's lockstep factor.
/// load_cluster("cpu") passes active_calibration().
Cluster cpu_preset(int devices, const CpuCalibration* k);

Json calibration_to_json(const CpuCalibration& c);
/// Strict (graphpipe.calibration/1); errors name `file`, the field and the value.
CpuCalibration calibration_from_json(const Json& j, const std::string& file);

/// The cache directory: $GRAPHPIPE_CACHE_DIR, else $XDG_CACHE_HOME/graphpipe, else
/// $HOME/.cache/graphpipe (empty when none of them is set).
std::string calibration_cache_dir();
/// The cache file for this machine and LibTorch version, keyed by CPU model, core count and
/// version: "<dir>/cpu-calibration-<model slug>-<cores>c-torch<version>.json".
std::string calibration_cache_path(const std::string& cpu_model, int cores, const std::string& torch_version);

/// Where `load_cluster("cpu")` gets its calibration, asked once per process. The LibTorch build of
/// the CLI installs one that reads the cache or measures (graphpipe calibrate); without one (unit
/// tests, the planner-only build) the preset keeps its fixed figures unless $GRAPHPIPE_CALIBRATION
/// names a calibration file. $GRAPHPIPE_CALIBRATION=off always keeps the fixed figures.
using CalibrationSource = std::function<std::optional<CpuCalibration>()>;
void set_calibration_source(CalibrationSource source);
/// The calibration the cpu preset uses in this process (asked once; nullopt: fixed figures).
const std::optional<CpuCalibration>& active_calibration();
/// $GRAPHPIPE_CALIBRATION ("" when unset).
std::string calibration_env();

/// MessageCpu as JSON: {"send_s", "send_s_per_byte", "recv_s", "recv_s_per_byte"}; read back with
/// every field a non-negative number (UserError naming the file, field and value).
Json message_cpu_to_json(const MessageCpu& m);
MessageCpu message_cpu_from_json(const JsonAt& j);

/// DeviceSpec::kind_overhead_s as JSON: {"gelu": seconds, ...}; read back with every value a
/// non-negative number and every key an op kind (UserError naming the file, field and value).
Json kind_overheads_to_json(const std::map<ir::OpKind, double>& m);
std::map<ir::OpKind, double> kind_overheads_from_json(const JsonAt& j);

/// DeviceSpec::kind_pace as JSON: {"gelu": [[elements, fwd seconds, bwd seconds], ...], ...}; read
/// back with every key an op kind and every list non-empty, its elements positive and increasing and
/// its times non-negative (UserError naming the file, field and value).
Json kind_pace_to_json(const std::map<ir::OpKind, std::vector<PacePoint>>& m);
/// `signed_times`: the times may be negative (DeviceSpec::kind_in_sequence), finite all the same.
std::map<ir::OpKind, std::vector<PacePoint>> kind_pace_from_json(const JsonAt& j, bool signed_times = false);

}  // namespace gp::cost
