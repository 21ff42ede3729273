// Per-op timing with LibTorch (forward, then backward with a random output gradient).
#include "runtime/exec/op_timing.h"

#include <dlfcn.h>
#include <malloc.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <limits>
#include <torch/version.h>

#include "runtime/exec/device.h"
#include "runtime/exec/divergence.h"
#include "runtime/exec/stage_module.h"
#include "runtime/exec/synthetic.h"
#include "runtime/exec/optim.h"
#include "support/error.h"
#include "support/stats.h"

namespace gp::runtime {

OpTiming time_op(const ir::Graph& g, OpId op, int64_t batch, int warmup, int repeats, bool cpu_clock,
                 const std::string& device) {
  return time_op(g, op, std::vector<int64_t>{batch}, warmup, repeats, cpu_clock, device).front();
}

namespace {

torch::Device timing_device(const std::string& device, bool cpu_clock, int warmup, int repeats) {
  const torch::Device dev = detail::select_device(device, 0);
  GP_CHECK(!cpu_clock || dev.is_cpu(), "--clock cpu: times the calling CPU thread; with --device {} use --clock wall",
           device);
  GP_CHECK(repeats >= 1 && warmup >= 0, "profile: need repeats >= 1 and warmup >= 0 (found {}, {})", repeats, warmup);
  return dev;
}

/// Median forward and backward time of `m` at each batch: `forward` runs the module and returns the
/// tensor to backpropagate (with a random gradient of its shape, or ones for a scalar).
template <class Forward>
std::vector<OpTiming> time_passes(StageModule& m, const std::vector<int64_t>& batches, int warmup, int repeats,
                                  detail::SpanTimer& timer, Forward forward) {
  std::vector<OpTiming> result;
  for (int64_t batch : batches) {
    GP_CHECK(batch >= 1, "profile: batch size must be >= 1, found {}", batch);
    MicroBatchInfo info{0, batch, batch, 0};
    TensorMap ext = synthetic_external_inputs(m, info);
    for (const std::string& name : m.external_inputs()) {
      if (ext.count(name)) continue;  // a graph input
      std::vector<int64_t> shape(m.graph().op(m.graph().find(name)).output_shape);
      if (!shape.empty()) shape[0] = batch;
      ext.emplace(name, torch::randn(shape, torch::TensorOptions().device(m.device())).requires_grad_(true));
    }
    std::vector<double> fwd, bwd;
    for (int i = 0; i < warmup + repeats; ++i) {
      // Fresh gradients each call, as for the first micro-batch of a step.
      for (auto& p : m.parameters()) p.mutable_grad() = torch::Tensor();
      for (auto& [name, t] : ext)
        if (t.requires_grad()) t.mutable_grad() = torch::Tensor();
      timer.start();
      torch::Tensor y = forward(ext, info);
      const double f = timer.stop();
      torch::Tensor grad = y.dim() == 0 ? torch::ones_like(y) : torch::randn_like(y);
      timer.start();
      if (y.requires_grad()) y.backward(grad);
      const double b = timer.stop();
      if (i >= warmup) {
        fwd.push_back(f);
        bwd.push_back(b);
      }
    }
    result.push_back({median(fwd), median(bwd)});
  }
  return result;
}

}  // namespace

std::vector<OpTiming> time_op(const ir::Graph& g, OpId op, const std::vector<int64_t>& batches, int warmup, int repeats,
                              bool cpu_clock, const std::string& device) {
  const torch::Device dev = timing_device(device, cpu_clock, warmup, repeats);
  constexpr uint64_t kSeed = 1;
  StageModule m(g, {op}, kSeed, {}, dev);
  const std::string& out_name = g.op(op).name;
  detail::SpanTimer timer(dev, cpu_clock);
  return time_passes(m, batches, warmup, repeats, timer, [&](const TensorMap& ext, const MicroBatchInfo& info) {
    return m.forward(ext, info).at(out_name);
  });
}

std::vector<OpTiming> time_model(const ir::Graph& g, const std::vector<int64_t>& batches, int warmup, int repeats,
                                 bool cpu_clock, const std::string& device) {
  const torch::Device dev = timing_device(device, cpu_clock, warmup, repeats);
  constexpr uint64_t kSeed = 1;
  StageModule m(g, g.op_ids(), kSeed, {}, dev);
  GP_CHECK(!m.loss_ops().empty(), "profile: the model has no loss op to backpropagate from");
  detail::SpanTimer timer(dev, cpu_clock);
  return time_passes(m, batches, warmup, repeats, timer, [&](const TensorMap& ext, const MicroBatchInfo& info) {
    TensorMap outs = m.forward(ext, info);
    return m.scaled_loss(outs, info, ext);  // every other output released, as in a step
  });
}

std::vector<OptimizerTiming> time_optimizers(const ir::Graph& g, const std::vector<std::string>& names, int warmup,
                                             int repeats, bool cpu_clock, const std::string& device) {
  const torch::Device dev = timing_device(device, cpu_clock, warmup, repeats);
  constexpr uint64_t kSeed = 1;
  StageModule m(g, g.op_ids(), kSeed, {}, dev);  // built once: the parameters of a large model take time
  std::vector<torch::Tensor> params = m.parameters();
  int64_t count = 0;
  for (const auto& p : params) {
    count += p.numel();
    p.mutable_grad() = torch::randn_like(p) * 1e-3;
  }
  detail::SpanTimer timer(dev, cpu_clock);
  // In a step the forward and backward run between two optimizer steps and leave other data in the
  // caches: each timed step starts after 64 MiB (beyond this machine's 32 MiB L3) were written.
  torch::Tensor evict = dev.is_cpu() ? torch::empty({16 << 20}, torch::kFloat32) : torch::Tensor();
  std::vector<OptimizerTiming> out;
  for (const std::string& name : names) {
    auto opt = make_optimizer(name, params, 1e-3, 0.9);
    std::vector<double> t;
    for (int i = 0; i < warmup + repeats; ++i) {
      if (evict.defined()) evict.fill_(static_cast<float>(i));
      timer.start();
      check_gradients_finite(m, {});  // as StageRunner::optimizer_step runs it (one sum per tensor)
      opt->step();
      const double s = timer.stop();
      if (i >= warmup) t.push_back(s);
    }
    out.push_back({count, median(t)});
  }
  return out;
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
