#!/usr/bin/env bash
# Measured step time of 1f1b vs zb on THIS machine (issue 33 item 5, runtime half): one plan, the
# same weights and data, trained with `--schedule 1f1b` and `--schedule zb` alternately in one run
# (ROUNDS rounds of STEPS steps each, the order of the two swapped every round), then the medians of
# the per-run step times (each run's own median, first step left out) and their ratio. Finally one
# zb run with --trace shows where BI and W ran (counts and time per stage from the Perfetto JSON).
#
# The plan: the model cut into STAGES chain stages at layer boundaries (l0., l1., ... ; the rest on
# the last stage), one device each, micro-batch MICRO of mini-batch BATCH, SGD.
#
# Usage: scripts/zb_measure.sh [BUILD_DIR]
#   MODEL=gpt:... STAGES=2 BATCH=32 MICRO=4 STEPS=6 ROUNDS=3 THREADS=1 OUT=/tmp/zb_measure override.
set -euo pipefail
BUILD=${1:-build}
GP=$BUILD/graphpipe
MODEL=${MODEL:-gpt:layers=4,seq=32,hidden=256,heads=4,ffn=1024,vocab=256}
STAGES=${STAGES:-2}
BATCH=${BATCH:-32}
MICRO=${MICRO:-4}
STEPS=${STEPS:-6}
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-1}
OUT=${OUT:-/tmp/zb_measure}
[ -x "$GP" ] || { echo "zb_measure.sh: $GP not found; build it first" >&2; exit 2; }
mkdir -p "$OUT"

# A one-stage plan from the planner (its costs and predictions), re-cut into a chain of STAGES.
"$GP" plan --model "$MODEL" --cluster cpu --devices 1 --batch "$BATCH" --micro-batch "$MICRO" --optimizer sgd \
  --out "$OUT/plan1.json" >/dev/null
python3 - "$OUT/plan1.json" "$OUT/plan.json" "$STAGES" <<'PY'
import json, re, sys
src, dst, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
p = json.load(open(src))
ops = [o for s in p["stages"] for o in s["ops"]]
layers = sorted({int(m.group(1)) for o in ops if (m := re.match(r"l(\d+)\.", o))})
if len(layers) < n:
    sys.exit(f"zb_measure.sh: MODEL has {len(layers)} layers, fewer than STAGES={n}")
per = len(layers) / n
def stage_of(op):
    m = re.match(r"l(\d+)\.", op)
    if not m:
        return 0 if ops.index(op) < len(ops) // 2 and op.startswith(("wte", "emb")) else n - 1
    return min(n - 1, int(layers.index(int(m.group(1))) / per))
tps = p["stages"][0]["tps_s"] / n
stages = []
for i in range(n):
    stages.append({"id": i, "devices": [i], "ops": [o for o in ops if stage_of(o) == i],
                   "micro_batch_size": p["stages"][0]["micro_batch_size"], "in_flight": n - i,
                   "inputs_from": [i - 1] if i else [], "outputs_to": [i + 1] if i + 1 < n else [],
                   "tps_s": tps, "memory_bytes": p["stages"][0]["memory_bytes"]})
p["stages"] = stages
p["cluster"]["num_devices"] = n
if p.get("costs", {}).get("cluster"):
    p["costs"]["cluster"]["num_devices"] = n
p["predicted"] = {"bottleneck_tps_s": 0, "iteration_time_s": 0, "peak_memory_bytes": [0] * n,
                  "throughput_samples_per_s": 0}
p["planner"] = "manual"
json.dump(p, open(dst, "w"), indent=1)
PY

echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores; $MODEL, $STAGES stages, batch $BATCH, micro-batch $MICRO"
echo "# $ROUNDS rounds x {1f1b, zb} x $STEPS steps, --threads $THREADS"
run() {  # schedule round
  "$GP" train --plan "$OUT/plan.json" --schedule "$1" --steps "$STEPS" --optimizer sgd --lr 0.01 --threads "$THREADS" \
    --json >"$OUT/$1.$2.json"
  python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print(f\"round $2 $1: median step {j['iteration_time_s']*1e3:.1f} ms, final loss {j['final_loss']:.6f}\")" "$OUT/$1.$2.json"
}
for r in $(seq 1 "$ROUNDS"); do
  if [ $((r % 2)) -eq 1 ]; then run 1f1b "$r"; run zb "$r"; else run zb "$r"; run 1f1b "$r"; fi
done
"$GP" train --plan "$OUT/plan.json" --schedule zb --steps 2 --optimizer sgd --lr 0.01 --threads "$THREADS" \
  --trace "$OUT/zb_trace.json" --json >/dev/null
"$GP" train --plan "$OUT/plan.json" --schedule 1f1b --steps 2 --optimizer sgd --lr 0.01 --threads "$THREADS" \
  --trace "$OUT/1f1b_trace.json" --json >/dev/null
python3 - "$OUT" "$ROUNDS" <<'PY'
import json, statistics, sys, collections
out, rounds = sys.argv[1], int(sys.argv[2])
t = {s: [json.load(open(f"{out}/{s}.{r}.json"))["iteration_time_s"] for r in range(1, rounds + 1)] for s in ("1f1b", "zb")}
loss = {s: json.load(open(f"{out}/{s}.1.json"))["losses"] for s in ("1f1b", "zb")}
same = all(abs(a - b) <= 1e-5 * abs(a) for a, b in zip(loss["1f1b"], loss["zb"]))
m = {s: statistics.median(v) for s, v in t.items()}
print()
print("| schedule | step time per round (ms) | median (ms) |")
print("|---|---|---|")
for s in ("1f1b", "zb"):
    print(f"| {s} | {', '.join(f'{x*1e3:.1f}' for x in t[s])} | {m[s]*1e3:.1f} |")
print(f"\nzb / 1f1b median step time: {m['zb'] / m['1f1b']:.3f}; per-step losses equal within 1e-5: {'yes' if same else 'NO'}")
for s in ("1f1b", "zb"):
    ranks = json.load(open(f"{out}/{s}.1.json"))["ranks"]
    print(f"{s} measured peak tensor memory per rank (MB): " +
          ", ".join(f"{r['peak_memory_bytes'] / 1e6:.1f}" for r in ranks))
for s in ("1f1b", "zb"):
    j = json.load(open(f"{out}/{s}_trace.json"))
    busy = collections.defaultdict(float)
    count = collections.Counter()
    span = collections.defaultdict(lambda: [1e300, 0])
    for e in j["traceEvents"]:
        if e.get("ph") != "X" or e.get("tid") != 0:
            continue
        st = e["args"]["stage"]
        span[st][0] = min(span[st][0], e["ts"])
        span[st][1] = max(span[st][1], e["ts"] + e["dur"])
        if e["cat"] in ("recv",):
            continue
        kind = e["name"].split()[1]
        busy[(st, kind)] += e["dur"] / 1e3
        count[(st, kind)] += 1
    print(f"\n{s} trace ({out}/{s}_trace.json, last step):")
    for st in sorted(span):
        parts = ", ".join(f"{k} x{count[(st, k)]} {busy[(st, k)]:.1f} ms" for (x, k) in sorted(busy) if x == st)
        print(f"  stage {st}: step span {(span[st][1] - span[st][0]) / 1e3:.1f} ms; {parts}")
PY
