#!/bin/bash
# The small version of make fidelity's ranking tables (scripts/fidelity_rank.py): a tiny model, one
# round of 3 steps per plan, the fixed cpu figures (GRAPHPIPE_CALIBRATION=off: no measurement). Checks
# the tables' shape and that every figure is a positive number; no timing is asserted (the machine is
# shared): the speed checks are `make fidelity`'s.
# Usage: fidelity_rank_test.sh path/to/graphpipe path/to/scripts
set -u
GP=$(readlink -f "$1")
SCRIPTS=$(readlink -f "$2")
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
export GRAPHPIPE_CALIBRATION=off
fail() { echo "FAIL: $*"; exit 1; }
M="mmt:branches=2,layers=1,hidden=32,seq=8,heads=2,ffn=64"
python3 "$SCRIPTS/fidelity_rank.py" "$GP" "$M" 8 "$T/rank.md" --rounds 1 --steps 3 --min-round-s 0 --warmup 1 --label tiny \
  --control on \
  > "$T/out" 2>&1 || { rc=$?; cat "$T/out"; fail "fidelity_rank.py exited $rc"; }
python3 - "$T/rank.md" <<'PY' || exit 1
import re, sys
text = open(sys.argv[1]).read()
rows = [l for l in text.splitlines() if l.startswith("| ") and not l.startswith("| ---")]
control = [r for r in rows if "(control)" in r]
plans = [r for r in rows if not r.startswith("| plan") and " vs " not in r and r not in control]
pairs = [r for r in rows if " vs " in r and not r.startswith("| a vs b") and r not in control]
assert len(plans) == 5, "want 5 plan rows, got %d:\n%s" % (len(plans), text)
assert len(pairs) == 10, "want 10 pair rows, got %d:\n%s" % (len(pairs), text)
# --control on: the planner's choice trained again (a plan row) and its ratio to the first run (a pair
# row that is not counted), and the noise-floor line naming it.
assert len(control) == 2 and "not counted" in control[1], "want the control's two rows:\n" + text
assert "Noise floor, the same plan trained twice a round (" in text and "(control)" in text.split("Noise floor")[1], text
for r in plans + pairs + control:
    # every figure positive; the CPU-time ones may be "-" (3 steps rarely rise above start-up's noise)
    nums = [float(x) for x in re.findall(r"(?<![\w.])\d+\.\d+", r)]
    assert len(nums) >= 3 and all(x > 0 for x in nums), "a figure is missing or not positive: " + r
assert "Wall clock: pairs within 0.85-1.15:" in text and "CPU time / cores in use:" in text, text
# The planner's choice against the fastest plan pools the rounds of identical plans (and the control's).
m = re.search(r"the planner's choice \(([^)]*)\) is (\d+\.\d+)x the fastest's time \(identical plans' rounds pooled", text)
assert m and float(m.group(2)) >= 1.0, "the planner's-choice line is missing or below 1:\n" + text
assert text.startswith("**tiny** `mmt:"), text[:200]
PY
# The order plans train in: over a full set of rounds, every plan in every slot and right after every
# other plan equally often; and a run shorter than that says so in its header.
python3 - "$SCRIPTS" "$T/rank.md" <<'PY' || exit 1
import collections, sys
sys.path.insert(0, sys.argv[1])
from fidelity_rank import balanced_orders
for n in range(1, 9):
    rows = balanced_orders(n)
    assert len(rows) == (n if n % 2 == 0 else 2 * n), (n, rows)
    assert all(sorted(r) == list(range(n)) for r in rows), (n, rows)
    slot = collections.Counter((k, i) for r in rows for i, k in enumerate(r))
    after = collections.Counter((r[i - 1], r[i]) for r in rows for i in range(1, n))
    assert len(slot) == n * n and len(set(slot.values())) == 1, (n, slot)
    assert n < 2 or (len(after) == n * (n - 1) and len(set(after.values())) == 1), (n, after)
text = open(sys.argv[2]).read()
assert "1 rounds (not a whole balanced order of 6)" in text, text
# Steal: the worst share stolen from a core in use (running or stolen over half the run); an idle
# core's steal does not count. Each plan row gives its steal.
from fidelity_rank import steal_share
before = {"cpu0": (0, 0, 0), "cpu1": (0, 0, 0)}
assert steal_share(before, {"cpu0": (70, 30, 0), "cpu1": (95, 5, 0)}) == 0.3
assert steal_share(before, {"cpu0": (10, 30, 60), "cpu1": (95, 5, 0)}) == 0.05
assert steal_share(before, {"cpu0": (0, 0, 100)}) == 0
plan_rows = [l for l in text.splitlines() if l.startswith("| ") and " mb " in l and " vs " not in l]
assert plan_rows and all(l.rstrip(" |").endswith("%)") for l in plan_rows), plan_rows
PY
# A machine of one device (a GPU box): the planner's 1-device plan against fixed micro-batches, the
# planner's choice first; the CPU-time clock left out with --device other than cpu is not testable here.
python3 "$SCRIPTS/fidelity_rank.py" "$GP" "$M" 8 "$T/one.md" --devices 1 --micro-batch 2,4 --rounds 1 --steps 3 \
  --min-round-s 0 --warmup 1 --control off > "$T/out1" 2>&1 || { rc=$?; cat "$T/out1"; fail "--devices 1 exited $rc"; }
python3 - "$T/one.md" <<'PY' || exit 1
import sys
text = open(sys.argv[1]).read()
rows = [l for l in text.splitlines() if l.startswith("| ") and not l.startswith("| ---")]
plans = [r.split(" | ")[0] for r in rows if " vs " not in r and not r.startswith("| plan")]
pairs = [r for r in rows if " vs " in r and not r.startswith("| a vs b")]
assert plans == ["| 1 device", "| 1 device mb 2", "| 1 device mb 4"], plans
assert len(pairs) == 3, text
assert "the planner's choice (1 device) is" in text, text
PY
python3 "$SCRIPTS/fidelity_rank.py" "$GP" "$M" 8 "$T/x.md" --cluster h200 --calibrate > "$T/out2" 2>&1
[ $? != 0 ] && grep -q "measures this machine for --cluster cpu, not h200" "$T/out2" || { cat "$T/out2"; fail "--calibrate with h200"; }
# The H200 profiles shipped in profiles/ (scripts/gpu-check.sh) still read and plan.
for m in mmt dlrm candle-uno; do
  "$GP" plan --model "$m" --cluster h200 --devices 8 --batch 256 --profile "$SCRIPTS/../profiles/h200-$m.json" \
    --out "$T/h200-$m.json" > "$T/out3" 2>&1 || { cat "$T/out3"; fail "plan with profiles/h200-$m.json"; }
done
# scripts/worker_probe.py: one round of a 1-worker plan, alone and beside its twin; each line has the
# wall time, the main thread's CPU time and the steal share.
"$GP" plan --model "$M" --cluster cpu --devices 1 --batch 8 --out "$T/one.json" > /dev/null || fail "plan for the probe"
python3 "$SCRIPTS/worker_probe.py" "$GP" "$T/one.json" --rounds 1 --warmup-s 1 --measure-s 1 --twin > "$T/probe" 2>&1 \
  || { rc=$?; cat "$T/probe"; fail "worker_probe.py exited $rc"; }
[ "$(grep -c 'wall .* ms a step | main thread CPU .* | steal [0-9]*%' "$T/probe")" = 2 ] && grep -q "one.json + twin" "$T/probe" \
  || { cat "$T/probe"; fail "worker_probe.py's lines"; }
echo '{}' > "$T/notaplan.json"
python3 "$SCRIPTS/worker_probe.py" "$GP" "$T/notaplan.json" > "$T/probe-bad" 2>&1
[ $? = 2 ] && grep -q "notaplan.json: not a plan (no field 'stages')" "$T/probe-bad" \
  || { cat "$T/probe-bad"; fail "worker_probe.py on a file that is not a plan"; }
# A bad model is one line on stderr naming it, and a non-zero exit.
if python3 "$SCRIPTS/fidelity_rank.py" "$GP" "nosuchmodel" 8 "$T/bad.md" --rounds 1 > "$T/bad" 2>&1; then
  fail "a bad model spec was accepted"
fi
grep -q "nosuchmodel" "$T/bad" || { cat "$T/bad"; fail "the error does not name the model"; }
echo "fidelity_rank_test: ok"
