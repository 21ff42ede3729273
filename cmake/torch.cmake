# Finding LibTorch (docs/runtime.md, "Which LibTorch").
#
# Default: the LibTorch inside the PyTorch wheel that scripts/install-deps.sh installs from PyPI, found
# by asking GP_PYTHON (python3) for torch.utils.cmake_prefix_path. Another LibTorch: pass
# -DTorch_DIR=<dir with TorchConfig.cmake> or put its prefix on CMAKE_PREFIX_PATH; then Python is not
# asked. A CUDA LibTorch (the wheel is built for CUDA 13) needs the CUDA toolkit to configure: nvcc on
# PATH, CUDAToolkit_ROOT, or /usr/local/cuda (tried here). Nothing here needs a GPU.
set(GP_PYTHON python3 CACHE STRING "Python whose torch wheel provides LibTorch (unless Torch_DIR is set)")
set(GP_TORCH_FROM "Torch_DIR / CMAKE_PREFIX_PATH")
if(NOT Torch_DIR AND NOT CMAKE_PREFIX_PATH MATCHES "[Tt]orch")
  execute_process(COMMAND ${GP_PYTHON} -c "import torch.utils; print(torch.utils.cmake_prefix_path)"
                  OUTPUT_VARIABLE gp_torch_prefix OUTPUT_STRIP_TRAILING_WHITESPACE
                  ERROR_VARIABLE gp_torch_err RESULT_VARIABLE gp_torch_rc)
  if(NOT gp_torch_rc EQUAL 0)
    string(REGEX MATCH "[^\n]*\n?$" gp_torch_err "${gp_torch_err}")
    message(FATAL_ERROR "LibTorch: ${GP_PYTHON} cannot import torch (${gp_torch_err}). Run "
            "scripts/install-deps.sh (installs the pinned torch wheel from PyPI), or point the build at "
            "another LibTorch with -DTorch_DIR=<dir with TorchConfig.cmake>, or -DGP_WITH_TORCH=OFF.")
  endif()
  list(APPEND CMAKE_PREFIX_PATH "${gp_torch_prefix}")
  set(GP_TORCH_FROM "${GP_PYTHON}'s torch wheel")
endif()
if(NOT CUDAToolkit_ROOT AND NOT DEFINED ENV{CUDAToolkit_ROOT} AND EXISTS /usr/local/cuda/bin/nvcc)
  find_program(gp_nvcc nvcc)
  if(NOT gp_nvcc)
    set(CUDAToolkit_ROOT /usr/local/cuda)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
endif()
# The wheel's Caffe2 config warns without an architecture list; the GPUs we target are H100/H200 (9.0).
if(NOT TORCH_CUDA_ARCH_LIST AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
  set(TORCH_CUDA_ARCH_LIST 9.0)
endif()
find_package(Torch REQUIRED)
# Wheels before PyTorch 2.7 use the old std::string ABI: every target must match, not only the ones
# linking torch (strings cross our libraries). Debian's LibTorch and wheels from 2.7 on use the new one.
if(TORCH_CXX_FLAGS MATCHES "_GLIBCXX_USE_CXX11_ABI=0")
  add_compile_definitions(_GLIBCXX_USE_CXX11_ABI=0)
endif()
# CUDA and NCCL compiled in: the CUDA LibTorch's torch_cuda target, and the NCCL process group in it.
set(GP_TORCH_CUDA OFF)
if(TARGET torch_cuda OR TORCH_LIBRARIES MATCHES "torch_cuda")
  set(GP_TORCH_CUDA ON)
endif()
message(STATUS "LibTorch ${Torch_VERSION} from ${GP_TORCH_FROM} (${Torch_DIR}); CUDA compiled in: ${GP_TORCH_CUDA}")
# The wheel's libtorch*.so export the copy of libstdc++'s std::filesystem they link statically
# (pytorch/pytorch#133437). Listed before libstdc++.so.6, that copy won the symbol lookup and crashed
# (std::filesystem::remove_all jumped to address 0). Needing libstdc++ first puts its definitions first.
add_link_options("LINKER:--push-state,--no-as-needed" -lstdc++ "LINKER:--pop-state")
