#!/usr/bin/env bash
# Zero-bubble vs 1F1B in the simulator on the SAME plan (issue 33 item 5, "same plan, two
# schedules"): for mmt, dlrm and candle-uno at 8 and 32 summit devices (mini-batch 128) make one
# plan with `graphpipe plan` (1f1b), then simulate it under 1f1b and under zb, once with the pass
# order `train` runs (the plan's pass times: 1:1:1 scaled by each stage's tps for a 1f1b plan) and
# once ordered by the simulator's own pass times (--zb-times sim). Prints one markdown row per run:
# iteration time, throughput, bubble fraction (idle share of device time), the largest per-device
# peak memory and whether every device's peak equals its 1F1B peak.
#
# A second table does the same at the memory limit (the issue's "mini-batch 128 and at the memory
# limit"; the paper's mini-batches "such that the system operates close to the memory limit", as
# `make paper`'s sweep picks them): per model and device count, the 1F1B plan of the mini-batches
# (LADDER per device) x devices in turn until its peak reaches NEAR of the usable memory (device
# memory minus the preset's reserve); the last one that fits when none does. The planner keeps
# growing mini-batches within the memory by its micro-batch size, so the memory binds the plan's
# micro-batch and in-flight counts, not the mini-batch. Both schedules run that one plan.
#
# Usage: scripts/zb_sim_table.sh [BUILD_DIR] > table.md
#   MODELS="mmt dlrm candle-uno" DEVICES="8 32" BATCH=128 override the sweep;
#   LADDER="32 128 512 2048 8192 32768" (per device), NEAR=0.8 the memory-limit rows (LADDER= skips them);
#   SVG_DIR=docs/img writes SVG timelines of mmt at 8 devices (zb_mmt8_1f1b.svg, zb_mmt8_zb.svg).
set -uo pipefail
BUILD=${1:-build}
GP=$BUILD/graphpipe
MODELS=${MODELS:-"mmt dlrm candle-uno"}
DEVICES=${DEVICES:-"8 32"}
BATCH=${BATCH:-128}
LADDER=${LADDER-"32 128 512 2048 8192 32768"}
NEAR=${NEAR:-0.8}
SVG_DIR=${SVG_DIR:-}
[ -x "$GP" ] || { echo "zb_sim_table.sh: $GP not found; build it first" >&2; exit 2; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# row LABEL SIM BASE_SIM [DIGITS]: one markdown row (the bubble with DIGITS decimals, default 1);
# peaks compared with the 1f1b run's per device.
row() {
  python3 - "$@" <<'PY'
import json, sys
label, sim, base = sys.argv[1], json.load(open(sys.argv[2])), json.load(open(sys.argv[3]))
digits = int(sys.argv[4]) if len(sys.argv) > 4 else 1
same = "yes" if sim["peak_memory_bytes"] == base["peak_memory_bytes"] else "no"
gain = base["iteration_time_s"] / sim["iteration_time_s"]
print("| %s | %.3f | %.1f | %.3fx | %.*f | %.3f | %s | %d / %d |" % (
    label, sim["iteration_time_s"] * 1e3, sim["throughput_samples_per_s"], gain,
    digits, sim["bubble_fraction"] * 100, sim["peak_memory_max_bytes"] / 1e9, same,
    sim["num_stages"], sim["pipeline_depth"]))
PY
}

echo "| model, devices, schedule | iteration ms | samples/s | vs 1f1b | bubble % | peak memory GB (max) | per-device peaks = 1f1b | stages / depth |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | --- | --- |"
for model in $MODELS; do
  for n in $DEVICES; do
    tag=$model.$n
    if ! "$GP" plan --model "$model" --cluster summit --devices "$n" --batch "$BATCH" \
      --out "$TMP/$tag.plan.json" >"$TMP/$tag.plan.out" 2>"$TMP/$tag.err"; then
      echo "| $model, $n | plan failed: $(tail -1 "$TMP/$tag.err" | cut -c1-80) | | | | | | |"
      continue
    fi
    svg_f=() svg_z=()
    if [ -n "$SVG_DIR" ] && [ "$model" = mmt ] && [ "$n" = 8 ]; then
      svg_f=(--svg "$SVG_DIR/zb_mmt8_1f1b.svg")
      svg_z=(--svg "$SVG_DIR/zb_mmt8_zb.svg")
    fi
    ok=1
    "$GP" simulate --plan "$TMP/$tag.plan.json" --schedule 1f1b --json "${svg_f[@]}" >"$TMP/$tag.1f1b.json" 2>>"$TMP/$tag.err" || ok=0
    "$GP" simulate --plan "$TMP/$tag.plan.json" --schedule zb --json "${svg_z[@]}" >"$TMP/$tag.zb.json" 2>>"$TMP/$tag.err" || ok=0
    "$GP" simulate --plan "$TMP/$tag.plan.json" --schedule zb --zb-times sim --json >"$TMP/$tag.zbsim.json" 2>>"$TMP/$tag.err" || ok=0
    if [ $ok = 0 ]; then
      echo "| $model, $n | simulate failed: $(tail -1 "$TMP/$tag.err" | cut -c1-80) | | | | | | |"
      continue
    fi
    row "$model, $n, 1f1b" "$TMP/$tag.1f1b.json" "$TMP/$tag.1f1b.json"
    row "$model, $n, zb" "$TMP/$tag.zb.json" "$TMP/$tag.1f1b.json"
    row "$model, $n, zb (sim times)" "$TMP/$tag.zbsim.json" "$TMP/$tag.1f1b.json"
  done
done

[ -n "$LADDER" ] || exit 0

# peak_share PLAN: the plan's predicted largest per-device peak over the usable memory.
peak_share() {
  python3 -c "import json,sys; p=json.load(open(sys.argv[1])); d=p['costs']['cluster']['device']; print('%.3f' % (max(p['predicted']['peak_memory_bytes']) / (d['memory_bytes'] - d['memory_reserve_bytes'])))" "$1"
}

echo
echo "At the memory limit: the first mini-batch of (${LADDER}) x devices whose 1F1B plan's peak reaches ${NEAR} of the usable memory (else the largest that fits):"
echo
echo "| model, devices, mini-batch, schedule | iteration ms | samples/s | vs 1f1b | bubble % | peak memory GB (max) | per-device peaks = 1f1b | stages / depth | peak / usable |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | --- | --- | ---: |"
for model in $MODELS; do
  for n in $DEVICES; do
    tag=$model.$n.limit batch=0 share=0
    for pd in $LADDER; do
      b=$((pd * n))
      "$GP" plan --model "$model" --cluster summit --devices "$n" --batch "$b" --out "$TMP/try.json" \
        >/dev/null 2>"$TMP/try.err" || break
      mv "$TMP/try.json" "$TMP/$tag.plan.json"
      batch=$b share=$(peak_share "$TMP/$tag.plan.json")
      awk -v s="$share" -v t="$NEAR" 'BEGIN { exit !(s >= t) }' && break
    done
    if [ "$batch" = 0 ]; then
      echo "| $model, $n | no mini-batch of the ladder fits: $(tail -1 "$TMP/try.err" | cut -c1-80) | | | | | | | |"
      continue
    fi
    ok=1
    for sched in 1f1b zb; do
      "$GP" simulate --plan "$TMP/$tag.plan.json" --schedule $sched --json >"$TMP/$tag.$sched.json" 2>>"$TMP/$tag.err" || ok=0
    done
    if [ $ok = 0 ]; then
      echo "| $model, $n, $batch | simulate failed: $(tail -1 "$TMP/$tag.err" | cut -c1-80) | | | | | | | |"
      continue
    fi
    for sched in 1f1b zb; do
      echo "$(row "$model, $n, $batch, $sched" "$TMP/$tag.$sched.json" "$TMP/$tag.1f1b.json" 2) $share |"
    done
  done
done
