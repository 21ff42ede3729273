// The communicator the pipeline workers use: point-to-point transfers along stage edges and
// all-reduce inside data-parallel stage groups. Internal (LibTorch types); c10d Gloo or NCCL behind it
// (comm/comm_select.h chooses).
#pragma once
#include <torch/types.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/comm/comm_select.h"
#include "support/error.h"

namespace c10d {
class Store;
class Backend;
class Work;
}  // namespace c10d

namespace gp::runtime::detail {

/// A communication failure: a peer timed out, its connection closed, or it sent a message this
/// rank rejected (wrong size or dtype). `peer` names the rank the operation waited on (-1 for
/// collectives, where the culprit is unknown).
class CommError : public RuntimeFailure {
 public:
  CommError(const std::string& msg, int peer, bool timed_out, bool rejected = false)
      : RuntimeFailure(msg), peer_(peer), timed_out_(timed_out), rejected_(rejected) {}
  int peer() const { return peer_; }
  bool timed_out() const { return timed_out_; }
  bool rejected() const { return rejected_; }

 private:
  int peer_;
  bool timed_out_, rejected_;
};

/// A non-blocking operation in flight; wait() blocks (bounded by the communicator timeout)
/// and rethrows a failure as CommError with context.
class Pending {
 public:
  Pending() = default;
  explicit Pending(std::function<void()> wait) : wait_(std::move(wait)) {}
  void wait() {
    if (wait_) std::exchange(wait_, nullptr)();
  }

 private:
  std::function<void()> wait_;
};

/// A receive posted ahead of its use (Communicator::post_recv): wait() blocks (bounded by the
/// communicator timeout) and returns the received tensor; a failure is a CommError.
class PostedRecv {
 public:
  PostedRecv() = default;
  explicit PostedRecv(std::function<torch::Tensor()> wait) : wait_(std::move(wait)) {}
  torch::Tensor wait() {
    GP_ASSERT(wait_ != nullptr, "PostedRecv waited twice or never posted");
    return std::exchange(wait_, nullptr)();
  }

 private:
  std::function<torch::Tensor()> wait_;
};

/// Bytes past the expected size that a receive posted ahead (post_recv) accepts and then refuses by the
/// message's size header: a message longer than expected + this makes Gloo abort the process (its
/// receive buffers cannot grow), so a message that is too long by more is not a clean error. The
/// received tensor is a view of that buffer when the spare bytes are under 1/32 of it, else a copy.
constexpr int64_t kPostedRecvSlackBytes = 4096;

enum class Reduce { sum, max };

/// Ranks 0..size()-1 of one group. Tags distinguish messages between the same pair of ranks.
/// Every wait is bounded by the timeout given at creation.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// Starts sending `t` (contiguous; kept alive by the Pending) to `dst`.
  virtual Pending send(const torch::Tensor& t, int dst, int tag) = 0;
  /// Receives into `t` (preallocated with the expected shape and dtype) from `src`.
  virtual void recv(torch::Tensor& t, int src, int tag) = 0;
  /// Posts now the receive of a tensor of `shape` and `options` (dtype, device) from `src`, so that the
  /// peer's send goes out the moment it is made: Gloo sends a message only to a receive the peer has
  /// announced, so a receive posted when the receiver needs the tensor costs a round trip more than one
  /// posted before the sender sends (docs/runtime.md "What a transfer costs"). The header and the
  /// payload are both posted at once, the payload with kPostedRecvSlackBytes to spare, and checked at
  /// wait(): a size or dtype mismatch is a CommError (rejected) naming the peer. The default waits for
  /// the whole receive in wait() (backends that match by order post nothing early).
  virtual PostedRecv post_recv(c10::IntArrayRef shape, torch::TensorOptions options, int src, int tag) {
    torch::Tensor t = torch::empty(shape, options);
    return PostedRecv([this, t, src, tag]() mutable {
      recv(t, src, tag);
      return t;
    });
  }
  /// Reduces in place over all ranks of this communicator; returns when done.
  virtual Pending all_reduce(std::vector<torch::Tensor>& ts, Reduce op) = 0;
  /// A communicator over `ranks` (this group's ranks, sorted; must include rank()). Collective
  /// over the members only: every member calls it with the same ranks and name.
  virtual std::unique_ptr<Communicator> subgroup(const std::vector<int>& ranks, const std::string& name) = 0;
  /// Opens the channels of the directed pairs (from, to) that will exchange messages, in the given
  /// order, which every rank must share (each rank opens the pairs it is in). A backend that matches
  /// messages by order (NCCL) connects lazily and blocks while a pair connects: opening every pair
  /// up front, in one global order, cannot deadlock. A no-op for Gloo (tags, all-to-all at start).
  virtual void connect(const std::vector<std::pair<int, int>>& directed_pairs) {}
  /// "gloo", "nccl" or "gloo-pairs" (comm_name).
  virtual CommKind kind() const = 0;
};

struct CommOptions {
  std::chrono::milliseconds timeout{60000};
  std::string hostname = "127.0.0.1";  // address Gloo binds to; "" = interface/hostname default
  std::string interface;               // GLOO_SOCKET_IFNAME, takes precedence when set
  /// Gloo moves host memory: tensors on a GPU always go through a CPU copy (host staging). With this
  /// set CPU tensors do too (GP_HOST_STAGING=1), so CPU-only CI runs the GPU path's copies.
  bool force_host_staging = false;
  /// All-reduce through shared memory where every rank of a group maps the same segment (one host;
  /// comm/shm_reduce.h), Gloo elsewhere; false: always Gloo (`train --local-all-reduce gloo`).
  bool shm_all_reduce = true;
};

/// Bytes this process copied through host staging (to the CPU before a send or all-reduce, back after
/// a receive or all-reduce), for tests.
std::atomic<int64_t>& host_staged_bytes();

/// Bytes this process all-reduced through shared memory (comm/shm_reduce.h), for tests.
std::atomic<int64_t>& shm_reduced_bytes();

/// Fault injection (GP_FAULT kind=size): when set, the next send of this process carries one
/// element too many; the receiver must reject it by its size header. Reset by that send.
std::atomic<bool>& wrong_size_next_send();

/// A Gloo communicator (c10d::ProcessGroupGloo) over `store`; blocks until all `size` ranks join.
/// Tensors may live on any device: Gloo sees host copies of those not on the CPU (CommOptions).
std::unique_ptr<Communicator> make_gloo_communicator(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                     const CommOptions& o);

/// Turns c10d's flight recorder off unless the user set TORCH_FR_BUFFER_SIZE: from PyTorch 2.x every
/// process group records each collective and transfer, with a Python/C++ traceback, into one
/// process-wide buffer (2000 entries). That costs a traceback per message, and the recorder inserts
/// into a shared map before taking its lock (torch 2.11, FlightRecorderDetail.hpp), which crashed
/// ranks run as threads of one process (the equivalence tests) in std::_Rb_tree_insert_and_rebalance.
/// TORCH_FR_BUFFER_SIZE=2000 turns it back on (NCCL hang dumps). Called before any group is made.
void limit_flight_recorder();

/// A c10d::ProcessGroupGloo of `size` ranks over `store` (CommOptions: timeout, address), joined.
c10::intrusive_ptr<c10d::Backend> make_gloo_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                    const CommOptions& o);

/// Makes the backend of `size` ranks over `store` a pairwise communicator builds its groups from.
using BackendFactory =
    std::function<c10::intrusive_ptr<c10d::Backend>(const c10::intrusive_ptr<c10d::Store>&, int rank, int size)>;

/// The communicator for backends that match point-to-point messages by order, not by tag (NCCL):
/// one 2-rank backend (channel) per directed pair of ranks, so each channel carries messages in one
/// direction, in the order they were sent. Every message is framed by a header (bytes, dtype, tag)
/// that the receiver checks: a message out of order is refused (CommError, rejected), never read
/// into the wrong tensor. Tensors are moved to `device` for the backend (NCCL: the rank's GPU; a
/// CPU device for Gloo). `kind` is what kind() reports.
std::unique_ptr<Communicator> make_pairwise_communicator(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                         int size, const CommOptions& o, BackendFactory factory,
                                                         torch::Device device, CommKind kind);

/// The communicator of `kind` (comm_select.h): Gloo, NCCL (a pairwise communicator over
/// c10d::ProcessGroupNCCL on `device`, the rank's GPU), or NCCL's pairwise logic over Gloo.
/// UserError for nccl when this build has no NCCL.
std::unique_ptr<Communicator> make_communicator(CommKind kind, const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                int size, const CommOptions& o, torch::Device device);

// Shared by the communicators (defined in comm_gloo.cpp).
bool looks_like_timeout(const std::string& what);
std::string dtype_name(int64_t code);
/// The payload as sent: one element too many when GP_FAULT kind=size asked for it (wrong_size_next_send).
torch::Tensor faulted_payload(torch::Tensor payload);
/// Refuses (CommError, rejected) a message whose header announced `bytes` of `dtype` that do not fit `t`.
void check_announced(const std::string& op, int src, int64_t bytes, int64_t dtype, const torch::Tensor& t);
/// A header and a payload in flight to `dst`: waiting waits on both (bounded by `timeout`); `keep`
/// holds the sent tensors until then.
Pending pending_send(c10::intrusive_ptr<c10d::Work> head, c10::intrusive_ptr<c10d::Work> payload,
                     std::vector<torch::Tensor> keep, std::string op, int dst, std::chrono::milliseconds timeout);
/// An all-reduce's tensors as one flat buffer (a view of `ts[0]` when it is the only one, contiguous),
/// and the reduced buffer's values back into them.
torch::Tensor join_for_reduce(const std::vector<torch::Tensor>& ts);
void scatter_reduced(const torch::Tensor& joined, std::vector<torch::Tensor>& ts);
template <class F>
void guarded(const std::string& op, int peer, F&& f) {
  try {
    f();
  } catch (const CommError&) {
    throw;
  } catch (const std::exception& e) {
    std::string what = e.what();
    auto nl = what.find('\n');  // c10 messages carry a backtrace after the first line
    if (nl != std::string::npos) what.resize(nl);
    throw CommError(op + ": " + what, peer, looks_like_timeout(what));
  }
}

}  // namespace gp::runtime::detail
