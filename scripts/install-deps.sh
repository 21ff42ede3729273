#!/usr/bin/env bash
# Installs the Debian packages GraphPipe needs (CONTRACT.md's apt line). Idempotent: when every
# package is already installed it returns in about a second without touching apt.
set -euo pipefail
PKGS=(build-essential cmake ninja-build pkg-config
  libtorch-dev libgloo-dev libopenblas0-pthread libonnx-dev libprotobuf-dev protobuf-compiler
  nlohmann-json3-dev libcli11-dev libfmt-dev libspdlog-dev libgtest-dev libgmock-dev
  libbenchmark-dev librapidcheck-dev graphviz)
missing=()
for p in "${PKGS[@]}"; do
  [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" = "install ok installed" ] || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "install-deps: installing ${missing[*]}" >&2
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${PKGS[@]}" >/dev/null
echo "install-deps: done" >&2
