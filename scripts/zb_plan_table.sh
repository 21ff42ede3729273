#!/usr/bin/env bash
# Zero-bubble vs 1F1B in the planner (issue 33 item 5, planner half): for mmt, dlrm and candle-uno
# at 8 and 32 summit devices, plan for 1f1b and for zb (`plan --schedule`), simulate each plan under
# its own schedule (`simulate` runs the schedule the plan records) and print one markdown table row
# per plan: simulated iteration time, throughput, bubble fraction, peak memory, stages, depth,
# micro-batch sizes, and the planner's prediction over the simulation.
#
# Two settings per model and device count, both at mini-batch 128 on summit (16 GB V100s):
#   16 GB       the devices' own memory
#   small mem   a small-memory cluster: --memory-limit = the device reserve + SHARE x the peak memory
#               of the 1F1B plan at 16 GB (so the bound binds the 1F1B plan; SHARE default 0.9); both
#               schedules are planned under that same bound. (At 16 GB no mini-batch of 128 x 2^k up
#               to 8,192 reaches the memory limit on these models: the planner keeps the micro-batch
#               small, so a mini-batch ladder does not bind.)
#
# Usage: scripts/zb_plan_table.sh [BUILD_DIR] > table.md
#   MODELS="mmt dlrm candle-uno" DEVICES="8 32" SHARE=0.9 override the sweep.
set -uo pipefail
BUILD=${1:-build}
GP=$BUILD/graphpipe
MODELS=${MODELS:-"mmt dlrm candle-uno"}
DEVICES=${DEVICES:-"8 32"}
SHARE=${SHARE:-0.9}
[ -x "$GP" ] || { echo "zb_plan_table.sh: $GP not found; build it first" >&2; exit 2; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# plan_sim MODEL N BATCH SCHEDULE TAG [PLAN ARGS...]: plan and simulate; 0 when both worked, 2 when
# no plan fits.
plan_sim() {
  local model=$1 n=$2 batch=$3 sched=$4 tag=$5
  shift 5
  "$GP" plan --model "$model" --cluster summit --devices "$n" --batch "$batch" --schedule "$sched" "$@" \
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
    # The small-memory cluster: a bound below the 1F1B plan's peak at 16 GB.
    [ -f "$TMP/$model.$n.128.1f1b.plan.json" ] || continue
    gb=$(python3 -c "import json,sys; p=json.load(open(sys.argv[1])); d=p['costs']['cluster']['device']; print('%.3f' % ((d['memory_reserve_bytes'] + float(sys.argv[2]) * max(p['predicted']['peak_memory_bytes'])) / 1e9))" \
      "$TMP/$model.$n.128.1f1b.plan.json" "$SHARE")
    for sched in 1f1b zb; do
      tag="$model.$n.small.$sched"
      if plan_sim "$model" "$n" 128 "$sched" "$tag" --memory-limit "$gb"; then
        row "$model, $n, B=128, --memory-limit $gb" "$tag"
      else
        echo "| $model, $n, B=128, --memory-limit $gb | $sched | failed: $(tail -1 "$TMP/$tag.err" | cut -c1-100) | | | | | | | |"
      fi
    done
  done
done
