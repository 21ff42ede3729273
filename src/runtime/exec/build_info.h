// What this graphpipe was built with and what it sees (`graphpipe --version`, --device checks).
// Torch-free.
#pragma once
#include <string>
#include <vector>

namespace gp::runtime {

struct BuildInfo {
  std::string torch_version;  // LibTorch's TORCH_VERSION, e.g. "2.11.0"
  bool cuda_built = false;    // built against a CUDA LibTorch (GP_HAVE_CUDA)
  std::string cuda_version;   // the CUDA runtime LibTorch was built with ("13.0"); "" without CUDA
  bool nccl_built = false;    // c10d's NCCL process group compiled in (GP_HAVE_NCCL)
  std::string nccl_version;   // "2.28.9"; "" without NCCL
  int gpus = 0;               // CUDA devices visible to this process
  std::vector<std::string> gpu_names;
};

/// Fills BuildInfo; counting GPUs asks the CUDA runtime (no context is made).
BuildInfo build_info();

/// The lines `graphpipe --version` prints after the graphpipe version.
std::string describe(const BuildInfo& b);

/// UserError (exit 2) unless `kind` is "cpu", or "cuda" with CUDA available in this LibTorch build and
/// on this machine ("--device cuda: CUDA is not available in this build or on this machine ...").
void check_device_available(const std::string& kind);

}  // namespace gp::runtime
