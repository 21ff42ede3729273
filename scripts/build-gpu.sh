#!/usr/bin/env bash
# Builds graphpipe against the CUDA LibTorch of a pip `torch` wheel on a machine without apt (a GPU
# machine with CUDA, PyTorch 2.x, CMake and ninja). Two steps:
#
#   scripts/build-gpu.sh deps [DIR]     on a Debian machine with apt (a developer's): downloads the
#                                       header-only / CMake-config packages the build finds
#                                       (nlohmann-json, CLI11, fmt, GTest, rapidcheck) and unpacks
#                                       them into DIR (default gpu-deps/, git-ignored; carry it over)
#   scripts/build-gpu.sh [BUILD_DIR]    on the GPU machine: configures BUILD_DIR (default build-gpu)
#                                       with the wheel's LibTorch and gpu-deps/, and builds graphpipe
#
# fmt is used header-only (GP_FMT_HEADER_ONLY, the default) so nothing prebuilt by Debian is linked. Without
# libonnx the ONNX importer is left out (GP_WITH_ONNX=OFF: *.onnx specs are an error; set
# GP_WITH_ONNX=ON to insist). Only the graphpipe binary is built (the tests link Debian's GTest).
# Environment: PYTHON (python3), JOBS (nproc), GP_WITH_ONNX, DEPS (gpu-deps).
set -euo pipefail
cd "$(dirname "$0")/.."
DEPS=${DEPS:-gpu-deps}
# libgloo-dev: headers only (c10d's ProcessGroupGloo.hpp includes gloo's; the wheel has Gloo compiled in).
PKGS=(nlohmann-json3-dev libcli11-dev libfmt-dev libgtest-dev libgmock-dev librapidcheck-dev libgloo-dev)

if [ "${1:-}" = deps ]; then
  dir=${2:-$DEPS}
  mkdir -p "$dir/debs"
  # libfmt-dev's CMake config checks that the shared library it names exists: fetch that package too.
  fmt_runtime=$(apt-cache depends libfmt-dev | awk '/Depends: libfmt[0-9]/ {print $2; exit}')
  (cd "$dir/debs" && apt-get download "${PKGS[@]}" ${fmt_runtime:+"$fmt_runtime"})
  for d in "$dir"/debs/*.deb; do dpkg-deb -x "$d" "$dir"; done
  rm -rf "$dir/debs" "$dir/usr/share/doc"
  echo "build-gpu: unpacked ${PKGS[*]} ${fmt_runtime} into $dir ($(du -sh "$dir" | cut -f1))"
  exit 0
fi

BUILD=${1:-build-gpu}
PYTHON=${PYTHON:-python3}
[ -d "$DEPS/usr" ] || { echo "build-gpu: $DEPS/usr is missing; run 'scripts/build-gpu.sh deps' on a machine with apt and carry $DEPS over" >&2; exit 2; }
TORCH_CMAKE=$("$PYTHON" -c 'import torch; print(torch.utils.cmake_prefix_path)') ||
  { echo "build-gpu: $PYTHON cannot import torch" >&2; exit 2; }
"$PYTHON" -c 'import torch; print("build-gpu: torch", torch.__version__, "CUDA", torch.version.cuda,
  "cxx11 abi", torch.compiled_with_cxx11_abi(), "GPUs", torch.cuda.device_count())'
ONNX=${GP_WITH_ONNX:-OFF}
DEPS_ABS=$(cd "$DEPS" && pwd)
# The wheel's TorchConfig looks for the CUDA toolkit; nvcc on PATH or CUDA_HOME lets it find one.
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH=/usr/local/cuda/bin:$PATH; fi
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$TORCH_CMAKE;$DEPS_ABS/usr" \
  -DGP_WITH_ONNX="$ONNX" -DTORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
ninja -C "$BUILD" -j "${JOBS:-$(nproc)}" graphpipe
echo "build-gpu: built $BUILD/graphpipe"
