#!/bin/bash
# Measured vs predicted peak memory per rank (issue 19): plans small mmt, dlrm, candle-uno presets and
# an imported ONNX model on the cpu preset at several device counts, micro-batch sizes, optimizers and
# schedules, trains 3 steps with `train --json` and prints one line per rank.
# Usage: bench/memory_fidelity.sh [build/graphpipe]
set -u
G=$(realpath "${1:-build/graphpipe}")
SRC=$(cd "$(dirname "$0")/.." && pwd)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cd "$TMP"
MMT='mmt:branches=2,layers=2,hidden=64,seq=64,heads=2,ffn=128'
DLRM='dlrm:dense_branches=1,embedding_branches=2,layers=2,hidden=64,rows=2000,dim=32,bag=8'
UNO='candle-uno:branches=2,layers=2,hidden=256'
ONNX="$SRC/tests/fixtures/onnx/two_branch.onnx"
run() {  # model devices batch micro optimizer schedule
  local m="$1" d=$2 b=$3 mb=$4 o=$5 s=$6
  "$G" plan --model "$m" --cluster cpu --devices "$d" --batch "$b" --micro-batch "$mb" --optimizer "$o" \
    --out p.json >/dev/null 2>err || { echo "plan failed: $m: $(cat err)"; return; }
  "$G" train --plan p.json --steps 3 --json --optimizer "$o" --schedule "$s" >t.json 2>err ||
    { echo "train failed: $m: $(tail -1 err)"; return; }
  python3 - "$m" "$d" "$b" "$mb" "$o" "$s" <<'PY'
import json, sys
name = sys.argv[1].split(':')[0].split('/')[-1]
for r in json.load(open('t.json'))['ranks']:
    if r['stage'] < 0:
        continue
    m, p = r['peak_memory_bytes'], r['predicted_memory_bytes']
    print(f"| {name} | {sys.argv[2]} | {sys.argv[3]} | {sys.argv[4]} | {sys.argv[5]} | {sys.argv[6]} | {r['rank']} | "
          f"{r['stage']} | {r['in_flight']} | {m / 1e6:.3f} | {p / 1e6:.3f} | {100 * (m - p) / p:+.1f}% |")
PY
}
echo "| model | devices | batch | micro | optimizer | schedule | rank | stage | in flight | measured MB | predicted MB | diff |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
run "$MMT" 2 32 4 adam 1f1b
run "$MMT" 3 32 8 sgd 1f1b
run "$MMT" 3 64 4 adam 1f1b
run "$MMT" 4 64 8 adam gpipe
run "$DLRM" 2 64 8 adam 1f1b
run "$DLRM" 3 128 16 sgd 1f1b
run "$UNO" 3 64 8 adam 1f1b
run "$UNO" 2 256 32 sgd 1f1b
run "$ONNX" 2 32 4 adam 1f1b
run "$ONNX" 3 64 16 sgd gpipe
