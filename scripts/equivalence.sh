#!/usr/bin/env bash
# The runtime equivalence matrix: plans of all three planners (graphpipe, pipedream, piper) for small
# mmt, dlrm, candle-uno and gpt presets at 2, 4 and 6 devices (cpu cluster preset, mini-batch 32),
# 5 steps each, every rank a thread; per-step losses must equal `train --single` within 1e-5 relative
# and final weights within 1e-5. Prints each plan's stage graph. (The same test runs in ctest.)
# Usage: scripts/equivalence.sh [BUILD_DIR]   (a build configured with -DGP_WITH_TORCH=ON)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
cmake --build "$build" --target runtime_equivalence_test -j2 >/dev/null
start=$(date +%s)
"$build/src/runtime/runtime_equivalence_test" --gtest_filter='PlannerEquivalence.*'
echo "equivalence matrix passed in $(( $(date +%s) - start )) s (load average: $(cut -d' ' -f1-3 /proc/loadavg))"
