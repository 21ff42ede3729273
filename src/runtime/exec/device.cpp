// --device: choosing and synchronizing the compute device without CUDA headers (torch/cuda.h for
// the queries, c10's virtual device guard to make a GPU current), so a CPU LibTorch builds it too.
#include "runtime/exec/device.h"

#include <c10/core/impl/VirtualGuardImpl.h>
#include <time.h>
#include <torch/cuda.h>
#include <torch/version.h>
#if GP_HAVE_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>

#include "runtime/exec/build_info.h"
#include "support/error.h"

namespace gp::runtime {

// Queries only: no CUDA context is made here (the local launcher checks before spawning workers).
void check_device_available(const std::string& kind) {
  GP_CHECK(kind == "cpu" || kind == "cuda", "--device: expected cpu or cuda, found \"{}\"", kind);
  if (kind == "cpu") return;
#if GP_HAVE_CUDA
  GP_CHECK(torch::cuda::is_available() && torch::cuda::device_count() > 0,
           "--device cuda: CUDA is not available in this build or on this machine: this graphpipe has CUDA "
           "compiled in (LibTorch {}) but sees no GPU (no NVIDIA GPU or driver here, or CUDA_VISIBLE_DEVICES "
           "hides them; `graphpipe --version` lists the GPUs it sees); use --device cpu",
           TORCH_VERSION);
#else
  GP_CHECK(false,
           "--device cuda: CUDA is not available in this build or on this machine: this graphpipe was built "
           "against a LibTorch without CUDA (LibTorch {}); build against a CUDA LibTorch (docs/runtime.md, "
           "\"Which LibTorch\") or use --device cpu",
           TORCH_VERSION);
#endif
}

namespace detail {

torch::Device select_device(const std::string& kind, int local_rank) {
  check_device_available(kind);
  if (kind == "cpu") return torch::kCPU;
  GP_CHECK(local_rank >= 0, "--device cuda: local rank {} is negative", local_rank);
  auto count = static_cast<int>(torch::cuda::device_count());
  torch::Device d(torch::kCUDA, static_cast<c10::DeviceIndex>(local_rank % count));
  make_current(d);
  return d;
}

void make_current(const torch::Device& d) {
  if (d.is_cuda()) c10::impl::VirtualGuardImpl(c10::DeviceType::CUDA).setDevice(d);
}

void synchronize(const torch::Device& d) {
  if (d.is_cuda()) torch::cuda::synchronize(d.index());
}

double cpu_time_s(bool process) {
  timespec ts{};
  ::clock_gettime(process ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct SpanTimer::Impl {
  torch::Device device;
  bool cpu_clock;
  double t0 = 0;
#if GP_HAVE_CUDA
  at::cuda::CUDAEvent begin{cudaEventDefault}, end{cudaEventDefault};  // timing enabled
#endif
  double host_now() const {
    if (!cpu_clock) return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
    return cpu_time_s();
  }
};

SpanTimer::SpanTimer(const torch::Device& device, bool cpu_clock) : impl_(new Impl{device, cpu_clock}) {}
SpanTimer::~SpanTimer() = default;

void SpanTimer::start() {
#if GP_HAVE_CUDA
  if (impl_->device.is_cuda()) return impl_->begin.record();
#endif
  synchronize(impl_->device);
  impl_->t0 = impl_->host_now();
}

double SpanTimer::stop() {
#if GP_HAVE_CUDA
  if (impl_->device.is_cuda()) {
    impl_->end.record();
    impl_->end.synchronize();
    return impl_->begin.elapsed_time(impl_->end) / 1e3;  // milliseconds
  }
#endif
  synchronize(impl_->device);
  return impl_->host_now() - impl_->t0;
}

std::string SpanTimer::method() const {
#if GP_HAVE_CUDA
  if (impl_->device.is_cuda()) return "cuda events";
#endif
  return impl_->cpu_clock ? "thread cpu time" : "wall time";
}

struct DeviceUpload::Impl {
  Tensors tensors;
  torch::Device device;
#if GP_HAVE_CUDA
  std::optional<at::cuda::CUDAEvent> copied;  // recorded on the side stream after the copies
#endif
};

DeviceUpload::DeviceUpload(Tensors host, const torch::Device& device) : impl_(new Impl{{}, device}) {
#if GP_HAVE_CUDA
  if (device.is_cuda()) {
    c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index());
    c10::cuda::CUDAStreamGuard guard(side);
    for (auto& [name, t] : host)
      impl_->tensors.emplace(name, (t.is_pinned() ? t : t.pin_memory()).to(device, /*non_blocking=*/true));
    impl_->copied.emplace();
    impl_->copied->record(side);
    return;
  }
#endif
  for (auto& [name, t] : host) impl_->tensors.emplace(name, t.to(device));
}

DeviceUpload::~DeviceUpload() = default;
DeviceUpload::DeviceUpload(DeviceUpload&&) noexcept = default;
DeviceUpload& DeviceUpload::operator=(DeviceUpload&&) noexcept = default;

DeviceUpload::Tensors DeviceUpload::take() {
#if GP_HAVE_CUDA
  if (impl_->copied) {
    c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(impl_->device.index());
    impl_->copied->block(current);
    // Allocated on the side stream: their blocks must not be reused before the compute stream is done.
    for (auto& [name, t] : impl_->tensors) t.record_stream(current);
    impl_->copied.reset();
  }
#endif
  return std::move(impl_->tensors);
}

std::string cuda_device_name(int index) {
  namespace fs = std::filesystem;
  std::set<std::string> models;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc/driver/nvidia/gpus", ec)) {
    std::ifstream in(e.path() / "information");
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("Model:", 0) != 0) continue;
      auto start = line.find_first_not_of(" \t", 6);
      if (start != std::string::npos) models.insert(line.substr(start));
    }
  }
  // The driver lists GPUs by PCI address, CUDA may number them otherwise: only a single model is sure.
  if (models.size() == 1) return *models.begin();
  return fmt::format("CUDA device {}", index);
}

}  // namespace detail
}  // namespace gp::runtime
