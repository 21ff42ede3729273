// The counting CPU allocator and the per-rank memory meter (memory_meter.h).
#include "runtime/exec/memory_meter.h"

#include <c10/core/CPUAllocator.h>
#if GP_HAVE_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "support/error.h"

namespace gp::runtime::detail {
namespace {

std::atomic<int64_t> g_live{0};
std::atomic<int64_t> g_peak{0};

void raise_peak(int64_t live) {
  int64_t p = g_peak.load(std::memory_order_relaxed);
  while (live > p && !g_peak.compare_exchange_weak(p, live, std::memory_order_relaxed)) {
  }
}

/// Live allocations: data pointer -> (bytes, the wrapped allocator's deleter). LibTorch's CPU
/// allocator returns "simple" pointers (context == data) and raw_allocate() relies on that, so the
/// counting allocator keeps them simple and looks the size up when the storage is freed.
struct Live {
  std::mutex mu;
  std::unordered_map<void*, std::pair<int64_t, c10::DeleterFnPtr>> by_ptr;
};
Live& live_table() {
  static Live* t = new Live;  // never destroyed: storage may be freed during static destruction
  return *t;
}

void delete_counted(void* p) {
  std::pair<int64_t, c10::DeleterFnPtr> e{0, nullptr};
  {
    Live& t = live_table();
    std::lock_guard<std::mutex> lock(t.mu);
    auto it = t.by_ptr.find(p);
    if (it != t.by_ptr.end()) {
      e = it->second;
      t.by_ptr.erase(it);
    }
  }
  g_live.fetch_sub(e.first, std::memory_order_relaxed);
  if (e.second) e.second(p);
}

class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* inner) : inner_(inner) {}
  // LibTorch 1.13 declares allocate const; 2.3 made it non-const and added copy_data: both are
  // defined (without `override`), so whichever the base has is overridden.
  c10::DataPtr allocate(size_t n) { return counted(n); }
  c10::DataPtr allocate(size_t n) const { return counted(n); }
  void copy_data(void* dest, const void* src, size_t count) const { std::memcpy(dest, src, count); }
  c10::DeleterFnPtr raw_deleter() const override { return &delete_counted; }

 private:
  c10::DataPtr counted(size_t n) const {
    c10::DataPtr p = inner_->allocate(n);
    void* data = p.get();
    if (!data || data != p.get_context() || !p.get_deleter()) return p;  // not a simple pointer: uncounted
    c10::Device dev = p.device();
    c10::DeleterFnPtr inner_deleter = p.get_deleter();
    p.release_context();
    {
      Live& t = live_table();
      std::lock_guard<std::mutex> lock(t.mu);
      t.by_ptr[data] = {static_cast<int64_t>(n), inner_deleter};
    }
    raise_peak(g_live.fetch_add(static_cast<int64_t>(n), std::memory_order_relaxed) + static_cast<int64_t>(n));
    return {data, data, &delete_counted, dev};
  }

  c10::Allocator* inner_;
};

double proc_status_kb(const std::string& key) {
  std::ifstream f("/proc/self/status");
  std::string k;
  double v = 0;
  while (f >> k) {
    if (k == key + ":") {
      f >> v;
      return v;
    }
    f.ignore(1 << 12, '\n');
  }
  return 0;
}

}  // namespace

void install_counting_allocator() {
  static std::once_flag once;
  std::call_once(once, [] {
    static CountingAllocator counting(c10::GetCPUAllocator());
    c10::SetCPUAllocator(&counting, /*priority=*/100);
  });
}

int64_t live_tensor_bytes() { return g_live.load(std::memory_order_relaxed); }
int64_t peak_tensor_bytes() { return std::max(g_peak.load(std::memory_order_relaxed), live_tensor_bytes()); }
void reset_peak_tensor_bytes() { g_peak.store(live_tensor_bytes(), std::memory_order_relaxed); }

#if GP_HAVE_CUDA
namespace {
const c10::CachingAllocator::Stat& cuda_allocated(const torch::Device& d) {
  thread_local c10::CachingDeviceAllocator::DeviceStats stats;
  stats = c10::cuda::CUDACachingAllocator::getDeviceStats(d.index());
  return stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
}
}  // namespace
#endif

int64_t live_tensor_bytes(const torch::Device& d) {
#if GP_HAVE_CUDA
  if (d.is_cuda()) return cuda_allocated(d).current;
#endif
  return live_tensor_bytes();
}
int64_t peak_tensor_bytes(const torch::Device& d) {
#if GP_HAVE_CUDA
  if (d.is_cuda()) return cuda_allocated(d).peak;
#endif
  return peak_tensor_bytes();
}
void reset_peak_tensor_bytes(const torch::Device& d) {
#if GP_HAVE_CUDA
  if (d.is_cuda()) return c10::cuda::CUDACachingAllocator::resetPeakStats(d.index());
#endif
  reset_peak_tensor_bytes();
}

Resident resident_memory() { return {proc_status_kb("VmRSS") * 1024, proc_status_kb("VmHWM") * 1024}; }

MemoryBreakdown MemoryMeter::state_now() const {
  MemoryBreakdown b;
  for (const auto& p : params_) {
    b.parameters += static_cast<double>(p.nbytes());
    if (p.grad().defined()) b.gradients += static_cast<double>(p.grad().nbytes());
  }
  if (optim_)
    for (const auto& [key, st] : optim_->state()) {
      if (const auto* a = dynamic_cast<const torch::optim::AdamParamState*>(st.get())) {
        for (const torch::Tensor* t : {&a->exp_avg(), &a->exp_avg_sq(), &a->max_exp_avg_sq()})
          if (t->defined()) b.optimizer_state += static_cast<double>(t->nbytes());
      } else if (const auto* s = dynamic_cast<const torch::optim::SGDParamState*>(st.get())) {
        if (s->momentum_buffer().defined()) b.optimizer_state += static_cast<double>(s->momentum_buffer().nbytes());
      }
    }
  return b;
}

void MemoryMeter::begin_action() {
  reset_peak_tensor_bytes(device_);
  start_live_ = static_cast<double>(live_tensor_bytes(device_));
  start_state_ = state_now();
}

double MemoryMeter::end_action(int64_t step, double t_s, bool sample) {
  double peak = static_cast<double>(peak_tensor_bytes(device_)), live = static_cast<double>(live_tensor_bytes(device_));
  if (sample) samples_.push_back({t_s, live, peak});
  if (peak > peak_) {
    // The model state of the two boundaries, whichever is larger (gradients appear during the first
    // backward, optimizer state during the first step); the rest held at the start is activations.
    MemoryBreakdown end = state_now(), b;
    b.parameters = std::max(start_state_.parameters, end.parameters);
    b.gradients = std::max(start_state_.gradients, end.gradients);
    b.optimizer_state = std::max(start_state_.optimizer_state, end.optimizer_state);
    double state = b.parameters + b.gradients + b.optimizer_state;
    b.activations = std::max(
        0.0, start_live_ - start_state_.parameters - start_state_.gradients - start_state_.optimizer_state);
    b.transient = std::max(0.0, peak - state - b.activations);
    peak_ = peak;
    peak_step_ = step;
    at_peak_ = b;
  }
  return peak;
}

}  // namespace gp::runtime::detail
