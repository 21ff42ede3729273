#!/bin/sh
# End-to-end checks of `graphpipe models`, `model export` and `model info`: exit codes and outputs.
# Usage: cli_model_test.sh path/to/graphpipe
set -u
GP="$1"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$GP" model export --model mmt --out "$tmp/m.json" >"$tmp/out" 2>"$tmp/err" || fail "export mmt exited $?: $(cat "$tmp/err")"
grep -q '"format": "graphpipe.model/1"' "$tmp/m.json" || fail "m.json has no format field"
grep -q "wrote $tmp/m.json: model mmt, 263 ops" "$tmp/out" || fail "unexpected export output: $(cat "$tmp/out")"

"$GP" model info --model "$tmp/m.json" --json >"$tmp/info.json" 2>"$tmp/err" || fail "info on exported file exited $?"
grep -q '"num_ops": 263' "$tmp/info.json" || fail "info --json: $(cat "$tmp/info.json")"

"$GP" model info --model inception:blocks=2,channels=4,image=32 --dot "$tmp/g.dot" >"$tmp/out" 2>&1 || fail "info --dot exited $?"
grep -q "subgraph cluster_" "$tmp/g.dot" || fail "dot file has no clusters"
grep -q "series-parallel: yes" "$tmp/out" || fail "info output: $(cat "$tmp/out")"

"$GP" models --json >"$tmp/models.json" 2>&1 || fail "models --json exited $?"
grep -q '"candle-uno"' "$tmp/models.json" || fail "models --json lacks candle-uno"

"$GP" model export --model mmt:layrs=2 --out "$tmp/bad.json" 2>"$tmp/err"
rc=$?
[ "$rc" -eq 2 ] || fail "bad spec exited $rc, expected 2"
grep -q 'unknown parameter "layrs"' "$tmp/err" || fail "bad spec message: $(cat "$tmp/err")"
[ ! -e "$tmp/bad.json" ] || fail "bad spec still wrote a file"

echo '{"format": "graphpipe.model/1"}' >"$tmp/broken.json"
"$GP" model info --model "$tmp/broken.json" 2>"$tmp/err"
rc=$?
[ "$rc" -eq 2 ] || fail "malformed file exited $rc, expected 2"
grep -q "broken.json: (top): missing required field \"name\"" "$tmp/err" || fail "malformed file message: $(cat "$tmp/err")"
echo "ok"
