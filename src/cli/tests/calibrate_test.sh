#!/bin/bash
# The self-calibrating cpu preset end to end, in a private cache directory: the first
# `plan --cluster cpu` measures this machine (progress on stderr) and caches it, the next reads the
# cache silently; the plan records the calibrated preset; `train` compares its measured time with
# that prediction; GRAPHPIPE_CALIBRATION=off / =FILE / a bad file behave as documented.
# Usage: calibrate_test.sh path/to/graphpipe
set -u
GP=$(readlink -f "$1")
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
export GRAPHPIPE_CACHE_DIR="$T/cache"
unset GRAPHPIPE_CALIBRATION
M="mmt:branches=2,layers=1,hidden=32,seq=8,heads=2,ffn=64"
fail() { echo "FAIL: $*"; exit 1; }
field() { python3 -c "import json, sys; d = json.load(open('$1')); print($2)"; }

"$GP" plan --model "$M" --cluster cpu --devices 2 --batch 8 --out "$T/p1.json" >/dev/null 2>"$T/err1" \
  || fail "first plan: $(cat "$T/err1")"
grep -q "calibrating the cpu preset on this machine" "$T/err1" || fail "first plan did not say it calibrates: $(cat "$T/err1")"
grep -q "calibrating: GEMM fit:" "$T/err1" || fail "no progress lines: $(cat "$T/err1")"
ls "$T"/cache/cpu-calibration-*c-torch*.json >/dev/null 2>&1 || fail "no cache file in $T/cache"
name=$(field "$T/p1.json" "d['costs']['cluster']['device']['name']")
case "$name" in *", calibrated "*) ;; *) fail "plan records an uncalibrated preset: $name" ;; esac

"$GP" plan --model "$M" --cluster cpu --devices 2 --batch 8 --out "$T/p2.json" >/dev/null 2>"$T/err2" || fail "second plan"
[ ! -s "$T/err2" ] || fail "second plan measured again or printed: $(cat "$T/err2")"
[ "$(field "$T/p1.json" "d['costs']['cluster']")" = "$(field "$T/p2.json" "d['costs']['cluster']")" ] \
  || fail "the cached calibration gave another cluster"
"$GP" calibrate --show | grep -q "GFLOP/s per thread" || fail "calibrate --show"
[ "$(field "$(ls "$T"/cache/cpu-calibration-*.json)" "d['method']")" -ge 2 ] || fail "the cache records no method"
# A message's CPU time at both ends of the busy link (hand-off rounds), per message or per byte.
[ "$(field "$(ls "$T"/cache/cpu-calibration-*.json)" \
  "all(c['send_s'] + 65536 * c['send_s_per_byte'] > 0 and c['recv_s'] + 65536 * c['recv_s_per_byte'] > 0 for c in [d['busy_link']['cpu']])")" = True ] \
  || fail "the cache records no message CPU time: $(field "$(ls "$T"/cache/cpu-calibration-*.json)" "d.get('busy_link')")"
# A stage's passes: the runtime's time per forward and backward action beyond the ops (method 10).
[ "$(field "$(ls "$T"/cache/cpu-calibration-*.json)" "d['pass']['fwd_s'] + d['pass']['bwd_s'] > 0")" = True ] \
  || fail "the cache records no pass time: $(field "$(ls "$T"/cache/cpu-calibration-*.json)" "d.get('pass')")"

# A cache measured by an older method is measured again, saying so.
cache=$(ls "$T"/cache/cpu-calibration-*.json)
python3 -c "import json; d = json.load(open('$cache')); d['method'] = 1; json.dump(d, open('$cache', 'w'))"
"$GP" plan --model "$M" --cluster cpu --devices 2 --batch 8 >/dev/null 2>"$T/err5" || fail "plan over an old cache"
grep -q "calibration cache was measured by method 1, this build measures by method [0-9]*: measuring again" "$T/err5" \
  || fail "an old method's cache was used: $(cat "$T/err5")"
[ "$(field "$cache" "d['method']")" -ge 2 ] || fail "the old cache was not replaced"

out=$("$GP" train --plan "$T/p1.json" --steps 3 2>&1) || fail "train: $out"
echo "$out" | grep -q "predicted .* by the plan .*calibrated cpu preset\|predicted .* by the plan .*this machine's cpu preset" \
  || fail "train does not compare with the calibrated prediction: $out"

GRAPHPIPE_CALIBRATION=off "$GP" plan --model "$M" --cluster cpu --devices 2 --batch 8 --out "$T/off.json" >/dev/null \
  || fail "plan with GRAPHPIPE_CALIBRATION=off"
case "$(field "$T/off.json" "d['costs']['cluster']['device']['name']")" in *calibrated*) fail "off still calibrated" ;; esac
cache=$(ls "$T"/cache/cpu-calibration-*.json)
GRAPHPIPE_CACHE_DIR="$T/none" GRAPHPIPE_CALIBRATION="$cache" "$GP" plan --model "$M" --cluster cpu --devices 2 \
  --batch 8 --out "$T/file.json" >/dev/null 2>"$T/err3" || fail "GRAPHPIPE_CALIBRATION=FILE: $(cat "$T/err3")"
[ ! -s "$T/err3" ] || fail "GRAPHPIPE_CALIBRATION=FILE measured: $(cat "$T/err3")"
echo '{"format": "graphpipe.calibration/1", "cpu_model": "x", "cores": 2, "torch_version": "1", "gemm_flops": -5}' >"$T/bad.json"
GRAPHPIPE_CALIBRATION="$T/bad.json" "$GP" plan --model "$M" --cluster cpu --devices 2 --batch 8 >/dev/null 2>"$T/err4"
code=$?
[ "$code" = 2 ] || fail "a bad calibration file exits $code, not 2"
grep -q "bad.json: gemm_flops: must be a positive number, found -5" "$T/err4" || fail "bad file message: $(cat "$T/err4")"
echo "PASS"
