#!/usr/bin/env bash
# make fidelity: does the cost model predict this machine? Profiles a small mmt, plans it at 1, 2 and 4
# devices (with the measured profile, and with the calibrated `cpu` preset alone), trains each plan
# for STEPS steps in each of FID_ROUNDS rounds (every plan in turn per round) and prints measured vs
# predicted iteration time per plan: the median over the rounds of each run's median step (the
# first WARMUP steps left out), and the range over the rounds. Writes the table to BUILD/fidelity.md
# too. Env: FID_MODEL, FID_BATCH, STEPS (default 12), WARMUP (2), DEVICES ("1 2 4"), FID_ROUNDS (3),
# CALIBRATE (1, the default: measure the machine again first, so that the figures and the runs meet the
# same host: its speed moves 20% within minutes, docs/results-history.md "Ranking plans on this machine,
# second round"; 0: the cached figures),
# FID_REPEATS (15: timed calls per op in the profile).
# On a machine shared with other jobs the wall-clock median measures the contention as much as the
# model; a second figure is robust to it: the CPU time of the training processes per step (from a
# run of STEPS steps minus one of 2 steps, so start-up cancels) divided by the cores in use,
# min(devices, cores): the iteration time of an otherwise idle machine if no core waits.
set -euo pipefail
BUILD=${1:-build}
GP=$BUILD/graphpipe
OUT=$BUILD/fidelity.md
MODEL=${FID_MODEL:-mmt:branches=2,layers=2,hidden=128,seq=32,heads=4,ffn=256}
BATCH=${FID_BATCH:-32}
STEPS=${STEPS:-12}
WARMUP=${WARMUP:-2}
DEVICES=${DEVICES:-1 2 4}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

echo "== fidelity: $MODEL, mini-batch $BATCH, ${FID_ROUNDS:-3} rounds of $STEPS steps per plan on $(nproc) cores (load: $(cut -d' ' -f1-3 /proc/loadavg))"
echo "-- calibrating the cpu preset (measured again now; CALIBRATE=0 uses the cached figures)"
if [ "${CALIBRATE:-1}" = 1 ]; then "$GP" calibrate | sed -n 1,6p
else "$GP" calibrate --show 2>/dev/null | sed -n 1,6p || "$GP" calibrate | sed -n 1,6p; fi
echo "-- profiling $MODEL (batches 1..$BATCH, links)"
batches=1; b=2; while [ "$b" -le "$BATCH" ]; do batches="$batches,$b"; b=$((b * 2)); done
PROF=${FID_PROFILE:-$BUILD/fidelity-profile.json}
"$GP" profile --model "$MODEL" --links --clock cpu --batches "$batches" --warmup 3 --repeats "${FID_REPEATS:-15}" --out "$PROF" 2>&1 |
  grep -E '^(wrote|links:|\[links\] lockstep|\[model\]|\[optimizer\])'
echo "-- the calibrated preset against the profile, per op kind (graphpipe calibrate --compare)"
"$GP" calibrate --compare "$PROF" --model "$MODEL" | grep -E "b=($BATCH|1) " || true

# median of step_time_s over steps >= WARMUP of a train --log file
median() { python3 -c "
import json, statistics, sys
t = [json.loads(l)['step_time_s'] for l in open('$1') if l.strip()]
t = t[$WARMUP:] or t
print('%.4f' % statistics.median(t))"; }
field() { python3 -c "import json; d = json.load(open('$1')); print($2)"; }
shape() { field "$1" "'%d stage(s): ' % len(d['stages']) + ', '.join('%d dev mb %d' % (len(s['devices']), s['micro_batch_size']) for s in d['stages'])"; }

ROUNDS=${FID_ROUNDS:-3}
# The plans first, then ROUNDS rounds of training every plan in turn: on a machine whose speed moves
# for minutes at a time (this VM's host), one run per plan measures the moment as much as the plan.
keys=()
declare -A pred shape_of runs cpus
for costs in profile calibrated; do
  for n in $DEVICES; do
    k="${costs}_$n"
    keys+=("$k")
    extra=(); [ "$costs" = profile ] && extra=(--profile "$PROF")
    "$GP" plan --model "$MODEL" --cluster cpu --devices "$n" --batch "$BATCH" "${extra[@]}" --out "$T/$k.json" >/dev/null
    pred[$k]=$(field "$T/$k.json" "'%.4f' % d['predicted']['iteration_time_s']")
    shape_of[$k]=$(shape "$T/$k.json")
    echo "-- $costs, $n device(s): ${shape_of[$k]}; predicted ${pred[$k]} s"
  done
done
cpu_s() { /usr/bin/time -f "%U %S" -o "$T/time" "$GP" train --plan "$T/$1.json" --steps "$2" --seed 1 \
            --log "$T/log.jsonl" >/dev/null; awk '{ print $1 + $2 }' "$T/time"; }
for r in $(seq "$ROUNDS"); do
  for k in "${keys[@]}"; do
    c=$(cpu_s "$k" "$STEPS")
    m=$(median "$T/log.jsonl")
    runs[$k]="${runs[$k]:-} $m"
    cpus[$k]="${cpus[$k]:-} $c"
    echo "   round $r/$ROUNDS, $k: measured $m s (median of $STEPS steps; predicted ${pred[$k]}), load $(cut -d' ' -f1 /proc/loadavg)"
  done
done
rows=()
for k in "${keys[@]}"; do
  short=$(cpu_s "$k" 2)
  n=${k#*_}
  # median / min / max over the rounds' medians; CPU time per step from the median round's CPU time
  read -r meas lo hi ratio rlo rhi cpu cratio < <(python3 -c "
import statistics
m = [float(x) for x in '${runs[$k]}'.split()]; c = [float(x) for x in '${cpus[$k]}'.split()]
p = ${pred[$k]}
cpu = (statistics.median(c) - $short) / ($STEPS - 2) / min($n, $(nproc))
# too few steps for the difference to rise above the start-up's noise: no figure
c_txt = ('%.4f %.2f' % (cpu, cpu / p)) if cpu > 0 else '- -'
print('%.4f %.4f %.4f %.2f %.2f %.2f %s' % (statistics.median(m), min(m), max(m), statistics.median(m) / p,
      min(m) / p, max(m) / p, c_txt))")
  rows+=("| ${k%_*} | $n | ${shape_of[$k]} | ${pred[$k]} | $meas | $lo-$hi | $ratio | $rlo-$rhi | $cpu | $cratio |")
done
{
  echo "| costs | devices | plan | predicted s | measured s (median of $ROUNDS runs) | runs' range | measured / predicted | range | CPU s per step / cores | CPU / predicted |"
  echo "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
  printf '%s\n' "${rows[@]}"
} | tee "$OUT"
echo "(load after: $(cut -d' ' -f1-3 /proc/loadavg); table in $OUT)"

# The ranking tables (issue 35): for an overhead-heavy and a compute-heavy model, 5 plans for this
# machine (1 device; 2 devices GraphPipe, PipeDream, data-parallel; GraphPipe at micro-batch 2) trained
# interleaved, and for every pair the measured speed ratio against the predicted one
# (scripts/fidelity_rank.py). FID_RANK=0 skips them; FID_RANK_MODELS overrides the two models
# ("label=spec" words); FID_RANK_BATCH (32), FID_RANK_ROUNDS (default: one full balanced order, 10
# rounds for 5 plans, in which each plan trains in every slot and right after every other plan equally
# often). Each plan runs at least STEPS steps a round, more where the fastest plan's round would last
# under a second (fidelity_rank.py --min-round-s).
# Each model's ranking calibrates this machine again first (--calibrate; not with CALIBRATE=0), and
# trains the same plan twice a round where no two plans are the same, as its noise floor.
if [ "${FID_RANK:-1}" = 1 ]; then
  RANK_CALIBRATE=$([ "${CALIBRATE:-1}" = 1 ] && echo --calibrate)
  RANK_OUT=$BUILD/fidelity-ranking.md
  { echo "# make fidelity: ranking tables, $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')), load before $(cut -d' ' -f1-3 /proc/loadavg)"; echo; } > "$RANK_OUT"
  for lm in ${FID_RANK_MODELS:-overhead-heavy=mmt:branches=4,layers=1,seq=16,hidden=64,heads=4,ffn=128 compute-heavy=mmt:branches=2,layers=2,seq=64,hidden=256,heads=4,ffn=1024}; do
    echo "-- ranking: ${lm%%=*} ${lm#*=}"
    python3 "$(dirname "$0")/fidelity_rank.py" "$GP" "${lm#*=}" "${FID_RANK_BATCH:-32}" "$RANK_OUT" \
      ${FID_RANK_ROUNDS:+--rounds "$FID_RANK_ROUNDS"} --steps "$STEPS" --warmup "$WARMUP" --label "${lm%%=*}" $RANK_CALIBRATE
  done
  echo "(ranking tables in $RANK_OUT)"
fi
