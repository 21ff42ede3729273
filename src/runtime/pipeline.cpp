// The pipeline worker: executes one rank's stage schedule with real tensors. Activations and
// gradients travel as sample ranges between stage replicas (regrouping between per-stage
// micro-batch sizes), gradients accumulate over micro-batches and are summed over replicas.
#include <fmt/ranges.h>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>

#include "importers/resolve.h"
#include "runtime/checkpoint_manifest.h"
#include "runtime/op_timing.h"
#include "plan/costs.h"
#include "runtime/comm_select.h"
#include "runtime/detail/checkpoint_set.h"
#include "runtime/detail/comm.h"
#include "runtime/detail/device.h"
#include "runtime/detail/divergence.h"
#include "runtime/detail/executor.h"
#include "runtime/detail/memory_meter.h"
#include "runtime/detail/optim.h"
#include "runtime/detail/pipeline.h"
#include "runtime/detail/split_backward.h"
#include "runtime/launcher.h"
#include "schedule/trace.h"
#include "support/error.h"
#include "support/json.h"

namespace gp::runtime {

std::atomic<bool>& poison_next_action() {
  static std::atomic<bool> flag{false};
  return flag;
}

namespace {

/// What the message tags (transfer_tag) can address: sample indices below 2^22 and at most 64
/// tensors on one stage edge. A valid plan beyond them is refused before any worker starts.
void check_runtime_limits(const plan::Plan& p, const ir::Graph& g) {
  GP_CHECK(p.mini_batch_size < kMaxMiniBatchSamples,
           "plan: mini_batch_size {} is above what the runtime can train, {} samples per step", p.mini_batch_size,
           kMaxMiniBatchSamples - 1);
  auto stage_of = plan::stage_of_ops(p, g);
  for (const auto& [e, ops] : plan::cut_edges(g, stage_of))
    GP_CHECK(ops.size() <= kMaxTensorsPerEdge,
             "plan: stage {} sends {} op outputs to stage {}; the runtime carries at most {} per stage edge (cut "
             "the model elsewhere)",
             e.first, ops.size(), e.second, kMaxTensorsPerEdge);
}

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

}  // namespace

PreparedRun prepare_run(plan::Plan p, const std::string& schedule_kind, const std::string& model_spec) {
  std::string spec = model_spec.empty() ? p.model_spec : model_spec;
  GP_CHECK(!spec.empty(), "plan: no model_spec in the plan; pass --model SPEC");
  importers::ParamValues w;  // every rank starts from the same weights
  ir::Graph g = importers::load_graph(spec, w);
  plan::validate_plan(p, g, "plan");
  check_runtime_limits(p, g);
  schedule::Schedule s = schedule::build_schedule(p, schedule_kind);
  schedule::check_schedule(s, p, "schedule");
  check_initial_values(g, w);
  return PreparedRun{std::move(p), std::move(g), std::move(s), std::move(w)};
}

PreparedRun prepare_run(const TrainOptions& opt, bool check_data_values) {
  GP_CHECK(!opt.plan_path.empty(), "train needs --plan FILE (or --single)");
  GP_CHECK(opt.steps >= 1, "--steps must be >= 1, found {}", opt.steps);
  GP_CHECK(opt.checkpoint_every >= 0, "--checkpoint-every must be >= 0, found {}", opt.checkpoint_every);
  GP_CHECK(!opt.resume || !opt.checkpoint_dir.empty(), "--resume needs --checkpoint-dir");
  GP_CHECK(opt.checkpoint_every == 0 || !opt.checkpoint_dir.empty(), "--checkpoint-every needs --checkpoint-dir");
  GP_CHECK(opt.timeout_s > 0 && opt.timeout_s <= kMaxTimeoutS, "--timeout must be in (0, {}] seconds, found {}",
           kMaxTimeoutS, opt.timeout_s);
  GP_CHECK(opt.threads >= 1 && opt.threads <= kMaxThreads, "--threads must be in [1, {}], found {}", kMaxThreads,
           opt.threads);
  GP_CHECK(std::isfinite(opt.lr) && opt.lr > 0, "--lr must be a positive finite number, found {}", opt.lr);
  plan::Plan p = plan::load_plan(opt.plan_path);
  const std::string kind = opt.schedule.empty() ? p.schedule : opt.schedule;  // default: the plan's own
  PreparedRun run = prepare_run(std::move(p), kind, opt.model_spec);
  if (opt.seeded_weights) run.weights.clear();
  RunData d = open_run_data(opt, run.graph, check_data_values);
  run.data = std::move(d.train);
  run.eval_data = std::move(d.eval);
  return run;
}

double stage_bytes_estimate(const PreparedRun& run, int stage, const std::string& optimizer) {
  const plan::Stage& st = run.plan.stages.at(stage);
  std::vector<OpId> ops;
  for (const auto& name : st.ops) ops.push_back(run.graph.find(name));
  double held = double(st.in_flight) * st.micro_batch_size / double(st.devices.size());
  return training_bytes_estimate(run.graph, ops, held, optimizer);
}

RankRole role_of_rank(const plan::Plan& p, int rank) {
  for (const auto& st : p.stages)
    for (size_t i = 0; i < st.devices.size(); ++i)
      if (st.devices[i] == rank) return {st.id, static_cast<int>(i)};
  return {};
}

namespace {

using detail::Communicator;
using detail::Pending;
using schedule::Action;
using schedule::ActionKind;

struct Range {
  int64_t begin = 0, count = 0;
  int64_t end() const { return begin + count; }
};
Range intersect(Range a, Range b) {
  int64_t lo = std::max(a.begin, b.begin), hi = std::min(a.end(), b.end());
  return {lo, std::max<int64_t>(0, hi - lo)};
}

/// The samples replica `rep` of `st` holds in the micro-batch that contains sample `s`.
Range replica_share(const plan::Stage& st, int rep, int64_t s) {
  int64_t m = st.micro_batch_size, share = m / static_cast<int64_t>(st.devices.size());
  return {s / m * m + rep * share, share};
}

double now_s() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

/// Messages between one pair of ranks are told apart by kind, first sample and tensor index;
/// the step parity keeps a fast sender's next step apart from a slow receiver's current one.
int transfer_tag(bool grad, int64_t sample, size_t tensor, int64_t step) {
  GP_ASSERT(sample < kMaxMiniBatchSamples && tensor < kMaxTensorsPerEdge, "tag overflow: sample {} tensor {}", sample,
            tensor);
  return static_cast<int>(((step & 1) << 30) | (int64_t{grad} << 29) | (sample << 6) | int64_t(tensor));
}

struct MicroBatchState {
  TensorMap leaves;     // received activations (requires_grad leaves when floating)
  TensorMap outputs;    // this stage's outputs that other stages read
  TensorMap out_grads;  // gradients of `outputs` summed over successors
  TensorMap in_grads;   // gradients w.r.t. `leaves`, after backward
  torch::Tensor loss;   // scaled loss (loss stage only)
  // Activation sends in flight by peer rank, and the peers a gradient (or ordering token) came back
  // from: that peer has received the activations, so backward can release them (memory.md).
  std::map<int, std::vector<Pending>> act_sends;
  std::set<int> grads_from;
  detail::SplitBackward split;  // zero-bubble: what backward_weight needs, from backward_input to it
};

/// One rank's stage: module, optimizer, communicators and the per-step transfer state.
class StageRunner {
 public:
  StageRunner(const TrainOptions& opt, const PreparedRun& run, RankRole role, Communicator& world, torch::Device device)
      : opt_(opt),
        p_(run.plan),
        g_(run.graph),
        st_(p_.stages[role.stage]),
        rep_(role.replica),
        world_(world),
        actions_(run.schedule.stages[role.stage].actions),
        data_(run.data.get()),
        eval_data_(run.eval_data.get()) {
    auto stage_of = plan::stage_of_ops(p_, g_);
    std::vector<OpId> ops;
    for (size_t i = 0; i < g_.num_ops(); ++i)
      if (stage_of[i] == st_.id) ops.emplace_back(static_cast<int32_t>(i));
    module_ = std::make_unique<StageModule>(g_, ops, opt.seed, run.weights, device);
    feed_ = std::make_unique<InputPrefetcher>(*module_, data_);
    for (const Action& a : actions_)
      if (a.kind == ActionKind::forward) forwards_.push_back(a.micro_batch);
    optim_ = make_optimizer(opt.optimizer, module_->parameters(), opt.lr, opt.momentum);
    edge_ = edge_tensor_names(g_, stage_of);
    link_receive_streams();
    if (st_.devices.size() > 1) group_ = world_.subgroup(st_.devices, "stage" + std::to_string(st_.id));
    make_shared_groups(stage_of);
  }

  StageModule& module() { return *module_; }
  torch::optim::Optimizer& optimizer() { return *optim_; }
  const std::vector<Action>& actions() const { return actions_; }
  int stage() const { return st_.id; }

  void begin_step(int64_t step) {
    step_ = step;
    loss_sum_ = 0;
    data_s_ = 0;
    optim_->zero_grad();
    mbs_.clear();
    pieces_.clear();
    if (!next_posted_)
      for (int i : first_recvs_) post_ahead(actions_[static_cast<size_t>(i)]);
    next_posted_ = false;
  }
  /// Posts step `next`'s first receives now, before the waits between steps (the step statistics, a
  /// checkpoint), so that a peer that starts that step first finds them announced (docs/runtime.md "What
  /// a transfer costs"). Not before an eval batch: its messages reuse the step parity of the tags.
  void post_next_step(int64_t next) {
    const int64_t current = step_;
    step_ = next;
    for (int i : first_recvs_) post_ahead(actions_[static_cast<size_t>(i)]);
    step_ = current;
    next_posted_ = true;
  }
  /// Waits for this step's sends; returns the sum of scaled losses this rank computed.
  double end_step() {
    for (auto& s : sends_) s.wait();
    sends_.clear();
    for (auto& [mb, ms] : mbs_)
      for (auto& [peer, pending] : ms.act_sends)
        for (auto& s : pending) s.wait();
    mbs_.clear();
    GP_ASSERT(posted_.empty(), "stage {}: {} receives of step {} were posted and never taken", st_.id, posted_.size(),
              step_);
    return loss_sum_;
  }

  double data_seconds() const { return data_s_; }

  /// Forward-only evaluation of eval mini-batch `j` (--eval-data): this stage's forwards and
  /// activation transfers of the schedule, in order; adds the loss stage's sums to `sums`.
  void eval_batch(int64_t j, EvalSums& sums) {
    torch::NoGradGuard no_grad;
    eval_ = true;
    step_ = j;
    mbs_.clear();
    pieces_.clear();
    for (const Action& a : actions_) {
      if (a.kind == ActionKind::forward) forward(a.micro_batch);
      if (a.kind == ActionKind::send_act || a.kind == ActionKind::recv_act)
        transfer(a, false, a.kind == ActionKind::send_act);
    }
    end_step();
    eval_ = false;
    sums.loss += eval_sums_.loss;
    sums.correct += eval_sums_.correct;
    sums.samples += eval_sums_.samples;
    sums.classified += eval_sums_.classified;
    eval_sums_ = EvalSums{};
  }

  void run(const Action& a) {
    if (poison_next_action().exchange(false)) poison_first_gradient(*module_);
    switch (a.kind) {
      case ActionKind::forward: forward(a.micro_batch); break;
      case ActionKind::backward: backward(a.micro_batch, Pass::full); break;
      case ActionKind::backward_input: backward(a.micro_batch, Pass::input); break;
      case ActionKind::backward_weight: backward_weight(a.micro_batch); break;
      case ActionKind::send_act: transfer(a, /*grad=*/false, /*send=*/true); break;
      case ActionKind::recv_act: transfer(a, false, false); break;
      case ActionKind::send_grad: transfer(a, true, true); break;
      case ActionKind::recv_grad: transfer(a, true, false); break;
      case ActionKind::allreduce: allreduce(); break;
      case ActionKind::optimizer_step:
        sum_shared_gradients();
        if (!opt_.allow_nonfinite) check_gradients_finite(*module_, {step_, st_.id});
        optim_->step();
        break;
    }
  }

 private:
  Range my_share(int64_t sample) const { return replica_share(st_, rep_, sample); }
  MicroBatchInfo info(int mb, int64_t step) const {
    Range r = my_share(int64_t{mb} * st_.micro_batch_size);
    return {r.begin, r.count, p_.mini_batch_size, step, !eval_};
  }
  MicroBatchInfo info(int mb) const { return info(mb, step_); }
  /// The micro-batch this replica runs forward after `mb` of this step: the schedule's next
  /// forward, or the first one of the next step (none after the last step).
  std::optional<MicroBatchInfo> next_forward(int mb) const {
    auto it = std::find(forwards_.begin(), forwards_.end(), mb);
    if (it != forwards_.end() && it + 1 != forwards_.end()) return info(*(it + 1), step_);
    if (step_ + 1 < opt_.steps && !forwards_.empty()) return info(forwards_.front(), step_ + 1);
    return std::nullopt;
  }
  const std::vector<std::string>& edge(int from, int to) const {
    static const std::vector<std::string> none;
    auto it = edge_.find({from, to});
    return it == edge_.end() ? none : it->second;
  }
  /// Rows [r.begin, r.end()) of every sample of a per-sample tensor whose batch starts at `base`.
  static torch::Tensor rows(const torch::Tensor& t, int64_t base, Range r) {
    return t.narrow(0, r.begin - base, r.count);
  }
  torch::Tensor empty_rows(const std::string& name, int64_t n) const {
    const ir::Op& op = g_.op(g_.find(name));
    std::vector<int64_t> shape = op.output_shape;
    GP_ASSERT(!shape.empty() && shape[0] == ir::kBatch, "edge tensor {} has no batch dim", name);
    shape[0] = n;
    return torch::empty(
        shape,
        torch::TensorOptions(op.dtype == ir::DType::i64 ? torch::kLong : torch::kFloat).device(module_->device()));
  }

  // One send/recv action: the range's part held by this replica, exchanged with every replica
  // of the peer stage whose share intersects it.
  void transfer(const Action& a, bool grad, bool send) {
    const plan::Stage& peer = p_.stages[a.peer];
    bool downstream = send != grad;  // act sends and grad receives talk to successors
    const auto& names = downstream ? edge(st_.id, peer.id) : edge(peer.id, st_.id);
    Range range{a.sample_begin, a.sample_count};
    Range mine = my_share(range.begin);
    int mb = static_cast<int>(range.begin / st_.micro_batch_size);
    for (size_t i = 0; i < peer.devices.size(); ++i) {
      Range part = intersect(intersect(range, mine), replica_share(peer, static_cast<int>(i), range.begin));
      if (part.count == 0) continue;
      int peer_rank = peer.devices[i];
      if (names.empty()) {  // a pure ordering edge: no op tensor crosses it
        token(grad, send, part, peer_rank);
        continue;
      }
      auto& ms = mbs_[mb];
      if (packed(names, grad)) {
        transfer_packed(names, grad, send, mine, part, peer_rank, ms, peer.id);
        continue;
      }
      std::vector<torch::Tensor> received;
      for (size_t t = 0; t < names.size(); ++t) {
        const std::string& n = names[t];
        int tag = transfer_tag(grad || eval_, part.begin, t, step_);  // eval: its own tag space
        if (!grad && send) {
          ms.act_sends[peer_rank].push_back(
              world_.send(rows(ms.outputs.at(n), mine.begin, part).detach(), peer_rank, tag));
        } else if (!grad) {
          received.push_back(receive(rows_shape(n, part.count), dtype_of(n), peer_rank, tag));
        } else if (send) {
          if (!torch::isFloatingType(ms.in_grads.at(n).scalar_type())) continue;
          sends_.push_back(world_.send(rows(ms.in_grads.at(n), mine.begin, part), peer_rank, tag));
        } else {
          auto& out = ms.outputs.at(n);
          if (!torch::isFloatingType(out.scalar_type())) continue;
          auto buf = receive(rows_shape(n, part.count), out.scalar_type(), peer_rank, tag);
          ms.grads_from.insert(peer_rank);
          auto& acc = ms.out_grads[n];
          if (!acc.defined()) acc = torch::zeros_like(out);
          rows(acc, mine.begin, part).add_(buf);
        }
      }
      if (!send && !grad) pieces_[peer.id][part.begin] = std::move(received);
    }
    if (!send && !eval_ && &a >= actions_.data() && &a < actions_.data() + actions_.size()) {
      const int next = next_recv_[static_cast<size_t>(&a - actions_.data())];
      if (next >= 0) post_ahead(actions_[static_cast<size_t>(next)]);
    }
  }

  // --- Receives posted ahead (docs/runtime.md "What a transfer costs") ---
  // Gloo sends a message only once the receiver has announced its receive, so a receive posted when the
  // tensor is needed waits a round trip more than one posted before the peer sends. Each stream of
  // receive actions (kind and peer stage) keeps its next action's receives posted: the first ones when
  // the step begins, the next when one is taken. posted_ holds them by (peer rank, tag), which a step
  // never repeats; eval batches post nothing ahead.
  struct RecvSpec {
    int peer_rank, tag;
    std::vector<int64_t> shape;
    torch::ScalarType dtype;
  };
  struct Posted {
    std::vector<int64_t> shape;
    torch::ScalarType dtype;
    detail::PostedRecv recv;
  };
  /// The messages a receive action takes, in the order transfer() and token() take them.
  std::vector<RecvSpec> recv_specs(const Action& a) const {
    const bool grad = a.kind == ActionKind::recv_grad;
    const plan::Stage& peer = p_.stages[a.peer];
    const auto& names = grad ? edge(st_.id, peer.id) : edge(peer.id, st_.id);
    Range range{a.sample_begin, a.sample_count};
    Range mine = my_share(range.begin);
    std::vector<RecvSpec> out;
    for (size_t i = 0; i < peer.devices.size(); ++i) {
      Range part = intersect(intersect(range, mine), replica_share(peer, static_cast<int>(i), range.begin));
      if (part.count == 0) continue;
      const int peer_rank = peer.devices[i];
      if (names.empty()) {
        out.push_back({peer_rank, transfer_tag(grad || eval_, part.begin, 0, step_), {1}, torch::kFloat});
      } else if (packed(names, grad)) {
        int64_t bytes = 0;
        for (const auto& n : names) {
          if (grad && !torch::isFloatingType(dtype_of(n))) continue;
          const auto shape = rows_shape(n, part.count);
          bytes += (c10::multiply_integers(shape) * static_cast<int64_t>(c10::elementSize(dtype_of(n))) + 15) / 16 * 16;
        }
        out.push_back({peer_rank, transfer_tag(grad || eval_, part.begin, 0, step_), {bytes}, torch::kUInt8});
      } else {
        for (size_t t = 0; t < names.size(); ++t)
          if (!grad || torch::isFloatingType(dtype_of(names[t])))
            out.push_back({peer_rank, transfer_tag(grad || eval_, part.begin, t, step_),
                           rows_shape(names[t], part.count), dtype_of(names[t])});
      }
    }
    return out;
  }
  void post_ahead(const Action& a) {
    for (RecvSpec& r : recv_specs(a)) {
      auto recv = world_.post_recv(r.shape, torch::TensorOptions(r.dtype).device(module_->device()), r.peer_rank,
                                   r.tag);
      bool fresh = posted_.emplace(std::pair{r.peer_rank, r.tag}, Posted{r.shape, r.dtype, std::move(recv)}).second;
      GP_ASSERT(fresh, "stage {}: the receive of tag {} from rank {} was posted twice", st_.id, r.tag, r.peer_rank);
    }
  }
  /// The message (`peer_rank`, `tag`) of the expected shape and dtype: posted ahead, or posted now.
  torch::Tensor receive(const std::vector<int64_t>& shape, torch::ScalarType dtype, int peer_rank, int tag) {
    auto it = posted_.find({peer_rank, tag});
    if (it == posted_.end())
      return world_.post_recv(shape, torch::TensorOptions(dtype).device(module_->device()), peer_rank, tag).wait();
    Posted p = std::move(it->second);
    posted_.erase(it);
    GP_ASSERT(p.shape == shape && p.dtype == dtype,
              "stage {}: the receive of tag {} from rank {} was posted as [{}] {}, taken as [{}] {}", st_.id, tag,
              peer_rank, fmt::join(p.shape, ", "), c10::toString(p.dtype), fmt::join(shape, ", "),
              c10::toString(dtype));
    return p.recv.wait();
  }
  /// next_recv_[i]: the schedule's next receive action after action i of the same kind from the same
  /// peer stage (-1: none); first_recvs_: the first receive action of each such stream.
  void link_receive_streams() {
    next_recv_.assign(actions_.size(), -1);
    std::map<std::pair<int, int>, int> last;  // (kind, peer stage) -> its latest receive action
    for (size_t i = 0; i < actions_.size(); ++i) {
      const Action& a = actions_[i];
      if (a.kind != ActionKind::recv_act && a.kind != ActionKind::recv_grad) continue;
      auto [it, first] = last.try_emplace({static_cast<int>(a.kind), a.peer}, static_cast<int>(i));
      if (first) first_recvs_.push_back(static_cast<int>(i));
      else next_recv_[static_cast<size_t>(it->second)] = static_cast<int>(i);
      it->second = static_cast<int>(i);
    }
  }
  std::vector<int64_t> rows_shape(const std::string& name, int64_t n) const {
    std::vector<int64_t> shape = g_.op(g_.find(name)).output_shape;
    GP_ASSERT(!shape.empty() && shape[0] == ir::kBatch, "edge tensor {} has no batch dim", name);
    shape[0] = n;
    return shape;
  }

  // Several tensors crossing one stage edge (a DAG cut often cuts more than one) travel as one
  // message per piece and direction: one header and payload round trip instead of one per tensor
  // (each costs a Gloo latency on the receiver's critical path). Gradients: the floating ones only.
  bool packed(const std::vector<std::string>& names, bool grad) const {
    size_t n = 0;
    for (const auto& name : names) n += !grad || torch::isFloatingType(dtype_of(name));
    return n > 1;
  }
  torch::ScalarType dtype_of(const std::string& name) const {
    return g_.op(g_.find(name)).dtype == ir::DType::i64 ? torch::kLong : torch::kFloat;
  }
  /// Byte offsets of each tensor in the packed message, each aligned to 16 bytes, and the total.
  static std::vector<int64_t> pack_offsets(const std::vector<torch::Tensor>& ts) {
    std::vector<int64_t> off{0};
    for (const auto& t : ts) off.push_back(off.back() + (t.numel() * t.element_size() + 15) / 16 * 16);
    return off;
  }
  static torch::Tensor byte_view(torch::Tensor& buf, int64_t begin, const torch::Tensor& like) {
    return buf.narrow(0, begin, like.numel() * like.element_size()).view(like.scalar_type()).view(like.sizes());
  }
  void transfer_packed(const std::vector<std::string>& names, bool grad, bool send, Range mine, Range part,
                       int peer_rank, MicroBatchState& ms, int peer_stage) {
    std::vector<std::string> moved;
    for (const auto& n : names)
      if (!grad || torch::isFloatingType(dtype_of(n))) moved.push_back(n);
    std::vector<torch::Tensor> ts;  // the pieces sent, or buffers shaped as those received
    for (const auto& n : moved)
      ts.push_back(send ? rows(grad ? ms.in_grads.at(n) : ms.outputs.at(n), mine.begin, part).detach()
                        : empty_rows(n, part.count));
    const std::vector<int64_t> off = pack_offsets(ts);
    const int tag = transfer_tag(grad || eval_, part.begin, 0, step_);
    if (send) {
      torch::Tensor buf = torch::empty({off.back()}, torch::TensorOptions(torch::kUInt8).device(module_->device()));
      for (size_t k = 0; k < ts.size(); ++k) byte_view(buf, off[k], ts[k]).copy_(ts[k]);
      (grad ? sends_ : ms.act_sends[peer_rank]).push_back(world_.send(buf, peer_rank, tag));
      return;
    }
    torch::Tensor buf = receive({off.back()}, torch::kUInt8, peer_rank, tag);
    for (size_t k = 0; k < ts.size(); ++k) ts[k].copy_(byte_view(buf, off[k], ts[k]));
    if (!grad) {
      pieces_[peer_stage][part.begin] = std::move(ts);
      return;
    }
    ms.grads_from.insert(peer_rank);
    for (size_t k = 0; k < ts.size(); ++k) {
      auto& acc = ms.out_grads[moved[k]];
      if (!acc.defined()) acc = torch::zeros_like(ms.outputs.at(moved[k]));
      rows(acc, mine.begin, part).add_(ts[k]);
    }
  }

  // A declared stage edge that no op tensor crosses (baselines chain their stages) still orders
  // the stages as the simulator models it: each transfer piece moves a one-float token holding
  // the piece's sample count, in both directions.
  void token(bool grad, bool send, Range part, int peer_rank) {
    int tag = transfer_tag(grad || eval_, part.begin, 0, step_);
    if (send) {
      sends_.push_back(world_.send(torch::full({1}, static_cast<float>(part.count)), peer_rank, tag));
      return;
    }
    torch::Tensor t = receive({1}, torch::kFloat, peer_rank, tag);
    if (grad) mbs_[static_cast<int>(part.begin / st_.micro_batch_size)].grads_from.insert(peer_rank);
    GP_ASSERT(t.item<float>() == static_cast<float>(part.count),
              "stage {}: ordering token from rank {} for samples [{}, {}) carries {}", st_.id, peer_rank, part.begin,
              part.end(), t.item<float>());
  }

  void forward(int mb) {
    MicroBatchInfo mi = info(mb);
    Range mine{mi.sample_begin, mi.count};
    double t0 = now_s();
    TensorMap ext = eval_ ? stage_inputs(*module_, mi, eval_data_) : feed_->take(mi, next_forward(mb));
    data_s_ += now_s() - t0;
    auto& ms = mbs_[mb];
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
      GP_ASSERT(got == mine.count, "stage {} mb {}: received {} of {} samples from stage {}", st_.id, mb, got,
                mine.count, u);
      for (size_t t = 0; t < names.size(); ++t) {
        auto x = parts[t].size() == 1 ? parts[t][0] : torch::cat(parts[t]);
        if (!eval_ && torch::isFloatingType(x.scalar_type())) x.requires_grad_(true);
        ms.leaves[names[t]] = x;
        ext[names[t]] = x;
      }
    }
    TensorMap outs = module_->forward(ext, mi);
    for (int v : st_.outputs_to)
      for (const auto& n : edge(st_.id, v)) ms.outputs[n] = outs.at(n);
    if (eval_) {
      add_eval_sums(*module_, ext, outs, mi, eval_data_->size(), eval_sums_);
    } else if (!module_->loss_ops().empty()) {
      ms.loss = module_->scaled_loss(outs, mi);
      double v = ms.loss.item<double>();
      if (!opt_.allow_nonfinite) check_loss_finite(v, *module_, ext, outs, {step_, st_.id});
      loss_sum_ += v;
    }
  }

  enum class Pass { full, input };
  /// B (Pass::full): input and parameter gradients. BI (Pass::input): the input gradients only, what
  /// the parameters' gradients need kept in ms.split for backward_weight (detail/split_backward.h).
  void backward(int mb, Pass pass) {
    auto& ms = mbs_[mb];
    std::vector<torch::Tensor> ts, gs;
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
    if (pass == Pass::full && !ts.empty()) torch::autograd::backward(ts, gs);
    if (pass == Pass::input) {
      std::vector<torch::Tensor> inputs;
      for (auto& [n, x] : ms.leaves)
        if (x.requires_grad()) inputs.push_back(x);
      ms.split.backward_input(ts, gs, inputs, module_->parameters());
    }
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
  void backward_weight(int mb) {
    auto it = mbs_.find(mb);
    GP_ASSERT(it != mbs_.end() && it->second.split.pending(), "stage {}: W mb{} without its BI", st_.id, mb);
    it->second.split.backward_weight();
  }

  // Each replica's loss is scaled by its share of the mini-batch, so replicas' gradients add up.
  // Shared parameters held by other stages too are summed with all their holders instead.
  void allreduce() {
    if (!group_) return;
    std::vector<torch::Tensor> grads;
    for (auto& p : module_->parameters()) {
      if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
      if (!summed_with_holders(p)) grads.push_back(p.grad());
    }
    if (!grads.empty()) group_->all_reduce(grads, detail::Reduce::sum).wait();
  }

  // A shared parameter whose users sit on several stages: every replica of every holding stage
  // keeps a copy; one communicator per set of holder ranks (created in shared-parameter order, the
  // same on every member, so creation cannot deadlock).
  void make_shared_groups(const std::vector<int>& stage_of) {
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
  bool summed_with_holders(const torch::Tensor& p) const {
    for (const auto& sg : shared_)
      for (const auto& t : sg.params)
        if (t.is_same(p)) return true;
    return false;
  }
  // Before the optimizer step: every holder (and replica) adds its gradient of each shared
  // parameter, so all copies take the same update from the whole mini-batch's gradient.
  void sum_shared_gradients() {
    for (auto& sg : shared_) {
      std::vector<torch::Tensor> grads;
      for (auto& p : sg.params) {
        if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
        grads.push_back(p.grad());
      }
      sg.comm->all_reduce(grads, detail::Reduce::sum).wait();
    }
  }

  const TrainOptions& opt_;
  const plan::Plan& p_;
  const ir::Graph& g_;
  const plan::Stage& st_;
  int rep_;
  Communicator& world_;
  std::unique_ptr<Communicator> group_;
  struct SharedGroup {
    std::unique_ptr<Communicator> comm;  // every rank of the stages holding these parameters
    std::vector<torch::Tensor> params;
  };
  std::vector<SharedGroup> shared_;
  const std::vector<Action>& actions_;
  std::unique_ptr<StageModule> module_;
  std::unique_ptr<torch::optim::Optimizer> optim_;
  std::map<std::pair<int, int>, std::vector<std::string>> edge_;
  int64_t step_ = 0;
  double loss_sum_ = 0;
  std::map<int, MicroBatchState> mbs_;
  std::map<int, std::map<int64_t, std::vector<torch::Tensor>>> pieces_;  // peer -> first sample -> tensors
  std::vector<Pending> sends_;
  std::map<std::pair<int, int>, Posted> posted_;  // receives posted ahead, by (peer rank, tag)
  std::vector<int> next_recv_, first_recvs_;      // link_receive_streams
  bool next_posted_ = false;                      // post_next_step ran for the coming step
  std::unique_ptr<InputPrefetcher> feed_;         // reads --data one forward ahead
  std::vector<int> forwards_;                     // micro-batches in the order of the stage's forwards
  const Dataset* data_;                           // --data (null: synthetic)
  const Dataset* eval_data_;                      // --eval-data
  bool eval_ = false;                             // inside eval_batch
  double data_s_ = 0;                             // seconds spent reading data this step
  EvalSums eval_sums_;
};

detail::CommOptions comm_options(const TrainOptions& opt) {
  detail::CommOptions co;
  co.timeout = std::chrono::milliseconds(static_cast<int64_t>(opt.timeout_s * 1000));
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME")) co.interface = ifname;
  const char* addr = std::getenv("MASTER_ADDR");
  std::string a = addr ? addr : "127.0.0.1";
  // Single-host runs bind loopback; multi-node runs the interface that routes to MASTER_ADDR ("": the
  // interface of this host's name, Gloo's default, when no route is found).
  co.hostname = (a == "127.0.0.1" || a == "localhost") ? "127.0.0.1" : local_address_towards(a);
  const char* staging = std::getenv("GP_HOST_STAGING");  // 1: stage CPU tensors too (tests the GPU path)
  co.force_host_staging = staging && std::string(staging) == "1";
  return co;
}

Json events_to_json(const std::vector<MeasuredEvent>& evs) {
  Json out = Json::array();
  for (const auto& e : evs) out.push_back({e.action, e.track, e.name, e.category, e.start_s, e.end_s});
  return out;
}

std::vector<MeasuredEvent> events_from_json(const Json& j) {
  std::vector<MeasuredEvent> out;
  for (const auto& e : j)
    out.push_back({e[0].get<int>(), e[1].get<int>(), e[2].get<std::string>(), e[3].get<std::string>(),
                   e[4].get<double>(), e[5].get<double>()});
  return out;
}

void store_set(c10d::Store& s, const std::string& key, const std::string& v) {
  s.set(key, std::vector<uint8_t>(v.begin(), v.end()));
}
std::string store_get(c10d::Store& s, const std::string& key) {
  auto v = s.get(key);
  return std::string(v.begin(), v.end());
}

// Every rank's --comm choice, made one (comm_select.h): each rank votes through the store whether it
// could use NCCL, the last to vote publishes the count, and all settle on the same backend.
CommChoice agree_on_comm(const TrainOptions& opt, const WorkerIo& io) {
  const int gpus = opt.device == "cuda" ? static_cast<int>(torch::cuda::device_count()) : 0;
  const CommChoice mine = choose_comm(opt.comm, opt.device, io.local_world, gpus, nccl_built());
  if (io.world == 1 || (opt.comm != "auto" && opt.comm != "nccl") || opt.device != "cuda")
    return settle_comm(opt.comm, mine, mine.nccl_possible ? io.world : 0, io.world);
  c10d::Store& s = *io.store;
  const char* restart = std::getenv("TORCHELASTIC_RESTART_COUNT");  // a restarted torchrun reuses its store
  const std::string key = fmt::format("graphpipe/comm/{}/", restart ? restart : "0");
  s.add(key + "nccl-votes", mine.nccl_possible ? 1 : 0);
  if (s.add(key + "voted", 1) == io.world) store_set(s, key + "result", std::to_string(s.add(key + "nccl-votes", 0)));
  s.wait({key + "result"}, std::chrono::milliseconds(static_cast<int64_t>(opt.timeout_s * 1000)));
  return settle_comm(opt.comm, mine, std::stoi(store_get(s, key + "result")), io.world);
}

// The directed pairs of ranks that exchange activations, gradients or ordering tokens (every replica
// of a stage with every replica of a successor, both ways), sorted: the order connect() needs.
std::vector<std::pair<int, int>> transfer_pairs(const plan::Plan& p) {
  std::set<std::pair<int, int>> pairs;
  for (const auto& st : p.stages)
    for (int next : st.outputs_to)
      for (int a : st.devices)
        for (int b : p.stages[next].devices) {
          pairs.insert({a, b});
          pairs.insert({b, a});
        }
  return {pairs.begin(), pairs.end()};
}

Json samples_to_json(const detail::MemoryMeter* meter) {
  Json out = Json::array();
  if (meter)
    for (const auto& m : meter->samples()) out.push_back({m.t_s, m.live_bytes, m.peak_bytes});
  return out;
}

std::vector<detail::MemorySample> samples_from_json(const Json& j) {
  std::vector<detail::MemorySample> out;
  for (const auto& m : j) out.push_back({m[0].get<double>(), m[1].get<double>(), m[2].get<double>()});
  return out;
}

/// The median step time, leaving out the first step (one-time costs) when there are others.
double median_step_time(std::vector<double> t) {
  if (t.size() > 1) t.erase(t.begin());
  if (t.empty()) return 0;
  std::sort(t.begin(), t.end());
  return t.size() % 2 ? t[t.size() / 2] : (t[t.size() / 2 - 1] + t[t.size() / 2]) / 2;
}

/// This rank's measured peak with the cost model's prediction for its stage, shared through the
/// store: rank 0 returns every rank's (by rank), the others their own.
std::vector<RankMemory> gather_memory(const PreparedRun& run, const TrainOptions& opt, const WorkerIo& io,
                                      RankRole role, const detail::MemoryMeter* meter) {
  RankMemory m;
  m.rank = io.rank;
  m.stage = role.stage;
  m.resident_peak_bytes = detail::resident_memory().peak_bytes;
  if (meter) {
    m.peak_bytes = meter->peak_bytes();
    m.peak_step = meter->peak_step();
    m.measured = meter->at_peak();
    m.in_flight = schedule::peak_in_flight(run.schedule).at(static_cast<size_t>(role.stage));
    m.predicted = predicted_stage_memory(run.plan, run.graph, role.stage, opt.optimizer, m.in_flight);
    m.predicted_bytes = m.predicted.total();
  }
  store_set(*io.store, "gp/memory/" + std::to_string(io.rank), m.to_json().dump());
  if (io.rank != 0) return {m};
  std::vector<RankMemory> all;
  for (int r = 0; r < io.world; ++r)
    all.push_back(RankMemory::from_json(Json::parse(store_get(*io.store, "gp/memory/" + std::to_string(r)))));
  return all;
}

/// Evaluates the current weights on --eval-data: every rank with a stage runs the forward-only
/// batches, the sums are added over the world (every rank gets them).
EvalSums evaluate_pipeline(Communicator& world, StageRunner* runner, const PreparedRun& run) {
  EvalSums s;
  if (runner)
    for (int64_t j = 0; j < eval_batches(run.eval_data->size(), run.plan.mini_batch_size); ++j)
      runner->eval_batch(j, s);
  std::vector<torch::Tensor> v{torch::tensor({s.loss, s.correct, s.samples, s.classified}, torch::kFloat64)};
  world.all_reduce(v, detail::Reduce::sum).wait();
  auto a = v[0].accessor<double, 1>();
  return EvalSums{a[0], a[1], a[2], a[3]};
}

}  // namespace

namespace {

/// One step's actions of this rank's stage, metered; with `trace`, each action's measured event.
void run_step_actions(const TrainOptions& opt, const WorkerIo& io, int64_t step, bool trace, StageRunner& runner,
                      detail::MemoryMeter& meter, std::vector<MeasuredEvent>& events) {
  const auto& acts = runner.actions();
  for (size_t i = 0; i < acts.size(); ++i) {
    if (io.on_action) io.on_action(step, static_cast<int>(i), acts[i]);
    double t0 = now_s();
    meter.begin_action();
    runner.run(acts[i]);
    double peak = meter.end_action(step, now_s(), trace);
    std::string over = memory_limit_failure(io.rank, runner.stage(), step, schedule::to_string(acts[i]), peak,
                                            meter.at_peak(), opt.memory_limit_gb * 1e9);
    if (!over.empty()) throw RuntimeFailure(over);
    if (trace) {
      bool is_send = acts[i].kind == ActionKind::send_act || acts[i].kind == ActionKind::send_grad;
      events.push_back({static_cast<int>(i), is_send ? schedule::kSendTrack : schedule::kComputeTrack,
                        fmt::format("s{} {}", runner.stage(), schedule::to_string(acts[i])),
                        schedule::trace_category(acts[i].kind), t0, now_s()});
    }
  }
}

/// Per-step statistics, reduced over the world asynchronously and reported one step late, so no
/// rank waits for the slowest one at a step boundary: losses and times go into the result; rank 0
/// prints each step and appends it to --log.
class StepStats {
 public:
  StepStats(const TrainOptions& opt, const PreparedRun& run, const WorkerIo& io, WorkerResult& res)
      : opt_(opt), run_(run), io_(io), res_(res) {
    if (io.rank == 0 && !opt.log_path.empty()) {
      log_.open(opt.log_path, opt.resume ? std::ios::app : std::ios::trunc);
      GP_CHECK(log_.good(), "--log: cannot open {} for writing", opt.log_path);
    }
  }
  /// Starts reducing this step's figures and reports the previous step's. One all-reduce per step (a
  /// sum and a max were two, each a few network latencies on Gloo's one collective thread): every rank
  /// fills its own row of a world x 4 table, the sum gives every rank all rows, and the loss is summed
  /// in rank order here, the times' maxima taken here.
  void submit(Communicator& world, int64_t step, double loss, double t_start, double t_end, double data_s) {
    Stats s{step, {torch::zeros({world.size(), 4}, torch::kFloat64)}, {}};
    auto row = s.table[0][world.rank()];
    row[0] = loss;
    row[1] = t_end;
    row[2] = -t_start;
    row[3] = data_s;
    s.pending = world.all_reduce(s.table, detail::Reduce::sum);
    flush();
    pending_ = std::make_unique<Stats>(std::move(s));
  }
  /// The median time from one step's end (its last rank's) to the next one's, the first step's left out:
  /// the pace of training. Below the median step time (iteration_time_s) when the ranks start their steps
  /// at different times: a stage that waits for its input starts its step (and its clock) early, and
  /// a step's time, from its first rank's start to its last rank's end, counts that wait; the simulator's
  /// iteration time is this pace. 0 with fewer than 3 steps.
  double median_period() const {
    std::vector<double> d;
    for (size_t i = 1; i < ends_.size(); ++i) d.push_back(ends_[i] - ends_[i - 1]);
    return d.empty() ? 0.0 : median_step_time(d);
  }
  /// Reports the step still in flight, if any.
  void flush() {
    if (pending_) report(*pending_);
    pending_.reset();
  }

 private:
  struct Stats {
    int64_t step;
    std::vector<torch::Tensor> table;  // rank r's row: loss, end, -start, data seconds
    Pending pending;
  };
  void report(Stats& s) {
    s.pending.wait();
    auto t = s.table[0].accessor<double, 2>();
    double loss = 0, end = t[0][1], neg_start = t[0][2], data = t[0][3];
    for (int64_t r = 0; r < t.size(0); ++r) {
      loss += t[r][0];
      end = std::max(end, t[r][1]);
      neg_start = std::max(neg_start, t[r][2]);
      data = std::max(data, t[r][3]);
    }
    double dt = end + neg_start;
    ends_.push_back(end);
    res_.step_losses.push_back(loss);
    res_.step_times_s.push_back(dt);
    res_.step_data_s.push_back(data);
    StepReport rep{s.step, loss, dt, run_.data.get(), run_.plan.mini_batch_size, res_.step_data_s.back(), nullptr};
    if (!res_.evals.empty() && res_.evals.back().first == s.step) rep.eval = &res_.evals.back().second;
    if (io_.rank != 0) return;
    if (io_.print && !opt_.json) {
      std::printf("%s\n", step_text(rep).c_str());
      if (rep.eval) std::printf("%s\n", eval_line(s.step, *rep.eval).c_str());
      std::fflush(stdout);
    }
    if (log_.is_open()) {
      log_ << step_json(rep).dump() << "\n";
      log_.flush();
      check_written(log_, "--log", opt_.log_path);
    }
  }

  const TrainOptions& opt_;
  const PreparedRun& run_;
  const WorkerIo& io_;
  WorkerResult& res_;
  std::ofstream log_;
  std::vector<double> ends_;        // each reported step's end (its last rank's clock)
  std::unique_ptr<Stats> pending_;  // not std::optional: GCC 12 warned maybe-uninitialized on its move
};

/// --trace: every rank puts its events and memory samples in the store; rank 0 writes the trace.
void write_trace(const TrainOptions& opt, const PreparedRun& run, const WorkerIo& io,
                 const std::vector<MeasuredEvent>& events, const detail::MemoryMeter* meter) {
  Json mine{{"events", events_to_json(events)}, {"memory", samples_to_json(meter)}};
  store_set(*io.store, "gp/trace/" + std::to_string(io.rank), mine.dump());
  if (io.rank != 0) return;
  std::vector<std::vector<MeasuredEvent>> all;
  std::vector<std::vector<detail::MemorySample>> memory;
  for (int r = 0; r < io.world; ++r) {
    Json j = Json::parse(store_get(*io.store, "gp/trace/" + std::to_string(r)));
    all.push_back(events_from_json(j.at("events")));
    memory.push_back(samples_from_json(j.at("memory")));
  }
  std::ofstream f(opt.trace_path);
  GP_CHECK(f.good(), "--trace: cannot open {} for writing", opt.trace_path);
  f << measured_trace_json(run.plan, all, memory);
  f.close();
  check_written(f, "--trace", opt.trace_path);
}

/// Rank 0's closing lines: the mean step time (the first step left out when there are more) against
/// the plan's prediction, compared only when the plan's costs describe this machine.
void print_iteration_time(const TrainOptions& opt, const PreparedRun& run, const std::vector<double>& step_times_s) {
  // The first step pays one-time costs (allocations, connections): leave it out when we can.
  size_t skip = step_times_s.size() > 1 ? 1 : 0;
  double sum = 0;
  for (size_t i = skip; i < step_times_s.size(); ++i) sum += step_times_s[i];
  double measured = sum / double(step_times_s.size() - skip);
  double predicted = run.plan.predicted.iteration_time_s;
  // The prediction was made with the costs the plan records; compare only when they describe
  // this machine (a profile measured on this CPU, or this machine's cpu preset), and say which.
  plan::PredictionScope scope = predicted > 0 ? plan::prediction_scope(run.plan, opt.plan_path)
                                              : plan::PredictionScope{};
  if (predicted > 0 && scope.here)
    std::printf("iteration time: measured %.4f s, predicted %.4f s by the plan (%+.1f%%); the plan was %s\n", measured,
                predicted, 100.0 * (measured - predicted) / predicted, scope.why.c_str());
  else if (predicted > 0)  // costs of other hardware: a prediction for that machine, not this one
    std::printf("iteration time: measured %.4f s here; the plan predicts %.4f s, not for this machine: it was %s\n",
                measured, predicted, scope.why.c_str());
  else std::printf("iteration time: measured %.4f s (the plan has no prediction)\n", measured);
}

}  // namespace

WorkerResult execute_worker(const TrainOptions& opt, const PreparedRun& run, const WorkerIo& io) {
  GP_CHECK(io.world == run.plan.num_devices, "launched with world size {} but the plan has {} devices", io.world,
           run.plan.num_devices);
  set_torch_threads(opt.threads);
  const torch::Device device = detail::select_device(opt.device, io.local_rank);
  detail::install_counting_allocator();  // before the stage's parameters exist
  const CommChoice comm = agree_on_comm(opt, io);
  if (io.rank == 0 && io.print && !opt.json && (opt.device != "cpu" || opt.comm != "auto"))
    std::printf("communication: %s (%s)\n", comm_name(comm.kind).c_str(), comm.why.c_str());
  auto world = detail::make_communicator(comm.kind, io.store, io.rank, io.world, comm_options(opt), device);
  RankRole role = role_of_rank(run.plan, io.rank);
  std::unique_ptr<StageRunner> runner;
  std::unique_ptr<detail::MemoryMeter> meter;
  if (role.stage >= 0) {
    runner = std::make_unique<StageRunner>(opt, run, role, *world, device);
    meter = std::make_unique<detail::MemoryMeter>(runner->module().parameters(), &runner->optimizer(), device);
  }
  world->connect(transfer_pairs(run.plan));

  // Checkpoint generations (detail/checkpoint_set.h): every rank's file, then latest.json.
  CheckpointSaver ckpt;
  if (!opt.checkpoint_dir.empty())
    ckpt = pipeline_saver(opt, run.plan, run.graph, io.rank, io.local_rank, role.stage,
                          runner ? &runner->module() : nullptr, runner ? &runner->optimizer() : nullptr, *world);
  const int64_t first = opt.resume ? resume_generation(ckpt) : 0;
  if (opt.resume && io.rank == 0 && io.print)
    std::printf("resumed from %s after %lld steps\n", opt.checkpoint_dir.c_str(), static_cast<long long>(first));

  WorkerResult res;
  StepStats stats(opt, run, io, res);
  for (int64_t step = first; step < opt.steps; ++step) {
    bool trace = !opt.trace_path.empty() && step + 1 == opt.steps;
    double t_start = now_s(), loss = 0;
    if (runner) {
      runner->begin_step(step);
      run_step_actions(opt, io, step, trace, *runner, *meter, res.events);
      loss = runner->end_step();
      const bool eval_next = run.eval_data && (step + 1) % opt.eval_every == 0;
      if (step + 1 < opt.steps && !eval_next) runner->post_next_step(step + 1);
    }
    stats.submit(*world, step, loss, t_start, now_s(), runner ? runner->data_seconds() : 0);
    bool last = step + 1 == opt.steps;
    if (!opt.checkpoint_dir.empty() && (last || (opt.checkpoint_every > 0 && (step + 1) % opt.checkpoint_every == 0)))
      save_generation(ckpt, step + 1);
    if (run.eval_data && (step + 1) % opt.eval_every == 0)
      res.evals.emplace_back(step, evaluate_pipeline(*world, runner.get(), run));
  }
  stats.flush();

  res.memory = gather_memory(run, opt, io, role, meter.get());
  if (!opt.trace_path.empty()) write_trace(opt, run, io, res.events, meter.get());
  if (io.rank == 0 && io.print && opt.json) {
    double predicted = run.plan.predicted.iteration_time_s;
    Json summary = train_summary_json(res.step_losses, median_step_time(res.step_times_s), predicted, res.memory);
    summary["step_period_s"] = stats.median_period();
    std::printf("%s\n", summary.dump(2).c_str());
    std::fflush(stdout);
  }
  if (io.rank == 0 && io.print && !opt.json) print_memory_report(res.memory);
  if (io.rank == 0 && io.print && !opt.json && !res.step_times_s.empty())
    print_iteration_time(opt, run, res.step_times_s);
  if (runner)
    for (auto& [n, t] : runner->module().named_parameters()) res.final_params.emplace_back(n, t.detach().clone());
  // Nobody leaves while a peer may still read from the store or finish a collective.
  std::vector<torch::Tensor> done{torch::zeros({1})};
  world->all_reduce(done, detail::Reduce::sum).wait();
  return res;
}

std::string measured_trace_json(const plan::Plan& p, const std::vector<std::vector<MeasuredEvent>>& per_rank,
                                const std::vector<std::vector<detail::MemorySample>>& memory) {
  double t0 = 1e300;
  for (const auto& evs : per_rank)
    for (const auto& e : evs) t0 = std::min(t0, e.start_s);
  schedule::TraceWriter w;
  for (size_t r = 0; r < per_rank.size(); ++r) {
    const int device = static_cast<int>(r);
    RankRole role = role_of_rank(p, device);
    w.add_device(device, role.stage);
    for (const auto& e : per_rank[r])
      w.add_slice(device, e.track, e.name, e.category, e.start_s - t0, e.end_s - t0,
                  {{"action", e.action}, {"stage", role.stage}});
    if (r < memory.size())  // a counter track: Perfetto draws it as a graph above the device's slices
      for (const auto& m : memory[r])
        w.add_counter(device, "tensor memory (MB)", m.t_s - t0,
                      {{"live", m.live_bytes / 1e6}, {"peak in action", m.peak_bytes / 1e6}});
  }
  return std::move(w).finish({{"source", "graphpipe train (measured)"}}).dump();
}

}  // namespace gp::runtime
