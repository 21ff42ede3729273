// The pairwise communicator (comm.h): one 2-rank c10d backend per directed pair of ranks, messages
// matched by order and checked by a (bytes, dtype, tag) header. NCCL's way of moving tensors; over
// Gloo (gloo-pairs) the same code runs on CPUs, which is how CI tests it.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <map>

#include "runtime/comm/comm.h"

namespace gp::runtime::detail {
namespace {

// The tag of the one message connect() sends on each channel to open it.
constexpr int kConnectTag = -1;

class PairwiseCommunicator final : public Communicator {
 public:
  PairwiseCommunicator(c10::intrusive_ptr<c10d::Store> store, int rank, int size, CommOptions o, BackendFactory factory,
                       torch::Device device, CommKind kind)
      : store_(std::move(store)),
        rank_(rank),
        size_(size),
        o_(std::move(o)),
        factory_(std::move(factory)),
        device_(device),
        kind_(kind) {
    if (size_ > 1)
      guarded(fmt::format("{} group of rank {} of {}", comm_name(kind_), rank_, size_), -1,
              [&] { all_ = factory_(c10::make_intrusive<c10d::PrefixStore>("all", store_), rank_, size_); });
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  CommKind kind() const override { return kind_; }

  void connect(const std::vector<std::pair<int, int>>& directed_pairs) override {
    for (auto [from, to] : directed_pairs) {
      GP_ASSERT(from != to && from >= 0 && to >= 0 && from < size_ && to < size_, "bad pair {} -> {}", from, to);
      if (from == rank_) {
        send(torch::zeros({1}), to, kConnectTag).wait();
      } else if (to == rank_) {
        auto t = torch::empty({1});
        recv(t, from, kConnectTag);
      }
    }
  }

  Pending send(const torch::Tensor& t, int dst, int tag) override {
    GP_ASSERT(dst >= 0 && dst < size_ && dst != rank_, "bad send peer {}", dst);
    const std::string op = fmt::format("send to rank {} (tag {}, {})", dst, tag, comm_name(kind_));
    torch::Tensor payload = faulted_payload(on_device(t.contiguous()));
    std::vector<torch::Tensor> head{header(payload, tag)}, v{payload};
    auto& ch = channel(rank_, dst);
    c10::intrusive_ptr<c10d::Work> work_head, work;
    guarded(op, dst, [&] {
      work_head = ch->send(head, /*dstRank=*/1, /*tag=*/0);
      work = ch->send(v, 1, 0);
    });
    return pending_send(work_head, work, {head[0], v[0]}, op, dst, o_.timeout);
  }

  void recv(torch::Tensor& t, int src, int tag) override {
    GP_ASSERT(src >= 0 && src < size_ && src != rank_, "bad recv peer {}", src);
    GP_ASSERT(t.is_contiguous(), "recv buffer must be contiguous");
    const std::string op = fmt::format("recv from rank {} (tag {}, {})", src, tag, comm_name(kind_));
    auto& ch = channel(src, rank_);
    std::vector<torch::Tensor> head{torch::empty({3}, torch::TensorOptions(torch::kInt64).device(device_))};
    guarded(op, src, [&] { ch->recv(head, /*srcRank=*/0, /*tag=*/0)->wait(o_.timeout); });
    torch::Tensor h = head[0].cpu();
    const int64_t sent_tag = h.data_ptr<int64_t>()[2];
    if (sent_tag != tag)
      throw CommError(fmt::format("{}: the next message from rank {} carries tag {}: messages between two ranks "
                                  "arrive in the order they were sent, and the ranks disagree on that order",
                                  op, src, sent_tag),
                      src, false, /*rejected=*/true);
    check_announced(op, src, h.data_ptr<int64_t>()[0], h.data_ptr<int64_t>()[1], t);
    std::vector<torch::Tensor> v{t.device() == device_ ? t : torch::empty_like(t, t.options().device(device_))};
    guarded(op, src, [&] { ch->recv(v, 0, 0)->wait(o_.timeout); });
    if (!v[0].is_same(t)) t.copy_(v[0]);
  }

  Pending all_reduce(std::vector<torch::Tensor>& ts, Reduce op) override {
    if (size_ == 1) return {};
    c10d::AllreduceOptions ao;
    ao.reduceOp = op == Reduce::sum ? c10d::ReduceOp::SUM : c10d::ReduceOp::MAX;
    ao.timeout = o_.timeout;
    torch::Tensor joined = join_for_reduce(ts);
    std::vector<torch::Tensor> flat{on_device(joined)};
    c10::intrusive_ptr<c10d::Work> work;
    std::string what = fmt::format("all-reduce over {} ranks ({})", size_, comm_name(kind_));
    guarded(what, -1, [&] { work = all_->allreduce(flat, ao); });
    auto timeout = o_.timeout;
    return Pending([work, what, timeout, flat, joined, ts]() mutable {
      guarded(what, -1, [&] { work->wait(timeout); });
      if (!flat[0].is_same(joined)) joined.copy_(flat[0]);
      scatter_reduced(joined, ts);
    });
  }

  std::unique_ptr<Communicator> subgroup(const std::vector<int>& ranks, const std::string& name) override {
    auto it = std::find(ranks.begin(), ranks.end(), rank_);
    GP_ASSERT(it != ranks.end(), "rank {} not in sub-group {}", rank_, name);
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>("group/" + name, store_);
    return std::make_unique<PairwiseCommunicator>(prefixed, int(it - ranks.begin()), int(ranks.size()), o_, factory_,
                                                  device_, kind_);
  }

 private:
  static torch::Tensor header(const torch::Tensor& payload, int tag) {
    auto h = torch::empty({3}, torch::kInt64);
    h.data_ptr<int64_t>()[0] = static_cast<int64_t>(payload.nbytes());
    h.data_ptr<int64_t>()[1] = static_cast<int64_t>(payload.scalar_type());
    h.data_ptr<int64_t>()[2] = tag;
    return h.to(payload.device());
  }
  torch::Tensor on_device(const torch::Tensor& t) const { return t.device() == device_ ? t : t.to(device_); }

  // The channel of from -> to: made on first use (both ranks must reach it: connect() orders that).
  c10::intrusive_ptr<c10d::Backend>& channel(int from, int to) {
    auto& ch = channels_[{from, to}];
    if (!ch) {
      auto prefixed = c10::make_intrusive<c10d::PrefixStore>(fmt::format("pair/{}->{}", from, to), store_);
      guarded(fmt::format("opening the channel rank {} -> rank {} ({})", from, to, comm_name(kind_)),
              rank_ == from ? to : from, [&] { ch = factory_(prefixed, rank_ == from ? 0 : 1, 2); });
    }
    return ch;
  }

  c10::intrusive_ptr<c10d::Store> store_;
  int rank_, size_;
  CommOptions o_;
  BackendFactory factory_;
  torch::Device device_;
  CommKind kind_;
  c10::intrusive_ptr<c10d::Backend> all_;
  std::map<std::pair<int, int>, c10::intrusive_ptr<c10d::Backend>> channels_;
};

}  // namespace

std::unique_ptr<Communicator> make_pairwise_communicator(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                         int size, const CommOptions& o, BackendFactory factory,
                                                         torch::Device device, CommKind kind) {
  return std::make_unique<PairwiseCommunicator>(store, rank, size, o, std::move(factory), device, kind);
}

#if GP_HAVE_NCCL
c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                    const CommOptions& o);  // comm_nccl.cpp
#endif

std::unique_ptr<Communicator> make_communicator(CommKind kind, const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                int size, const CommOptions& o, torch::Device device) {
  switch (kind) {
    case CommKind::gloo: return make_gloo_communicator(store, rank, size, o);
    case CommKind::gloo_pairs:
      // Gloo moves host memory: the channels carry CPU tensors (host staging, as GPU tensors need).
      return make_pairwise_communicator(
          store, rank, size, o, [o](const auto& s, int r, int n) { return make_gloo_backend(s, r, n, o); }, torch::kCPU,
          kind);
    case CommKind::nccl:
#if GP_HAVE_NCCL
      GP_CHECK(device.is_cuda(), "--comm nccl needs --device cuda");
      return make_pairwise_communicator(
          store, rank, size, o, [o](const auto& s, int r, int n) { return make_nccl_backend(s, r, n, o); }, device,
          kind);
#else
      throw UserError("--comm nccl: this graphpipe was built without NCCL (its LibTorch has no CUDA)");
#endif
  }
  GP_ASSERT(false, "unknown communicator kind");
  return nullptr;
}

}  // namespace gp::runtime::detail
