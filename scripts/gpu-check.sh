#!/usr/bin/env bash
# The GPU checks of issue 14 in one run on a machine with one (or more) NVIDIA GPUs, CUDA, PyTorch 2.x,
# CMake and ninja, and gpu-deps/ carried from a Debian machine (scripts/build-gpu.sh deps). Budget:
# about 10 minutes on 16 cores + 1 GPU (the build takes most of it). Usage:
#   scripts/gpu-check.sh [OUT_DIR]          (OUT_DIR: $OUT or gpu-check-out)
# Writes OUT_DIR/gpu-check.log (every figure below, with the command that made it), OUT_DIR/profiles/
# h200-{mmt,dlrm,candle-uno}.json (copy them to profiles/ when the GPU is an H200) and the plans.
#   1. train --single --device cuda equals --device cpu (per-step loss within 1e-4 relative)
#   2. a 2- and a 4-device pipeline whose ranks share the GPU (Gloo, host staging) equals --single
#   3. profile --device cuda of the paper models' ops at b = 1..64
#   4. plan mmt, dlrm, candle-uno on the h200 preset with those profiles: GraphPipe vs PipeDream
#   5. measured single-GPU step time of a mid-sized model (mmt with 2 layers) vs the prediction
#   6. peak GPU memory (the CUDA caching allocator's) vs the prediction, per rank of the 2-rank pipeline
#   7. the communicators on the GPU: --comm gloo-pairs (NCCL's channels and order, host-staged) == --single;
#      --comm nccl with one GPU per rank where there are at least 2 GPUs (NCCL refuses two ranks on one
#      GPU, so a 1-GPU machine cannot run it)
# Exit 0 when every check ran and the equality checks passed; failures are listed at the end.
# A dry run of the script itself on a CPU machine: DEVICE=cpu BUILD=build MODELS=candle-uno BATCHES=1,2
# MID=candle-uno:hidden=256 scripts/gpu-check.sh /tmp/gc (the figures then mean nothing).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-gpu-check-out}}
BUILD=${BUILD:-build-gpu}
GP=$BUILD/graphpipe
PY=${PYTHON:-python3}
BATCHES=${BATCHES:-1,2,4,8,16,32,64}
DEVICE=${DEVICE:-cuda}
MODELS=${MODELS:-"mmt dlrm candle-uno"}
MID=${MID:-mmt:layers=2}  # a mid-sized model whose op signatures the first model's profile covers
mkdir -p "$OUT/profiles" "$OUT/work"
W=$OUT/work
exec > >(tee "$OUT/gpu-check.log") 2>&1
exec 3>&1  # say() writes here, past the redirections of the command it announces
START=$(date +%s)
FAILED=()
say() { echo "[$(($(date +%s) - START))s] $*" >&3; }
run() { say "\$ $*"; "$@"; }
fail() { FAILED+=("$1"); say "FAILED: $1"; }

say "gpu-check: $(date -u +%F) on $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -4 | paste -sd';')"
say "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) x $(nproc)"
if [ ! -x "$GP" ]; then
  say "building $GP (scripts/build-gpu.sh, log $OUT/build.log)"
  scripts/build-gpu.sh "$BUILD" >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; fail build; exit 1; }
  grep "^build-gpu: torch" "$OUT/build.log"
fi

# compare A.jsonl B.jsonl TOL NAME: per-step losses of two --log files within TOL relative.
compare() {
  "$PY" - "$@" <<'EOF'
import json, sys
a, b, tol, name = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
la = [json.loads(l)["loss"] for l in open(a)]
lb = [json.loads(l)["loss"] for l in open(b)]
worst = max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(la, lb)) if la and len(la) == len(lb) else float("inf")
print(f"{name}: {len(la)} vs {len(lb)} steps, losses {la[:1]}..{la[-1:]} vs {lb[:1]}..{lb[-1:]}, "
      f"max relative difference {worst:.3g} (tolerance {tol:g}): {'PASS' if worst <= tol else 'FAIL'}")
sys.exit(0 if worst <= tol else 1)
EOF
}

run "$GP" --version

# 1. --single on the GPU equals the CPU.
SMALL="mmt:branches=2,layers=2,hidden=64,seq=16,heads=4,ffn=128"
TRAIN=(--model "$SMALL" --batch 16 --steps 5 --optimizer sgd --lr 0.05)
run "$GP" train --single "${TRAIN[@]}" --device cpu --log "$W/single-cpu.jsonl" >/dev/null || fail "single cpu"
run "$GP" train --single "${TRAIN[@]}" --device "$DEVICE" --log "$W/single-cuda.jsonl" >/dev/null || fail "single cuda"
compare "$W/single-cuda.jsonl" "$W/single-cpu.jsonl" 1e-4 "check 1: --single cuda vs cpu" || fail "check 1"

# 2. Pipelines whose ranks share the GPU (every rank: GPU LOCAL_RANK % 1 = 0; Gloo with host staging).
for n in 2 4; do
  run "$GP" plan --model "$SMALL" --cluster h200 --devices "$n" --batch 16 --optimizer sgd \
    --out "$W/plan$n.json" >/dev/null || { fail "plan $n"; continue; }
  "$PY" -c "import json,sys; p=json.load(open(sys.argv[1])); print('plan%s: %d stages on %d ranks' % (sys.argv[2], len(p['stages']), sum(len(s['devices']) for s in p['stages'])))" "$W/plan$n.json" "$n"
  run "$GP" train --plan "$W/plan$n.json" --steps 5 --optimizer sgd --lr 0.05 --device "$DEVICE" \
    --log "$W/pipe$n-cuda.jsonl" >/dev/null || { fail "pipeline $n cuda"; continue; }
  compare "$W/pipe$n-cuda.jsonl" "$W/single-cuda.jsonl" 1e-4 "check 2: $n-rank pipeline on one $DEVICE device vs --single" ||
    fail "check 2 ($n ranks)"
done

# 3. Profiles of the paper models' ops on this GPU.
for m in $MODELS; do
  run "$GP" profile --model "$m" --device "$DEVICE" --batches "$BATCHES" --warmup 3 --repeats 10 \
    --out "$OUT/profiles/h200-$m.json" 2>"$W/profile-$m.err" | tail -1 || { tail -5 "$W/profile-$m.err"; fail "profile $m"; }
done

# 4. GraphPipe vs PipeDream with the measured profiles (mini-batch 32 per device, as scripts/paper.sh).
for m in $MODELS; do
  [ -f "$OUT/profiles/h200-$m.json" ] || continue
  for n in 8 16; do
    for planner in pipedream graphpipe; do
      tag="$m.$n.$planner"
      "$GP" plan --model "$m" --cluster h200 --devices "$n" --batch $((32 * n)) --planner "$planner" \
        --profile "$OUT/profiles/h200-$m.json" --out "$W/$tag.plan.json" >/dev/null 2>"$W/$tag.err" &&
        "$GP" simulate --plan "$W/$tag.plan.json" --json >"$W/$tag.sim.json" 2>>"$W/$tag.err" ||
        { tail -2 "$W/$tag.err"; fail "plan $tag"; }
    done
    "$PY" - "$W/$m.$n.graphpipe.sim.json" "$W/$m.$n.pipedream.sim.json" "$m" "$n" <<'EOF' || true
import json, sys
g, p = (json.load(open(f)) for f in sys.argv[1:3])
t = lambda s: s["throughput_samples_per_s"]
print(f"check 4: {sys.argv[3]} on {sys.argv[4]} x h200 (measured profile): GraphPipe {t(g):.1f} samples/s "
      f"({g['num_stages']} stages), PipeDream {t(p):.1f} ({p['num_stages']} stages), {t(g) / t(p):.2f}x")
EOF
  done
done

# 5. Measured single-GPU step time vs the prediction (mmt's layers share the profiled signatures).
PROF="$OUT/profiles/h200-${MID%%:*}.json"
if [ -f "$PROF" ]; then
  run "$GP" plan --model "$MID" --cluster h200 --devices 1 --batch 32 --micro-batch 32 \
    --profile "$PROF" --out "$W/mid.plan.json" >/dev/null &&
    "$GP" simulate --plan "$W/mid.plan.json" --json >"$W/mid.sim.json" || fail "plan $MID"
  run "$GP" train --single --model "$MID" --batch 32 --steps 12 --device "$DEVICE" --json >"$W/mid.train.json" ||
    fail "train $MID"
  "$PY" - "$W/mid.sim.json" "$W/mid.train.json" "$MID" <<'EOF' || true
import json, sys
sim, tr = (json.load(open(f)) for f in sys.argv[1:3])
pred = 32 / sim["throughput_samples_per_s"]
meas = tr["iteration_time_s"]
print(f"check 5: {sys.argv[3]} at batch 32 on one device: measured {meas * 1e3:.1f} ms per step (median of 11), "
      f"predicted {pred * 1e3:.1f} ms (simulate, measured profile), measured/predicted {meas / pred:.2f}")
EOF
fi

# 6. Peak GPU memory of each rank of the 2-rank pipeline (caching allocator) vs the cost model.
if [ -f "$W/plan2.json" ]; then
  run "$GP" train --plan "$W/plan2.json" --steps 3 --optimizer sgd --lr 0.05 --device "$DEVICE" --json \
    >"$W/pipe2-mem.json" || fail "memory run"
  "$PY" - "$W/pipe2-mem.json" <<'EOF' || true
import json, sys
for r in json.load(open(sys.argv[1]))["ranks"]:
    m, p = r["peak_memory_bytes"], r["predicted_memory_bytes"]
    print(f"check 6: rank {r['rank']} stage {r['stage']}: measured peak {m / 1e6:.2f} MB (CUDA caching allocator), "
          f"predicted {p / 1e6:.2f} MB, measured/predicted {m / p:.2f}")
EOF
fi

# 7. Communicators on the GPU.
if [ -f "$W/plan2.json" ]; then
  run "$GP" train --plan "$W/plan2.json" --steps 5 --optimizer sgd --lr 0.05 --device "$DEVICE" --comm gloo-pairs \
    --log "$W/pairs2-cuda.jsonl" || fail "gloo-pairs cuda"
  compare "$W/pairs2-cuda.jsonl" "$W/single-cuda.jsonl" 1e-4 "check 7: --comm gloo-pairs on $DEVICE vs --single" ||
    fail "check 7 (gloo-pairs)"
  GPUS=$("$PY" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
  if [ "$GPUS" -ge 2 ]; then
    run "$GP" train --plan "$W/plan2.json" --steps 5 --optimizer sgd --lr 0.05 --device "$DEVICE" --comm nccl \
      --log "$W/nccl2.jsonl" || fail "nccl"
    compare "$W/nccl2.jsonl" "$W/single-cuda.jsonl" 1e-4 "check 7: --comm nccl, 2 GPUs vs --single" || fail "check 7 (nccl)"
  else
    say "check 7: NCCL between ranks not run: $GPUS GPU(s) here, and NCCL needs one GPU per rank"
  fi
fi

say "done in $(($(date +%s) - START)) s; failed: ${FAILED[*]:-none}"
[ ${#FAILED[@]} -eq 0 ]
