#!/bin/sh
# End-to-end `--model x.onnx` through the CLI: model info for every fixture (exit 0, params equal
# PyTorch's), malformed files exit 2 naming the file, and - where the planner and simulator exist -
# `graphpipe plan` + `graphpipe simulate` at 4 and 8 devices.
# Usage: onnx_cli_test.sh path/to/graphpipe path/to/tests/fixtures/onnx
set -u
GP="$1"
FX="$2"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

for spec in resnet18:11689512 googlenet:6624904 two_branch:17322 encoder_op13:67594 encoder_op17:67594 token_encoder:10693 token_posemb:3235; do
  name=${spec%%:*}
  params=${spec#*:}
  "$GP" model info --model "$FX/$name.onnx" --json >"$tmp/info.json" 2>"$tmp/err" ||
    fail "model info $name exited $?: $(cat "$tmp/err")"
  grep -q "\"params\": $params\b" "$tmp/info.json" || fail "$name: expected params $params in $(cat "$tmp/info.json")"
done
"$GP" model info --model "$FX/resnet18.onnx" >"$tmp/out" 2>&1 || fail "model info resnet18 (text) exited $?"

"$GP" model info --model "$FX/unknown_op.onnx" 2>"$tmp/err"
rc=$?
[ "$rc" -eq 2 ] || fail "unknown op exited $rc, expected 2"
grep -q "unsupported operators: FancyOp x2, WarpDrive x1" "$tmp/err" || fail "unknown op message: $(cat "$tmp/err")"
head -c 5000 "$FX/resnet18.onnx" >"$tmp/cut.onnx"
"$GP" model info --model "$tmp/cut.onnx" 2>"$tmp/err"
rc=$?
[ "$rc" -eq 2 ] || fail "truncated file exited $rc, expected 2"
grep -q "cut.onnx: corrupt or truncated ONNX file" "$tmp/err" || fail "truncated message: $(cat "$tmp/err")"

# Subcommands present in this build (an unknown one would just print the root help and exit 0).
has() { "$GP" --help 2>/dev/null | grep -q "^  $1 "; }
if has plan; then
  for name in resnet18 googlenet two_branch encoder_op13 encoder_op17 token_encoder token_posemb; do
    for n in 4 8; do
      "$GP" plan --model "$FX/$name.onnx" --cluster dgx-a100 --devices $n --batch 64 --out "$tmp/p.json" \
        >"$tmp/out" 2>"$tmp/err" || fail "plan $name at $n devices exited $?: $(cat "$tmp/err")"
      grep -q '"graphpipe.plan/1"' "$tmp/p.json" || fail "plan $name at $n devices wrote no plan"
      if has simulate; then
        "$GP" simulate --plan "$tmp/p.json" --json >"$tmp/sim.json" 2>"$tmp/err" ||
          fail "simulate $name at $n devices exited $?: $(cat "$tmp/err")"
        grep -q '"graphpipe.sim/1"' "$tmp/sim.json" || fail "simulate $name: $(cat "$tmp/sim.json")"
      fi
    done
  done
  # Issue 15: every torchvision family and the multi-modal model plan and simulate at 4 devices.
  for name in alexnet vgg11 resnext50_32x4d wide_resnet50_2 squeezenet1_1 densenet121 inception_v3 \
      shufflenet_v2_x0_5 mobilenet_v2 mobilenet_v3_small mnasnet0_5 efficientnet_b0 regnet_y_400mf convnext_tiny \
      vit_b_16 multimodal; do
    "$GP" plan --model "$FX/$name.onnx" --cluster dgx-a100 --devices 4 --batch 64 --out "$tmp/p.json" \
      >"$tmp/out" 2>"$tmp/err" || fail "plan $name exited $?: $(cat "$tmp/err")"
    if has simulate; then
      "$GP" simulate --plan "$tmp/p.json" --json >"$tmp/sim.json" 2>"$tmp/err" ||
        fail "simulate $name exited $?: $(cat "$tmp/err")"
      grep -q '"graphpipe.sim/1"' "$tmp/sim.json" || fail "simulate $name: $(cat "$tmp/sim.json")"
    fi
  done
fi
echo "ok (plan: $(has plan && echo yes || echo no), simulate: $(has simulate && echo yes || echo no))"
