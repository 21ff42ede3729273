#!/usr/bin/env bash
# The C++ layout check: .clang-format (the style the code already follows) over our sources.
#   scripts/format.sh check [PATH...]   list the files clang-format would change; exit 1 if any
#   scripts/format.sh fix [PATH...]     reformat them in place
# PATH: files or folders (default: src tests bench fuzz); only tracked *.cpp, *.h, *.hpp, *.cc files.
# The layout depends on clang-format's major version: the style was measured with 14 (Debian 12's
# `clang-format`, scripts/install-deps.sh); CLANG_FORMAT=... picks another binary, and another major
# version is refused (exit 2) unless GP_FORMAT_ANY_VERSION=1.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-}
case "$mode" in
  check | fix) shift ;;
  *) echo "usage: scripts/format.sh check|fix [PATH...]" >&2; exit 2 ;;
esac
CF=${CLANG_FORMAT:-}
if [ -z "$CF" ]; then
  for c in clang-format-14 clang-format; do
    if command -v "$c" >/dev/null; then CF=$c; break; fi
  done
fi
if [ -z "$CF" ] || ! command -v "$CF" >/dev/null; then
  echo "format: clang-format not found (scripts/install-deps.sh installs it; or CLANG_FORMAT=...)" >&2
  exit 2
fi
major=$("$CF" --version | sed -n 's/.*version \([0-9]*\).*/\1/p')
if [ "$major" != 14 ] && [ "${GP_FORMAT_ANY_VERSION:-0}" != 1 ]; then
  echo "format: $CF is version $major; .clang-format was measured with 14, whose layout CI checks" \
    "(GP_FORMAT_ANY_VERSION=1 to use it anyway)" >&2
  exit 2
fi
[ $# -gt 0 ] || set -- src tests bench fuzz
mapfile -t files < <(git ls-files -- "$@" | grep -E '\.(cpp|h|hpp|cc)$' || true)
if [ ${#files[@]} -eq 0 ]; then
  echo "format: no C++ files under $*" >&2
  exit 2
fi
if [ "$mode" = fix ]; then
  printf '%s\0' "${files[@]}" | xargs -0 -n 16 -P "${JOBS:-$(nproc)}" "$CF" -i --style=file
  echo "format: ${#files[@]} files formatted with $CF"
  exit 0
fi
# check: --dry-run names each file that would change (one warning per changed region); any other
# message (a bad .clang-format, an unreadable file) is an error, not a pass.
out=$(printf '%s\0' "${files[@]}" | xargs -0 -n 16 -P "${JOBS:-$(nproc)}" "$CF" --dry-run -Werror --style=file \
  2>&1 >/dev/null) && rc=0 || rc=$?
bad=$(printf '%s\n' "$out" | sed -n 's/^\([^:]*\):[0-9]*:[0-9]*: error: code should be clang-formatted.*/\1/p' | sort -u)
if [ -n "$bad" ]; then
  n=$(printf '%s\n' "$bad" | wc -l)
  printf '%s\n' "$bad"
  echo "format: $n of ${#files[@]} files differ from .clang-format; scripts/format.sh fix rewrites them" >&2
  exit 1
fi
if [ "$rc" != 0 ]; then
  printf '%s\n' "$out" | head -20 >&2
  echo "format: $CF failed (exit $rc)" >&2
  exit 2
fi
echo "format: ${#files[@]} files follow .clang-format"
