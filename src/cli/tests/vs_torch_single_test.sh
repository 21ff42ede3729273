#!/bin/bash
# bench/vs_torch.py --no-pipelines, small: two models, one round; graphpipe train --single must give
# PyTorch's losses (the script's parity check, 1e-4 relative) and the JSON carries both engines' step
# times and their ratio. No timing is asserted (the machine is shared). The same path runs on a GPU
# with --device cuda (scripts/gpu-check.sh, check 9).
# Usage: vs_torch_single_test.sh path/to/graphpipe path/to/source
set -u
GP=$(readlink -f "$1")
SRC=$(readlink -f "$2")
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
python3 "$SRC/bench/vs_torch.py" --graphpipe "$GP" --out "$T/vt.json" --no-pipelines --models chain,towers \
  --batch 8 --steps 5 --parity-steps 4 --skip 1 --rounds 1 --layers 2 --d-model 32 --ffn 64 --tower-width 32 \
  > "$T/out" 2>&1 || { rc=$?; cat "$T/out"; fail "vs_torch.py --no-pipelines exited $rc"; }
python3 - "$T/vt.json" "$T/out" <<'PY' || exit 1
import json, sys
doc = json.load(open(sys.argv[1]))
out = open(sys.argv[2]).read()
assert doc["parity_ok"] and not doc["failures"], doc
assert [m["model"] for m in doc["models"]] == ["chain", "towers"], doc["models"]
for m in doc["models"]:
    names = sorted(e["engine"] for e in m["engines"])
    assert names == ["graphpipe --single", "torch 1 process"], names
    assert m["graphpipe_plan"] is None and m["torch_cut_search"] is None, m
    assert m["parity"]["max_rel_diff"]["graphpipe --single"] <= 1e-4, m["parity"]
    assert all(e["median_step_s"] > 0 and e["runs"] == 1 for e in m["engines"]), m["engines"]
    r = m["graphpipe_single_over_torch_1_process"]
    assert r and r > 0, m
    assert f"{m['model']:<8} step time graphpipe --single / torch 1 process: {r:.2f}" in out, out
assert "graphpipe vs PyTorch, " in out and "2 processes, 1 thread each" not in out, out
print("ok:", ", ".join(f"{m['model']} {m['graphpipe_single_over_torch_1_process']:.2f}" for m in doc["models"]))
PY
# --device cuda where torch sees no GPU: exit 2 with one line naming the problem.
if ! python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  python3 "$SRC/bench/vs_torch.py" --graphpipe "$GP" --out "$T/x.json" --device cuda > "$T/err" 2>&1
  rc=$?
  [ $rc = 2 ] || { cat "$T/err"; fail "--device cuda without a GPU: exit $rc, want 2"; }
  grep -q "sees no GPU" "$T/err" || { cat "$T/err"; fail "--device cuda without a GPU: no reason given"; }
fi
echo PASS
