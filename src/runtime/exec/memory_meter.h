// Internal (LibTorch) memory accounting of a training process: a counting CPU allocator (live and
// peak bytes of tensor storage), resident memory from /proc, and a per-step meter that splits a
// rank's peak into parameters, gradients, optimizer state, held activations and transient buffers.
// Include only from runtime .cpp files.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/exec/memory_report.h"

namespace gp::runtime::detail {

using runtime::MemoryBreakdown;

/// Wraps LibTorch's CPU allocator (c10::SetCPUAllocator) with one that counts the bytes of every
/// live allocation. Idempotent; storage allocated before the call is not counted (its frees are
/// not subtracted either).
void install_counting_allocator();
/// Bytes of tensor storage allocated through the counting allocator and not yet freed.
int64_t live_tensor_bytes();
/// The most live_tensor_bytes() reached since the last reset_peak_tensor_bytes().
int64_t peak_tensor_bytes();
/// Starts a new peak window at the current live bytes.
void reset_peak_tensor_bytes();

/// The same three for the tensors on `device`: the counting allocator's on the CPU, LibTorch's CUDA
/// caching allocator's statistics on a GPU (bytes handed to tensors, not the cache it keeps).
int64_t live_tensor_bytes(const torch::Device& device);
int64_t peak_tensor_bytes(const torch::Device& device);
void reset_peak_tensor_bytes(const torch::Device& device);

/// This process's resident set size now and its high-water mark (/proc/self/status VmRSS, VmHWM);
/// 0 where /proc is missing.
struct Resident {
  double current_bytes = 0, peak_bytes = 0;
};
Resident resident_memory();

/// One point of the memory counter track: live tensor bytes at the end of an action and the most
/// reached during it.
struct MemorySample {
  double t_s = 0, live_bytes = 0, peak_bytes = 0;
};

/// Per-rank measurement over a run: call begin_action() before and end_action() after each action
/// (or each phase of --single). Parameters, gradients and optimizer state are read from the model's
/// tensors at each action boundary.
class MemoryMeter {
 public:
  /// Counts the tensors on `device` (where the parameters live).
  MemoryMeter(std::vector<torch::Tensor> params, const torch::optim::Optimizer* optim,
              torch::Device device = torch::kCPU)
      : params_(std::move(params)), optim_(optim), device_(device) {}

  void begin_action();
  /// Returns the peak bytes reached during the action.
  double end_action(int64_t step, double t_s, bool sample);

  double peak_bytes() const { return peak_; }
  int64_t peak_step() const { return peak_step_; }
  const MemoryBreakdown& at_peak() const { return at_peak_; }
  /// The counter track (actions run with sample = true).
  const std::vector<MemorySample>& samples() const { return samples_; }

 private:
  MemoryBreakdown state_now() const;
  std::vector<torch::Tensor> params_;
  const torch::optim::Optimizer* optim_;
  torch::Device device_;
  double start_live_ = 0;
  MemoryBreakdown start_state_;
  double peak_ = 0;
  int64_t peak_step_ = -1;
  MemoryBreakdown at_peak_;
  std::vector<MemorySample> samples_;
};

}  // namespace gp::runtime::detail
