#!/usr/bin/env bash
# Data-loading cost of `train --data` (issue 16): a candle-uno whose inputs are large next to its
# compute (4 towers x 1024 floats = 16 KB per sample), a dataset of N samples written with
# numpy.lib.format.open_memmap, trained with and without --shuffle, with the files in the page
# cache (warm) and evicted first (cold: posix_fadvise DONTNEED on each file, nothing else).
# Prints the mean data_time_s and step_time_s per step (the first step left out).
#   scripts/data_bench.sh [build dir] [N samples] [steps]
set -euo pipefail
BUILD=${1:-build}
N=${2:-131072}
STEPS=${3:-12}
GP=$(realpath "$BUILD/graphpipe")
MODEL=candle-uno:branches=4,layers=1,hidden=1024
WORK=$(mktemp -d /tmp/gp_data_bench.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
PY=/usr/bin/python3

$PY - "$WORK/data" "$N" <<'EOF'
import os, sys
import numpy as np
d, n = sys.argv[1], int(sys.argv[2])
os.makedirs(d)
rng = np.random.default_rng(0)
for t in range(4):
    a = np.lib.format.open_memmap(os.path.join(d, f"tower{t}.input.npy"), mode="w+", dtype=np.float32, shape=(n, 1024))
    for s in range(0, n, 8192):
        a[s:s + 8192] = rng.standard_normal((min(8192, n - s), 1024), dtype=np.float32)
    a.flush()
    del a
np.save(os.path.join(d, "target.npy"), rng.standard_normal((n, 1), dtype=np.float32))
EOF
du -sh "$WORK/data"

evict() {
  $PY - "$WORK/data" <<'EOF'
import os, sys
for f in os.listdir(sys.argv[1]):
    fd = os.open(os.path.join(sys.argv[1], f), os.O_RDONLY)
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
EOF
}

summary() {  # mean data_time_s and step_time_s over the steps after the first
  $PY - "$1" "$2" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])][1:]
d = sum(r["data_time_s"] for r in rows) / len(rows)
t = sum(r["step_time_s"] for r in rows) / len(rows)
print(f"{sys.argv[2]:<32} data {d * 1e3:8.2f} ms/step  step {t * 1e3:8.1f} ms/step  data share {100 * d / t:5.2f}%")
EOF
}

run_single() {  # name, cache state, extra flags
  [ "$2" = cold ] && evict
  "$GP" train --single --model "$MODEL" --batch 256 --steps "$STEPS" --optimizer sgd --lr 0.01 \
    --data "$WORK/data" $3 --log "$WORK/log.jsonl" >/dev/null
  summary "$WORK/log.jsonl" "$1 ($2)"
}

run_single "single, file order" cold ""
run_single "single, file order" warm ""
run_single "single, --shuffle" cold "--shuffle"
run_single "single, --shuffle" warm "--shuffle"

"$GP" plan --model "$MODEL" --cluster cpu --devices 2 --batch 256 --out "$WORK/plan.json" >/dev/null
evict
"$GP" train --plan "$WORK/plan.json" --steps "$STEPS" --optimizer sgd --lr 0.01 --data "$WORK/data" --shuffle \
  --log "$WORK/log.jsonl" >/dev/null
summary "$WORK/log.jsonl" "plan on 2 workers, --shuffle (cold)"
