// Per-op timing with LibTorch (forward, then backward with a random output gradient).
#include "runtime/op_timing.h"

#include <dlfcn.h>
#include <malloc.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <torch/version.h>

#include "runtime/detail/device.h"
#include "runtime/detail/executor.h"
#include "support/error.h"

namespace gp::runtime {

namespace {
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
double thread_cpu_s() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}
}  // namespace

OpTiming time_op(const ir::Graph& g, OpId op, int64_t batch, int warmup, int repeats, bool cpu_clock,
                 const std::string& device) {
  return time_op(g, op, std::vector<int64_t>{batch}, warmup, repeats, cpu_clock, device).front();
}

std::vector<OpTiming> time_op(const ir::Graph& g, OpId op, const std::vector<int64_t>& batches, int warmup,
                              int repeats, bool cpu_clock, const std::string& device) {
  const torch::Device dev = detail::select_device(device, 0);
  GP_CHECK(!cpu_clock || dev.is_cpu(), "--clock cpu: times the calling CPU thread; with --device {} use --clock wall",
           device);
  double (*host_clock)() = cpu_clock ? thread_cpu_s : now_s;
  auto clock = [&] {  // the device's queued work done, then the host's clock
    detail::synchronize(dev);
    return host_clock();
  };
  GP_CHECK(repeats >= 1 && warmup >= 0, "profile: need repeats >= 1 and warmup >= 0 (found {}, {})", repeats,
           warmup);
  constexpr uint64_t kSeed = 1;
  StageModule m(g, {op}, kSeed, {}, dev);
  const std::string& out_name = g.op(op).name;
  std::vector<OpTiming> result;
  for (int64_t batch : batches) {
    GP_CHECK(batch >= 1, "profile: batch size must be >= 1, found {}", batch);
    MicroBatchInfo info{0, batch, batch, 0};
    TensorMap ext = synthetic_external_inputs(m, info);
    for (const std::string& name : m.external_inputs()) {
      if (ext.count(name)) continue;  // a graph input
      std::vector<int64_t> shape(g.op(g.find(name)).output_shape);
      if (!shape.empty()) shape[0] = batch;
      ext.emplace(name, torch::randn(shape, torch::TensorOptions().device(dev)).requires_grad_(true));
    }
    std::vector<double> fwd, bwd;
    for (int i = 0; i < warmup + repeats; ++i) {
      // Fresh gradients each call, as for the first micro-batch of a step.
      for (auto& p : m.parameters()) p.mutable_grad() = torch::Tensor();
      for (auto& [name, t] : ext)
        if (t.requires_grad()) t.mutable_grad() = torch::Tensor();
      double t0 = clock();
      torch::Tensor y = m.forward(ext, info).at(out_name);
      double t1 = clock();
      torch::Tensor grad = y.dim() == 0 ? torch::ones_like(y) : torch::randn_like(y);
      double t2 = clock();
      if (y.requires_grad()) y.backward(grad);
      double t3 = clock();
      if (i >= warmup) {
        fwd.push_back(t1 - t0);
        bwd.push_back(t3 - t2);
      }
    }
    result.push_back({median(fwd), median(bwd)});
  }
  return result;
}

void set_torch_threads(int threads) {
  GP_CHECK(threads >= 1, "--threads must be >= 1, found {}", threads);
  keep_freed_heap();
  torch::set_num_threads(threads);
  // LibTorch's intra-op setting does not reach the BLAS it was linked with: Debian's LibTorch calls
  // OpenBLAS, whose own pool starts one thread per core and spins (sched_yield) between GEMMs. A
  // "1 thread" worker then kept a second core busy, the profile's thread-CPU clock missed the helper's
  // share of every GEMM, and two workers on two cores ran four busy threads (measured 2.8x slower than
  // predicted). Bound the BLAS pool to the same count when the library offers the call.
  using SetBlasThreads = void (*)(int);
  if (auto f = reinterpret_cast<SetBlasThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) f(threads);
}

void keep_freed_heap() {
  // LibTorch's CPU allocator is glibc malloc: an activation buffer over the mmap threshold (128 KiB
  // at first) is mapped fresh and unmapped when freed, and the heap's top is trimmed back to the OS,
  // so every training step faulted its activations in again (clear_page in perf; 6.7 ms of system
  // time per step of a small mmt on one core, 10% of the step). A profile's op, timed again and again
  // on the same shapes, never paid this. Keep freed memory in the process: buffers up to 32 MiB (the
  // most glibc allows) come from the heap, and the heap is not trimmed.
  static const bool done = [] {
    ::mallopt(M_MMAP_THRESHOLD, 32 << 20);
    ::mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
    return true;
  }();
  (void)done;
}

int torch_threads() { return torch::get_num_threads(); }

std::string torch_version() { return TORCH_VERSION; }

std::string accelerator_description(const std::string& device) {
  const torch::Device dev = detail::select_device(device, 0);
  if (dev.is_cpu()) return "";
  return fmt::format("cuda: {} (device {}, LibTorch {})", detail::cuda_device_name(dev.index()), dev.index(),
                     TORCH_VERSION);
}

}  // namespace gp::runtime
