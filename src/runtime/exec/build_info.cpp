#include "runtime/exec/build_info.h"

#include <fmt/format.h>
#include <torch/cuda.h>
#include <torch/version.h>
#if GP_HAVE_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/detail/CUDAHooksInterface.h>
#endif

#include "runtime/exec/device.h"

namespace gp::runtime {
#if GP_HAVE_NCCL
namespace detail {
std::string nccl_version();  // comm_nccl.cpp
}
#endif

BuildInfo build_info() {
  BuildInfo b;
  b.torch_version = TORCH_VERSION;
#if GP_HAVE_CUDA
  b.cuda_built = true;
  const long rt = at::detail::getCUDAHooks().versionCUDART();  // e.g. 13000
  b.cuda_version = fmt::format("{}.{}", rt / 1000, (rt % 1000) / 10);
#endif
#if GP_HAVE_NCCL
  b.nccl_built = true;
  b.nccl_version = detail::nccl_version();
#endif
  b.gpus = static_cast<int>(torch::cuda::device_count());
  for (int i = 0; i < b.gpus; ++i) {
#if GP_HAVE_CUDA
    b.gpu_names.push_back(at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(i))->name);
#else
    b.gpu_names.push_back(detail::cuda_device_name(i));
#endif
  }
  return b;
}

std::string describe(const BuildInfo& b) {
  std::string s = fmt::format("LibTorch {}\n", b.torch_version);
  s += b.cuda_built ? fmt::format("CUDA: compiled in (CUDA {})\n", b.cuda_version)
                    : "CUDA: not compiled in (a CPU LibTorch): --device cuda is unavailable\n";
  s += b.nccl_built ? fmt::format("NCCL: compiled in (NCCL {})\n", b.nccl_version)
                    : "NCCL: not compiled in: stages exchange tensors through Gloo\n";
  if (b.gpus == 0) {
    s += b.cuda_built ? "GPUs: none visible (no NVIDIA GPU or driver here, or CUDA_VISIBLE_DEVICES hides them)\n"
                      : "GPUs: not looked for (no CUDA in this build)\n";
  } else {
    s += fmt::format("GPUs: {} visible\n", b.gpus);
    for (int i = 0; i < b.gpus; ++i) s += fmt::format("  cuda:{}  {}\n", i, b.gpu_names[i]);
  }
  return s;
}

}  // namespace gp::runtime
