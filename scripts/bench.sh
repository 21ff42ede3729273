#!/usr/bin/env bash
# make bench: planner search time and predicted throughput (GraphPipe vs PipeDream vs Piper) on the
# paper's multi-branch models on summit, plus a 2,000-op graph on 1,024 devices. Writes a markdown
# table to BUILD/bench-planner.md and prints it. Piper gets PIPER_LIMIT seconds (default 60); any
# run is cut after BIG_LIMIT seconds (default 900); BIG=0 skips the 1,024-device case. "search s" is the planner's wall clock, "cpu s"
# the process's user CPU time (the machine may be shared: CPU time is the one-core number).
set -uo pipefail
BUILD=${1:-build}
GP=$BUILD/graphpipe
OUT=$BUILD/bench-planner.md
PIPER_LIMIT=${PIPER_LIMIT:-60}
BATCH=${BATCH:-256}
THR=$(mktemp)  # "model/devices/planner throughput" lines (run() runs in a subshell)
trap 'rm -f "$THR"' EXIT
thr() { awk -v k="$1" '$1 == k { print $2 }' "$THR"; }
field() { python3 -c "import json,sys; d=json.load(open('$1')); print($2)" 2>/dev/null; }
run() {  # model devices planner batch -> "search_s | cpu_s | tps_ms | throughput | stages | mbs | piper graph" or an error note
  local f; f=$(mktemp)
  if /usr/bin/time -f "%U" -o "$f.time" timeout "${BIG_LIMIT:-900}" "$GP" plan --model "$1" --cluster summit \
       --devices "$2" --batch "$4" --planner "$3" --time-limit "$PIPER_LIMIT" --json >"$f" 2>"$f.err"; then
    echo "$1/$2/$3 $(field "$f" "d['predicted']['throughput_samples_per_s']")" >>"$THR"
    field "$f" "'%.3f | $(tail -1 "$f.time") | %.3f | %.1f | %d | %d | %s' % (d['search_time_s'], d['predicted']['bottleneck_tps_s']*1e3, d['predicted']['throughput_samples_per_s'], len(d['stages']), d['stages'][0]['micro_batch_size'], ('%d of %d ops: %s, %d downsets' % (d['piper']['nodes'], d['piper']['ops'], d['piper']['graph'], d['piper']['downsets']) if 'piper' in d else '-'))"
  else
    echo "error: $(tail -1 "$f.err" | cut -c1-80)$([ -s "$f.err" ] || echo "timed out after ${BIG_LIMIT:-900} s") | $(tail -1 "$f.time" 2>/dev/null | grep -o '^[0-9.]*$' || echo -) | - | - | - | - | -"
  fi
  rm -f "$f" "$f.err" "$f.time"
}
ratio() { python3 -c "print('%.2fx' % ($1 / $2))" 2>/dev/null || echo "-"; }
{
  echo "# Planner benchmark"
  echo
  echo "$(date -u '+%Y-%m-%d %H:%M UTC') on $(uname -n), $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), load average $(cut -d' ' -f1-3 /proc/loadavg); mini-batch $BATCH; Piper time limit $PIPER_LIMIT s."
  echo "Command: scripts/bench.sh $BUILD"
  echo
  echo "| model | devices | planner | search s | cpu s | bottleneck ms/sample | throughput samples/s | stages | micro-batch | graph Piper saw |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
  for m in mmt dlrm candle-uno; do
    for n in 4 8 16 32; do
      for p in graphpipe pipedream piper; do
        echo "| $m | $n | $p | $(run "$m" "$n" "$p" "$BATCH") |"
      done
    done
  done
  # BIG=0 leaves out the 2,059-op / 1,024-device case (minutes of CPU per planner).
  if [ "${BIG:-1}" != 0 ]; then
    for p in graphpipe pipedream; do
      echo "| mmt:branches=8,layers=32 (2,059 ops) | 1024 | $p | $(run "mmt:branches=8,layers=32" 1024 "$p" 4096) |"
    done
  fi
  echo
  echo "Predicted throughput of GraphPipe over the baselines:"
  echo
  echo "| model | devices | GraphPipe / PipeDream | GraphPipe / Piper |"
  echo "| --- | --- | --- | --- |"
  for m in mmt dlrm candle-uno; do
    for n in 4 8 16 32; do
      g=$(thr "$m/$n/graphpipe"); d=$(thr "$m/$n/pipedream"); q=$(thr "$m/$n/piper")
      echo "| $m | $n | $([ -n "$g" ] && [ -n "$d" ] && ratio "$g" "$d" || echo -) | $([ -n "$g" ] && [ -n "$q" ] && ratio "$g" "$q" || echo -) |"
    done
  done
} | tee "$OUT"
