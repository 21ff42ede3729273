// The cost model: clusters (devices, links), per-op forward/backward time (measured profile when it
// covers the op, roofline formula otherwise), memory per stage, and communication times.
// The planner calls this millions of times: per-op times are precomputed at power-of-two batches.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cost/efficiency.h"
#include "cost/optimizer.h"
#include "ir/model.h"

namespace gp::cost {

/// A memory-bound op kind's measured pace at one call size: the time per element of the call's
/// largest tensor (OpWork::elems x batch) beyond its fixed time per call, forward and backward.
struct PacePoint {
  double elems = 0;
  double fwd_s = 0, bwd_s = 0;
  bool operator==(const PacePoint&) const = default;
};
/// The pace at `elems` per call: interpolated on log(elems) between the points (sorted by elems),
/// the nearest point's outside them.
PacePoint pace_at(const std::vector<PacePoint>& points, double elems);

struct DeviceSpec {
  std::string name;  // "V100-16GB"
  double memory_bytes = 0;
  double peak_flops_f32 = 0;     // FLOP/s
  double peak_flops_f16 = 0;     // FLOP/s (tensor cores where the device has them)
  double mem_bandwidth_Bps = 0;  // bytes/s
  double kernel_overhead_s = 0;  // fixed cost per op launch
  /// Fraction of peak reached per op class, by rows per call (efficiency.h). Default: the flat
  /// table (no dependence on the batch); the GPU presets carry the DeepBench V100 fit.
  EfficiencyTable efficiency;
  /// Bytes of each device that tensors cannot use: the runtime's context (CUDA context and library
  /// kernels; on the cpu preset the worker process itself), library workspaces and allocator
  /// fragmentation. The planner fits plans into memory_bytes - memory_reserve_bytes.
  double memory_reserve_bytes = 0;
  /// The optimizer step per parameter where it was measured (the calibrated cpu preset); 0: priced
  /// as its state's bytes read and written at mem_bandwidth_Bps. A profile's measurement wins.
  double sgd_step_s_per_param = 0;
  double adam_step_s_per_param = 0;
  /// ... and per parameter tensor (on the CPU the optimizers loop over the tensors, a dozen calls
  /// each for Adam): a model of many small tensors pays for them more than for its parameters. 0: none.
  double sgd_step_s_per_tensor = 0;
  double adam_step_s_per_tensor = 0;
  /// What an op costs more inside a step than timed alone (the calibrated cpu preset; 0 elsewhere):
  /// per forward or backward call, and per weight byte the call reads or writes (weights fetched
  /// again from memory, gradients written back). docs/cost-model.md, "Ops in sequence".
  double sequence_overhead_s = 0;
  double sequence_s_per_weight_byte = 0;
  /// ... and per activation byte it reads or writes (a step's activations leave the caches too).
  double sequence_s_per_activation_byte = 0;
  /// What a stage's forward and backward pass cost once per micro-batch beyond their ops (the
  /// calibrated cpu preset; 0 elsewhere): the runtime around them and each kind's first call in the
  /// pass. StageCost adds them to fwd_s and bwd_s. docs/cost-model.md, the calibration table.
  double pass_fwd_s = 0, pass_bwd_s = 0;
  double pass_s() const { return pass_fwd_s + pass_bwd_s; }  // both passes of one micro-batch
  /// What a forward or backward call of an op of this kind costs beyond kernel_overhead_s (measured
  /// on a relu) at any size: its own kernels and autograd nodes (a layernorm's, a gelu's erf). The
  /// calibrated cpu preset measures the memory-bound kinds; empty elsewhere. docs/cost-model.md.
  std::map<ir::OpKind, double> kind_overhead_s;
  double kind_overhead(ir::OpKind k) const {
    auto it = kind_overhead_s.find(k);
    return it == kind_overhead_s.end() ? 0.0 : it->second;
  }
  /// The measured pace of a memory-bound kind at two or more call sizes (the calibrated cpu preset
  /// times relu, add, gelu, layernorm, ... at 1 K, 32 K and 512 K elements): an op of a kind here
  /// costs elements x pace_at(...) beyond its per-call time, forward and backward, in place of the
  /// roofline's FLOP and bandwidth terms. They priced a gelu's erf at 0.6-0.75 and an add's backward
  /// (a pass-through) at 2-4x what they measured. Empty elsewhere. docs/cost-model.md.
  std::map<ir::OpKind, std::vector<PacePoint>> kind_pace;
  /// What a call of an op of this kind costs more (or less: negative) inside a step than timed alone,
  /// at two or more call sizes (PacePoint::elems; fwd_s and bwd_s are per call here, not per element),
  /// interpolated as pace_at does: the calibrated cpu preset trains chains of 8 ops of each kind. Timed
  /// alone, an op's tensors stay in the L2 cache and each backward starts the autograd engine; in a
  /// step they come from further away and one engine run serves every op (a 4-head attention on
  /// 32 x 16 x 64 floats: +0.13 ms forward and +0.34 ms backward over 0.43 and 0.78 alone; a relu's
  /// backward: -5 us). Empty elsewhere. docs/cost-model.md, "Ops in sequence".
  std::map<ir::OpKind, std::vector<PacePoint>> kind_in_sequence;
};

/// What a message costs the cores at its two ends, beyond its time on the link (0: nothing; the
/// calibrated cpu preset with a worker on every core, where Gloo's socket calls and threads share the
/// workers' cores): the sender's compute is held while it packs and posts the message, the
/// receiver's when it takes it (its threads read and wake). Per message plus per byte.
struct MessageCpu {
  double send_s = 0, send_s_per_byte = 0;
  double recv_s = 0, recv_s_per_byte = 0;
  double send(double bytes) const { return send_s + bytes * send_s_per_byte; }
  double recv(double bytes) const { return recv_s + bytes * recv_s_per_byte; }
  bool any() const { return send_s > 0 || send_s_per_byte > 0 || recv_s > 0 || recv_s_per_byte > 0; }
  MessageCpu scaled(double f) const { return {send_s * f, send_s_per_byte * f, recv_s * f, recv_s_per_byte * f}; }
  bool operator==(const MessageCpu&) const = default;
};

struct LinkSpec {
  double bandwidth_Bps = 0;
  double latency_s = 0;
  MessageCpu cpu;
};

/// nodes x devices_per_node identical devices. Device d lives on node d / devices_per_node.
/// The last node may be partial (`--devices 6` on 4-device nodes: one full node + 2 devices).
struct Cluster {
  std::string name;
  int num_nodes = 1;
  int devices_per_node = 1;
  /// Devices in use; 0 means num_nodes * devices_per_node (all nodes full).
  int devices = 0;
  DeviceSpec device;
  LinkSpec intra;  // between devices of one node
  /// The link a per-step collective inside a node meets where it differs from `intra` (bandwidth 0:
  /// the same). The calibrated cpu preset: point-to-point messages of a pipelined step travel
  /// between busy cores, a data-parallel all-reduce between idle ones.
  LinkSpec collective_intra;
  LinkSpec inter;                 // between nodes
  double node_injection_Bps = 0;  // a node's network bandwidth shared by its devices (0 = none)
  /// Mixed precision: fp16 peak for compute, fp16 activations and messages, fp16 weights and
  /// gradients with fp32 master weights and optimizer state (docs/cost-model.md, "Memory").
  bool mixed_precision = false;
  /// The all-reduce the runtime runs here: NCCL's ring (GPU presets, the default) or Gloo's
  /// (`"collectives": "gloo"`; the cpu preset: the runtime trains on CPUs with c10d Gloo), which sends
  /// a segment only to a receive its peer announced: a ring step costs two link latencies, not one
  /// (docs/cost-model.md "Communication").
  bool gloo_collectives = false;

  int num_devices() const { return devices > 0 ? devices : num_nodes * devices_per_node; }
  /// Devices of node n in use (devices_per_node except for a partial last node).
  int devices_on_node(int n) const {
    int rest = num_devices() - n * devices_per_node;
    return rest < devices_per_node ? rest : devices_per_node;
  }
  int node_of(int device) const { return device / devices_per_node; }
  bool same_node(int a, int b) const { return node_of(a) == node_of(b); }
};

/// Preset name (summit, dgx-a100, dgx-h100, h200, cpu) or a graphpipe.cluster/1 file; `devices` > 0
/// takes the first N devices (whole nodes first). Throws UserError naming the spec or file field.
Cluster load_cluster(const std::string& spec, int devices = 0);
Json cluster_to_json(const Cluster& c);
std::vector<std::string> cluster_preset_names();
/// This machine's CPU model (/proc/cpuinfo "model name"; "unknown CPU" without one). A profile
/// measured here names it in its `device` ("cpu: MODEL (1 thread)").
std::string local_cpu_model();
/// Parses a graphpipe.cluster/1 document; errors name `file` and the JSON path of the bad value.
Cluster cluster_from_json(const Json& j, const std::string& file);
/// The same for a document inside another (a plan's costs.cluster): errors name its full path.
Cluster cluster_from_json(const JsonAt& j);
/// The first `devices` devices of `c` (whole nodes first); UserError when c has fewer.
Cluster take_devices(Cluster c, int devices, const std::string& where);

/// Where an estimate came from: every estimate says whether it was measured or computed.
/// measured: a profile covers the op at that batch (interpolated between measured batches);
/// extrapolated: a profiled op beyond its measured batches, along the curve fitted to them;
/// formula: the roofline.
enum class Source { measured, formula, extrapolated };

struct OpTime {
  double fwd_s = 0;
  double bwd_s = 0;
  Source source = Source::formula;
  /// The part of bwd_s that computes the op's parameter gradients (zero-bubble "W"):
  /// bwd_s x bwd_weight_fraction(op), measured or not. The rest is "B", the input gradients.
  double bwd_weight_s = 0;
  double bwd_input_s() const { return bwd_s - bwd_weight_s; }
};

class Profile;  // measured op costs (profile.h)

/// The share of an op's backward that computes its parameter gradients (the zero-bubble W pass),
/// from the work the two halves do (docs/cost-model.md, "Backward split"): 0 without parameters;
/// linear, conv2d, conv_transpose2d with weights 1/2 (dX = dY W and dW = X^T dY are GEMMs of the
/// same size); embedding, embedding_bag 1 (integer indices have no gradient); attention half of its
/// projections' backward over its whole backward; layernorm, batchnorm 3/14 (dgamma and dbeta, 3
/// of the 14 FLOPs per element); add, mul, concat with a learned parameter 1/2 (a reduction of dY
/// over the batch beside dX).
double bwd_weight_fraction(const ir::Graph& g, OpId op);

/// The flat efficiency (fraction of peak FLOP/s) per op kind of the default EfficiencyTable, which
/// devices without fitted curves use (file clusters without "efficiency", the cpu preset).
double compute_efficiency(ir::OpKind k);

/// Bytes an op moves per sample beyond the IR's input and output bytes (attention: the score
/// matrix written and read; embedding_bag's gathered rows are already in the IR's input_bytes).
double extra_bytes_per_sample(const ir::Graph& g, OpId op);

/// Roofline time of one op at per-device batch b on device d (see docs/cost-model.md):
///   act = b*(input_bytes + output_bytes + extra)        (0 for views: flatten, reshape)
///   compute(flops) = sum over the op's work parts p of b*flops_p / (peak * e_p(b*rows_p, S_p))
///   fwd = max(compute(fwd_flops), (weight_read_bytes + act) / mem_bw) + kernel_overhead
///   bwd = max(compute(bwd_flops), (weight_read_bytes + param_bytes + 2*act) / mem_bw)
///         + kernel_overhead
/// with e_p the device's efficiency curve for the part's class; a kind in d.kind_pace costs
/// n x pace_at(n) (n = b x elems) in place of the max(...) instead. `f16` selects the f16 (tensor
/// core) peak and curves. Source is always formula.
OpTime roofline_time(const OpWork& w, const ir::OpCosts& c, const DeviceSpec& d, bool f16, int64_t b);
/// The activation bytes a forward call of the op reads and writes at batch `b` (inputs, output and
/// its work's extra bytes; 0 for a view); backward moves about twice as many.
double activation_bytes(const OpWork& w, const ir::OpCosts& c, int64_t b);

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
  /// The profile's optimizer step for this optimizer per byte of state (stretched when workers share
  /// cores), or 0 when it has none (optimizer_step_time then uses the memory bandwidth).
  double measured_optimizer_s_per_byte() const { return optimizer_s_per_byte_; }
  /// The step's time per parameter tensor on top of it (the calibrated cpu preset; 0 with a profile's
  /// measured step, which holds the model's own tensors, and on other presets).
  double optimizer_s_per_tensor() const { return optimizer_s_per_tensor_; }

  /// Forward/backward time of one op at per-device batch b (b >= 1).
  OpTime op_time(OpId op, int64_t b) const;
  /// fwd + bwd time of one op at per-device batch b; O(1) for power-of-two b.
  double op_step_time(OpId op, int64_t b) const;

  /// Per device: the model state of one op. weights: the copy forward reads (fp16 under mixed
  /// precision); gradients: the same size; optimizer: its moments in fp32 (SGD momentum 1, Adam 2)
  /// plus, under mixed precision or for an fp16/bf16 op, the fp32 master weights.
  struct StateParts {
    double weights = 0, gradients = 0, optimizer = 0;
    double total() const { return weights + gradients + optimizer; }
  };
  StateParts state_parts(OpId op) const;
  /// Per device: weights + gradients + optimizer state of these ops.
  double state_bytes(OpId op) const;
  /// Per device: activation bytes kept for backward for one micro-batch of b samples (fp16 under
  /// mixed precision, except dropout masks and index tensors).
  double saved_bytes(OpId op, int64_t b) const;
  /// Bytes of op's output for b samples as it is held or sent: fp16 under mixed precision for a
  /// floating output (activation messages and their gradients).
  double output_bytes(OpId op, int64_t b) const;
  /// Bytes of tensors op keeps for backward beyond its inputs and output (layernorm statistics,
  /// dropout masks, attention's projections and scores, maxpool indices), for b samples.
  double saved_extra_bytes(OpId op, int64_t b) const;
  /// Elements of op's largest parameter tensor (attention: one of its four projections).
  double largest_param_tensor(OpId op) const;
  /// Bytes a device's tensors may use: `limit` (0: the device's memory) minus memory_reserve_bytes.
  double usable_memory_bytes(double limit = 0) const;

  /// Point-to-point transfer time of `bytes` between two devices (latency + bytes/bandwidth).
  double p2p_time(int dev_a, int dev_b, double bytes) const;
  /// Same, by link class, for the planner before devices are placed.
  double p2p_time(bool same_node, double bytes) const;
  /// Ring all-reduce of `bytes` among `devices` (placement-aware: the slowest link in the ring).
  double allreduce_time(const std::vector<int>& devices, double bytes) const;
  /// Same, by degree and whether the ring stays inside one node.
  double allreduce_time(int degree, bool same_node, double bytes) const;
  /// Off-node bandwidth per sender when `devices_sending` devices of one node send off-node at
  /// once: min(inter link, node injection / devices_sending). For the simulator's contention model.
  double effective_inter_bandwidth(int devices_sending) const;

  /// Links actually used (a profile's measured fits replace the cluster's intra-node link).
  const LinkSpec& intra_link() const { return intra_; }
  const LinkSpec& inter_link() const { return cluster_.inter; }
  /// Where the intra-node link numbers came from (measured when the profile has a p2p fit).
  Source link_source() const { return link_source_; }
  /// The profile key of each op (computed once).
  const std::string& signature(OpId op) const;

  /// Sums over the ops at topological positions [begin, end) (OpId(i) order): O(1) for
  /// power-of-two b (prefix sums), for baselines that cut the topological order into ranges.
  double range_step_time(size_t begin, size_t end, int64_t b) const;
  double range_state_bytes(size_t begin, size_t end) const;
  double range_saved_bytes(size_t begin, size_t end, int64_t b) const;

 private:
  const ir::Graph* g_;
  Cluster cluster_;
  Optimizer opt_;
  std::shared_ptr<const Profile> profile_;
  LinkSpec intra_;                   // cluster intra link, or the profile's p2p fit
  double optimizer_s_per_byte_ = 0;  // measured_optimizer_s_per_byte()
  double optimizer_s_per_tensor_ = 0;
  double compute_stretch_ = 1;     // profiled compute: workers per core x the lockstep factor
  LinkSpec allreduce_intra_;       // per-step ring link inside a node (profile's all-reduce fit)
  bool allreduce_fitted_ = false;  // allreduce_intra_ is a measured all-reduce fit (not a link's figures)
  /// Gloo's ring inside a node: a measured fit already holds Gloo's latencies, priced as NCCL's form.
  bool gloo_intra() const { return cluster_.gloo_collectives && !allreduce_fitted_; }
  Source link_source_ = Source::formula;
  struct Tables;
  std::unique_ptr<Tables> tables_;
  bool tables_ready_ = false;  // false while the constructor fills the tables
};

/// The cost of one stage, shared by the planner and the simulator so that their numbers agree.
/// All times in seconds, memory in bytes per device. See docs/cost-model.md ("Stage cost").
struct StageCost {
  int64_t per_device_batch = 0;  // ceil(micro_batch / dp_degree)
  double compute_s = 0;          // fwd + bwd of the stage's ops per micro-batch, on one device
  double fwd_s = 0, bwd_s = 0;   // the same ops' forward and backward times apart (their split of compute_s)
  /// bwd_s split for the zero-bubble schedule: the ops' input-gradient (B) and parameter-gradient
  /// (W) parts (OpTime::bwd_input_s(), bwd_weight_s). bwd_s itself is summed as before, so 1F1B
  /// figures do not change; the two parts add up to it up to rounding.
  double bwd_input_s = 0, bwd_weight_s = 0;
  double comm_s = 0;       // cut-edge activations + gradients sent and received per micro-batch
  double allreduce_s = 0;  // gradient all-reduce among the dp_degree replicas, per mini-batch
  double optimizer_s = 0;  // the optimizer step, per mini-batch (optimizer_step_time)
  /// Summing the gradients of shared parameters the stage holds with their holders on other stages,
  /// per mini-batch: a ring all-reduce of those bytes among 2 x dp_degree devices (the other holders
  /// are not known while one stage is costed; sim_costs uses the plan's real holders).
  double shared_allreduce_s = 0;
  double shared_bytes = 0;      // bytes of those shared parameters (held by other stages too)
  double tps_s = 0;             // time per sample: (compute + comm)/micro_batch
                                //   + (allreduce + shared_allreduce + optimizer)/mini_batch
  double state_bytes = 0;       // weights + gradients + optimizer state
  int64_t param_tensors = 0;    // the stage's parameter tensors (the optimizer steps each)
  double act_bytes_per_mb = 0;  // activations saved for backward per in-flight micro-batch
  CostModel::StateParts state;  // state_bytes split into weights, gradients, optimizer state
  /// Working memory above the held activations while one micro-batch runs (docs/cost-model.md,
  /// "Memory"): forward holds every op output of the stage until it returns, backward holds
  /// the output gradients and the largest op's gradient buffers.
  double transient_bytes = 0;
  /// Gradients w.r.t. the stage's received inputs, per micro-batch: kept until their sends finish
  /// at the end of the step, so a step holds one per micro-batch of the step.
  double sent_grad_bytes_per_mb = 0;
  /// Temporaries at the end of the step, once the activations are gone (so they count only where
  /// they exceed them): the gradient all-reduce of a replicated stage flattens all gradients into
  /// one buffer; the optimizer (Adam) holds two fp32 copies of the largest parameter tensor while it
  /// computes the denominator (SGD with momentum: none). The larger of the two.
  double step_transient_bytes = 0;
  int micro_batches = 1;  // micro-batches per step (mini_batch / micro_batch, rounded up)
};

/// Cost of the stage made of `ops` (with in_stage[i] = 1 iff OpId(i) is in it; size num_ops) on
/// dp_degree devices at `micro_batch` samples per micro-batch (the whole stage's, split over its
/// replicas) and `mini_batch` samples per iteration. `same_node`: its cut edges and its all-reduce
/// ring stay inside one node. O(|ops| + cut edges).
StageCost stage_cost(const CostModel& cm, const std::vector<OpId>& ops, const std::vector<char>& in_stage,
                     int dp_degree, int64_t micro_batch, int64_t mini_batch, bool same_node);

/// Per-device peak memory of a stage with `in_flight` micro-batches alive, by part.
struct StageMemory {
  double weights = 0, gradients = 0, optimizer = 0;
  double activations = 0;  // in_flight * act_bytes_per_mb + the step's sent gradients
  double transient = 0;
  double total() const { return weights + gradients + optimizer + activations + transient; }
};
StageMemory stage_memory_parts(const StageCost& s, int in_flight);
/// stage_memory_parts(s, in_flight).total().
double stage_memory(const StageCost& s, int in_flight);

/// The optimizer step of a stage, once per iteration. With a profile that measured this optimizer
/// (Profile::optimizer): the measured step time per byte of fp32 state (weights, gradients and
/// optimizer buffers) times `state_bytes`, stretched like profiled op times when workers share
/// cores. Otherwise memory-bound: it reads and writes the weights, gradients and optimizer state
/// about once each (2 x state bytes / memory bandwidth). The simulator, the planner's estimate and
/// every planner's stage costs use it.
/// `tensors`: parameter tensors stepped, each costing CostModel::optimizer_s_per_tensor() more.
double optimizer_step_time(const CostModel& cm, double state_bytes, double tensors = 0);

/// The link latencies a ring all-reduce of `bytes` over `d` ranks pays (NCCL: 2 (d - 1); Gloo splits
/// the buffer into segments of at most 1 MiB, at least 2d, and pays one latency per segment step).
double ring_latencies(int d, double bytes, bool gloo);

}  // namespace gp::cost
