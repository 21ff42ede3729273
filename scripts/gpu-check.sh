#!/usr/bin/env bash
# The GPU checks of issue 14 in one run on a machine with one (or more) NVIDIA GPUs, CUDA, PyTorch 2.x,
# CMake and ninja, and gpu-deps/ carried from a Debian machine (scripts/build-gpu.sh deps), or a binary
# built elsewhere (BUILD, below). Time: 166 s on an H200 with 16 cores and a carried binary
# (2026-12-04); building there adds several minutes. Usage:
#   scripts/gpu-check.sh [OUT_DIR]          (OUT_DIR: $OUT or gpu-check-out)
# Writes OUT_DIR/gpu-check.log (every figure below, with the command that made it), OUT_DIR/profiles/
# h200-{mmt,dlrm,candle-uno}.json (copy them to profiles/ when the GPU is an H200), OUT_DIR/ranking.md
# (check 8), OUT_DIR/pipe4-cuda.trace.json (a 4-stage pipeline's measured timeline), OUT_DIR/vs-torch-
# {small,wide}.json (check 9) and the plans.
#   1. train --single --device cuda equals --device cpu (per-step loss within 1e-4 relative)
#   2. a 2- and a 4-device pipeline whose ranks share the GPU (Gloo, host staging) equals --single, also with
#      all ranks on one core (taskset -c 0: inputs made on the spot, not ahead on a spare core)
#   3. profile --device cuda of the paper models' ops at b = 1..64
#   4. plan mmt, dlrm, candle-uno on the h200 preset with those profiles: GraphPipe vs PipeDream
#   5. measured single-GPU step time of a mid-sized model (mmt with 2 layers) vs the prediction
#   6. peak GPU memory (the CUDA caching allocator's) vs the prediction, per rank of the 2-rank pipeline
#   7. the communicators on the GPU: --comm gloo-pairs (NCCL's channels and order, host-staged) == --single;
#      --comm nccl with one GPU per rank where there are at least 2 GPUs (NCCL refuses two ranks on one
#      GPU, so a 1-GPU machine cannot run it)
#   8. the ranking table on this GPU (scripts/fidelity_rank.py --devices 1 --cluster h200 --device cuda with
#      the measured profile): the planner's 1-GPU plan against fixed small micro-batches, interleaved
#   9. graphpipe train --single against plain PyTorch on the GPU (bench/vs_torch.py --device cuda), the
#      models at the CPU comparison's sizes and wider: equal losses, step times side by side
# The checks run in the order 1, 2, 3 (the first model), 5, 6, 7, 8, 3 (the others), 4, 9: with BUDGET_S set,
# a check that would start later than BUDGET_S seconds in is skipped (and listed), so that a leased
# machine's minutes go to the most important checks first. CHECKS="N ..." runs only those (check 1 always
# runs: it is a few seconds, and the others compare with it).
# A graphpipe already built elsewhere can be used: BUILD=DIR with DIR/graphpipe and, in DIR/lib, the
# shared libraries it needs beyond LibTorch and CUDA's (Debian's libonnx, libonnx_proto, libprotobuf). It
# must be built against the same torch version as this machine's (graphpipe --version says which); the
# script puts this machine's torch/lib and CUDA runtime first on LD_LIBRARY_PATH and builds afresh in
# build-gpu if that binary does not start.
# Exit 0 when every check ran and the equality checks passed; failures are listed at the end.
# A dry run of the script itself on a CPU machine: DEVICE=cpu BUILD=build MODELS=candle-uno BATCHES=1,2
# MID=candle-uno:hidden=256 VS_SIZES=small VS_ROUNDS=1 VS_STEPS=12 scripts/gpu-check.sh /tmp/gc (the figures then
# mean nothing).
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
BUDGET_S=${BUDGET_S:-0}
W=${WORK:-$OUT/work}  # the plans, logs and simulations (WORK: elsewhere, e.g. to bring back only the results)
RANK_MODEL=${RANK_MODEL:-$MID}
RANK_BATCH=${RANK_BATCH:-32}
RANK_MBS=${RANK_MBS:-4,8}
mkdir -p "$OUT/profiles" "$W"
exec > >(tee "$OUT/gpu-check.log") 2>&1
exec 3>&1  # say() writes here, past the redirections of the command it announces
START=$(date +%s)
FAILED=()
SKIPPED=()
say() { echo "[$(($(date +%s) - START))s] $*" >&3; }
run() { say "\$ $*"; "$@"; }
fail() { FAILED+=("$1"); say "FAILED: $1"; }
# due NAME: false (and NAME listed as skipped) once BUDGET_S seconds have passed; false (silently) for a
# check whose number CHECKS (a space-separated list, e.g. CHECKS="5 9") leaves out.
due() {
  local num=${1#check }
  num=${num%% *}
  if [ -n "${CHECKS:-}" ]; then case " $CHECKS " in *" $num "*) ;; *) return 1 ;; esac; fi
  [ "$BUDGET_S" = 0 ] || [ $(($(date +%s) - START)) -lt "$BUDGET_S" ] && return 0
  SKIPPED+=("$1")
  say "skipped $1: past BUDGET_S=$BUDGET_S s"
  return 1
}

say "gpu-check: $(date -u +%F) on $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -4 | paste -sd';')"
say "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) x $(nproc)"
# This machine's LibTorch and CUDA runtime first, then a prebuilt binary's own libraries.
TORCH_LIB=$("$PY" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))' 2>/dev/null)
CUDART=$("$PY" - <<'EOF' 2>/dev/null
import glob, os, site
roots = site.getsitepackages() + ["/usr/local/cuda/lib64", "/usr/local/cuda/lib"]
hits = [h for r in roots for h in sorted(glob.glob(os.path.join(r, "**", "libcudart.so.1[0-9]*"), recursive=True))]
print(os.path.dirname(hits[0]) if hits else "")
EOF
)
export LD_LIBRARY_PATH=${TORCH_LIB:+$TORCH_LIB:}${CUDART:+$CUDART:}$BUILD/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
say "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
if [ -x "$GP" ] && ! "$GP" --version >"$W/version.txt" 2>&1; then
  say "$GP does not start here ($(tail -2 "$W/version.txt" | paste -sd' ')); building afresh in build-gpu"
  BUILD=build-gpu
  GP=$BUILD/graphpipe
fi
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
"$PY" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda, "GPUs", torch.cuda.device_count(),
  torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")' 2>&1 || true

# 1. --single on the GPU equals the CPU.
SMALL="mmt:branches=2,layers=2,hidden=64,seq=16,heads=4,ffn=128"
TRAIN=(--model "$SMALL" --batch 16 --steps 5 --optimizer sgd --lr 0.05)
run "$GP" train --single "${TRAIN[@]}" --device cpu --log "$W/single-cpu.jsonl" >/dev/null || fail "single cpu"
run "$GP" train --single "${TRAIN[@]}" --device "$DEVICE" --log "$W/single-cuda.jsonl" >/dev/null || fail "single cuda"
compare "$W/single-cuda.jsonl" "$W/single-cpu.jsonl" 1e-4 "check 1: --single cuda vs cpu" || fail "check 1"

# 2. Pipelines whose ranks share the GPU (every rank: GPU LOCAL_RANK % 1 = 0; Gloo with host staging).
for n in 2 4; do
  due "check 2 ($n ranks)" || continue
  # --no-data-parallel: a pipeline of 2+ stages (a model this small fits one H200 whole)
  run "$GP" plan --model "$SMALL" --cluster h200 --devices "$n" --batch 16 --optimizer sgd --no-data-parallel \
    --out "$W/plan$n.json" >/dev/null || { fail "plan $n"; continue; }
  "$PY" -c "import json,sys; p=json.load(open(sys.argv[1])); print('plan%s: %d stages on %d ranks' % (sys.argv[2], len(p['stages']), sum(len(s['devices']) for s in p['stages'])))" "$W/plan$n.json" "$n"
  trace=()
  [ "$n" = 4 ] && trace=(--trace "$OUT/pipe4-$DEVICE.trace.json")  # the measured timeline, for Perfetto
  run "$GP" train --plan "$W/plan$n.json" --steps 5 --optimizer sgd --lr 0.05 --device "$DEVICE" "${trace[@]}" \
    --log "$W/pipe$n-cuda.jsonl" >/dev/null || { fail "pipeline $n cuda"; continue; }
  compare "$W/pipe$n-cuda.jsonl" "$W/single-cuda.jsonl" 1e-4 "check 2: $n-rank pipeline on one $DEVICE device vs --single" ||
    fail "check 2 ($n ranks)"
  # Again with every rank on one core (taskset): no core to spare, so each rank makes its inputs on the
  # spot instead of ahead on a thread; same upload, same losses.
  if command -v taskset >/dev/null; then
    run taskset -c 0 "$GP" train --plan "$W/plan$n.json" --steps 5 --optimizer sgd --lr 0.05 --device "$DEVICE" \
      --log "$W/pipe$n-onecore.jsonl" >/dev/null || { fail "pipeline $n cuda on one core"; continue; }
    compare "$W/pipe$n-onecore.jsonl" "$W/single-cuda.jsonl" 1e-4 \
      "check 2: $n-rank pipeline, all ranks on one core (inputs made on the spot) vs --single" ||
      fail "check 2 ($n ranks, one core)"
  fi
done

# 3. Profiles of the paper models' ops on this GPU (the first model here, the others after check 8).
profile() {
  due "check 3 ($1)" || return 0
  run timeout "${PROFILE_TIMEOUT_S:-200}" "$GP" profile --model "$1" --device "$DEVICE" --batches "$BATCHES" --warmup 3 --repeats 10 \
    --out "$OUT/profiles/h200-$1.json" 2>"$W/profile-$1.err" | tail -1 || { tail -5 "$W/profile-$1.err"; fail "profile $1"; }
}
read -r -a MODEL_LIST <<<"$MODELS"
profile "${MODEL_LIST[0]}"

# 5. Measured single-GPU step time vs the prediction (mmt's layers share the profiled signatures), the
# prediction made with the measured profile and with the preset's datasheet figures alone.
PROF="$OUT/profiles/h200-${MID%%:*}.json"
if [ -f "$PROF" ] && due "check 5"; then
  run "$GP" plan --model "$MID" --cluster h200 --devices 1 --batch 32 --micro-batch 32 \
    --profile "$PROF" --out "$W/mid.plan.json" >/dev/null &&
    "$GP" simulate --plan "$W/mid.plan.json" --json >"$W/mid.sim.json" || fail "plan $MID"
  run "$GP" plan --model "$MID" --cluster h200 --devices 1 --batch 32 --micro-batch 32 \
    --out "$W/mid-preset.plan.json" >/dev/null &&
    "$GP" simulate --plan "$W/mid-preset.plan.json" --json >"$W/mid-preset.sim.json" || fail "plan $MID (preset)"
  run "$GP" train --single --model "$MID" --batch 32 --steps 12 --device "$DEVICE" --json >"$W/mid.train.json" ||
    fail "train $MID"
  "$PY" - "$W/mid.sim.json" "$W/mid-preset.sim.json" "$W/mid.train.json" "$MID" <<'EOF' || true
import json, sys
sim, preset, tr = (json.load(open(f)) for f in sys.argv[1:4])
meas = tr["iteration_time_s"]
for name, s in (("measured profile", sim), ("h200 preset alone, no profile", preset)):
    pred = 32 / s["throughput_samples_per_s"]
    print(f"check 5: {sys.argv[4]} at batch 32 on one device: measured {meas * 1e3:.2f} ms per step (median of 11), "
          f"predicted {pred * 1e3:.2f} ms (simulate, {name}), measured/predicted {meas / pred:.2f}")
EOF
fi

# 6. Peak GPU memory of each rank of the 2-rank pipeline (caching allocator) vs the cost model; again
# without cuBLAS's workspaces (CUBLAS_WORKSPACE_CONFIG=:0:0), which the allocator counts and the
# prediction leaves to the device reserve (on an H200 about 64 MiB a process, 2026-12-04: consistent
# with 32 MiB for each of two cuBLAS handles, the forward's thread's and autograd's).
if [ -f "$W/plan2.json" ] && due "check 6"; then
  for ws in "" CUBLAS_WORKSPACE_CONFIG=:0:0; do
    run env $ws "$GP" train --plan "$W/plan2.json" --steps 3 \
      --optimizer sgd --lr 0.05 --device "$DEVICE" --json >"$W/pipe2-mem.json" || fail "memory run"
    "$PY" - "$W/pipe2-mem.json" "${ws:-cuBLAS workspaces as by default}" <<'EOF' || true
import json, sys
for r in json.load(open(sys.argv[1]))["ranks"]:
    if r["stage"] < 0:
        continue  # a rank the plan leaves idle
    m, p = r["peak_memory_bytes"], r["predicted_memory_bytes"]
    print(f"check 6: rank {r['rank']} stage {r['stage']}: measured peak {m / 1e6:.2f} MB (CUDA caching allocator, "
          f"{sys.argv[2]}), predicted {p / 1e6:.2f} MB, measured/predicted {m / p:.2f}")
EOF
  done
fi

# 7. Communicators on the GPU.
if [ -f "$W/plan2.json" ] && due "check 7"; then
  run "$GP" train --plan "$W/plan2.json" --steps 5 --optimizer sgd --lr 0.05 --device "$DEVICE" --comm gloo-pairs \
    --log "$W/pairs2-cuda.jsonl" >/dev/null || fail "gloo-pairs cuda"
  compare "$W/pairs2-cuda.jsonl" "$W/single-cuda.jsonl" 1e-4 "check 7: --comm gloo-pairs on $DEVICE vs --single" ||
    fail "check 7 (gloo-pairs)"
  GPUS=$("$PY" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
  if [ "$GPUS" -ge 2 ]; then
    run "$GP" train --plan "$W/plan2.json" --steps 5 --optimizer sgd --lr 0.05 --device "$DEVICE" --comm nccl \
      --log "$W/nccl2.jsonl" >/dev/null || fail "nccl"
    compare "$W/nccl2.jsonl" "$W/single-cuda.jsonl" 1e-4 "check 7: --comm nccl, 2 GPUs vs --single" || fail "check 7 (nccl)"
  else
    say "check 7: NCCL between ranks not run: $GPUS GPU(s) here, and NCCL needs one GPU per rank"
  fi
fi

# 8. The ranking table on this GPU: the planner's 1-GPU plan against fixed small micro-batches.
RPROF="$OUT/profiles/h200-${RANK_MODEL%%:*}.json"
if [ -f "$RPROF" ] && due "check 8"; then
  run "$PY" scripts/fidelity_rank.py "$GP" "$RANK_MODEL" "$RANK_BATCH" "$OUT/ranking.md" --devices 1 \
    --micro-batch "$RANK_MBS" --cluster h200 --profile "$RPROF" --device "$DEVICE" --steps 20 \
    --min-round-s 0.2 --label "check 8: one $DEVICE device" || fail "check 8"
fi

# 3, the other models' profiles.
for m in "${MODEL_LIST[@]:1}"; do profile "$m"; done

# 4. GraphPipe vs PipeDream with the measured profiles (mini-batch 32 per device, as scripts/paper.sh).
for m in $MODELS; do
  [ -f "$OUT/profiles/h200-$m.json" ] || continue
  due "check 4 ($m)" || continue
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

# 9. graphpipe train --single against plain PyTorch on this GPU (bench/vs_torch.py --device cuda): same
# models, weights, data and SGD; losses within 1e-4 relative over 10 steps, then interleaved timing
# rounds. Twice: at the CPU comparison's sizes (a few ms a step: the per-op launch cost of each side)
# and wider, where the GPU's arithmetic dominates.
if due "check 9"; then
  for size in ${VS_SIZES:-small wide}; do
    args=()
    [ $size = wide ] && args=(--batch 512 --seq 64 --d-model 1024 --ffn 4096 --layers 4 --uno-hidden 2048
      --tower-input 512 --tower-width 2048)
    run "$PY" bench/vs_torch.py --graphpipe "$GP" --device "$DEVICE" --no-pipelines --rounds "${VS_ROUNDS:-3}" \
      --steps "${VS_STEPS:-20}" "${args[@]}" --out "$OUT/vs-torch-$size.json" --work "$W/vs-torch-$size" \
      >"$W/vs-torch-$size.out" 2>&1 || fail "check 9 ($size)"
    sed -n '/^graphpipe vs PyTorch/,$p' "$W/vs-torch-$size.out" | sed "s/^/check 9 ($size): /"
  done
fi

say "done in $(($(date +%s) - START)) s; failed: ${FAILED[*]:-none}; skipped: ${SKIPPED[*]:-none}"
[ ${#FAILED[@]} -eq 0 ] && [ ${#SKIPPED[@]} -eq 0 ]
