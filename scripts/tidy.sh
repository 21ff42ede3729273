#!/usr/bin/env bash
# clang-tidy with .clang-tidy's checks over the libraries that do not include LibTorch, through the
# build's compile_commands.json (CMAKE_EXPORT_COMPILE_COMMANDS is on).
#   scripts/tidy.sh [BUILD_DIR] [PATH_REGEX]
# BUILD_DIR: a configured build (default build). PATH_REGEX (grep -E on the repository-relative path):
# which translation units to check. The default is CI's subset: the library sources of support, graph,
# ir, models, plan, cost, schedule, sim, planner and profiler (48 translation units, 3-6 s of CPU
# each with .clang-tidy's checks), leaving out importers and cli (their ONNX/protobuf and CLI11
# headers make each several times dearer) to stay within CI's 2 minutes on 2 cores; `make tidy-all`
# passes 'all': every library source under src/. Translation units whose compile command names
# LibTorch's headers are always left out (their parse alone takes 10-30 s each), and so are tests.
# Headers under src/ are checked as they are included.
# Exit 0: no finding; 1: findings (printed, one file:line a finding); 2: setup error.
# JOBS (nproc) files run at once; CLANG_TIDY picks the binary (the checks were chosen with 14).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
FILTER=${2:-'^src/(support|graph|ir|models|plan|cost|schedule|sim|planner|profiler)/[^/]+\.cpp$'}
[ "$FILTER" = all ] && FILTER='^src/[a-z_]+/[^/]+\.cpp$'
CT=${CLANG_TIDY:-}
if [ -z "$CT" ]; then
  for c in clang-tidy-14 clang-tidy; do
    if command -v "$c" >/dev/null; then CT=$c; break; fi
  done
fi
if [ -z "$CT" ] || ! command -v "$CT" >/dev/null; then
  echo "tidy: clang-tidy not found (scripts/install-deps.sh installs it; or CLANG_TIDY=...)" >&2
  exit 2
fi
db=$BUILD/compile_commands.json
if [ ! -f "$db" ]; then
  echo "tidy: $db: not found (configure first: make configure, or cmake -B $BUILD)" >&2
  exit 2
fi
root=$(pwd)
mapfile -t files < <(python3 - "$db" "$root" "$FILTER" <<'EOF'
import json, re, sys
db, root, pattern = sys.argv[1], sys.argv[2].rstrip("/") + "/", re.compile(sys.argv[3])
seen = set()
for entry in json.load(open(db)):
    path = entry["file"]
    rel = path[len(root):] if path.startswith(root) else path
    command = entry.get("command") or " ".join(entry.get("arguments", []))
    if "/torch/" in command or "torch/csrc" in command or rel in seen or not pattern.search(rel):
        continue
    seen.add(rel)
    print(rel)
EOF
)
if [ ${#files[@]} -eq 0 ]; then
  echo "tidy: no translation unit in $db matches $FILTER" >&2
  exit 2
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
start=$(date +%s)
# GCC-only warning flags in the compile commands (-Wshadow=local, -Wno-restrict) mean nothing to clang.
printf '%s\n' "${files[@]}" | xargs -P "${JOBS:-$(nproc)}" -I{} sh -c \
  '"$1" -p "$2" --quiet --extra-arg=-Wno-unknown-warning-option "$3" > "$4/$(echo "$3" | tr / _).log" 2>&1 || true' \
  _ "$CT" "$BUILD" {} "$out"
# A finding is "path:line:col: warning|error: ... [check]"; a header's finding appears once per file
# that includes it, so each is listed once.
findings=$(cat "$out"/*.log | grep -E '^[^ ]+:[0-9]+:[0-9]+: (warning|error): ' | sed "s|^$root/||" | sort -u || true)
secs=$(($(date +%s) - start))
if [ -n "$findings" ]; then
  printf '%s\n' "$findings"
  echo "tidy: $(printf '%s\n' "$findings" | wc -l) finding(s) in ${#files[@]} translation units (${secs} s)" >&2
  exit 1
fi
echo "tidy: ${#files[@]} translation units, no finding (${secs} s, $CT)"
