#!/usr/bin/env bash
# make crashtest: checkpoints survive a crash of any process at any instant.
#   1. plan a small mmt on 3 devices (3 stages) and train it uninterrupted for STEPS steps (the reference);
#   2. train it again with --checkpoint-every 1 and kill it KILLS times: each attempt resumes from the
#      checkpoint directory (fresh when it holds none yet) and, after a random delay, one random
#      process gets SIGKILL: a worker, or (one time in four) the launcher itself;
#   3. after the last kill, resume once more to STEPS.
# Checks: every attempt resumes (exit 0 up to the kill; never "refused"), every loss any attempt
# logged equals the reference's loss of that step bit for bit, the final weights equal the
# reference's (`graphpipe checkpoint diff`), and the directory ends with latest.json and one
# generation (no temporaries). Prints one line per kill and a summary; exits non-zero on any failure.
set -euo pipefail
GP=${GP:-build/graphpipe}
KILLS=${CRASH_KILLS:-24}
STEPS=${CRASH_STEPS:-40}
SEED=${CRASH_SEED:-$RANDOM}
MODEL=${CRASH_MODEL:-"mmt:branches=2,layers=1,seq=8,hidden=32,heads=2,ffn=64"}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
RANDOM=$SEED
cp "$GP" "$T/graphpipe" && GP=$T/graphpipe  # a copy: a rebuild meanwhile must not change the binary

loss_of() { sed -E 's/.*"loss": ?([-0-9.eE+]+).*/\1/' "$1"; }
step_of() { sed -E 's/.*"step": ?([0-9]+).*/\1/' "$1"; }

echo "== crashtest: $MODEL, 3 stages on 3 workers, $STEPS steps, checkpoint every step, $KILLS kills (seed $SEED)"
"$GP" plan --model "$MODEL" --cluster summit --devices 3 --batch 8 --out "$T/plan.json" > /dev/null
common=(train --plan "$T/plan.json" --steps "$STEPS" --lr 0.01 --optimizer adam --timeout 20)
t0=$(date +%s.%N)
"$GP" "${common[@]}" --checkpoint-dir "$T/full" --checkpoint-every 1 --log "$T/full.jsonl" > /dev/null
span_ms=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%d", (b - a) * 1000 }')  # kills land in [0.2 s, this]
step_ms=$(( (span_ms - 700) / STEPS )); [ "$step_ms" -ge 20 ] || step_ms=20
echo "uninterrupted: $STEPS steps in $((span_ms / 1000)).$(printf %03d $((span_ms % 1000))) s (about $step_ms ms a step with its save)"
paste -d' ' <(step_of "$T/full.jsonl") <(loss_of "$T/full.jsonl") > "$T/reference"

compare_log() {  # every logged step's loss against the reference
  local log=$1 bad=0
  [ -s "$log" ] || return 0
  paste -d' ' <(step_of "$log") <(loss_of "$log") > "$T/got"
  while read -r step loss; do
    want=$(awk -v s="$step" '$1 == s { print $2 }' "$T/reference")
    if [ "$loss" != "$want" ]; then echo "FAIL: step $step loss $loss, uninterrupted $want ($log)"; bad=1; fi
  done < "$T/got"
  return $bad
}

kills=0 launcher_kills=0 attempts=0 logged=0 resumes=0 saves=0
while [ "$kills" -lt "$KILLS" ]; do
  attempts=$((attempts + 1))
  resume=() before=none
  if [ -e "$T/ck/latest.json" ]; then
    resume=(--resume)
    before=$(sed -nE 's/.*"steps_done":([0-9]+).*/\1/p' "$T/ck/latest.json")
    if [ "$before" -ge "$STEPS" ]; then  # the last attempt got to the end before its kill: start over
      rm -rf "$T/ck"
      resume=() before=none
    fi
  fi
  log="$T/attempt$attempts.jsonl"
  "$GP" "${common[@]}" --checkpoint-dir "$T/ck" --checkpoint-every 1 "${resume[@]}" --log "$log" \
    > "$T/out$attempts" 2> "$T/err$attempts" &
  launcher=$!
  # A random moment: start-up, a step, a save (the first attempts start from scratch).
  # The moment: one kill in six during start-up (the first second), the others once the attempt
  # has logged a random number of its remaining steps, plus a random part of a step (compute or save).
  left=$STEPS; [ "$before" = none ] || left=$((STEPS - before))
  if [ $((RANDOM % 6)) -eq 0 ]; then
    sleep "$(awk -v r="$RANDOM" 'BEGIN { printf "%.3f", (50 + r % 950) / 1000 }')"
  else
    target=$((RANDOM % left))
    while kill -0 "$launcher" 2> /dev/null && [ "$( ([ -f "$log" ] && wc -l < "$log") || echo 0)" -lt "$target" ]; do
      sleep 0.02
    done
    sleep "$(awk -v r="$RANDOM" -v s="$step_ms" 'BEGIN { printf "%.3f", (r % (s * 3 / 2 + 1)) / 1000 }')"
  fi
  workers=($(pgrep -P "$launcher" || true))
  if [ "${#workers[@]}" -eq 0 ] || ! kill -0 "$launcher" 2> /dev/null; then
    set +e; wait "$launcher"; code=$?; set -e
    [ "$code" -eq 0 ] || { echo "FAIL: attempt $attempts exited $code before the kill"; cat "$T/err$attempts"; exit 1; }
    compare_log "$log"
    [ -s "$log" ] && logged=$((logged + $(wc -l < "$log")))
    echo "attempt $attempts finished before its kill (the next one starts over)"
    continue
  fi
  if [ $((RANDOM % 4)) -eq 0 ]; then
    victim=$launcher what="the launcher"
    launcher_kills=$((launcher_kills + 1))
  else
    victim=${workers[$((RANDOM % ${#workers[@]}))]} what="worker pid"
  fi
  kill -9 "$victim" 2> /dev/null || true
  set +e; wait "$launcher" 2> /dev/null; code=$?; set -e
  for w in "${workers[@]}"; do while kill -0 "$w" 2> /dev/null; do sleep 0.05; done; done  # die with the launcher
  kills=$((kills + 1))
  grep -q "refused\|different run\|stopped after different steps\|corrupt" "$T/err$attempts" &&
    { echo "FAIL: attempt $attempts: $(cat "$T/err$attempts")"; exit 1; }
  from=$(grep -o 'after [0-9]* steps' "$T/out$attempts" | sed -n 1p || true)
  if [ -n "$from" ] && [ "$from" != "after $before steps" ]; then
    echo "FAIL: attempt $attempts resumed $from, latest.json said $before"; exit 1
  fi
  at=$(sed -nE 's/.*"steps_done":([0-9]+).*/\1/p' "$T/ck/latest.json" 2> /dev/null || echo none)
  compare_log "$log"
  # A kill inside a save (or its clean-up) leaves a generation folder latest.json does not name.
  gen=$(sed -nE 's/.*"generation":"([^"]+)".*/\1/p' "$T/ck/latest.json" 2> /dev/null || true)
  unpublished=$( (ls -d "$T"/ck/step-* 2> /dev/null || true) | grep -v -c "/${gen:-none}\$" || true)
  in_save=""
  if [ "$unpublished" -gt 0 ]; then in_save=", a save was in flight"; saves=$((saves + 1)); fi
  n=0
  [ -s "$log" ] && n=$(wc -l < "$log")
  [ -n "$from" ] && resumes=$((resumes + 1))
  logged=$((logged + n))
  echo "kill $kills: $what $victim after $n logged steps (exit $code; ${from:+resumed }${from:-started fresh}); latest.json now at step $at$in_save"
done

resume=()
[ -e "$T/ck/latest.json" ] && resume=(--resume)
"$GP" "${common[@]}" --checkpoint-dir "$T/ck" --checkpoint-every 1 "${resume[@]}" --log "$T/final.jsonl" > "$T/final.out" 2> "$T/final.err" ||
  { echo "FAIL: the final resume failed"; cat "$T/final.err"; exit 1; }
compare_log "$T/final.jsonl"
logged=$((logged + $(wc -l < "$T/final.jsonl")))
echo "final: $(grep -o 'resumed from .* steps' "$T/final.out" || echo 'from scratch'), $(wc -l < "$T/final.jsonl") steps to $STEPS"
"$GP" checkpoint diff "$T/full" "$T/ck" > "$T/diff" || { cat "$T/diff"; echo "FAIL: final weights differ"; exit 1; }
left=$(ls "$T/ck" | grep -v -E '^(latest\.json|step-[0-9]{8}-[0-9a-f]{8})$' || true)
[ -z "$left" ] || { echo "FAIL: left in the checkpoint directory: $left"; exit 1; }
[ "$(ls -d "$T"/ck/step-* | wc -l)" -eq 1 ] || { echo "FAIL: more than one generation left"; ls "$T/ck"; exit 1; }
echo "crashtest passed: $kills kills ($launcher_kills of the launcher, $saves inside a save) in $attempts attempts; $resumes killed attempts" \
  "had resumed (the others were killed before their first line or started fresh), every one from latest.json's step;" \
  "$logged logged losses equal to the uninterrupted run's, final weights $(cat "$T/diff")"
