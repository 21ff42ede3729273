// One rank's stage of the pipeline runtime (stage_runner.h): one handler per schedule action kind.
#include "runtime/pipeline/stage_runner.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>

#include "runtime/exec/divergence.h"
#include "runtime/exec/optim.h"
#include "support/error.h"

namespace gp::runtime {

using schedule::Action;
using schedule::ActionKind;

double now_s() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

namespace {

/// The tensors on each stage edge (plan::cut_edges), by op name in name order: both ends of an
/// edge number its tensors alike, and the index is part of each message's tag (transfer_tag).
std::map<std::pair<int, int>, std::vector<std::string>> edge_tensor_names(const ir::Graph& g,
                                                                          const std::vector<int>& stage_of) {
  std::map<std::pair<int, int>, std::vector<std::string>> out;
  for (const auto& [e, ops] : plan::cut_edges(g, stage_of)) {
    std::vector<std::string>& names = out[e];
    for (OpId o : ops) names.push_back(g.op(o).name);
    std::sort(names.begin(), names.end());
  }
  return out;
}

/// Messages between one pair of ranks are told apart by kind, first sample and tensor index;
/// the step parity keeps a fast sender's next step apart from a slow receiver's current one.
int transfer_tag(bool grad, int64_t sample, size_t tensor, int64_t step) {
  GP_ASSERT(sample < kMaxMiniBatchSamples && tensor < kMaxTensorsPerEdge, "tag overflow: sample {} tensor {}", sample,
            tensor);
  return static_cast<int>(((step & 1) << 30) | (int64_t{grad} << 29) | (sample << 6) | int64_t(tensor));
}

/// Byte offsets of each tensor in the packed message, each aligned to 16 bytes, and the total.
std::vector<int64_t> pack_offsets(const std::vector<torch::Tensor>& ts) {
  std::vector<int64_t> off{0};
  for (const auto& t : ts) off.push_back(off.back() + (t.numel() * t.element_size() + 15) / 16 * 16);
  return off;
}

torch::Tensor byte_view(torch::Tensor& buf, int64_t begin, const torch::Tensor& like) {
  return buf.narrow(0, begin, like.numel() * like.element_size()).view(like.scalar_type()).view(like.sizes());
}

}  // namespace

StageRunner::StageRunner(const TrainOptions& opt, const PreparedRun& run, RankRole role, detail::Communicator& world,
                         torch::Device device, bool spare_core)
    : opt_(opt),
      p_(run.plan),
      g_(run.graph),
      st_(p_.stages[role.stage]),
      rep_(role.replica),
      world_(world),
      actions_(run.schedule.stages[role.stage].actions),
      in_{nullptr, {}, run.data.get(), run.eval_data.get()} {
  auto stage_of = plan::stage_of_ops(p_, g_);
  std::vector<OpId> ops;
  for (size_t i = 0; i < g_.num_ops(); ++i)
    if (stage_of[i] == st_.id) ops.emplace_back(static_cast<int32_t>(i));
  module_ = std::make_unique<StageModule>(g_, ops, opt.seed, run.weights, device);
  in_.feed = std::make_unique<InputPrefetcher>(*module_, in_.data, spare_core);
  for (const Action& a : actions_)
    if (a.kind == ActionKind::forward) in_.forwards.push_back(a.micro_batch);
  optim_ = make_optimizer(opt.optimizer, module_->parameters(), opt.lr, opt.momentum);
  edge_ = edge_tensor_names(g_, stage_of);
  link_receive_streams();
  if (st_.devices.size() > 1) group_ = world_.subgroup(st_.devices, "stage" + std::to_string(st_.id));
  make_shared_groups(stage_of);
  make_gradient_buffer();
}

// --- Steps ---

void StageRunner::begin_step(int64_t step) {
  step_ = step;
  loss_sum_ = 0;
  data_s_ = 0;
  zero_gradients();
  mbs_.clear();
  pieces_.clear();
  if (!ahead_.next_step_posted)
    for (int i : ahead_.first) post_ahead(actions_[static_cast<size_t>(i)]);
  ahead_.next_step_posted = false;
}

void StageRunner::post_next_step(int64_t next) {
  const int64_t current = step_;
  step_ = next;
  for (int i : ahead_.first) post_ahead(actions_[static_cast<size_t>(i)]);
  step_ = current;
  ahead_.next_step_posted = true;
}

double StageRunner::end_step() {
  for (auto& s : sends_) s.wait();
  sends_.clear();
  for (auto& [mb, ms] : mbs_)
    for (auto& [peer, pending] : ms.act_sends)
      for (auto& s : pending) s.wait();
  mbs_.clear();
  GP_ASSERT(ahead_.posted.empty(), "stage {}: {} receives of step {} were posted and never taken", st_.id,
            ahead_.posted.size(), step_);
  return loss_sum_;
}

void StageRunner::eval_batch(int64_t j, EvalSums& sums) {
  torch::NoGradGuard no_grad;
  eval_ = true;
  step_ = j;
  mbs_.clear();
  pieces_.clear();
  for (const Action& a : actions_) {
    if (a.kind == ActionKind::forward) forward(a.micro_batch);
    if (a.kind == ActionKind::send_act) send_act(a);
    if (a.kind == ActionKind::recv_act) recv_act(a);
  }
  end_step();
  eval_ = false;
  sums.loss += eval_sums_.loss;
  sums.correct += eval_sums_.correct;
  sums.samples += eval_sums_.samples;
  sums.classified += eval_sums_.classified;
  eval_sums_ = EvalSums{};
}

void StageRunner::run(const Action& a) {
  if (poison_next_action().exchange(false)) poison_first_gradient(*module_);
  switch (a.kind) {
    case ActionKind::forward: forward(a.micro_batch); break;
    case ActionKind::backward: backward(a.micro_batch); break;
    case ActionKind::backward_input: backward_input(a.micro_batch); break;
    case ActionKind::backward_weight: backward_weight(a.micro_batch); break;
    case ActionKind::send_act: send_act(a); break;
    case ActionKind::recv_act: recv_act(a); break;
    case ActionKind::send_grad: send_grad(a); break;
    case ActionKind::recv_grad: recv_grad(a); break;
    case ActionKind::allreduce: allreduce(); break;
    case ActionKind::optimizer_step: optimizer_step(); break;
  }
}

// --- Micro-batches ---

StageRunner::Range StageRunner::intersect(Range a, Range b) {
  int64_t lo = std::max(a.begin, b.begin), hi = std::min(a.end(), b.end());
  return {lo, std::max<int64_t>(0, hi - lo)};
}

/// The samples replica `rep` of `st` holds in the micro-batch that contains sample `s`.
StageRunner::Range StageRunner::replica_share(const plan::Stage& st, int rep, int64_t s) {
  int64_t m = st.micro_batch_size, share = m / static_cast<int64_t>(st.devices.size());
  return {s / m * m + rep * share, share};
}

StageRunner::Range StageRunner::my_share(int64_t sample) const { return replica_share(st_, rep_, sample); }

/// Rows [r.begin, r.end()) of every sample of a per-sample tensor whose batch starts at `base`.
torch::Tensor StageRunner::rows(const torch::Tensor& t, int64_t base, Range r) {
  return t.narrow(0, r.begin - base, r.count);
}

MicroBatchInfo StageRunner::info(int mb, int64_t step) const {
  Range r = my_share(int64_t{mb} * st_.micro_batch_size);
  return {r.begin, r.count, p_.mini_batch_size, step, !eval_};
}

/// The micro-batch this replica runs forward after `mb` of this step: the schedule's next
/// forward, or the first one of the next step (none after the last step).
std::optional<MicroBatchInfo> StageRunner::next_forward(int mb) const {
  const std::vector<int>& fw = in_.forwards;
  auto it = std::find(fw.begin(), fw.end(), mb);
  if (it != fw.end() && it + 1 != fw.end()) return info(*(it + 1), step_);
  if (step_ + 1 < opt_.steps && !fw.empty()) return info(fw.front(), step_ + 1);
  return std::nullopt;
}

// --- Compute actions ---

// The labels each ignore_index cross-entropy of this stage counts in the whole mini-batch of this
// step (read once a step from the data, or made as the synthetic feed makes them), so that every
// micro-batch's mean weighs as many labels as it counts: the pipeline's loss and gradients are then
// the mini-batch's mean over its counted labels, as one device computes them.
std::shared_ptr<const std::map<std::string, int64_t>> StageRunner::counted_labels() {
  if (counted_ && counted_step_ == step_) return counted_;
  MicroBatchInfo whole{0, p_.mini_batch_size, p_.mini_batch_size, step_};
  const TensorMap all = stage_inputs(*module_, whole, in_.data);
  auto counts = std::make_shared<std::map<std::string, int64_t>>();
  for (const auto& [name, ignored] : module_->ignoring_labels())
    if (auto it = all.find(name); it != all.end()) (*counts)[name] = it->second.ne(ignored).sum().item<int64_t>();
  counted_ = counts;
  counted_step_ = step_;
  return counted_;
}

void StageRunner::forward(int mb) {
  MicroBatchInfo mi = info(mb);
  Range mine{mi.sample_begin, mi.count};
  double t0 = now_s();
  TensorMap ext = eval_ ? stage_inputs(*module_, mi, in_.eval_data) : in_.feed->take(mi, next_forward(mb));
  data_s_ += now_s() - t0;
  auto& ms = mbs_[mb];
  take_received(mb, mine, ms, ext);
  if (!eval_ && mi.count < mi.mini_batch && !module_->ignoring_labels().empty()) mi.counted_labels = counted_labels();
  TensorMap outs = module_->forward(ext, mi);
  for (int v : st_.outputs_to)
    for (const auto& n : edge(st_.id, v)) ms.outputs[n] = outs.at(n);
  if (eval_) {
    add_eval_sums(*module_, ext, outs, mi, in_.eval_data->size(), eval_sums_);
  } else if (!module_->loss_ops().empty()) {
    ms.loss = module_->scaled_loss(outs, mi, ext);
    double v = ms.loss.item<double>();
    if (!opt_.allow_nonfinite) check_loss_finite(v, *module_, ext, outs, {step_, st_.id});
    loss_sum_ += v;
  }
}

/// The activations received for the samples `mine` of micro-batch `mb` from every predecessor,
/// joined in sample order: leaves of the micro-batch's graph (requires_grad when floating, in training).
void StageRunner::take_received(int mb, Range mine, MicroBatchState& ms, TensorMap& ext) {
  for (int u : st_.inputs_from) {
    const auto& names = edge(u, st_.id);
    if (names.empty()) continue;  // ordering-only edge: its tokens were received already
    auto& pieces = pieces_[u];
    std::vector<std::vector<torch::Tensor>> parts(names.size());
    int64_t got = 0;
    for (auto it = pieces.lower_bound(mine.begin); it != pieces.end() && it->first < mine.end();) {
      for (size_t t = 0; t < names.size(); ++t) parts[t].push_back(it->second[t]);
      got += it->second.empty() ? 0 : it->second[0].size(0);
      it = pieces.erase(it);
    }
    GP_ASSERT(got == mine.count, "stage {} mb {}: received {} of {} samples from stage {}", st_.id, mb, got, mine.count,
              u);
    for (size_t t = 0; t < names.size(); ++t) {
      auto x = parts[t].size() == 1 ? parts[t][0] : torch::cat(parts[t]);
      if (!eval_ && torch::isFloatingType(x.scalar_type())) x.requires_grad_(true);
      ms.leaves[names[t]] = x;
      ext[names[t]] = x;
    }
  }
}

/// The roots of micro-batch `mb`'s backward and their gradients: the outputs other stages read
/// (with the gradients received for them) and the scaled loss.
void StageRunner::gradient_roots(int mb, MicroBatchState& ms, std::vector<torch::Tensor>& ts,
                                 std::vector<torch::Tensor>& gs) {
  for (auto& [n, out] : ms.outputs) {
    if (!out.requires_grad()) continue;
    auto it = ms.out_grads.find(n);
    GP_ASSERT(it != ms.out_grads.end(), "stage {} mb {}: no gradient received for {}", st_.id, mb, n);
    ts.push_back(out);
    gs.push_back(it->second);
  }
  if (ms.loss.defined()) {
    ts.push_back(ms.loss);
    gs.push_back(torch::ones_like(ms.loss));
  }
}

/// B: input and parameter gradients.
void StageRunner::backward(int mb) {
  auto& ms = mbs_[mb];
  std::vector<torch::Tensor> ts, gs;
  gradient_roots(mb, ms, ts, gs);
  if (!ts.empty()) torch::autograd::backward(ts, gs);
  finish_backward(ms);
}

/// BI: the input gradients only, what the parameters' gradients need kept in ms.split for
/// backward_weight (exec/split_backward.h).
void StageRunner::backward_input(int mb) {
  auto& ms = mbs_[mb];
  std::vector<torch::Tensor> ts, gs;
  gradient_roots(mb, ms, ts, gs);
  std::vector<torch::Tensor> inputs;
  for (auto& [n, x] : ms.leaves)
    if (x.requires_grad()) inputs.push_back(x);
  ms.split.backward_input(ts, gs, inputs, module_->parameters());
  finish_backward(ms);
}

/// After B or BI: the input gradients to send upstream; the activations whose receivers answered are
/// released, and the micro-batch's tensors dropped.
void StageRunner::finish_backward(MicroBatchState& ms) {
  for (auto& [n, x] : ms.leaves) {
    if (!torch::isFloatingType(x.scalar_type())) {
      ms.in_grads[n] = x;
      continue;
    }
    ms.in_grads[n] = x.grad().defined() ? x.grad() : torch::zeros_like(x);
  }
  for (int peer : ms.grads_from) {
    auto it = ms.act_sends.find(peer);
    if (it == ms.act_sends.end()) continue;
    for (auto& s : it->second) s.wait();
    ms.act_sends.erase(it);
  }
  ms.outputs.clear();
  ms.leaves.clear();
  ms.out_grads.clear();
  ms.loss = torch::Tensor();
}

/// W: the parameter gradients of micro-batch `mb` whose backward_input ran; frees its graph.
void StageRunner::backward_weight(int mb) {
  auto it = mbs_.find(mb);
  GP_ASSERT(it != mbs_.end() && it->second.split.pending(), "stage {}: W mb{} without its BI", st_.id, mb);
  it->second.split.backward_weight();
}

// Each replica's loss is scaled by its share of the mini-batch, so replicas' gradients add up.
// Shared parameters held by other stages too are summed with all their holders instead.
void StageRunner::allreduce() {
  if (!group_) return;
  if (grad_buffer_.defined()) {  // one contiguous tensor: reduced in place, nothing joined or copied back
    std::vector<torch::Tensor> flat{grad_buffer_};
    group_->all_reduce(flat, detail::Reduce::sum).wait();
    return;
  }
  std::vector<torch::Tensor> grads;
  for (auto& p : module_->parameters()) {
    if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
    if (!summed_with_holders(p)) grads.push_back(p.grad());
  }
  if (!grads.empty()) group_->all_reduce(grads, detail::Reduce::sum).wait();
}

void StageRunner::optimizer_step() {
  sum_shared_gradients();
  if (!opt_.allow_nonfinite) check_gradients_finite(*module_, {step_, st_.id});
  optim_->step();
}

// --- Transfer actions ---
// Each send/recv action moves the range's part held by this replica, exchanged with every replica
// of the peer stage whose share intersects it (one Piece each).

/// The pieces of a send/recv action; `downstream`: the peer is a successor (activation sends,
/// gradient receives).
std::vector<StageRunner::Piece> StageRunner::action_pieces(const Action& a, bool downstream) const {
  const plan::Stage& peer = p_.stages[a.peer];
  const auto& names = downstream ? edge(st_.id, peer.id) : edge(peer.id, st_.id);
  Range range{a.sample_begin, a.sample_count};
  Range mine = my_share(range.begin);
  const int mb = static_cast<int>(range.begin / st_.micro_batch_size);
  std::vector<Piece> out;
  for (size_t i = 0; i < peer.devices.size(); ++i) {
    Range part = intersect(intersect(range, mine), replica_share(peer, static_cast<int>(i), range.begin));
    if (part.count > 0) out.push_back({names, mine, part, peer.devices[i], peer.id, mb});
  }
  return out;
}

void StageRunner::send_act(const Action& a) {
  for (const Piece& pc : action_pieces(a, /*downstream=*/true)) {
    if (pc.names.empty()) {  // a pure ordering edge: no op tensor crosses it
      send_token(pc, false);
      continue;
    }
    auto& ms = mbs_[pc.mb];
    std::vector<torch::Tensor> ts;
    for (const auto& n : pc.names) ts.push_back(rows(ms.outputs.at(n), pc.mine.begin, pc.part).detach());
    auto& pending = ms.act_sends[pc.peer_rank];
    if (packed(pc.names, false)) {
      pending.push_back(send_packed(ts, pc.peer_rank, piece_tag(false, pc, 0)));
      continue;
    }
    for (size_t t = 0; t < ts.size(); ++t) pending.push_back(world_.send(ts[t], pc.peer_rank, piece_tag(false, pc, t)));
  }
}

void StageRunner::recv_act(const Action& a) {
  for (const Piece& pc : action_pieces(a, /*downstream=*/false)) {
    if (pc.names.empty()) {
      recv_token(pc, false);
      continue;
    }
    std::vector<torch::Tensor> received;
    if (packed(pc.names, false)) {
      received = recv_packed(pc.names, pc, false);
    } else {
      for (size_t t = 0; t < pc.names.size(); ++t) {
        const std::string& n = pc.names[t];
        received.push_back(receive(rows_shape(n, pc.part.count), dtype_of(n), pc.peer_rank, piece_tag(false, pc, t)));
      }
    }
    pieces_[pc.peer_stage][pc.part.begin] = std::move(received);
  }
  post_after(a);
}

void StageRunner::send_grad(const Action& a) {
  for (const Piece& pc : action_pieces(a, /*downstream=*/false)) {
    if (pc.names.empty()) {
      send_token(pc, true);
      continue;
    }
    auto& ms = mbs_[pc.mb];
    if (packed(pc.names, true)) {
      std::vector<torch::Tensor> ts;
      for (const auto& n : floating(pc.names)) ts.push_back(rows(ms.in_grads.at(n), pc.mine.begin, pc.part).detach());
      sends_.push_back(send_packed(ts, pc.peer_rank, piece_tag(true, pc, 0)));
      continue;
    }
    for (size_t t = 0; t < pc.names.size(); ++t) {
      const torch::Tensor& g = ms.in_grads.at(pc.names[t]);
      if (!torch::isFloatingType(g.scalar_type())) continue;
      sends_.push_back(world_.send(rows(g, pc.mine.begin, pc.part), pc.peer_rank, piece_tag(true, pc, t)));
    }
  }
}

void StageRunner::recv_grad(const Action& a) {
  for (const Piece& pc : action_pieces(a, /*downstream=*/true)) {
    if (pc.names.empty()) {
      recv_token(pc, true);
      continue;
    }
    auto& ms = mbs_[pc.mb];
    if (packed(pc.names, true)) {
      const std::vector<std::string> moved = floating(pc.names);
      std::vector<torch::Tensor> ts = recv_packed(moved, pc, true);
      ms.grads_from.insert(pc.peer_rank);
      for (size_t k = 0; k < ts.size(); ++k) add_gradient(ms, moved[k], pc, ts[k]);
      continue;
    }
    for (size_t t = 0; t < pc.names.size(); ++t) {
      const std::string& n = pc.names[t];
      const torch::ScalarType dtype = ms.outputs.at(n).scalar_type();
      if (!torch::isFloatingType(dtype)) continue;
      auto buf = receive(rows_shape(n, pc.part.count), dtype, pc.peer_rank, piece_tag(true, pc, t));
      ms.grads_from.insert(pc.peer_rank);
      add_gradient(ms, n, pc, buf);
    }
  }
  post_after(a);
}

/// Adds a received gradient piece `g` of output `name` to the micro-batch's sum over successors.
void StageRunner::add_gradient(MicroBatchState& ms, const std::string& name, const Piece& pc, const torch::Tensor& g) {
  auto& acc = ms.out_grads[name];
  if (!acc.defined()) acc = torch::zeros_like(ms.outputs.at(name));
  rows(acc, pc.mine.begin, pc.part).add_(g);
}

const std::vector<std::string>& StageRunner::edge(int from, int to) const {
  static const std::vector<std::string> none;
  auto it = edge_.find({from, to});
  return it == edge_.end() ? none : it->second;
}

int StageRunner::piece_tag(bool grad, const Piece& pc, size_t tensor) const {
  return transfer_tag(grad || eval_, pc.part.begin, tensor, step_);  // eval: its own tag space
}

std::vector<int64_t> StageRunner::rows_shape(const std::string& name, int64_t n) const {
  std::vector<int64_t> shape = g_.op(g_.find(name)).output_shape;
  GP_ASSERT(!shape.empty() && shape[0] == ir::kBatch, "edge tensor {} has no batch dim", name);
  shape[0] = n;
  return shape;
}

torch::Tensor StageRunner::empty_rows(const std::string& name, int64_t n) const {
  return torch::empty(rows_shape(name, n), torch::TensorOptions(dtype_of(name)).device(module_->device()));
}

torch::ScalarType StageRunner::dtype_of(const std::string& name) const {
  return g_.op(g_.find(name)).dtype == ir::DType::i64 ? torch::kLong : torch::kFloat;
}

// Several tensors crossing one stage edge (a DAG cut often cuts more than one) travel as one
// message per piece and direction: one header and payload round trip instead of one per tensor
// (each costs a Gloo latency on the receiver's critical path). Gradients: the floating ones only.
bool StageRunner::packed(const std::vector<std::string>& names, bool grad) const {
  size_t n = 0;
  for (const auto& name : names) n += !grad || torch::isFloatingType(dtype_of(name));
  return n > 1;
}

/// The floating tensors of `names` (those that have gradients), in order.
std::vector<std::string> StageRunner::floating(const std::vector<std::string>& names) const {
  std::vector<std::string> out;
  for (const auto& n : names)
    if (torch::isFloatingType(dtype_of(n))) out.push_back(n);
  return out;
}

detail::Pending StageRunner::send_packed(const std::vector<torch::Tensor>& ts, int peer_rank, int tag) {
  const std::vector<int64_t> off = pack_offsets(ts);
  torch::Tensor buf = torch::empty({off.back()}, torch::TensorOptions(torch::kUInt8).device(module_->device()));
  for (size_t k = 0; k < ts.size(); ++k) byte_view(buf, off[k], ts[k]).copy_(ts[k]);
  return world_.send(buf, peer_rank, tag);
}

/// The tensors `names` of piece `pc`, received as one packed message.
std::vector<torch::Tensor> StageRunner::recv_packed(const std::vector<std::string>& names, const Piece& pc, bool grad) {
  std::vector<torch::Tensor> ts;  // buffers shaped as the tensors received
  for (const auto& n : names) ts.push_back(empty_rows(n, pc.part.count));
  const std::vector<int64_t> off = pack_offsets(ts);
  torch::Tensor buf = receive({off.back()}, torch::kUInt8, pc.peer_rank, piece_tag(grad, pc, 0));
  for (size_t k = 0; k < ts.size(); ++k) ts[k].copy_(byte_view(buf, off[k], ts[k]));
  return ts;
}

// A declared stage edge that no op tensor crosses (baselines chain their stages) still orders
// the stages as the simulator models it: each transfer piece moves a one-float token holding
// the piece's sample count, in both directions.
void StageRunner::send_token(const Piece& pc, bool grad) {
  sends_.push_back(
      world_.send(torch::full({1}, static_cast<float>(pc.part.count)), pc.peer_rank, piece_tag(grad, pc, 0)));
}

void StageRunner::recv_token(const Piece& pc, bool grad) {
  torch::Tensor t = receive({1}, torch::kFloat, pc.peer_rank, piece_tag(grad, pc, 0));
  if (grad) mbs_[pc.mb].grads_from.insert(pc.peer_rank);
  GP_ASSERT(t.item<float>() == static_cast<float>(pc.part.count),
            "stage {}: ordering token from rank {} for samples [{}, {}) carries {}", st_.id, pc.peer_rank,
            pc.part.begin, pc.part.end(), t.item<float>());
}

// --- Receives posted ahead ---

/// The messages a receive action takes, in the order recv_act / recv_grad and recv_token take them.
std::vector<StageRunner::RecvSpec> StageRunner::recv_specs(const Action& a) const {
  const bool grad = a.kind == ActionKind::recv_grad;
  std::vector<RecvSpec> out;
  for (const Piece& pc : action_pieces(a, /*downstream=*/grad)) {
    if (pc.names.empty()) {
      out.push_back({pc.peer_rank, piece_tag(grad, pc, 0), {1}, torch::kFloat});
    } else if (packed(pc.names, grad)) {
      int64_t bytes = 0;
      for (const auto& n : grad ? floating(pc.names) : pc.names) {
        const auto shape = rows_shape(n, pc.part.count);
        bytes += (c10::multiply_integers(shape) * static_cast<int64_t>(c10::elementSize(dtype_of(n))) + 15) / 16 * 16;
      }
      out.push_back({pc.peer_rank, piece_tag(grad, pc, 0), {bytes}, torch::kUInt8});
    } else {
      for (size_t t = 0; t < pc.names.size(); ++t)
        if (!grad || torch::isFloatingType(dtype_of(pc.names[t])))
          out.push_back(
              {pc.peer_rank, piece_tag(grad, pc, t), rows_shape(pc.names[t], pc.part.count), dtype_of(pc.names[t])});
    }
  }
  return out;
}

void StageRunner::post_ahead(const Action& a) {
  for (RecvSpec& r : recv_specs(a)) {
    auto recv = world_.post_recv(r.shape, torch::TensorOptions(r.dtype).device(module_->device()), r.peer_rank, r.tag);
    bool fresh = ahead_.posted.emplace(std::pair{r.peer_rank, r.tag}, Posted{r.shape, r.dtype, std::move(recv)}).second;
    GP_ASSERT(fresh, "stage {}: the receive of tag {} from rank {} was posted twice", st_.id, r.tag, r.peer_rank);
  }
}

/// After receive action `a` of the schedule (not of an eval batch): posts the next one of its stream.
void StageRunner::post_after(const Action& a) {
  if (eval_ || &a < actions_.data() || &a >= actions_.data() + actions_.size()) return;
  const int next = ahead_.next[static_cast<size_t>(&a - actions_.data())];
  if (next >= 0) post_ahead(actions_[static_cast<size_t>(next)]);
}

/// The message (`peer_rank`, `tag`) of the expected shape and dtype: posted ahead, or posted now.
torch::Tensor StageRunner::receive(const std::vector<int64_t>& shape, torch::ScalarType dtype, int peer_rank, int tag) {
  auto it = ahead_.posted.find({peer_rank, tag});
  if (it == ahead_.posted.end())
    return world_.post_recv(shape, torch::TensorOptions(dtype).device(module_->device()), peer_rank, tag).wait();
  Posted p = std::move(it->second);
  ahead_.posted.erase(it);
  GP_ASSERT(p.shape == shape && p.dtype == dtype,
            "stage {}: the receive of tag {} from rank {} was posted as [{}] {}, taken as [{}] {}", st_.id, tag,
            peer_rank, fmt::join(p.shape, ", "), c10::toString(p.dtype), fmt::join(shape, ", "), c10::toString(dtype));
  return p.recv.wait();
}

/// ahead_.next[i]: the schedule's next receive action after action i of the same kind from the same
/// peer stage (-1: none); ahead_.first: the first receive action of each such stream.
void StageRunner::link_receive_streams() {
  ahead_.next.assign(actions_.size(), -1);
  std::map<std::pair<int, int>, int> last;  // (kind, peer stage) -> its latest receive action
  for (size_t i = 0; i < actions_.size(); ++i) {
    const Action& a = actions_[i];
    if (a.kind != ActionKind::recv_act && a.kind != ActionKind::recv_grad) continue;
    auto [it, first] = last.try_emplace({static_cast<int>(a.kind), a.peer}, static_cast<int>(i));
    if (first) ahead_.first.push_back(static_cast<int>(i));
    else ahead_.next[static_cast<size_t>(it->second)] = static_cast<int>(i);
    it->second = static_cast<int>(i);
  }
}

// --- Shared parameters ---

// A shared parameter whose users sit on several stages: every replica of every holding stage
// keeps a copy; one communicator per set of holder ranks (created in shared-parameter order, the
// same on every member, so creation cannot deadlock).
void StageRunner::make_shared_groups(const std::vector<int>& stage_of) {
  std::map<std::vector<int>, size_t> by_ranks;
  for (const auto& [k, t] : module_->shared()) {
    std::set<int> stages;
    for (OpId u : g_.shared_users(static_cast<size_t>(k))) stages.insert(stage_of[u.v]);
    if (stages.size() < 2) continue;
    std::vector<int> ranks;
    for (int h : stages) ranks.insert(ranks.end(), p_.stages[h].devices.begin(), p_.stages[h].devices.end());
    std::sort(ranks.begin(), ranks.end());
    auto [it, fresh] = by_ranks.emplace(ranks, shared_.size());
    if (fresh) shared_.push_back({world_.subgroup(ranks, "shared" + std::to_string(k)), {}});
    shared_[it->second].params.push_back(t);
  }
}

// The all-reduce of a replicated stage's gradients joined them into one new buffer and copied the
// sums back, every step (1.56 MB in 58 tensors right after computing, 2 ranks on 2 cores: 4.8 ms
// against 4.3 ms for one buffer; issue 35). Instead each parameter's gradient is a view of one buffer
// kept for the whole training (as DDP's gradient_as_bucket_view): backward accumulates into the views
// in place, the all-reduce reduces the buffer where it is.
void StageRunner::make_gradient_buffer() {
  if (!group_) return;
  std::vector<torch::Tensor> params;
  int64_t total = 0;
  for (auto& p : module_->parameters())
    if (!summed_with_holders(p)) {
      if (!params.empty() && p.options().dtype() != params.front().options().dtype()) return;
      params.push_back(p);
      total += p.numel();
    }
  if (params.empty()) return;
  grad_buffer_ = torch::zeros({total}, params.front().options().requires_grad(false));
  int64_t off = 0;
  for (auto& p : params) {
    p.mutable_grad() = grad_buffer_.narrow(0, off, p.numel()).view_as(p);
    off += p.numel();
  }
}

void StageRunner::zero_gradients() {
  if (!grad_buffer_.defined()) return optim_->zero_grad();  // every grad set to none
  grad_buffer_.zero_();
  for (auto& p : module_->parameters())
    if (summed_with_holders(p)) p.mutable_grad() = torch::Tensor();
}

bool StageRunner::summed_with_holders(const torch::Tensor& p) const {
  for (const auto& sg : shared_)
    for (const auto& t : sg.params)
      if (t.is_same(p)) return true;
  return false;
}

// Before the optimizer step: every holder (and replica) adds its gradient of each shared
// parameter, so all copies take the same update from the whole mini-batch's gradient.
void StageRunner::sum_shared_gradients() {
  for (auto& sg : shared_) {
    std::vector<torch::Tensor> grads;
    for (auto& p : sg.params) {
      if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
      grads.push_back(p.grad());
    }
    sg.comm->all_reduce(grads, detail::Reduce::sum).wait();
  }
}

}  // namespace gp::runtime
