#!/usr/bin/env bash
# Installs what GraphPipe builds and tests with. Idempotent: when everything is there it returns in
# about two seconds without touching apt or pip.
#   1. Debian packages (apt): compilers, CMake/ninja, the header and library packages below.
#   2. PyTorch from PyPI (pip): the pinned torch wheel, whose LibTorch (C++ headers, libtorch*.so,
#      CUDA 13 and NCCL compiled in) the build links (cmake/torch.cmake), plus what the fixture and
#      reference scripts import (numpy, onnx, onnxscript, torchvision), and pytest for the Python
#      package's tests (python/tests). About 4 GB with torch's CUDA libraries (nvidia-* wheels);
#      about 2 minutes on a fast link.
# Environment: PYTHON (python3), GP_TORCH_VERSION (2.11.0: the GPU machine's torch, so both builds
# agree), GP_SKIP_PIP=1 (apt only: a LibTorch of your own, given to CMake with -DTorch_DIR).
# libgloo-dev is for its headers only: c10d's ProcessGroupGloo.hpp includes gloo's headers, which the
# wheel does not ship (its Gloo is compiled into libtorch_cpu.so; we never link Debian's libgloo).
# clang-format and clang-tidy (14 on Debian 12) are for `make format-check` and `make tidy` (CI).
# iproute2 and iptables are for scripts/multihost.sh (network-namespace hosts; iptables' NFQUEUE
# target stands in for tc netem on kernels without sch_netem).
set -euo pipefail
PKGS=(build-essential cmake ninja-build pkg-config
  libgloo-dev libonnx-dev libprotobuf-dev protobuf-compiler
  nlohmann-json3-dev libcli11-dev libfmt-dev libspdlog-dev libgtest-dev libgmock-dev
  libbenchmark-dev librapidcheck-dev graphviz iproute2 iptables clang-format clang-tidy)
PYTHON=${PYTHON:-python3}
TORCH_VERSION=${GP_TORCH_VERSION:-2.11.0}
# torchvision's release that matches each torch we pin (torchvision's README table). The others are
# pinned too: tests/fixtures/check_reproduce.py compares what these versions produce with the record.
declare -A TORCHVISION=([2.11.0]=0.26.0 [2.10.0]=0.25.0 [2.9.1]=0.24.1)
PIP_PKGS=("torch==$TORCH_VERSION" "torchvision==${TORCHVISION[$TORCH_VERSION]:-0.26.0}" numpy==2.4.6 onnx==1.23.2
  onnxscript==0.7.2 pytest==9.2.0)

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
missing=()
for p in "${PKGS[@]}"; do
  [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" = "install ok installed" ] || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: apt: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${PKGS[@]}" >/dev/null
  echo "install-deps: apt: done" >&2
fi

[ "${GP_SKIP_PIP:-0}" = 1 ] && exit 0
command -v "$PYTHON" >/dev/null || { echo "install-deps: $PYTHON not found (set PYTHON=...)" >&2; exit 2; }
# One Python call checks every pip package: prints what is missing or at another version.
pip_missing=$("$PYTHON" - "${PIP_PKGS[@]}" <<'EOF' 2>/dev/null || echo all
import importlib.metadata as md, sys
out = []
for spec in sys.argv[1:]:
    name, version = spec.split("==")
    try:
        have = md.version(name)
    except md.PackageNotFoundError:
        out.append(name); continue
    if have.split("+")[0] != version:
        out.append(f"{name} (have {have}, want {version})")
print(", ".join(out))
EOF
)
if [ -n "$pip_missing" ]; then
  echo "install-deps: pip: installing ${PIP_PKGS[*]} for $("$PYTHON" -c 'import sys; print(sys.executable)')" >&2
  echo "install-deps: pip: missing: $pip_missing; downloads about 4 GB (torch with its CUDA 13 libraries)" >&2
  extra=()
  # Debian's own python3 refuses pip into its site-packages (PEP 668) unless told.
  if "$PYTHON" -c 'import sys, sysconfig, os; sys.exit(0 if os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")) else 1)'; then
    extra=(--break-system-packages)
  fi
  "$PYTHON" -m pip install -q --progress-bar off "${extra[@]}" "${PIP_PKGS[@]}"
  "$PYTHON" -c 'import torch; print(f"install-deps: pip: done: torch {torch.__version__} (CUDA {torch.version.cuda})")' >&2
fi
