// Internal (LibTorch): one rank's stage of the pipeline runtime. It owns the stage's module,
// optimizer and communicators and runs the stage's schedule one action at a time, with one handler
// per schedule::ActionKind. Activations and gradients travel as sample ranges between stage replicas
// (regrouping between per-stage micro-batch sizes), gradients accumulate over micro-batches and are
// summed over replicas. Used by execute_worker (pipeline.cpp); include only from runtime .cpp files.
#pragma once
#include <torch/torch.h>

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "runtime/comm/comm.h"
#include "runtime/data/data_feed.h"
#include "runtime/exec/stage_module.h"
#include "runtime/pipeline/pipeline.h"
#include "runtime/exec/split_backward.h"
#include "schedule/schedule.h"

namespace gp::runtime {

/// Seconds since the system clock's epoch: the common clock of measured events and step times.
double now_s();

/// One rank's stage: module, optimizer, communicators and the per-step transfer state.
class StageRunner {
 public:
  /// `spare_core`: this host has more cores than workers (synthetic inputs are then made ahead).
  StageRunner(const TrainOptions& opt, const PreparedRun& run, RankRole role, detail::Communicator& world,
              torch::Device device, bool spare_core);

  StageModule& module() { return *module_; }
  torch::optim::Optimizer& optimizer() { return *optim_; }
  const std::vector<schedule::Action>& actions() const { return actions_; }
  int stage() const { return st_.id; }
  double data_seconds() const { return data_s_; }

  void begin_step(int64_t step);
  /// Posts step `next`'s first receives now, before the waits between steps (the step statistics, a
  /// checkpoint), so that a peer that starts that step first finds them announced (docs/runtime.md "What
  /// a transfer costs"). Not before an eval batch: its messages reuse the step parity of the tags.
  void post_next_step(int64_t next);
  /// Waits for this step's sends; returns the sum of scaled losses this rank computed.
  double end_step();
  /// Forward-only evaluation of eval mini-batch `j` (--eval-data): this stage's forwards and
  /// activation transfers of the schedule, in order; adds the loss stage's sums to `sums`.
  void eval_batch(int64_t j, EvalSums& sums);
  /// Runs one action of the stage's schedule: the handler of its kind.
  void run(const schedule::Action& a);

 private:
  struct Range {
    int64_t begin = 0, count = 0;
    int64_t end() const { return begin + count; }
  };
  struct MicroBatchState {
    TensorMap leaves;     // received activations (requires_grad leaves when floating)
    TensorMap outputs;    // this stage's outputs that other stages read
    TensorMap out_grads;  // gradients of `outputs` summed over successors
    TensorMap in_grads;   // gradients w.r.t. `leaves`, after backward
    torch::Tensor loss;   // scaled loss (loss stage only)
    // Activation sends in flight by peer rank, and the peers a gradient (or ordering token) came back
    // from: that peer has received the activations, so backward can release them (memory.md).
    std::map<int, std::vector<detail::Pending>> act_sends;
    std::set<int> grads_from;
    detail::SplitBackward split;  // zero-bubble: what backward_weight needs, from backward_input to it
  };
  /// One piece of a send/recv action: the samples `part` of the action's range that this replica
  /// (holding `mine` of the micro-batch) exchanges with replica rank `peer_rank` of stage `peer_stage`.
  struct Piece {
    const std::vector<std::string>& names;  // the edge's tensors (empty: an ordering-only edge)
    Range mine, part;
    int peer_rank, peer_stage, mb;
  };
  // --- Receives posted ahead (docs/runtime.md "What a transfer costs") ---
  // Gloo sends a message only once the receiver has announced its receive, so a receive posted when the
  // tensor is needed waits a round trip more than one posted before the peer sends. Each stream of
  // receive actions (kind and peer stage) keeps its next action's receives posted: the first ones when
  // the step begins, the next when one is taken. `posted` holds them by (peer rank, tag), which a step
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
  struct ReceivesAhead {
    std::map<std::pair<int, int>, Posted> posted;  // by (peer rank, tag)
    std::vector<int> next, first;                  // link_receive_streams
    bool next_step_posted = false;                 // post_next_step ran for the coming step
  };
  /// Where the stage's graph inputs come from.
  struct Inputs {
    std::unique_ptr<InputPrefetcher> feed;  // reads --data one forward ahead
    std::vector<int> forwards;              // micro-batches in the order of the stage's forwards
    const Dataset* data = nullptr;          // --data (null: synthetic)
    const Dataset* eval_data = nullptr;     // --eval-data
  };
  struct SharedGroup {
    std::unique_ptr<detail::Communicator> comm;  // every rank of the stages holding these parameters
    std::vector<torch::Tensor> params;
  };

  // One handler per action kind.
  void forward(int mb);
  std::shared_ptr<const std::map<std::string, int64_t>> counted_labels();
  void backward(int mb);
  void backward_input(int mb);
  void backward_weight(int mb);
  void send_act(const schedule::Action& a);
  void recv_act(const schedule::Action& a);
  void send_grad(const schedule::Action& a);
  void recv_grad(const schedule::Action& a);
  void allreduce();
  void optimizer_step();

  // Micro-batches and sample ranges.
  static Range intersect(Range a, Range b);
  static Range replica_share(const plan::Stage& st, int rep, int64_t s);
  static torch::Tensor rows(const torch::Tensor& t, int64_t base, Range r);
  Range my_share(int64_t sample) const;
  MicroBatchInfo info(int mb, int64_t step) const;
  MicroBatchInfo info(int mb) const { return info(mb, step_); }
  std::optional<MicroBatchInfo> next_forward(int mb) const;
  void take_received(int mb, Range mine, MicroBatchState& ms, TensorMap& ext);

  // Backward pieces shared by B and BI.
  void gradient_roots(int mb, MicroBatchState& ms, std::vector<torch::Tensor>& ts, std::vector<torch::Tensor>& gs);
  void finish_backward(MicroBatchState& ms);

  // Transfers: the pieces of an action, tensors of an edge, packed messages, ordering tokens.
  std::vector<Piece> action_pieces(const schedule::Action& a, bool downstream) const;
  const std::vector<std::string>& edge(int from, int to) const;
  int piece_tag(bool grad, const Piece& pc, size_t tensor) const;
  std::vector<int64_t> rows_shape(const std::string& name, int64_t n) const;
  torch::Tensor empty_rows(const std::string& name, int64_t n) const;
  torch::ScalarType dtype_of(const std::string& name) const;
  bool packed(const std::vector<std::string>& names, bool grad) const;
  std::vector<std::string> floating(const std::vector<std::string>& names) const;
  detail::Pending send_packed(const std::vector<torch::Tensor>& ts, int peer_rank, int tag);
  std::vector<torch::Tensor> recv_packed(const std::vector<std::string>& names, const Piece& pc, bool grad);
  void send_token(const Piece& pc, bool grad);
  void recv_token(const Piece& pc, bool grad);
  void add_gradient(MicroBatchState& ms, const std::string& name, const Piece& pc, const torch::Tensor& g);

  // Receives posted ahead.
  std::vector<RecvSpec> recv_specs(const schedule::Action& a) const;
  void post_ahead(const schedule::Action& a);
  void post_after(const schedule::Action& a);
  torch::Tensor receive(const std::vector<int64_t>& shape, torch::ScalarType dtype, int peer_rank, int tag);
  void link_receive_streams();

  // Gradients of parameters shared with other stages.
  void make_shared_groups(const std::vector<int>& stage_of);
  bool summed_with_holders(const torch::Tensor& p) const;
  void sum_shared_gradients();
  // The replicas' all-reduced gradients in one buffer.
  void make_gradient_buffer();
  void zero_gradients();

  const TrainOptions& opt_;
  const plan::Plan& p_;
  const ir::Graph& g_;
  const plan::Stage& st_;
  int rep_;
  detail::Communicator& world_;
  std::unique_ptr<detail::Communicator> group_;
  std::vector<SharedGroup> shared_;
  // With replicas: the gradients all_reduced between them, each parameter's grad a view of it (none
  // where the parameters differ in dtype); the other parameters' grads are set to none each step.
  torch::Tensor grad_buffer_;
  const std::vector<schedule::Action>& actions_;
  std::unique_ptr<StageModule> module_;
  std::unique_ptr<torch::optim::Optimizer> optim_;
  std::map<std::pair<int, int>, std::vector<std::string>> edge_;
  int64_t step_ = 0;
  double loss_sum_ = 0;
  std::map<int, MicroBatchState> mbs_;
  std::map<int, std::map<int64_t, std::vector<torch::Tensor>>> pieces_;  // peer -> first sample -> tensors
  std::vector<detail::Pending> sends_;
  ReceivesAhead ahead_;
  Inputs in_;
  std::shared_ptr<const std::map<std::string, int64_t>> counted_;  // counted_labels() of step counted_step_
  int64_t counted_step_ = -1;
  bool eval_ = false;  // inside eval_batch
  double data_s_ = 0;  // seconds spent reading data this step
  EvalSums eval_sums_;
};

}  // namespace gp::runtime
