#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan+UBSan+fuzzer instrumentation, build dir $FUZZ_BUILD) and
# runs each for FUZZ_SECONDS seconds on a scratch copy of its corpus (fuzz/corpus/<target> is read,
# never written). Crashes land in $FUZZ_BUILD/artifacts/. Usage: fuzz/run.sh [target...]
# Env: FUZZ_SECONDS (30), FUZZ_BUILD (build-fuzz), JOBS (nproc), FUZZ_MERGE=1 to merge new coverage
# back into fuzz/corpus/<target> (minimised with -merge=1).
set -euo pipefail
cd "$(dirname "$0")/.."
FUZZ_SECONDS=${FUZZ_SECONDS:-30}
FUZZ_BUILD=${FUZZ_BUILD:-build-fuzz}
JOBS=${JOBS:-$(nproc)}
CXX_BIN=${FUZZ_CXX:-clang++-14}
CC_BIN=${FUZZ_CC:-clang-14}
ALL="model_json cluster_json profile_json plan_json schedule_json onnx"
TARGETS=${*:-$ALL}

if ! command -v "$CXX_BIN" >/dev/null; then
  echo "fuzz: installing clang-14 (libFuzzer runtime included)"
  apt-get install -y --no-install-recommends clang-14 libclang-rt-14-dev >/dev/null
fi
if [ ! -f "$FUZZ_BUILD/build.ninja" ]; then
  CC=$CC_BIN CXX=$CXX_BIN cmake -S . -B "$FUZZ_BUILD" -G Ninja -DGP_FUZZ=ON -DGP_WITH_TORCH=OFF \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGP_LIBS="support;graph;ir;models;importers;cost;plan;schedule;sim" \
    "-DCMAKE_CXX_FLAGS=-fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
fi
cmake --build "$FUZZ_BUILD" --target fuzzers -j "$JOBS"

mkdir -p "$FUZZ_BUILD/artifacts"
status=0
for t in $TARGETS; do
  bin="$FUZZ_BUILD/fuzz/fuzz_$t"
  scratch="$FUZZ_BUILD/corpus/$t"
  mkdir -p "$scratch" "fuzz/corpus/$t"
  dict=() seeds=()
  [[ $t == *_json ]] && dict=(-dict=fuzz/json.dict)
  [[ $t == onnx ]] && seeds=(tests/fixtures/onnx)  # the real fixtures seed the ONNX corpus
  echo "== fuzz_$t: ${FUZZ_SECONDS}s"
  if ! UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 "$bin" "${dict[@]}" -max_total_time="$FUZZ_SECONDS" \
      -timeout=20 -rss_limit_mb=4096 -max_len=65536 -print_final_stats=1 \
      -artifact_prefix="$FUZZ_BUILD/artifacts/${t}-" "$scratch" "fuzz/corpus/$t" "${seeds[@]}" 2>"$FUZZ_BUILD/fuzz_$t.log"; then
    echo "fuzz_$t FAILED (log: $FUZZ_BUILD/fuzz_$t.log, inputs: $FUZZ_BUILD/artifacts/${t}-*)"
    grep -m3 -E "ERROR|runtime error|terminate|SUMMARY" "$FUZZ_BUILD/fuzz_$t.log" || true
    status=1
  fi
  grep -E "stat::number_of_executed_units|cov: .*ft:" "$FUZZ_BUILD/fuzz_$t.log" | tail -2 || true
  if [ "${FUZZ_MERGE:-0}" = 1 ]; then
    # Edge coverage only (no hit counters) keeps the committed corpus small.
    "$bin" -merge=1 -use_counters=0 "fuzz/corpus/$t" "$scratch" 2>/dev/null >/dev/null
  fi
done
exit $status
