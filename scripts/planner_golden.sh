#!/usr/bin/env bash
# Planner golden outputs: plans, their simulations, --explain text and the DP statistics
# (bench/planner_scale) for a spread of models, clusters, device counts and planners, so a change
# that must not change the planner's behaviour (issue 39: the engine refactor) can be checked
# against a binary built before it.
#
#   scripts/planner_golden.sh save DIR [BUILD_DIR]    write the outputs of BUILD_DIR's binaries to DIR
#   scripts/planner_golden.sh check DIR [BUILD_DIR]   write them to a temporary folder and diff with DIR
#   scripts/planner_golden.sh speed REF_BUILD [BUILD_DIR] [ROUNDS]
#                                                      planner_scale's search CPU time, the two builds
#                                                      interleaved (ROUNDS rounds, default 7): per round the
#                                                      totals, then the median ratio BUILD / REF
#   scripts/planner_golden.sh paper REF.md NEW.md      two `make paper` outputs (PAPER_OUT=... scripts/paper.sh
#                                                      BUILD_DIR): every table row equal but its search-time column
#
# BUILD_DIR (default build) holds graphpipe and bench/planner_scale (or planner_scale). What is
# compared: each plan file (graphpipe.plan/1) with its wall-clock field search_time_s removed, the
# plan command's stdout with its "search time:" line removed, `graphpipe simulate --json` of each
# plan, and planner_scale's per-size lines (states, solves, stage evaluations, pruning counts,
# bottleneck) with its time columns removed. Everything else must be byte-identical. Exit 0 when
# all match, 1 on a difference (the diff is printed), 2 on bad usage.
set -uo pipefail
if [ "${1:-}" = speed ]; then
  REF=${2:-}
  NEW=${3:-build}
  ROUNDS=${4:-7}
  [ -n "$REF" ] || { echo "usage: scripts/planner_golden.sh speed REF_BUILD [BUILD_DIR] [ROUNDS]" >&2; exit 2; }
  scale_bin() { if [ -x "$1/bench/planner_scale" ]; then echo "$1/bench/planner_scale"; else echo "$1/planner_scale"; fi; }
  R=$(scale_bin "$REF")
  N=$(scale_bin "$NEW")
  [ -x "$R" ] && [ -x "$N" ] || { echo "planner_golden.sh: planner_scale not found in $REF or $NEW" >&2; exit 2; }
  # total BIN: the summed "total cpu s" of the benchmark set.
  total() {
    local t=0 a
    for a in "mmt 32 1024" "dlrm 1024 32768" "candle-uno 1024 32768" "gpt 32 512"; do
      # shellcheck disable=SC2086
      t=$(awk -v t="$t" -v x="$("$1" $a 2>&1 | sed -n 's/^total cpu s //p')" 'BEGIN { print t + x }')
    done
    echo "$t"
  }
  ratios=()
  for ((r = 1; r <= ROUNDS; ++r)); do
    if ((r % 2)); then a=$(total "$R"); b=$(total "$N"); else b=$(total "$N"); a=$(total "$R"); fi
    ratio=$(awk -v a="$a" -v b="$b" 'BEGIN { printf("%.3f", b / a) }')
    ratios+=("$ratio")
    echo "round $r: ref $a s, new $b s, new / ref $ratio"
  done
  printf '%s\n' "${ratios[@]}" | sort -n | awk '{ x[NR] = $1 } END { print "median new / ref: " x[int((NR + 1) / 2)] }'
  exit 0
fi
if [ "${1:-}" = paper ]; then
  [ -f "${2:-}" ] && [ -f "${3:-}" ] || { echo "usage: scripts/planner_golden.sh paper REF.md NEW.md" >&2; exit 2; }
  python3 - "$2" "$3" <<'PY'
import sys
def rows(path):
    out, head = [], None
    for line in open(path):
        line = line.rstrip("\n")
        if not line.startswith("| ") or "---" in line:
            if line.startswith("#"): head = None
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if any("search" in c for c in cells) or cells[0] in ("model", "devices / planner"):
            head = cells
        elif head:
            cells = ["T" if "search" in h else c for h, c in zip(head, cells)] + cells[len(head):]
        out.append(cells)
    return out
a, b = rows(sys.argv[1]), rows(sys.argv[2])
bad = [(x, y) for x, y in zip(a, b) if x != y]
for x, y in bad: print("ref:", " | ".join(x), "\nnew:", " | ".join(y))
if len(a) != len(b) or bad or not a:
    print(f"planner_golden.sh: paper tables differ ({len(a)} vs {len(b)} rows, {len(bad)} differ)", file=sys.stderr)
    sys.exit(1)
print(f"planner_golden.sh: all {len(a)} paper table rows identical (search-time columns aside)")
PY
  exit $?
fi
MODE=${1:-}
DIR=${2:-}
BUILD=${3:-build}
if [ -z "$MODE" ] || [ -z "$DIR" ] || { [ "$MODE" != save ] && [ "$MODE" != check ]; }; then
  echo "usage: scripts/planner_golden.sh save|check DIR [BUILD_DIR]" >&2
  exit 2
fi
GP=$BUILD/graphpipe
SCALE=$BUILD/bench/planner_scale
[ -x "$SCALE" ] || SCALE=$BUILD/planner_scale
[ -x "$GP" ] || { echo "planner_golden.sh: $GP not found" >&2; exit 2; }
[ -x "$SCALE" ] || { echo "planner_golden.sh: planner_scale not found in $BUILD" >&2; exit 2; }
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=$DIR
if [ "$MODE" = check ]; then
  [ -d "$DIR" ] || { echo "planner_golden.sh: $DIR: no saved outputs" >&2; exit 2; }
  OUT=$(mktemp -d)
  trap 'rm -rf "$OUT"' EXIT
fi
mkdir -p "$OUT"
# A small measured profile for the --profile cases: generated once, then kept with the outputs
# (an input, not an output: the check reuses the saved one).
PROFILE=$DIR/candle-small.profile.json
PROFILE_MODEL=candle-uno:branches=3,layers=2,hidden=256
if [ "$MODE" = save ] && [ ! -f "$PROFILE" ]; then
  "$GP" profile --model "$PROFILE_MODEL" --batches 1,2,4,8 --repeats 1 --warmup 0 --clock cpu --no-context \
    --out "$PROFILE" >/dev/null 2>&1 || { echo "planner_golden.sh: profiling failed" >&2; exit 2; }
fi

# case TAG ARGS...: plan (stdout, plan file) and simulate it.
case_() {
  local tag=$1
  shift
  "$GP" plan "$@" --explain --out "$OUT/$tag.plan.json" >"$OUT/$tag.plan.out" 2>"$OUT/$tag.plan.err"
  echo "rc=$?" >>"$OUT/$tag.plan.err"
  # Wall-clock text: the search time, the simulator's own time, progress lines (printed by time).
  sed -i -E '/^search time:/d; /^wrote /d; s/ \([0-9.e+-]+ s to simulate\)//' "$OUT/$tag.plan.out"
  sed -i '/ done (/d' "$OUT/$tag.plan.err"
  if [ -f "$OUT/$tag.plan.json" ]; then
    "$GP" simulate --plan "$OUT/$tag.plan.json" --json >"$OUT/$tag.sim.json" 2>/dev/null
    sed -i '/"search_time_s"/d' "$OUT/$tag.plan.json" "$OUT/$tag.sim.json"
  fi
}

ONNX=$ROOT/tests/fixtures/onnx
for planner in graphpipe pipedream; do
  for n in 8 32 1024; do
    case_ "mmt-summit-$n-$planner" --model mmt --cluster summit --devices $n --batch $((32 * n)) --planner $planner
    case_ "dlrm-summit-$n-$planner" --model dlrm --cluster summit --devices $n --batch $((32 * n)) --planner $planner
    case_ "candle-summit-$n-$planner" --model candle-uno --cluster summit --devices $n --batch $((32 * n)) \
      --planner $planner
  done
  case_ "gpt-summit-32-$planner" --model gpt --cluster summit --devices 32 --batch 512 --planner $planner
  case_ "gpt-summit-8-mb4-$planner" --model gpt:layers=24 --cluster summit --devices 8 --batch 256 --micro-batch 4 \
    --planner $planner
  case_ "mmt-cpu-8-$planner" --model mmt:layers=2,hidden=256,ffn=1024,seq=64 --cluster cpu --devices 8 --batch 64 \
    --planner $planner
  case_ "candle-cpu-32-$planner" --model candle-uno:hidden=1024 --cluster cpu --devices 32 --batch 1024 --planner $planner
  case_ "inception-summit-8-$planner" --model "$ONNX/tiny_inception.onnx" --cluster summit --devices 8 --batch 64 \
    --planner $planner
  case_ "resnet18-summit-32-$planner" --model "$ONNX/resnet18.onnx" --cluster summit --devices 32 --batch 256 \
    --planner $planner
  case_ "candle-small-profile-8-$planner" --model "$PROFILE_MODEL" --cluster cpu --devices 8 --batch 64 \
    --profile "$PROFILE" --planner $planner
  # Near the memory limit: mixed stage sizes and the memory bounds at work.
  case_ "dlrm-summit-8-tight-$planner" --model dlrm --cluster summit --devices 8 --batch 4096 --memory-limit 6 \
    --planner $planner
  case_ "mmt-summit-16-tight-$planner" --model mmt --cluster summit --devices 16 --batch 2048 --memory-limit 8 \
    --planner $planner
done
case_ "candle-summit-8-piper" --model candle-uno --cluster summit --devices 8 --batch 256 --planner piper
case_ "inception-summit-8-piper" --model "$ONNX/tiny_inception.onnx" --cluster summit --devices 8 --batch 64 \
  --planner piper

# The DP's statistics per micro-batch size (planner_scale prints them), time columns removed.
scale() {
  local tag=$1
  shift
  # Columns: mbs dp bottleneck states solves evals mem-pruned "cpu s" plans "best iter s": the 8th is time.
  "$SCALE" "$@" 2>&1 | awk '/^total cpu s/ { next } NF == 10 && $1 ~ /^[0-9]+$/ { $8 = "T" } { print }' \
    >"$OUT/$tag.scale.out"
}
scale mmt-32 mmt 32 1024
scale dlrm-1024 dlrm 1024 32768
scale candle-32 candle-uno 32 1024 8 32

if [ "$MODE" = check ]; then
  if diff -r -x '*.profile.json' "$DIR" "$OUT"; then
    echo "planner_golden.sh: all $(ls "$OUT" | wc -l) outputs identical to $DIR"
    exit 0
  fi
  echo "planner_golden.sh: outputs differ from $DIR" >&2
  exit 1
fi
echo "planner_golden.sh: wrote $(ls "$OUT" | wc -l) outputs to $OUT"
