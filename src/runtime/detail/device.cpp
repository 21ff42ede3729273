// --device: choosing and synchronizing the compute device without CUDA headers (torch/cuda.h for
// the queries, c10's virtual device guard to make a GPU current), so a CPU LibTorch builds it too.
#include "runtime/detail/device.h"

#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/cuda.h>
#include <torch/version.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "runtime/train.h"
#include "support/error.h"

namespace gp::runtime {

// Queries only: no CUDA context is made here (the local launcher checks before spawning workers).
void check_device_available(const std::string& kind) {
  GP_CHECK(kind == "cpu" || kind == "cuda", "--device: expected cpu or cuda, found \"{}\"", kind);
  if (kind == "cpu") return;
  GP_CHECK(torch::cuda::is_available() && torch::cuda::device_count() > 0,
           "--device cuda: CUDA is not available in this build or on this machine (LibTorch {} sees {} CUDA "
           "devices); build against a CUDA LibTorch (docs/runtime.md, \"GPUs\") or use --device cpu",
           TORCH_VERSION, torch::cuda::device_count());
}

namespace detail {

torch::Device select_device(const std::string& kind, int local_rank) {
  check_device_available(kind);
  if (kind == "cpu") return torch::kCPU;
  GP_CHECK(local_rank >= 0, "--device cuda: local rank {} is negative", local_rank);
  auto count = static_cast<int>(torch::cuda::device_count());
  torch::Device d(torch::kCUDA, static_cast<c10::DeviceIndex>(local_rank % count));
  c10::impl::VirtualGuardImpl(c10::DeviceType::CUDA).setDevice(d);
  return d;
}

void synchronize(const torch::Device& d) {
  if (d.is_cuda()) torch::cuda::synchronize(d.index());
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
