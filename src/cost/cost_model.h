// The cost model: clusters (devices, links), per-op forward/backward time (measured profile when it
// covers the op, roofline formula otherwise), memory per stage, and communication times.
// The planner calls this millions of times: per-op times are precomputed at power-of-two batches.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "ir/model.h"

namespace gp::cost {

struct DeviceSpec {
  std::string name;                 // "V100-16GB"
  double memory_bytes = 0;
  double peak_flops_f32 = 0;        // FLOP/s
  double peak_flops_f16 = 0;        // FLOP/s (tensor cores where the device has them)
  double mem_bandwidth_Bps = 0;     // bytes/s
  double kernel_overhead_s = 0;     // fixed cost per op launch
};

struct LinkSpec {
  double bandwidth_Bps = 0;
  double latency_s = 0;
};

/// nodes x devices_per_node identical devices. Device d lives on node d / devices_per_node.
struct Cluster {
  std::string name;
  int num_nodes = 1;
  int devices_per_node = 1;
  DeviceSpec device;
  LinkSpec intra;                   // between devices of one node
  LinkSpec inter;                   // between nodes
  double node_injection_Bps = 0;    // a node's network bandwidth shared by its devices (0 = none)
  /// Use fp16 peak for compute (mixed precision) instead of fp32.
  bool mixed_precision = false;

  int num_devices() const { return num_nodes * devices_per_node; }
  int node_of(int device) const { return device / devices_per_node; }
  bool same_node(int a, int b) const { return node_of(a) == node_of(b); }
};

/// Preset name (summit, dgx-a100, dgx-h100, cpu) or a graphpipe.cluster/1 file; `devices` > 0
/// takes the first N devices (whole nodes first). Throws UserError naming the spec or file field.
Cluster load_cluster(const std::string& spec, int devices = 0);
Json cluster_to_json(const Cluster& c);
std::vector<std::string> cluster_preset_names();

enum class Optimizer { sgd, adam };
Optimizer optimizer_from_string(const std::string& s);
const char* to_string(Optimizer o);

/// Where an estimate came from: every estimate says whether it was measured or computed.
enum class Source { measured, formula };

struct OpTime {
  double fwd_s = 0;
  double bwd_s = 0;
  Source source = Source::formula;
};

class Profile;  // measured op costs (profile.h)

/// Cost of ops and transfers on one cluster. Cheap to query; construction precomputes tables.
class CostModel {
 public:
  CostModel(const ir::Graph& g, Cluster c, Optimizer opt = Optimizer::adam,
            std::shared_ptr<const Profile> profile = nullptr);
  ~CostModel();
  CostModel(CostModel&&) noexcept;

  const ir::Graph& graph() const { return *g_; }
  const Cluster& cluster() const { return cluster_; }
  Optimizer optimizer() const { return opt_; }

  /// Forward/backward time of one op at per-device batch b (b >= 1).
  OpTime op_time(OpId op, int64_t b) const;
  /// fwd + bwd time of one op at per-device batch b; O(1) for power-of-two b.
  double op_step_time(OpId op, int64_t b) const;

  /// Per device: weights + gradients + optimizer state of these ops.
  double state_bytes(OpId op) const;
  /// Per device: activation bytes kept for backward for one micro-batch of b samples.
  double saved_bytes(OpId op, int64_t b) const;

  /// Point-to-point transfer time of `bytes` between two devices (latency + bytes/bandwidth).
  double p2p_time(int dev_a, int dev_b, double bytes) const;
  /// Same, by link class, for the planner before devices are placed.
  double p2p_time(bool same_node, double bytes) const;
  /// Ring all-reduce of `bytes` among `devices` (placement-aware: the slowest link in the ring).
  double allreduce_time(const std::vector<int>& devices, double bytes) const;
  /// Same, by degree and whether the ring stays inside one node.
  double allreduce_time(int degree, bool same_node, double bytes) const;

 private:
  const ir::Graph* g_;
  Cluster cluster_;
  Optimizer opt_;
  std::shared_ptr<const Profile> profile_;
  struct Tables;
  std::unique_ptr<Tables> tables_;
};

}  // namespace gp::cost
