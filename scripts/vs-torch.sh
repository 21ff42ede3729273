#!/usr/bin/env bash
# graphpipe train vs torch.distributed.pipelining on this machine (issue 38): same models, weights,
# data and optimizer, 2 CPU processes with 1 thread each; checks that every engine's per-step losses
# agree (1e-4 relative over 10 steps) and times them in interleaved rounds. docs/vs-torch.md.
# Usage: scripts/vs-torch.sh [BUILD_DIR] [bench/vs_torch.py options...]
#   e.g. scripts/vs-torch.sh build --rounds 5 --models chain,uno
# Writes BUILD_DIR/vs-torch.json (graphpipe.vs-torch/1); PYTHON overrides the interpreter (python3).
# Exit status: 0 done, 1 a parity check or a graphpipe run failed, 2 graphpipe or torch missing.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
[ $# -gt 0 ] && shift
exec "${PYTHON:-python3}" bench/vs_torch.py --graphpipe "$build/graphpipe" --out "$build/vs-torch.json" "$@"
