#!/usr/bin/env bash
# make soak: a bounded long run of the pipeline runtime with a crash in the middle.
#   1. plan a small multi-branch mmt on 4 devices (GraphPipe: one branch per device + a head);
#   2. train it uninterrupted for STEPS steps on 4 local worker processes (checkpoint at the end);
#   3. train it again with a checkpoint every EVERY steps and an injected SIGKILL of one worker in
#      step CRASH_STEP (GP_FAULT), check the job ended with a message naming the worker, that the
#      published checkpoint generation holds exactly one intact .pt per rank (no temporary files);
#   4. resume from those checkpoints to STEPS and compare: per-step losses of the resumed steps and
#      the final checkpoints (every rank's weights, `graphpipe checkpoint diff`) must be bit-identical.
# Prints a summary line per phase and exits non-zero on any difference.
set -euo pipefail
GP=${GP:-build/graphpipe}
STEPS=${SOAK_STEPS:-500}
EVERY=${SOAK_EVERY:-50}
CRASH_STEP=${SOAK_CRASH_STEP:-273}
CRASH_RANK=${SOAK_CRASH_RANK:-3}
MODEL=${SOAK_MODEL:-"mmt:branches=3,layers=1,seq=16,hidden=64,heads=4,ffn=128,classes=10"}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

now() { date +%s.%N; }
loss() { sed -E 's/.*"loss": ?([-0-9.eE+]+).*/\1/' "$1"; }  # the losses of a --log file, one per line
# Under pipefail never pipe into something that stops reading early (head, grep -m1/-q, sed q): the
# writer then dies of SIGPIPE (exit 141) once its output outgrows the pipe buffer. `sed -n 1p` reads
# to the end.
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

echo "== soak: $MODEL, $STEPS steps, 4 workers, checkpoint every $EVERY, crash of rank $CRASH_RANK in step $CRASH_STEP"
"$GP" plan --model "$MODEL" --cluster summit --devices 4 --batch 32 --out "$T/plan.json" | sed -n '1,7p'

t0=$(now)
"$GP" train --plan "$T/plan.json" --steps "$STEPS" --lr 0.001 --optimizer adam --seed 11 \
  --checkpoint-dir "$T/full" --log "$T/full.jsonl" --timeout 30 > "$T/full.out"
t1=$(now)
first_loss=$(loss "$T/full.jsonl" | sed -n 1p)
last_loss=$(loss "$T/full.jsonl" | tail -1)
echo "uninterrupted: $STEPS steps in $(secs "$t0" "$t1") s, loss $first_loss -> $last_loss; $(grep -m1 'iteration time' "$T/full.out" || true)"

set +e
GP_FAULT="rank=$CRASH_RANK,action=0,step=$CRASH_STEP,kind=crash" \
  "$GP" train --plan "$T/plan.json" --steps "$STEPS" --lr 0.001 --optimizer adam --seed 11 \
  --checkpoint-dir "$T/ck" --checkpoint-every "$EVERY" --log "$T/part1.jsonl" --timeout 30 > "$T/part1.out" 2> "$T/part1.err"
code=$?
set -e
t2=$(now)
if [ "$code" -eq 0 ]; then echo "FAIL: the injected crash did not stop the run"; exit 1; fi
echo "crashed run: exit $code after $(wc -l < "$T/part1.jsonl") logged steps in $(secs "$t1" "$t2") s"
echo "  message: $(tail -1 "$T/part1.err")"
grep -q "worker rank $CRASH_RANK .* was killed by signal 9" "$T/part1.err" || { echo "FAIL: message does not name rank $CRASH_RANK"; exit 1; }
# The published generation (latest.json names it) holds exactly one intact .pt per rank; an interrupted
# save may have left a folder of its own, which the resume names and the next save removes.
gen=$(sed -nE 's/.*"generation":"([^"]+)".*/\1/p' "$T/ck/latest.json")
ls "$T/ck/$gen" | grep -v '\.pt$' && { echo "FAIL: temporary files in the published generation $gen"; exit 1; }
n=$(ls "$T/ck/$gen" | wc -l)
[ "$n" -eq 4 ] || { echo "FAIL: expected 4 checkpoint files in $gen, found $n"; exit 1; }

"$GP" train --plan "$T/plan.json" --steps "$STEPS" --lr 0.001 --optimizer adam --seed 11 \
  --checkpoint-dir "$T/ck" --resume --log "$T/part2.jsonl" --timeout 30 > "$T/part2.out"
t3=$(now)
resumed_from=$(grep -o 'after [0-9]* steps' "$T/part2.out" | sed -n 1p || true)
echo "resumed: $resumed_from, $(wc -l < "$T/part2.jsonl") steps in $(secs "$t2" "$t3") s"
expect=$(( CRASH_STEP / EVERY * EVERY ))
[ "$resumed_from" = "after $expect steps" ] || { echo "FAIL: expected to resume after $expect steps"; exit 1; }

# Resumed steps vs the same steps of the uninterrupted run (JSON numbers, full precision).
tail -n "$(wc -l < "$T/part2.jsonl")" "$T/full.jsonl" | loss /dev/stdin > "$T/a"
loss "$T/part2.jsonl" > "$T/b"
if ! cmp -s "$T/a" "$T/b"; then echo "FAIL: resumed losses differ"; paste "$T/a" "$T/b" | sed -n 1,10p; exit 1; fi
echo "losses of steps $expect..$((STEPS - 1)): identical ($(wc -l < "$T/b") steps; first $(head -1 "$T/b"), last $(tail -1 "$T/b"))"
"$GP" checkpoint diff "$T/full" "$T/ck" > "$T/diff" || { cat "$T/diff"; echo "FAIL: final checkpoints differ"; exit 1; }
echo "final weights vs the uninterrupted run: $(cat "$T/diff")"
echo "soak passed"
