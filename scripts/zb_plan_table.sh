#!/usr/bin/env bash
# Zero-bubble vs 1F1B in the planner (issue 33 item 5, planner half): for mmt, dlrm and candle-uno
# at 8 and 32 summit devices, plan for 1f1b and for zb (`plan --schedule`), simulate each plan under
# its own schedule (`simulate` runs the schedule the plan records) and print one markdown table row
# per plan: simulated iteration time, throughput, bubble fraction, peak memory, stages, depth,
# micro-batch sizes, and the planner's prediction over the simulation.
#
# Two settings per model and device count:
#   B=128       mini-batch 128 on summit (16 GB V100s)
#   mem-limit   the largest mini-batch of 128 x 2^k (k = 0..LADDER_MAX) whose 1F1B plan still fits
#               the devices' memory (the next step exits 2: no plan fits); zb is planned at the same
#               mini-batch under the same memory bound.
#
# Usage: scripts/zb_plan_table.sh [BUILD_DIR] > table.md
#   MODELS="mmt dlrm candle-uno" DEVICES="8 32" LADDER_MAX=6 override the sweep.
set -uo pipefail
BUILD=${1:-build}
GP=$BUILD/graphpipe
MODELS=${MODELS:-"mmt dlrm candle-uno"}
DEVICES=${DEVICES:-"8 32"}
LADDER_MAX=${LADDER_MAX:-6}
[ -x "$GP" ] || { echo "zb_plan_table.sh: $GP not found; build it first" >&2; exit 2; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# plan_sim MODEL N BATCH SCHEDULE TAG: plan and simulate; 0 when both worked, 2 when no plan fits.
plan_sim() {
  local model=$1 n=$2 batch=$3 sched=$4 tag=$5
  "$GP" plan --model "$model" --cluster summit --devices "$n" --batch "$batch" --schedule "$sched" \
    --out "$TMP/$tag.plan.json" >"$TMP/$tag.plan.out" 2>"$TMP/$tag.err" || return $?
  "$GP" simulate --plan "$TMP/$tag.plan.json" --json >"$TMP/$tag.sim.json" 2>>"$TMP/$tag.err" || return 1
}

# row LABEL TAG: one markdown row from the plan and its simulation.
row() {
  python3 - "$1" "$TMP/$2.plan.json" "$TMP/$2.sim.json" <<'EOF'
import json, sys
label, plan, sim = sys.argv[1], json.load(open(sys.argv[2])), json.load(open(sys.argv[3]))
sizes = sorted({s["micro_batch_size"] for s in plan["stages"]})
print("| %s | %s | %.2f | %.1f | %.1f | %.2f | %d | %d | %s | %.3f |" % (
    label, sim["schedule"], sim["iteration_time_s"] * 1e3, sim["throughput_samples_per_s"],
    sim["bubble_fraction"] * 100, sim["peak_memory_max_bytes"] / 1e9, sim["num_stages"],
    sim["pipeline_depth"], ",".join(map(str, sizes)),
    sim["iteration_time_s"] / sim["predicted_iteration_time_s"]))
EOF
}

echo "| model, devices, setting | schedule | iteration ms | samples/s | bubble % | peak memory GB | stages | depth | micro-batch sizes | simulated / predicted |"
echo "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |"
for model in $MODELS; do
  for n in $DEVICES; do
    for sched in 1f1b zb; do
      if plan_sim "$model" "$n" 128 "$sched" "$model.$n.128.$sched"; then
        row "$model, $n, B=128" "$model.$n.128.$sched"
      else
        echo "| $model, $n, B=128 | $sched | failed: $(tail -1 "$TMP/$model.$n.128.$sched.err" | cut -c1-100) | | | | | | | |"
      fi
    done
    # The memory limit: climb the ladder while the 1F1B plan fits.
    fit=0
    for ((k = 1; k <= LADDER_MAX; ++k)); do
      b=$((128 << k))
      plan_sim "$model" "$n" "$b" 1f1b "$model.$n.$b.1f1b"
      rc=$?
      if [ $rc -eq 2 ]; then break; fi
      [ $rc -eq 0 ] || { echo "zb_plan_table.sh: $model $n B=$b failed: $(tail -1 "$TMP/$model.$n.$b.1f1b.err")" >&2; break; }
      fit=$b
    done
    if [ $fit -eq 0 ]; then
      echo "| $model, $n, mem-limit | - | B=128 is the largest mini-batch of the ladder that fits (above) | | | | | | | |"
      continue
    fi
    [ $fit -eq $((128 << LADDER_MAX)) ] && note=" (ladder top: still fits)" || note=""
    row "$model, $n, B=$fit$note" "$model.$n.$fit.1f1b"
    if plan_sim "$model" "$n" "$fit" zb "$model.$n.$fit.zb"; then
      row "$model, $n, B=$fit$note" "$model.$n.$fit.zb"
    else
      echo "| $model, $n, B=$fit | zb | failed: $(tail -1 "$TMP/$model.$n.$fit.zb.err" | cut -c1-100) | | | | | | | |"
    fi
  done
done
