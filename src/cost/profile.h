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

class Profile {
 public:
  std::string device;                      // e.g. "cpu: Intel Xeon ... (1 thread)"
  std::map<std::string, OpMeasurement> ops;  // by signature
  std::optional<LinkFit> p2p;              // measured point-to-point (c10d Gloo, local processes)
  std::optional<LinkFit> allreduce;        // measured 2-rank all-reduce, fitted the same way

  /// Interpolated (piecewise linear in b) fwd/bwd time, or nullopt when the profile does not
  /// cover this op or b lies outside the measured range (never extrapolates silently).
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
