// Communicator over c10d::ProcessGroupGloo: p2p via send/recv (Gloo unbound buffers),
// collectives via allreduce, sub-groups as separate process groups over a PrefixStore.
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO
#endif
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <unistd.h>

#include <condition_variable>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <future>
#include <mutex>
#include <random>
#include <thread>

#include "runtime/comm/comm.h"
#include "runtime/comm/shm_reduce.h"

namespace gp::runtime::detail {
namespace {

torch::Tensor header(const torch::Tensor& payload) {
  auto h = torch::empty({2}, torch::kInt64);
  h.data_ptr<int64_t>()[0] = static_cast<int64_t>(payload.nbytes());
  h.data_ptr<int64_t>()[1] = static_cast<int64_t>(payload.scalar_type());
  return h;
}

// Host staging: Gloo reads and writes host memory, so a tensor elsewhere (a GPU) travels as a CPU
// copy; `force` stages CPU tensors too (a separate copy), so the same path runs without a GPU.
bool staged(const torch::Tensor& t, bool force) { return force || !t.is_cpu(); }

torch::Tensor to_host(const torch::Tensor& t, bool force) {
  if (!staged(t, force)) return t;
  host_staged_bytes() += static_cast<int64_t>(t.nbytes());
  return t.to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true);
}

void from_host(torch::Tensor& dst, const torch::Tensor& host) {
  if (dst.is_same(host)) return;
  host_staged_bytes() += static_cast<int64_t>(host.nbytes());
  dst.copy_(host);
}

// Runs jobs one at a time, in the order they were given, on a thread of its own: the all-reduces of a
// communicator whose ranks reduce through shared memory, which progresses only while a thread of
// every rank works on it. On this thread a rank's part goes on while its caller computes or waits on
// something else, as Gloo's own threads do, so posting a collective never blocks the caller.
class InOrderThread {
 public:
  InOrderThread() : thread_([this] { loop(); }) {}
  ~InOrderThread() {
    {
      std::lock_guard<std::mutex> lock(m_);
      stop_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }
  InOrderThread(const InOrderThread&) = delete;
  InOrderThread& operator=(const InOrderThread&) = delete;
  std::future<void> submit(std::function<void()> job) {
    std::packaged_task<void()> task(std::move(job));
    auto done = task.get_future();
    {
      std::lock_guard<std::mutex> lock(m_);
      jobs_.push_back(std::move(task));
    }
    cv_.notify_one();
    return done;
  }

 private:
  void loop() {
    for (;;) {
      std::packaged_task<void()> job;
      {
        std::unique_lock<std::mutex> lock(m_);
        cv_.wait(lock, [this] { return stop_ || !jobs_.empty(); });
        if (jobs_.empty()) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();
    }
  }
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<std::packaged_task<void()>> jobs_;
  bool stop_ = false;
  std::thread thread_;
};

bool shm_dtype(torch::ScalarType t, ShmDtype* out) {
  switch (t) {
    case torch::kFloat: *out = ShmDtype::f32; return true;
    case torch::kDouble: *out = ShmDtype::f64; return true;
    case torch::kInt: *out = ShmDtype::i32; return true;
    case torch::kLong: *out = ShmDtype::i64; return true;
    default: return false;
  }
}

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(c10::intrusive_ptr<c10d::Store> store, int rank, int size, CommOptions o)
      : store_(std::move(store)), rank_(rank), size_(size), o_(std::move(o)) {
    pg_ = make_gloo_backend(store_, rank, size, o_);
    if (o_.shm_all_reduce && size_ > 1) reducer_ = std::make_unique<InOrderThread>();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  CommKind kind() const override { return CommKind::gloo; }

  // Every p2p message is preceded by a 2 x int64 header (payload bytes, dtype) with the same tag,
  // so a receiver can check the size before it posts the payload buffer: Gloo aborts the whole
  // process when a message is longer than the posted buffer, and leaves the rest of the buffer
  // silently unwritten when it is shorter.
  Pending send(const torch::Tensor& t, int dst, int tag) override {
    GP_ASSERT(dst >= 0 && dst < size_ && dst != rank_, "bad send peer {}", dst);
    torch::Tensor payload = faulted_payload(to_host(t.contiguous(), o_.force_host_staging));
    std::vector<torch::Tensor> head{header(payload)}, v{payload};
    c10::intrusive_ptr<c10d::Work> work_head, work;
    std::string op = fmt::format("send to rank {} (tag {})", dst, tag);
    guarded(op, dst, [&] {
      work_head = pg_->send(head, dst, tag);
      work = pg_->send(v, dst, tag);
    });
    return pending_send(work_head, work, {head[0], v[0]}, op, dst, o_.timeout);
  }

  void recv(torch::Tensor& t, int src, int tag) override {
    GP_ASSERT(src >= 0 && src < size_ && src != rank_, "bad recv peer {}", src);
    GP_ASSERT(t.is_contiguous(), "recv buffer must be contiguous");
    std::string op = fmt::format("recv from rank {} (tag {})", src, tag);
    std::vector<torch::Tensor> head{torch::empty({2}, torch::kInt64)};
    guarded(op, src, [&] { pg_->recv(head, src, tag)->wait(o_.timeout); });
    check_announced(op, src, head[0].data_ptr<int64_t>()[0], head[0].data_ptr<int64_t>()[1], t);
    std::vector<torch::Tensor> v{
        staged(t, o_.force_host_staging) ? torch::empty_like(t, t.options().device(torch::kCPU)) : t};
    guarded(op, src, [&] { pg_->recv(v, src, tag)->wait(o_.timeout); });
    from_host(t, v[0]);
  }

  // The header's and the payload's receives posted at once (the sender sends them as always, one after
  // the other on the same tag, and Gloo matches a tag's messages in order): both announcements reach
  // the sender together, so a send made after them goes out at once and the transfer costs one one-way
  // latency, where recv() costs three (header, then the payload's announcement, then the payload).
  PostedRecv post_recv(c10::IntArrayRef shape, torch::TensorOptions options, int src, int tag) override {
    GP_ASSERT(src >= 0 && src < size_ && src != rank_, "bad recv peer {}", src);
    std::string op = fmt::format("recv from rank {} (tag {})", src, tag);
    const auto dtype = options.dtype().toScalarType();
    const int64_t want = c10::multiply_integers(shape) * static_cast<int64_t>(c10::elementSize(dtype));
    std::vector<int64_t> dims(shape.begin(), shape.end());
    std::vector<torch::Tensor> head{torch::empty({2}, torch::kInt64)},
        body{torch::empty({want + kPostedRecvSlackBytes}, torch::kUInt8)};
    c10::intrusive_ptr<c10d::Work> work_head, work;
    guarded(op, src, [&] {
      work_head = pg_->recv(head, src, tag);
      work = pg_->recv(body, src, tag);
    });
    return PostedRecv([this, op, src, want, dtype, dims, options, head, body, work_head, work]() -> torch::Tensor {
      guarded(op, src, [&] { work_head->wait(o_.timeout); });
      torch::Tensor t = body[0].narrow(0, 0, want).view(dtype).view(dims);
      try {
        check_announced(op, src, head[0].data_ptr<int64_t>()[0], head[0].data_ptr<int64_t>()[1], t);
      } catch (const CommError&) {
        refused_.push_back(work);  // its buffer stays alive: the payload may still land in it
        throw;
      }
      guarded(op, src, [&] { work->wait(o_.timeout); });
      if (o_.force_host_staging || options.device().type() != torch::kCPU) {  // host staging
        torch::Tensor out = torch::empty(dims, options);
        from_host(out, t);
        return out;
      }
      return kPostedRecvSlackBytes * 32 <= want ? t : t.clone();
    });
  }

  Pending all_reduce(std::vector<torch::Tensor>& ts, Reduce op) override {
    if (size_ == 1) return {};
    c10d::AllreduceOptions ao;
    ao.reduceOp = op == Reduce::sum ? c10d::ReduceOp::SUM : c10d::ReduceOp::MAX;
    ao.timeout = o_.timeout;
    // Gloo reduces a list of equal-sized tensors as one per device: flatten into one buffer.
    torch::Tensor joined = join_for_reduce(ts);
    std::vector<torch::Tensor> flat{to_host(joined, o_.force_host_staging)};
    std::string what = fmt::format("all-reduce over {} ranks", size_);
    if (reducer_) {
      auto done = std::make_shared<std::future<void>>(reducer_->submit([this, flat, op, ao, what] {
        if (!shm_decided_) join_shared_memory();
        ShmDtype dt{};
        if (shm_ && shm_dtype(flat[0].scalar_type(), &dt)) {
          try {
            shm_->all_reduce(flat[0].data_ptr(), flat[0].numel(), dt, op == Reduce::sum ? ShmOp::sum : ShmOp::max,
                             o_.timeout);
            shm_reduced_bytes() += static_cast<int64_t>(flat[0].nbytes());
          } catch (const ShmError& e) {
            throw CommError(e.what(), -1, e.timed_out());
          }
          return;
        }
        std::vector<torch::Tensor> v = flat;
        guarded(what, -1, [&] { pg_->allreduce(v, ao)->wait(o_.timeout); });
      }));
      return Pending([done, flat, joined, ts]() mutable {
        done->get();
        from_host(joined, flat[0]);
        scatter_reduced(joined, ts);
      });
    }
    c10::intrusive_ptr<c10d::Work> work;
    guarded(what, -1, [&] { work = pg_->allreduce(flat, ao); });
    auto timeout = o_.timeout;
    return Pending([work, what, timeout, flat, joined, ts]() mutable {
      guarded(what, -1, [&] { work->wait(timeout); });
      from_host(joined, flat[0]);
      scatter_reduced(joined, ts);
    });
  }

  std::unique_ptr<Communicator> subgroup(const std::vector<int>& ranks, const std::string& name) override {
    auto it = std::find(ranks.begin(), ranks.end(), rank_);
    GP_ASSERT(it != ranks.end(), "rank {} not in sub-group {}", rank_, name);
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>("group/" + name, store_);
    return std::make_unique<GlooCommunicator>(prefixed, int(it - ranks.begin()), int(ranks.size()), o_);
  }

 private:
  // Collective, on reducer_'s thread at the first all-reduce: rank 0 makes a segment and broadcasts its
  // name; every rank maps it; all use it only if every rank could (another host cannot), else Gloo.
  void join_shared_memory() {
    shm_decided_ = true;
    std::string why;
    torch::Tensor msg = torch::zeros({256}, torch::kUInt8);
    if (rank_ == 0) {
      std::random_device rd;
      const uint64_t nonce = (uint64_t{rd()} << 32) ^ rd() ^ static_cast<uint64_t>(::getpid());
      shm_ = ShmReducer::create(size_, nonce, ShmReducer::kDefaultSlotBytes, &why);
      if (!shm_) std::fprintf(stderr, "[comm] all-reduce over %d ranks through Gloo: %s\n", size_, why.c_str());
      std::memcpy(msg.data_ptr(), &nonce, sizeof nonce);
      if (shm_)
        std::memcpy(msg.data_ptr<uint8_t>() + 8, shm_->name().c_str(), std::min<size_t>(shm_->name().size(), 200));
    }
    std::vector<torch::Tensor> b{msg};
    const std::string what = fmt::format("shared-memory set-up over {} ranks", size_);
    guarded(what, -1, [&] { pg_->broadcast(b, c10d::BroadcastOptions{})->wait(o_.timeout); });
    if (rank_ != 0) {
      uint64_t nonce = 0;
      std::memcpy(&nonce, msg.data_ptr(), sizeof nonce);
      const std::string name(reinterpret_cast<const char*>(msg.data_ptr<uint8_t>() + 8));
      if (!name.empty()) shm_ = ShmReducer::open(name, rank_, size_, nonce, &why);
    }
    std::vector<torch::Tensor> ok{torch::full({1}, shm_ ? 1 : 0, torch::kInt32)};
    c10d::AllreduceOptions min;
    min.reduceOp = c10d::ReduceOp::MIN;
    guarded(what, -1, [&] { pg_->allreduce(ok, min)->wait(o_.timeout); });
    if (rank_ == 0 && shm_) shm_->unlink();  // every rank mapped it or gave up: the name is not needed
    if (ok[0].item<int32_t>() == 0) shm_.reset();
  }

  c10::intrusive_ptr<c10d::Store> store_;
  int rank_, size_;
  CommOptions o_;
  std::unique_ptr<ShmReducer> shm_;  // set up by join_shared_memory; null: Gloo reduces
  bool shm_decided_ = false;
  // Posted payload receives whose header was refused, kept (with their buffers) until the backend is
  // gone: declared before pg_ so that they outlive it.
  std::vector<c10::intrusive_ptr<c10d::Work>> refused_;
  c10::intrusive_ptr<c10d::Backend> pg_;
  std::unique_ptr<InOrderThread> reducer_;  // last: its thread, whose jobs use pg_ and shm_, stops first
};

}  // namespace

bool looks_like_timeout(const std::string& what) {
  return what.find("imed out") != std::string::npos || what.find("imeout") != std::string::npos;
}

std::string dtype_name(int64_t code) {
  if (code < 0 || code >= static_cast<int64_t>(c10::ScalarType::NumOptions)) return fmt::format("dtype code {}", code);
  return c10::toString(static_cast<c10::ScalarType>(code));
}

torch::Tensor faulted_payload(torch::Tensor payload) {
  if (!wrong_size_next_send().exchange(false)) return payload;
  torch::Tensor flat = payload.reshape({-1});
  return torch::cat({flat, flat.narrow(0, 0, 1)});
}

void check_announced(const std::string& op, int src, int64_t bytes, int64_t dtype, const torch::Tensor& t) {
  const int64_t want = static_cast<int64_t>(t.nbytes());
  if (bytes != want || dtype != static_cast<int64_t>(t.scalar_type()))
    throw CommError(fmt::format("{}: the peer sent {} bytes of {}, expected {} bytes of {} (shape [{}]); "
                                "the ranks disagree on the plan or the peer is faulty",
                                op, bytes, dtype_name(dtype), want, dtype_name(static_cast<int64_t>(t.scalar_type())),
                                fmt::join(t.sizes(), ", ")),
                    src, false, /*rejected=*/true);
}

Pending pending_send(c10::intrusive_ptr<c10d::Work> head, c10::intrusive_ptr<c10d::Work> payload,
                     std::vector<torch::Tensor> keep, std::string op, int dst, std::chrono::milliseconds timeout) {
  return Pending([head, payload, keep = std::move(keep), op = std::move(op), dst, timeout] {
    guarded(op, dst, [&] {
      head->wait(timeout);
      payload->wait(timeout);
    });
  });
}

torch::Tensor join_for_reduce(const std::vector<torch::Tensor>& ts) {
  if (ts.size() == 1 && ts[0].is_contiguous()) return ts[0].view({-1});
  std::vector<torch::Tensor> flat;
  for (const auto& t : ts) flat.push_back(t.reshape({-1}));
  return torch::cat(flat);
}

void scatter_reduced(const torch::Tensor& joined, std::vector<torch::Tensor>& ts) {
  int64_t off = 0;
  for (auto& t : ts) {
    const int64_t n = t.numel();
    if (!t.is_contiguous() || ts.size() > 1) t.copy_(joined.narrow(0, off, n).view_as(t));
    off += n;
  }
}

void limit_flight_recorder() {
  static std::once_flag once;
  std::call_once(once, [] { ::setenv("TORCH_FR_BUFFER_SIZE", "0", /*overwrite=*/0); });
}

c10::intrusive_ptr<c10d::Backend> make_gloo_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                    const CommOptions& o) {
  limit_flight_recorder();
  auto opts = c10d::ProcessGroupGloo::Options::create(o.timeout);
  if (!o.interface.empty()) {
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(o.interface));
  } else if (!o.hostname.empty()) {
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(o.hostname));
  } else {
    opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  }
  opts->threads = 1;
  c10::intrusive_ptr<c10d::Backend> pg;
  guarded(fmt::format("rendezvous of rank {} of {}", rank, size), -1,
          [&] { pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, opts); });
  return pg;
}

std::atomic<int64_t>& host_staged_bytes() {
  static std::atomic<int64_t> bytes{0};
  return bytes;
}

std::atomic<int64_t>& shm_reduced_bytes() {
  static std::atomic<int64_t> bytes{0};
  return bytes;
}

std::atomic<bool>& wrong_size_next_send() {
  static std::atomic<bool> flag{false};
  return flag;
}

std::unique_ptr<Communicator> make_gloo_communicator(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                     const CommOptions& o) {
  return std::make_unique<GlooCommunicator>(store, rank, size, o);
}

}  // namespace gp::runtime::detail
