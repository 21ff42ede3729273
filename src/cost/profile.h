// Measured op costs (graphpipe.profile/1), written by `graphpipe profile` and read by the cost model.
// Ops are keyed by a signature of (kind, input shapes, output shape, attrs), so one measurement
// serves every op of the same shape (e.g. all 32 identical encoder layers).
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ir/model.h"
#include "support/json.h"

namespace gp::cost {

/// One measured op: times at several per-device batch sizes (ascending, unique).
struct OpMeasurement {
  std::string signature;
  std::string kind;
  std::vector<int64_t> batches;
  std::vector<double> fwd_s;
  std::vector<double> bwd_s;
  bool operator==(const OpMeasurement&) const = default;
};

/// A fitted link: time(bytes) = latency_s + bytes / bandwidth_Bps.
struct LinkFit {
  double latency_s = 0;
  double bandwidth_Bps = 0;
  bool operator==(const LinkFit&) const = default;
};

/// The efficiency-curve family over batches: with e(N) = Emax N / (N + N0) and N = b * rows, an
/// op's time t(b) = t0 + work*b / (peak e(N)) is affine in b: t(b) = fixed_s + per_sample_s * b
/// (fixed_s = the per-call overhead plus the N0 rows' worth of work). docs/cost-model.md, "Profiles".
struct BatchFit {
  double fixed_s = 0;
  double per_sample_s = 0;
  double at(double b) const { return fixed_s + per_sample_s * b; }
  bool operator==(const BatchFit&) const = default;
};

/// Least-squares fit of t(b) = fixed_s + per_sample_s * b to measured (batch, time) points on the
/// relative error, with both coefficients >= 0. One distinct batch (or all times 0): proportional
/// to b (fixed_s = 0), the flat-efficiency answer. Points with time 0 carry no relative error and
/// are skipped.
BatchFit fit_batch_curve(const std::vector<int64_t>& batches, const std::vector<double>& times);

/// A profiled op's time at one batch.
struct ProfileTime {
  double fwd_s = 0;
  double bwd_s = 0;
  bool extrapolated = false;  // b lies outside the measured batches
};

/// The whole model timed in sequence (runtime::time_model) against the sum of its ops' profiled
/// times, per batch: ops in a training step run after one another on cold weights and on
/// activations that left the caches, and the profile times each op alone, again and again.
struct ContextTiming {
  std::vector<int64_t> batches;                  // ascending, unique
  std::vector<double> model_fwd_s, model_bwd_s;  // the whole model, forward to the loss / backward
  std::vector<double> ops_fwd_s, ops_bwd_s;      // the sum over its ops of their profiled times
  /// model / ops at batch b, forward and backward: piecewise linear in b between measured batches,
  /// the nearest end's value outside them; 1 where the ops sum to 0.
  std::pair<double, double> factor(int64_t b) const;
  bool operator==(const ContextTiming&) const = default;
};

/// One measured optimizer step over `params` parameters (runtime::time_optimizers).
struct OptimizerStep {
  int64_t params = 0;
  double step_s = 0;
  bool operator==(const OptimizerStep&) const = default;
};

class Profile {
 public:
  std::string device;                        // e.g. "cpu: Intel Xeon ... (1 thread)"
  std::map<std::string, OpMeasurement> ops;  // by signature
  std::optional<LinkFit> p2p;                // measured point-to-point (c10d Gloo, local processes)
  std::optional<LinkFit> allreduce;          // measured 2-rank all-reduce, fitted the same way
  /// Two cores computing in lockstep (`profile --links`): the slower core's mean time per round over
  /// one core's; the cost model stretches profiled compute of plans with 2+ workers by it.
  std::optional<double> lockstep;
  std::optional<ContextTiming> context;            // the whole model in sequence against its ops alone
  std::map<std::string, OptimizerStep> optimizer;  // by optimizer name ("sgd", "adam")

  /// fwd/bwd time of the op with this signature at batch b >= 1, or nullopt when the profile does
  /// not have it. Inside the measured range: piecewise linear between the two nearest measured
  /// batches (exact at measured ones; each segment is the curve family through its two ends).
  /// Outside: the BatchFit of all measured points, scaled to pass through the nearest measured
  /// point (continuous at the edge), flagged `extrapolated`. Never the roofline.
  std::optional<ProfileTime> estimate(const std::string& signature, int64_t b) const;
  /// estimate() without the flag.
  std::optional<std::pair<double, double>> lookup(const std::string& signature, int64_t b) const;
  bool operator==(const Profile&) const = default;
};

/// The key an op is profiled under: kind, input shapes, output shape and attrs.
std::string op_signature(const ir::Graph& g, OpId op);

Json profile_to_json(const Profile& p);
Profile profile_from_json(const Json& j, const std::string& file);
/// The same for a document inside another (a plan's costs.profile): errors name its full path.
Profile profile_from_json(const JsonAt& j);
Profile load_profile(const std::string& path);
void save_profile(const std::string& path, const Profile& p);

}  // namespace gp::cost
