#!/usr/bin/env bash
# make demo: show what GraphPipe does on its embedded default (a multi-branch model).
set -euo pipefail
GP=${1:-build/graphpipe}
echo "== builtin models"
"$GP" models
echo
echo "== the default multi-branch model: mmt (4 parallel transformer encoders)"
"$GP" model info --model mmt
