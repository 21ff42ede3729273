#!/bin/bash
# Table-driven check that no user input makes graphpipe abort: every command and numeric option
# gets 0, -1, 2^40, "abc" and "1e999" (plus a few named extremes), each run under a timeout. An
# input the command rejects must exit 2 with exactly one line on stderr ("graphpipe: error: ...");
# an internal error (exit 134: GP_ASSERT/abort), a signal, a hang or any other exit code fails.
# Usage: absurd_inputs_test.sh path/to/graphpipe [JOBS]
set -u
GP=$(readlink -f "$1")
JOBS="${2:-2}"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
# The cpu preset's fixed figures: measuring this machine (cli_calibrate_test) is not what this tests.
export GRAPHPIPE_CALIBRATION=off
LIMIT=60   # seconds per run; the slowest legal case (a 2-worker train) takes a few
M="mmt:branches=2,layers=1,hidden=16,seq=4,heads=2,ffn=32"
VALUES="0 -1 1099511627776 abc 1e999"
NAMES="abc"
HAS_TORCH=0
"$GP" --help 2>/dev/null | grep -q "^  train " && HAS_TORCH=1

# Fixtures: a small plan, its schedule, a model file, a checkpoint, two broken files.
"$GP" plan --model "$M" --cluster cpu --devices 2 --batch 8 --out "$T/plan.json" >/dev/null 2>&1 \
  || { echo "FAIL: fixture plan"; exit 1; }
"$GP" schedule show --plan "$T/plan.json" --out "$T/sched.json" >/dev/null || { echo "FAIL: fixture schedule"; exit 1; }
"$GP" model export --model "$M" --out "$T/m.json" >/dev/null || { echo "FAIL: fixture model"; exit 1; }
if [ "$HAS_TORCH" = 1 ]; then
  "$GP" train --single --model "$M" --batch 4 --steps 1 --checkpoint-dir "$T/ck" >/dev/null \
    || { echo "FAIL: fixture checkpoint"; exit 1; }
fi
head -c 3000 /dev/urandom >"$T/garbage.pt"
: >"$T/empty.pt"
mkdir -p "$T/nopt"

P="$T/plan.json"
# Each row: EXPECT|ARGS. ARGS has {} where each value goes (a row without {} runs once, with its
# single expectation). EXPECT has one letter per value, in order: five for a numeric option
# ($VALUES), one for a name or path ($NAMES: every other string takes the same code path):
#   2  rejected: exit 2, one line on stderr
#   o  a legal value: exit 0, or exit 2 with one line
#   d  may train into divergence: exit 0, 1 (one line naming the step) or 2
# T marks rows that need LibTorch (train, profile, checkpoint).
ROWS=$(cat <<ROWS
22222|models --json {}
22222|model info --model mmt:branches={}
22222|model info --model mmt:hidden={}
22222|model info --model dlrm:rows={}
2|model info --model {}
2|model export --model {} --out $T/x.json
22222|plan --model $M --cluster cpu --devices {} --batch 8
22222|plan --model mmt --cluster summit --devices {} --batch 64
22222|plan --model $M --cluster summit --devices 4 --batch {}
o2222|plan --model $M --cluster summit --devices 4 --batch 8 --micro-batch {}
2|plan --model $M --cluster summit --devices 4 --batch 8 --micro-batch 3
2|plan --model $M --cluster summit --devices 4 --batch 8 --micro-batch 16
o2o22|plan --model $M --cluster summit --devices 4 --batch 8 --memory-limit {}
22o22|plan --model $M --cluster summit --devices 4 --batch 8 --planner piper --time-limit {}
2|plan --model $M --cluster {} --devices 4 --batch 8
2|plan --model $M --cluster summit --devices 4 --batch 8 --planner {}
2|plan --model $M --cluster summit --devices 4 --batch 8 --optimizer {}
2|plan --model $M --cluster cpu --devices 4 --batch 8 --profile {}
2|plan --model mmt --cluster summit --devices 100000 --batch 64
2|plan --model mmt --cluster summit --devices 65536 --batch 64
2|plan --model $M --cluster summit --devices 4 --batch 2147483647
22222|piper-export --model $M --cluster summit --devices {} --batch 8 --micro-batch 2
22222|piper-export --model $M --cluster summit --devices 4 --batch {} --micro-batch 1
22222|piper-export --model $M --cluster summit --devices 4 --batch 8 --micro-batch {}
22o22|piper-export --model $M --cluster summit --devices 4 --batch 8 --micro-batch 2 --time-limit {}
o2o22|piper-export --model $M --cluster summit --devices 4 --batch 8 --micro-batch 2 --memory-limit {}
2|piper-export --model {} --devices 4 --batch 8 --micro-batch 2
2|piper-export --model $M --devices 4 --batch 8 --micro-batch 3
2|piper-export --model $M --devices 4 --batch 8 --micro-batch 2 --out $T/no/such/dir/x.json
2|simulate --plan {}
2|simulate --plan $P --schedule {}
2|simulate --plan $P --schedule-file {}
2|simulate --plan $P --model {}
2|simulate --plan $P --cluster {}
2|simulate --plan $P --profile {}
2|schedule show --plan {}
2|schedule show --plan $P --kind {}
2|schedule check --plan $P --schedule {}
T22222|train --single --model $M --batch {} --steps 1
T22222|train --single --model $M --batch 4 --steps {}
To2o22|train --single --model $M --batch 4 --steps 1 --seed {}
T22d22|train --single --model $M --batch 4 --steps 1 --lr {}
To2222|train --single --model $M --batch 4 --steps 1 --optimizer sgd --momentum {}
To2222|train --single --model $M --batch 4 --steps 1 --checkpoint-dir $T/ck2 --checkpoint-every {}
T22222|train --single --model $M --batch 4 --steps 1 --threads {}
To2o22|train --single --model $M --batch 4 --steps 1 --memory-limit {}
T2|train --single --model {} --batch 4 --steps 1
T2|train --single --model $M --batch 4 --steps 1 --optimizer {}
T2|train --single --model $M --batch 4 --steps 2 --resume --checkpoint-dir $T/missing{}
T2|train --single --model $M --batch 2147483647 --steps 1
T2|train --single --model mmt:hidden=65536,ffn=65536 --batch 1 --steps 1
T2|train --single --model $M --batch 4 --steps 1 --threads 100000
T2|train --single --model $M --batch 4 --steps 1 --log $T/no/such/dir/log.jsonl
T22222|train --plan $P --steps {}
T22222|train --plan $P --steps 1 --timeout {}
T22222|train --plan $P --steps 1 --threads {}
T2|train --single --model $M --batch 4 --steps 1 --data {}
T2|train --single --model $M --batch 4 --steps 1 --eval-data {} --eval-every 1
To2222|train --single --model $M --batch 4 --steps 1 --eval-every {}
T2|train --single --model $M --batch 4 --steps 1 --shuffle
T2|train --plan $P --steps 1 --data {}
T2|train --plan {} --steps 1
T2|train --plan $P --steps 1 --schedule {}
T2|train --plan $P --steps 1 --model {}
T2|train --plan $P --batch 4 --steps 1 --single
T22222|profile --model $M --batches {} --repeats 1 --warmup 0 --out $T/prof.json
T22222|profile --model $M --batches 1 --repeats {} --warmup 0 --out $T/prof.json
To2222|profile --model $M --batches 1 --repeats 1 --warmup {} --out $T/prof.json
T22222|profile --model $M --batches 1 --repeats 1 --warmup 0 --threads {} --out $T/prof.json
T22222|profile --links --link-sizes {} --repeats 1 --out $T/prof.json
T2|profile --model {} --out $T/prof.json
T2|profile --model $M --batches 1 --repeats 1 --warmup 0 --clock {} --out $T/prof.json
T2|profile --model $M --batches 1 --repeats 1 --warmup 0 --clock cpu --threads 2 --out $T/prof.json
T22222|calibrate --repeats {}
T22222|calibrate --passes {}
T2|calibrate --compare {} --model $M
T2|calibrate --compare $P --model $M
T2|calibrate --compare $T/prof.json --model {}
T2|profile --model $M --batches 2147483647 --repeats 1 --warmup 0 --out $T/prof.json
T2|checkpoint show {}
T2|checkpoint diff {} $T/ck
T2|checkpoint diff $T/ck {}
T2|checkpoint show $T/garbage.pt
T2|checkpoint show $T/empty.pt
T2|checkpoint show $T/nopt
T2|worker --plan $P --steps {}
T22222|link-worker --sizes {}
ROWS
)

# One run: prints "ok" or a FAIL line.
run_one() {
  local expect="$1" args="$2" n="$3"
  local out="$T/run$n.out" err="$T/run$n.err"
  # shellcheck disable=SC2086
  (cd "$T" && timeout -s KILL "$LIMIT" "$GP" $args >"$out" 2>"$err" </dev/null)
  local rc=$? lines
  lines=$(wc -l <"$err")
  local msg="exit $rc, $lines stderr line(s): $(head -c 300 "$err" | tr '\n' '|')"
  case "$rc" in
    137) echo "FAIL [$args]: timed out after ${LIMIT}s (a hang)"; return ;;
    134) echo "FAIL [$args]: internal abort: $msg"; return ;;
  esac
  if [ "$rc" -eq 2 ]; then
    [ "$lines" -eq 1 ] && grep -q '^graphpipe: error: ' "$err" && { echo ok; return; }
    echo "FAIL [$args]: exit 2 without exactly one 'graphpipe: error:' line: $msg"; return
  fi
  case "$expect" in
    2) echo "FAIL [$args]: expected exit 2: $msg" ;;
    o) [ "$rc" -eq 0 ] && echo ok || echo "FAIL [$args]: expected exit 0 or 2: $msg" ;;
    d) if [ "$rc" -eq 0 ] || { [ "$rc" -eq 1 ] && [ "$lines" -eq 1 ] && grep -q 'non-finite' "$err"; }; then echo ok
       else echo "FAIL [$args]: expected exit 0, 2 or a one-line divergence (exit 1): $msg"; fi ;;
  esac
}
export -f run_one
export GP T LIMIT

# Expand the table into one job per (row, value).
jobs="$T/jobs"
: >"$jobs"
n=0
while IFS='|' read -r expect args; do
  [ -z "$expect" ] && continue
  if [ "${expect#T}" != "$expect" ]; then
    expect="${expect#T}"
    [ "$HAS_TORCH" = 1 ] || continue
  fi
  case "$args" in
    *"{}"*)
      i=0
      vals="$VALUES"
      [ "${#expect}" -eq 1 ] && vals="$NAMES"
      for v in $vals; do
        e="${expect:$i:1}"
        i=$((i + 1))
        printf '%s\t%s\t%s\n' "$e" "${args//\{\}/$v}" "$n" >>"$jobs"
        n=$((n + 1))
      done ;;
    *) printf '%s\t%s\t%s\n' "$expect" "$args" "$n" >>"$jobs"; n=$((n + 1)) ;;
  esac
done <<<"$ROWS"

results=$(tr '\t' '\037' <"$jobs" | xargs -P "$JOBS" -d '\n' -n 1 bash -c 'IFS=$'"'"'\037'"'"' read -r e a n <<<"$1"; run_one "$e" "$a" "$n"' _)
fails=$(printf '%s\n' "$results" | grep -c '^FAIL' || true)
total=$(printf '%s\n' "$results" | grep -c . || true)
printf '%s\n' "$results" | grep '^FAIL'
echo "$total runs, $fails failed"
[ "$fails" -eq 0 ] && [ "$total" -eq "$n" ] || exit 1
echo ok
