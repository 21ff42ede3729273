#!/usr/bin/env bash
# make bench: planner search time and predicted throughput (GraphPipe vs PipeDream vs Piper) on the
# paper's multi-branch models on summit, plus a 2,000-op graph on 1,024 devices. Writes a markdown
# table to BUILD/bench-planner.md and prints it. Piper gets PIPER_LIMIT seconds (default 60); any
# run is cut after BIG_LIMIT seconds (default 600).
set -uo pipefail
BUILD=${1:-build}
GP=$BUILD/graphpipe
OUT=$BUILD/bench-planner.md
PIPER_LIMIT=${PIPER_LIMIT:-60}
BATCH=${BATCH:-256}
field() { python3 -c "import json,sys; d=json.load(open('$1')); print($2)" 2>/dev/null; }
run() {  # model devices planner -> "search_s tps_ms throughput stages" or an error note
  local f; f=$(mktemp)
  if timeout "${BIG_LIMIT:-600}" "$GP" plan --model "$1" --cluster summit --devices "$2" --batch "$4" --planner "$3" \
       --time-limit "$PIPER_LIMIT" --json >"$f" 2>"$f.err"; then
    field "$f" "'%.3f | %.3f | %.1f | %d' % (d['search_time_s'], d['predicted']['bottleneck_tps_s']*1e3, d['predicted']['throughput_samples_per_s'], len(d['stages']))"
  else
    echo "error: $(tail -1 "$f.err" | cut -c1-80)$([ -s "$f.err" ] || echo "timed out") | - | - | -"
  fi
  rm -f "$f" "$f.err"
}
{
  echo "# Planner benchmark"
  echo
  echo "$(date -u '+%Y-%m-%d %H:%M UTC') on $(uname -n), $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)); mini-batch $BATCH; Piper time limit $PIPER_LIMIT s."
  echo "Command: scripts/bench.sh $BUILD"
  echo
  echo "| model | devices | planner | search s | bottleneck ms/sample | throughput samples/s | stages |"
  echo "| --- | --- | --- | --- | --- | --- | --- |"
  for m in mmt dlrm candle-uno; do
    for n in 4 8 16 32; do
      for p in graphpipe pipedream piper; do
        echo "| $m | $n | $p | $(run "$m" "$n" "$p" "$BATCH") |"
      done
    done
  done
  for p in graphpipe pipedream; do
    echo "| mmt:branches=8,layers=32 (2,059 ops) | 1024 | $p | $(run "mmt:branches=8,layers=32" 1024 "$p" 4096) |"
  done
} | tee "$OUT"
