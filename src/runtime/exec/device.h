// The device a process computes on (--device cpu|cuda). Internal (LibTorch types); compiles against
// a CPU-only LibTorch: no CUDA headers, only torch::cuda's queries and c10's device-generic guard.
#pragma once
#include <torch/types.h>

#include <memory>
#include <string>
#include <unordered_map>

namespace gp::runtime::detail {

/// `kind` "cpu": the CPU. "cuda": GPU `local_rank % device_count` (all local ranks share one GPU when
/// there is only one), made the current CUDA device of this process. UserError (exit 2) for any
/// other kind, and for cuda where CUDA is not available in this LibTorch build or on this machine.
torch::Device select_device(const std::string& kind, int local_rank);

/// Makes GPU `d` the calling thread's current CUDA device (a no-op on the CPU): a thread starts on
/// GPU 0, where a pinned allocation or a stream would otherwise make a second context on a rank's
/// behalf.
void make_current(const torch::Device& d);

/// Waits until the work queued on `d` is done (a no-op on the CPU): for host timing of CUDA work.
void synchronize(const torch::Device& d);

/// CPU time in seconds: the calling thread's, or the whole process's (every thread) when `process`.
double cpu_time_s(bool process = false);

/// Times spans of the work queued on a device. On a GPU (a CUDA build): CUDA events recorded on the
/// current stream, so a span is the stream's own time between the two points, without the host's
/// synchronization around it. Elsewhere: the host clock (`cpu_clock`: the calling thread's CPU time,
/// else wall time) read after the device's queued work is done.
class SpanTimer {
 public:
  SpanTimer(const torch::Device& device, bool cpu_clock);
  ~SpanTimer();
  void start();
  /// Seconds since start() (waits for the span's work on a GPU).
  double stop();
  /// "cuda events", "thread cpu time" or "wall time".
  std::string method() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Host tensors on their way to `device`. On a GPU (a CUDA build): copied from page-locked host memory
/// (pinned here unless they are already) on a side stream of the device, so that the copy engine moves
/// the next micro-batch's inputs while the compute stream runs the current one (a copy from pageable
/// memory on the compute stream held a 32-sample step of mmt:layers=2 on an H200 up by a third);
/// take() orders the calling thread's current stream after the copy and returns the device tensors.
/// Elsewhere the tensors are moved as they are. Made on one thread, taken on another.
class DeviceUpload {
 public:
  using Tensors = std::unordered_map<std::string, torch::Tensor>;
  DeviceUpload(Tensors host, const torch::Device& device);
  ~DeviceUpload();
  DeviceUpload(DeviceUpload&&) noexcept;
  DeviceUpload& operator=(DeviceUpload&&) noexcept;
  /// Once: the tensors on the device, ready for work queued on the current stream.
  Tensors take();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// The name of GPU `index` from the NVIDIA driver (/proc/driver/nvidia/gpus/*/information), or
/// "CUDA device <index>" when the driver does not say.
std::string cuda_device_name(int index);

}  // namespace gp::runtime::detail
