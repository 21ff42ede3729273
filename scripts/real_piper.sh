#!/usr/bin/env bash
# Real Piper against ours: runs msr-fiddle/piper's own algo.cpp (NeurIPS 2021) on instances that
# `graphpipe piper-export` writes from our cost model, on the coarse graph our Piper baseline runs
# on, and prints a markdown table of bottlenecks (ms/sample) per model and micro-batch size: real
# Piper's, and our Piper's, GraphPipe's and PipeDream's at that micro-batch size, each as its DP's
# own optimum (all links assumed as the planner assumes them before placement, as in the instance)
# and as the placed plan's re-costed bottleneck.
# Piper's code is not part of this repository: clone it yourself and give its directory.
#   git clone https://github.com/msr-fiddle/piper /path/to/piper
#   scripts/real_piper.sh /path/to/piper [BUILD_DIR]
# Environment: MODELS ("dlrm candle-uno mmt"), DEVICES (8), BATCH (128), MICRO ("1 2 4 ... 128"),
# LIMIT (20: our Piper's --time-limit, which sets how far both see the graph coarsened),
# PIPER_TIMEOUT (600: wall seconds before a real Piper run is reported as "timeout"), CLUSTER (summit).
set -uo pipefail
PIPER_DIR=${1:?usage: scripts/real_piper.sh PIPER_DIR [BUILD_DIR]}
BUILD=${2:-build}
GP=$BUILD/graphpipe
MODELS=${MODELS:-"dlrm candle-uno mmt"}
DEVICES=${DEVICES:-8}
BATCH=${BATCH:-128}
MICRO=${MICRO:-"1 2 4 8 16 32 64 128"}
LIMIT=${LIMIT:-20}
PIPER_TIMEOUT=${PIPER_TIMEOUT:-600}
CLUSTER=${CLUSTER:-summit}
HERE=$(cd "$(dirname "$0")" && pwd)
[ -f "$PIPER_DIR/algo.cpp" ] || { echo "real_piper.sh: no algo.cpp in $PIPER_DIR (clone msr-fiddle/piper there)" >&2; exit 2; }
[ -x "$GP" ] || { echo "real_piper.sh: $GP not found; build the graphpipe target first" >&2; exit 2; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
DRIVER=$TMP/piper_driver
echo "building $DRIVER from $PIPER_DIR/algo.cpp" >&2
g++ -O3 -std=c++17 -w -I "$PIPER_DIR" "$HERE/piper_driver.cpp" -o "$DRIVER" || exit 1

# bottleneck FILE MB: from a `plan --explain` output, the DP's own optimum at micro-batch MB and
# the placed plan's bottleneck (re-costed on its links), "DP / placed" in ms/sample
bottleneck() {
  local dp placed
  dp=$(grep -o "DP optimum.*" "$1" | grep -o " $2: [0-9.e+-]* ms" | awk '{ print $2 }')
  placed=$(grep -o "predicted: bottleneck [0-9.]*" "$1" | awk '{ print $3 }')
  [ -n "$dp" ] && echo "$dp / $placed" || echo "no plan"
}
# real MB FILE: real Piper's bottleneck (ms/sample), its stage count and CPU seconds
real() {
  python3 -c "
import json,sys
r = json.loads(open(sys.argv[2]).read().strip().splitlines()[-1])
if not r['feasible']: print('infeasible | %.1f' % r['cpu_s'])
else: print('%.4f (%d stages) | %.1f' % (r['tps'] / int(sys.argv[1]), len(r['stages']), r['cpu_s']))" "$1" "$2" 2>/dev/null
}

echo "| model | micro-batch | graph both Pipers saw | real Piper ms/sample | real Piper CPU s | our Piper (DP / placed) | GraphPipe (DP / placed) | PipeDream (DP / placed) | real / our Piper (DP) |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
for model in $MODELS; do
  for mb in $MICRO; do
    echo "$model, micro-batch $mb" >&2
    base=$TMP/$model.$mb
    "$GP" piper-export --model "$model" --cluster "$CLUSTER" --devices "$DEVICES" --batch "$BATCH" \
      --micro-batch "$mb" --time-limit "$LIMIT" --out "$base.instance.json" 2>"$base.err" || {
      echo "| $model | $mb | export failed: $(tail -1 "$base.err" | cut -c1-80) | | | | | | |"
      continue
    }
    graph=$(python3 -c "import json,sys; g=json.load(open(sys.argv[1]))['graphpipe']; n=len(json.load(open(sys.argv[1]))['nodes']); print('%d nodes of %d ops (%s), %d downsets' % (n, g['ops'], g['graph'], g['downsets']))" "$base.instance.json")
    timeout "$PIPER_TIMEOUT" "$DRIVER" "$base.instance.json" >"$base.real.json" 2>/dev/null
    rc=$?
    if [ $rc -eq 124 ]; then r="timeout | > $PIPER_TIMEOUT"
    elif [ $rc -ne 0 ]; then r="failed (exit $rc) |"
    else r=$(real "$mb" "$base.real.json"); fi
    for p in piper graphpipe pipedream; do
      "$GP" plan --model "$model" --cluster "$CLUSTER" --devices "$DEVICES" --batch "$BATCH" --micro-batch "$mb" \
        --planner "$p" --time-limit "$LIMIT" --explain >"$base.$p.out" 2>>"$base.err"
    done
    ours=$(bottleneck "$base.piper.out" "$mb")
    ratio=$(awk -v a="${r%% *}" -v b="${ours%% *}" 'BEGIN { if (a + 0 > 0 && b + 0 > 0) printf("%.3f", a / b); else print "-" }')
    echo "| $model | $mb | $graph | $r | $ours | $(bottleneck "$base.graphpipe.out" "$mb") | $(bottleneck "$base.pipedream.out" "$mb") | $ratio |"
  done
done
