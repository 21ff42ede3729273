// CostModel: roofline / measured op times with power-of-two tables, memory, and communication.
#include "cost/cost_model.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <thread>
#include <set>

#include "cost/profile.h"

namespace gp::cost {
namespace {

using ir::OpKind;

/// Table rows: per-device batches 1, 2, 4, ..., 2^kMaxLog2.
constexpr int kMaxLog2 = 20;
constexpr int kRows = kMaxLog2 + 1;

/// log2(b) when b is a power of two in the table, else -1.
int table_row(int64_t b) {
  if (b < 1 || b > (int64_t{1} << kMaxLog2) || !std::has_single_bit(static_cast<uint64_t>(b))) return -1;
  return std::countr_zero(static_cast<uint64_t>(b));
}

/// A ring all-reduce of `bytes` over `d` devices, links of bandwidth `bw` and one-way latency `latency`.
/// NCCL: 2 (d-1) steps (reduce-scatter, then all-gather), one latency each. Gloo (gloo/allreduce.cc,
/// what c10d's ProcessGroupGloo runs for CPU tensors): the buffer is cut into segments of at most
/// 1 MiB, at least two per rank and a multiple of d; each phase passes (d-1) x segments-per-rank of
/// them along the ring, two in flight, and a segment leaves only once its receiver's notice that it
/// posted the receive arrived (Gloo's TCP transport sends only to an announced receive), so each
/// segment step costs the notice and the data, one latency per step with two in flight. The bytes
/// cross each link as in NCCL's ring.
double ring_time(int d, double bytes, double bw, double latency, bool gloo) {
  return 2.0 * (d - 1) / d * bytes / bw + ring_latencies(d, bytes, gloo) * latency;
}

}  // namespace

double ring_latencies(int d, double bytes, bool gloo) {
  if (!gloo) return 2.0 * (d - 1);
  constexpr double kGlooMaxSegmentBytes = 1 << 20;  // gloo::detail::AllreduceOptionsImpl::kMaxSegmentSize
  const double segments = std::max(std::ceil(bytes / kGlooMaxSegmentBytes), 2.0 * d);
  const double per_rank = std::ceil(segments / d);
  return 2.0 * (d - 1) * per_rank;
}

double compute_efficiency(OpKind k) { return EfficiencyTable{}.f32[static_cast<int>(work_class(k))].emax; }

double extra_bytes_per_sample(const ir::Graph& g, OpId id) {
  const ir::Op& op = g.op(id);
  // (embedding_bag's gathered rows are already in the IR's input_bytes.)
  if (op.kind == OpKind::attention && op.output_shape.size() == 3) {
    // heads x seq x seq scores: written by QK^T, read and written by softmax, read by (.)V.
    double elt = static_cast<double>(ir::dtype_bytes(op.dtype));
    double seq = static_cast<double>(op.output_shape[1]), keys = static_cast<double>(g.attention_keys(id));
    double heads = static_cast<double>(op.attrs.value("heads", int64_t{1}));
    return 4.0 * heads * seq * keys * elt;
  }
  return 0;
}

PacePoint pace_at(const std::vector<PacePoint>& points, double elems) {
  GP_ASSERT(!points.empty(), "pace_at: no points");
  if (elems <= points.front().elems) return points.front();
  if (elems >= points.back().elems) return points.back();
  size_t i = 1;
  while (points[i].elems < elems) ++i;
  const PacePoint& a = points[i - 1];
  const PacePoint& z = points[i];
  const double f = std::log(elems / a.elems) / std::log(z.elems / a.elems);
  return {elems, a.fwd_s + f * (z.fwd_s - a.fwd_s), a.bwd_s + f * (z.bwd_s - a.bwd_s)};
}

double activation_bytes(const OpWork& w, const ir::OpCosts& c, int64_t b) {
  return w.view ? 0.0 : static_cast<double>(b) * (c.input_bytes + c.output_bytes + w.extra_bytes);
}

OpTime roofline_time(const OpWork& w, const ir::OpCosts& c, const DeviceSpec& d, bool f16, int64_t b) {
  GP_ASSERT(b >= 1, "batch must be >= 1, got {}", b);
  double bd = static_cast<double>(b);
  double peak = f16 ? d.peak_flops_f16 : d.peak_flops_f32;
  double fwd_compute = 0, bwd_compute = 0, class_overhead = 0;
  for (int i = 0; i < w.num_parts; ++i) {
    const WorkPart& p = w.parts[i];
    class_overhead = std::max(class_overhead, d.efficiency.curve(p.cls, f16).overhead_s);
    double rate = peak * d.efficiency.curve(p.cls, f16).at(bd * p.rows, p.weight_elems);
    fwd_compute += bd * p.fwd_flops / rate;
    bwd_compute += bd * p.bwd_flops / rate;
  }
  double act = activation_bytes(w, c, b);
  const auto paced = d.kind_pace.find(w.kind);
  double weights_read = static_cast<double>(c.weight_read_bytes);
  double fwd_bytes = weights_read + act;
  // Backward reads the weights again and writes a dense gradient for every weight (for
  // embedding_bag the whole table, although the forward read only the gathered rows), and
  // reads/writes about twice the forward's activation traffic.
  double bwd_bytes = weights_read + static_cast<double>(c.param_bytes) + 2 * act;
  OpTime t;
  // In a step (sequence_*: the calibrated cpu preset) each call costs a little more, and the weights
  // it touches come from further away than when the op is timed alone, again and again; so do its
  // activations, when they are large.
  const double fwd_seq = d.sequence_overhead_s + weights_read * d.sequence_s_per_weight_byte +
                         act * d.sequence_s_per_activation_byte;
  const double bwd_seq = d.sequence_overhead_s +
                         (weights_read + static_cast<double>(c.param_bytes)) * d.sequence_s_per_weight_byte +
                         2 * act * d.sequence_s_per_activation_byte;
  const double per_call = d.kernel_overhead_s + class_overhead + d.kind_overhead(w.kind);
  double fwd_call = per_call, bwd_call = per_call;
  if (auto seq = d.kind_in_sequence.find(w.kind); seq != d.kind_in_sequence.end() && !w.view) {
    // Signed; a call never costs less than nothing beyond its work.
    const PacePoint e = pace_at(seq->second, bd * w.elems);
    fwd_call = std::max(0.0, per_call + e.fwd_s);
    bwd_call = std::max(0.0, per_call + e.bwd_s);
  }
  if (paced != d.kind_pace.end() && !w.view) {
    // A kind timed at several sizes (the calibrated cpu preset): its measured pace, caches and all.
    const double n = bd * w.elems;
    const PacePoint p = pace_at(paced->second, n);
    t.fwd_s = n * p.fwd_s + fwd_call + fwd_seq;
    t.bwd_s = n * p.bwd_s + bwd_call + bwd_seq;
  } else {
    t.fwd_s = std::max(fwd_compute, fwd_bytes / d.mem_bandwidth_Bps) + fwd_call + fwd_seq;
    t.bwd_s = std::max(bwd_compute, bwd_bytes / d.mem_bandwidth_Bps) + bwd_call + bwd_seq;
  }
  t.source = Source::formula;
  return t;
}

struct CostModel::Tables {
  size_t n = 0;
  std::vector<std::string> signature;
  std::vector<OpWork> work;          // work parts by efficiency class, extra bytes
  std::vector<char> f16;             // use the f16 peak
  std::vector<OpTime> time;          // [row * n + op]
  std::vector<double> weight_frac;   // bwd_weight_fraction per op
  std::vector<double> prefix_step;   // [row * (n+1) + i]: sum of fwd+bwd of ops < i
  std::vector<double> prefix_state;  // [i]
  std::vector<double> prefix_saved;  // [i]: saved bytes per sample
};

namespace {
/// Worker processes per core of the `cpu` preset (1 when each has its own core, 2 for 4 workers on
/// 2 cores). A profile is measured with one process on a free core: with N workers on C < N cores
/// each of its op times (CPU time) stretches by N / C, as the preset's own rates are divided.
double cpu_oversubscription(const Cluster& c) {
  if (c.name != "cpu") return 1;
  static const double cores = std::max(1u, std::thread::hardware_concurrency());
  return std::max(1.0, c.devices_per_node / cores);
}

/// How much slower profiled compute runs when the plan has 2+ workers on the `cpu` preset: the
/// profile's measured lockstep factor (two cores computing round by round wait for the slower one;
/// docs/cost-model.md, "Profiles"), never below 1; 1 without it or with one worker.
double lockstep_stretch(const Cluster& c, const Profile* p) {
  if (c.name != "cpu" || !p || !p->lockstep || c.num_devices() < 2) return 1;
  return std::max(1.0, *p->lockstep);
}
}  // namespace

CostModel::CostModel(const ir::Graph& g, Cluster c, Optimizer opt, std::shared_ptr<const Profile> profile)
    : g_(&g), cluster_(std::move(c)), opt_(opt), profile_(std::move(profile)), tables_(std::make_unique<Tables>()) {
  intra_ = cluster_.intra;
  allreduce_intra_ = cluster_.collective_intra.bandwidth_Bps > 0 ? cluster_.collective_intra : cluster_.intra;
  const double over = cpu_oversubscription(cluster_);
  compute_stretch_ = over * lockstep_stretch(cluster_, profile_.get());
  if (profile_ && profile_->p2p) {
    intra_ = {profile_->p2p->bandwidth_Bps / over, profile_->p2p->latency_s * over};
    allreduce_intra_ = intra_;
    link_source_ = Source::measured;
  }
  // fp32 state per parameter as state_parts counts it: weights, gradients, 1 (SGD) or 2 (Adam) buffers.
  const double bytes_per_param = 4.0 * (opt_ == Optimizer::adam ? 4 : 3);
  if (profile_ && profile_->optimizer.count(opt_ == Optimizer::adam ? "adam" : "sgd")) {
    const OptimizerStep& m = profile_->optimizer.at(opt_ == Optimizer::adam ? "adam" : "sgd");
    optimizer_s_per_byte_ = m.step_s / (static_cast<double>(m.params) * bytes_per_param) * compute_stretch_;
  } else {
    // The calibrated cpu preset's measured rate (its sharing of cores is already in the figure).
    const DeviceSpec& d = cluster_.device;
    optimizer_s_per_byte_ = (opt_ == Optimizer::adam ? d.adam_step_s_per_param : d.sgd_step_s_per_param) /
                            bytes_per_param;
    optimizer_s_per_tensor_ = opt_ == Optimizer::adam ? d.adam_step_s_per_tensor : d.sgd_step_s_per_tensor;
  }
  if (profile_ && profile_->allreduce) {
    // A 2-rank ring takes bytes/bw + 2*latency, so a fit t = a + bytes/B gives bw = B, latency = a/2.
    allreduce_intra_ = {profile_->allreduce->bandwidth_Bps / over, profile_->allreduce->latency_s / 2 * over};
    allreduce_fitted_ = true;
  }

  Tables& t = *tables_;
  t.n = g.num_ops();
  t.time.resize(kRows * t.n);
  t.prefix_step.assign(kRows * (t.n + 1), 0.0);
  t.prefix_state.assign(t.n + 1, 0.0);
  t.prefix_saved.assign(t.n + 1, 0.0);
  for (size_t i = 0; i < t.n; ++i) {
    OpId id(static_cast<int32_t>(i));
    const ir::Op& op = g.op(id);
    t.signature.push_back(op_signature(g, id));
    t.work.push_back(op_work(g, id));
    t.weight_frac.push_back(bwd_weight_fraction(g, id));
    t.f16.push_back(cluster_.mixed_precision || op.dtype == ir::DType::f16 || op.dtype == ir::DType::bf16);
  }
  for (int r = 0; r < kRows; ++r) {
    for (size_t i = 0; i < t.n; ++i) {
      OpTime ot = op_time(OpId(static_cast<int32_t>(i)), int64_t{1} << r);  // computes (table empty)
      t.time[r * t.n + i] = ot;
      t.prefix_step[r * (t.n + 1) + i + 1] = t.prefix_step[r * (t.n + 1) + i] + ot.fwd_s + ot.bwd_s;
    }
  }
  for (size_t i = 0; i < t.n; ++i) {
    OpId id(static_cast<int32_t>(i));
    t.prefix_state[i + 1] = t.prefix_state[i] + state_bytes(id);
    t.prefix_saved[i + 1] = t.prefix_saved[i] + g.costs(id).saved_bytes;
  }
  tables_ready_ = true;
}

CostModel::~CostModel() = default;
CostModel::CostModel(CostModel&&) noexcept = default;

const std::string& CostModel::signature(OpId op) const { return tables_->signature.at(op.v); }

OpTime CostModel::op_time(OpId op, int64_t b) const {
  GP_ASSERT(op.valid() && static_cast<size_t>(op.v) < tables_->n, "bad op id {}", op.v);
  GP_ASSERT(b >= 1, "per-device batch must be >= 1, got {}", b);
  const Tables& t = *tables_;
  int row = table_row(b);
  if (tables_ready_ && row >= 0) return t.time[row * t.n + op.v];
  if (profile_) {
    if (auto m = profile_->estimate(t.signature[op.v], b)) {
      auto [in_seq_fwd, in_seq_bwd] = profile_->context ? profile_->context->factor(b) : std::make_pair(1.0, 1.0);
      OpTime mt;
      mt.fwd_s = m->fwd_s * compute_stretch_ * in_seq_fwd;
      mt.bwd_s = m->bwd_s * compute_stretch_ * in_seq_bwd;
      mt.source = m->extrapolated ? Source::extrapolated : Source::measured;
      mt.bwd_weight_s = mt.bwd_s * t.weight_frac[op.v];  // the measured backward, split analytically
      return mt;
    }
  }
  OpTime rt = roofline_time(t.work[op.v], g_->costs(op), cluster_.device, t.f16[op.v] != 0, b);
  rt.bwd_weight_s = rt.bwd_s * t.weight_frac[op.v];
  return rt;
}

double bwd_weight_fraction(const ir::Graph& g, OpId id) {
  const ir::Op& op = g.op(id);
  const ir::OpCosts& c = g.costs(id);
  if (c.params <= 0 || c.bwd_flops <= 0) return 0;
  switch (op.kind) {
    case OpKind::linear:
    case OpKind::matmul:
    case OpKind::conv2d:
    case OpKind::conv_transpose2d: return 0.5;
    case OpKind::embedding:
    case OpKind::embedding_bag: return 1.0;
    case OpKind::attention: {
      const OpWork w = op_work(g, id);
      // Part 0 is the projections (op_work) when there are two parts; their backward is half dX, half dW.
      if (w.num_parts < 2) return 0.5;
      return std::clamp(0.5 * w.parts[0].bwd_flops / c.bwd_flops, 0.0, 1.0);
    }
    case OpKind::layernorm:
    case OpKind::batchnorm: return 3.0 / 14.0;
    default: return 0.5;
  }
}

double CostModel::op_step_time(OpId op, int64_t b) const {
  OpTime t = op_time(op, b);
  return t.fwd_s + t.bwd_s;
}

namespace {

bool half_dtype(ir::DType t) { return t == ir::DType::f16 || t == ir::DType::bf16; }

/// Under mixed precision an fp32 op's floating activations are held in fp16: half the bytes. Masks
/// (dropout) and index tensors (embedding inputs) keep their size.
double activation_scale(const ir::Op& op, bool mixed) {
  if (!mixed || op.dtype != ir::DType::f32) return 1.0;
  switch (op.kind) {
    case ir::OpKind::dropout:
    case ir::OpKind::embedding:
    case ir::OpKind::embedding_bag: return 1.0;
    default: return 0.5;
  }
}

}  // namespace

CostModel::StateParts CostModel::state_parts(OpId op) const {
  const ir::OpCosts& c = g_->costs(op);
  const ir::Op& o = g_->op(op);
  double params = static_cast<double>(c.params);
  // Weights and gradients in the op's dtype (fp16 under mixed precision); optimizer state in fp32
  // (SGD momentum: 1 buffer, Adam: first and second moments), plus fp32 master weights when the
  // working copy is fp16/bf16 (ZeRO's 2 + 2 + 12 bytes per parameter for mixed-precision Adam).
  bool half = half_dtype(o.dtype) || (cluster_.mixed_precision && o.dtype == ir::DType::f32);
  double elt = half ? 2.0 : static_cast<double>(c.param_bytes) / std::max(1.0, params);
  double opt_buffers = (opt_ == Optimizer::sgd ? 1.0 : 2.0) + (half ? 1.0 : 0.0);
  return {elt * params, elt * params, opt_buffers * 4.0 * params};
}

double CostModel::state_bytes(OpId op) const { return state_parts(op).total(); }

double CostModel::saved_bytes(OpId op, int64_t b) const {
  return g_->costs(op).saved_bytes * activation_scale(g_->op(op), cluster_.mixed_precision) * static_cast<double>(b);
}

double CostModel::output_bytes(OpId op, int64_t b) const {
  const ir::Op& o = g_->op(op);
  bool floating = o.dtype != ir::DType::i64;
  double scale = floating && cluster_.mixed_precision && o.dtype == ir::DType::f32 ? 0.5 : 1.0;
  return g_->costs(op).output_bytes * scale * static_cast<double>(b);
}

double CostModel::saved_extra_bytes(OpId op, int64_t b) const {
  const ir::Op& o = g_->op(op);
  const ir::OpCosts& c = g_->costs(op);
  double extra = 0;
  switch (o.kind) {
    case ir::OpKind::dropout: extra = c.saved_bytes; break;  // the mask
    case ir::OpKind::layernorm:
    case ir::OpKind::attention:
    case ir::OpKind::maxpool: extra = std::max(0.0, c.saved_bytes - c.input_bytes); break;
    default: break;
  }
  return extra * activation_scale(o, cluster_.mixed_precision) * static_cast<double>(b);
}

double CostModel::largest_param_tensor(OpId op) const {
  double params = static_cast<double>(g_->costs(op).params);
  return g_->op(op).kind == ir::OpKind::attention ? params / 4 : params;
}

double CostModel::usable_memory_bytes(double limit) const {
  return (limit > 0 ? limit : cluster_.device.memory_bytes) - cluster_.device.memory_reserve_bytes;
}

double CostModel::range_step_time(size_t begin, size_t end, int64_t b) const {
  const Tables& t = *tables_;
  GP_ASSERT(begin <= end && end <= t.n, "bad op range [{}, {})", begin, end);
  int row = table_row(b);
  if (row >= 0) return t.prefix_step[row * (t.n + 1) + end] - t.prefix_step[row * (t.n + 1) + begin];
  double s = 0;
  for (size_t i = begin; i < end; ++i) s += op_step_time(OpId(static_cast<int32_t>(i)), b);
  return s;
}

double CostModel::range_state_bytes(size_t begin, size_t end) const {
  GP_ASSERT(begin <= end && end <= tables_->n, "bad op range [{}, {})", begin, end);
  return tables_->prefix_state[end] - tables_->prefix_state[begin];
}

double CostModel::range_saved_bytes(size_t begin, size_t end, int64_t b) const {
  GP_ASSERT(begin <= end && end <= tables_->n, "bad op range [{}, {})", begin, end);
  return (tables_->prefix_saved[end] - tables_->prefix_saved[begin]) * static_cast<double>(b);
}

double CostModel::p2p_time(int dev_a, int dev_b, double bytes) const {
  if (dev_a == dev_b || bytes <= 0) return 0;
  return p2p_time(cluster_.same_node(dev_a, dev_b), bytes);
}

double CostModel::p2p_time(bool same_node, double bytes) const {
  if (bytes <= 0) return 0;
  const LinkSpec& l = same_node || cluster_.num_nodes == 1 ? intra_ : cluster_.inter;
  return l.latency_s + bytes / l.bandwidth_Bps;
}

double CostModel::effective_inter_bandwidth(int devices_sending) const {
  double bw = cluster_.inter.bandwidth_Bps;
  if (cluster_.node_injection_Bps > 0 && devices_sending > 1)
    bw = std::min(bw, cluster_.node_injection_Bps / devices_sending);
  return bw;
}

/// Bus bandwidth of a ring that crosses nodes with at least `k` members on every node: the ring
/// (NCCL runs one ring per NIC) can drive k NICs per node, capped by the node's injection
/// bandwidth and by the intra-node hops.
static double cross_node_ring_bw(const Cluster& c, const LinkSpec& intra, int k) {
  double bw = k * c.inter.bandwidth_Bps;
  if (c.node_injection_Bps > 0) bw = std::min(bw, c.node_injection_Bps);
  return std::min(bw, intra.bandwidth_Bps);
}

double CostModel::allreduce_time(const std::vector<int>& devices, double bytes) const {
  int d = static_cast<int>(devices.size());
  if (d <= 1 || bytes <= 0) return 0;
  std::vector<int> per_node(cluster_.num_nodes, 0);
  for (int dev : devices) {
    GP_ASSERT(dev >= 0 && dev < cluster_.num_devices(), "device {} out of range", dev);
    ++per_node[cluster_.node_of(dev)];
  }
  int nodes = 0, k = d;
  for (int m : per_node) {
    if (m > 0) ++nodes, k = std::min(k, m);
  }
  if (nodes == 1) return ring_time(d, bytes, allreduce_intra_.bandwidth_Bps, allreduce_intra_.latency_s, gloo_intra());
  return ring_time(d, bytes, cross_node_ring_bw(cluster_, allreduce_intra_, k), cluster_.inter.latency_s,
                   cluster_.gloo_collectives);
}

double CostModel::allreduce_time(int degree, bool same_node, double bytes) const {
  if (degree <= 1 || bytes <= 0) return 0;
  int dpn = cluster_.devices_per_node;
  if ((same_node && degree <= dpn) || cluster_.num_nodes == 1)
    return ring_time(degree, bytes, allreduce_intra_.bandwidth_Bps, allreduce_intra_.latency_s, gloo_intra());
  // Unplaced: assume the replicas spread evenly over the fewest nodes that hold them (>= 2).
  int nodes = std::max(2, (degree + dpn - 1) / dpn);
  int k = std::max(1, degree / nodes);
  return ring_time(degree, bytes, cross_node_ring_bw(cluster_, allreduce_intra_, k), cluster_.inter.latency_s,
                   cluster_.gloo_collectives);
}

namespace {

/// Views share their input's storage (flatten, reshape, slice): no bytes of their own.
bool is_view(const ir::Op& op) {
  return op.kind == ir::OpKind::flatten || op.kind == ir::OpKind::reshape || op.kind == ir::OpKind::slice;
}

/// The rise above the held activations while one micro-batch of b samples runs on the stage:
/// forward keeps every op output (and the received inputs and graph inputs) alive until it returns,
/// beyond what backward keeps (`saved`); backward holds the gradients received for the stage's
/// outputs plus one op's output gradient, input gradients and a parameter gradient before it is
/// accumulated. The larger of the two.
double stage_transient_bytes(const CostModel& cm, const std::vector<OpId>& ops, const std::vector<OpId>& producers,
                             const std::vector<OpId>& senders, double saved, int64_t b) {
  const ir::Graph& g = cm.graph();
  double fwd = 0, out_grads = 0, worst_op = 0;
  std::set<std::string> graph_inputs;
  for (OpId op : ops) {
    const ir::Op& o = g.op(op);
    if (!is_view(o)) fwd += cm.output_bytes(op, b);
    fwd += cm.saved_extra_bytes(op, b);
    for (const std::string& in : o.inputs)
      if (g.find_input(in)) graph_inputs.insert(in);
    double in_bytes = 0;
    for (OpId p : g.preds(op)) in_bytes += cm.output_bytes(p, b);
    double w = cm.state_parts(op).gradients;
    worst_op = std::max(worst_op, (is_view(o) ? 0 : cm.output_bytes(op, b)) + in_bytes + w);
  }
  for (OpId p : producers) fwd += cm.output_bytes(p, b);
  for (const std::string& in : graph_inputs) {
    const ir::Input* x = g.find_input(in);
    fwd += static_cast<double>(ir::per_sample_elems(x->shape)) * ir::dtype_bytes(x->dtype) * static_cast<double>(b);
  }
  for (OpId o : senders) out_grads += cm.output_bytes(o, b);
  return std::max(std::max(0.0, fwd - saved), out_grads + worst_op);
}

/// Shared (tied) parameters the stage holds (docs/cost-model.md, "Shared parameters"): one copy of
/// each, whose state is not yet counted when its canonical user is on another stage; the bytes of
/// those also held by other stages leave the replicas' all-reduce for the holders' sum. Returns
/// the bytes to take off the stage's data-parallel all-reduce.
double add_shared_copies(const CostModel& cm, const std::vector<char>& in_stage, int dp_degree, bool same_node,
                         StageCost& s) {
  const ir::Graph& g = cm.graph();
  double leave_dp = 0;
  for (int k : g.shared_held(in_stage)) {
    const std::vector<OpId>& users = g.shared_users(static_cast<size_t>(k));
    const OpId canon = users.front();
    const double frac = static_cast<double>(g.shared_numel(static_cast<size_t>(k))) /
                        static_cast<double>(std::max<int64_t>(1, g.costs(canon).params));
    const double bytes = frac * static_cast<double>(g.costs(canon).param_bytes);
    if (!in_stage[canon.v]) {
      CostModel::StateParts sp = cm.state_parts(canon);
      s.state.weights += frac * sp.weights;
      s.state.gradients += frac * sp.gradients;
      s.state.optimizer += frac * sp.optimizer;
    }
    bool all_here = std::all_of(users.begin(), users.end(), [&](OpId u) { return in_stage[u.v] != 0; });
    if (all_here) continue;  // one copy, summed over the replicas like any parameter
    s.shared_bytes += bytes;
    if (in_stage[canon.v]) leave_dp += bytes;
  }
  if (s.shared_bytes > 0) s.shared_allreduce_s = cm.allreduce_time(2 * dp_degree, same_node, s.shared_bytes);
  return leave_dp;
}

}  // namespace

StageCost stage_cost(const CostModel& cm, const std::vector<OpId>& ops, const std::vector<char>& in_stage,
                     int dp_degree, int64_t micro_batch, int64_t mini_batch, bool same_node) {
  const ir::Graph& g = cm.graph();
  GP_ASSERT(in_stage.size() == g.num_ops(), "in_stage has {} entries for {} ops", in_stage.size(), g.num_ops());
  GP_ASSERT(dp_degree >= 1 && micro_batch >= 1 && mini_batch >= 1, "bad stage shape dp={} micro={} mini={}", dp_degree,
            micro_batch, mini_batch);
  StageCost s;
  int64_t b = (micro_batch + dp_degree - 1) / dp_degree;
  s.per_device_batch = b;
  double param_bytes = 0;
  std::vector<OpId> producers;  // ops outside the stage whose output the stage reads
  std::vector<OpId> senders;    // ops inside the stage whose output leaves it
  for (OpId op : ops) {
    GP_ASSERT(in_stage[op.v], "op {} listed but not marked in_stage", op.v);
    const OpTime t = cm.op_time(op, b);
    s.compute_s += t.fwd_s + t.bwd_s;
    s.fwd_s += t.fwd_s;
    s.bwd_s += t.bwd_s;
    s.bwd_input_s += t.bwd_input_s();
    s.bwd_weight_s += t.bwd_weight_s;
    CostModel::StateParts sp = cm.state_parts(op);
    s.state.weights += sp.weights;
    s.state.gradients += sp.gradients;
    s.state.optimizer += sp.optimizer;
    s.act_bytes_per_mb += cm.saved_bytes(op, b);
    param_bytes += static_cast<double>(g.costs(op).param_bytes);
    s.param_tensors += g.costs(op).param_tensors;
    if (cm.optimizer() == Optimizer::adam)
      s.step_transient_bytes = std::max(s.step_transient_bytes, 2 * 4.0 * cm.largest_param_tensor(op));
    for (OpId p : g.preds(op)) {
      if (!in_stage[p.v]) producers.push_back(p);
    }
    for (OpId q : g.succs(op)) {
      if (!in_stage[q.v]) {
        senders.push_back(op);
        break;
      }
    }
  }
  // Each pass of the stage costs the runtime its fixed time once per micro-batch (DeviceSpec::pass_fwd_s).
  const DeviceSpec& dev = cm.cluster().device;
  s.fwd_s += dev.pass_fwd_s;
  s.bwd_s += dev.pass_bwd_s;
  s.bwd_input_s += dev.pass_bwd_s;
  s.compute_s += dev.pass_s();
  std::sort(producers.begin(), producers.end());
  producers.erase(std::unique(producers.begin(), producers.end()), producers.end());
  // Each cut tensor crosses twice per micro-batch: activation forward, gradient backward.
  for (OpId p : producers) s.comm_s += 2 * cm.p2p_time(same_node, cm.output_bytes(p, b));
  for (OpId o : senders) s.comm_s += 2 * cm.p2p_time(same_node, cm.output_bytes(o, b));
  param_bytes -= add_shared_copies(cm, in_stage, dp_degree, same_node, s);
  s.allreduce_s = cm.allreduce_time(dp_degree, same_node, std::max(0.0, param_bytes));
  s.state_bytes = s.state.total();
  if (dp_degree > 1) s.step_transient_bytes = std::max(s.step_transient_bytes, s.state.gradients);
  s.micro_batches = static_cast<int>((mini_batch + micro_batch - 1) / micro_batch);
  for (OpId p : producers)
    if (g.op(p).dtype != ir::DType::i64) s.sent_grad_bytes_per_mb += cm.output_bytes(p, b);
  s.transient_bytes = stage_transient_bytes(cm, ops, producers, senders, s.act_bytes_per_mb, b);
  // Per-iteration work is spread over the mini-batch's samples, so the planner's DP sees it: a
  // stage of many embedding tables is cheap per sample in compute but not in its optimizer step.
  s.optimizer_s = optimizer_step_time(cm, s.state_bytes, static_cast<double>(s.param_tensors));
  s.tps_s = (s.compute_s + s.comm_s) / static_cast<double>(micro_batch) +
            (s.allreduce_s + s.shared_allreduce_s + s.optimizer_s) / static_cast<double>(mini_batch);
  return s;
}

StageMemory stage_memory_parts(const StageCost& s, int in_flight) {
  StageMemory m;
  m.weights = s.state.weights;
  m.gradients = s.state.gradients;
  m.optimizer = s.state.optimizer;
  m.activations = in_flight * s.act_bytes_per_mb + s.micro_batches * s.sent_grad_bytes_per_mb;
  m.transient = std::max(s.transient_bytes, s.step_transient_bytes - in_flight * s.act_bytes_per_mb);
  return m;
}

double stage_memory(const StageCost& s, int in_flight) { return stage_memory_parts(s, in_flight).total(); }

double optimizer_step_time(const CostModel& cm, double state_bytes, double tensors) {
  if (cm.measured_optimizer_s_per_byte() > 0)
    return cm.measured_optimizer_s_per_byte() * state_bytes + cm.optimizer_s_per_tensor() * tensors;
  const Cluster& c = cm.cluster();
  return c.device.mem_bandwidth_Bps > 0 ? 2 * state_bytes / c.device.mem_bandwidth_Bps : 0;
}

}  // namespace gp::cost
