#!/usr/bin/env bash
# Runs clang-tidy (.clang-tidy's checks, warnings as errors) on the C++ sources that changed in
# the last ATTEND_TIDY_COMMITS commits (default 20; "all" for every source), against the
# compile commands of a configured build (ATTEND_BUILD_DIR, default build/). A fresh clone of
# main has no branch to compare with, so "changed" means recent history: each landing is
# checked at least once while its files are still that recent. Headers are checked through the
# sources that include them (.clang-tidy's HeaderFilterRegex). Exit 1 naming the findings.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${ATTEND_BUILD_DIR:-build}
commits=${ATTEND_TIDY_COMMITS:-20}
jobs=${ATTEND_JOBS:-$(nproc)}
if ! command -v clang-tidy >/dev/null; then
  echo "tidy: clang-tidy is not installed (scripts/setup.sh installs it)" >&2
  exit 1
fi
if [ ! -f "$build_dir/compile_commands.json" ]; then
  echo "tidy: $build_dir/compile_commands.json is missing: configure the build first" >&2
  exit 1
fi
# The sources the build compiles (generated code left out), as paths relative to the root.
mapfile -t compiled < <(python3 - "$build_dir/compile_commands.json" "$PWD" <<'PY'
import json, os, sys
root = sys.argv[2]
for f in sorted({e["file"] for e in json.load(open(sys.argv[1]))}):
    rel = os.path.relpath(f, root)
    if not rel.startswith("..") and not rel.startswith(os.path.basename(sys.argv[1].split("/")[0])):
        print(rel)
PY
)
if [ "$commits" = all ]; then
  files=("${compiled[@]}")
else
  total=$(git rev-list --count HEAD)
  [ "$commits" -ge "$total" ] && commits=$((total - 1))
  mapfile -t changed < <(git diff --name-only --diff-filter=AMR "HEAD~$commits" HEAD -- '*.cc')
  files=()
  for f in "${changed[@]}"; do
    for c in "${compiled[@]}"; do
      if [ "$f" = "$c" ]; then files+=("$f"); break; fi
    done
  done
fi
if [ ${#files[@]} -eq 0 ]; then
  echo "tidy: no compiled C++ source changed in the last $commits commits"
  exit 0
fi
echo "tidy: ${#files[@]} files, $jobs at a time"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
printf '%s\n' "${files[@]}" |
  xargs -P "$jobs" -I{} sh -c 'clang-tidy -p "$1" --quiet "$2" >"$3.$$" 2>&1 || { cat "$3.$$" >>"$3"; echo "tidy: FAILED $2" >>"$3"; }; rm -f "$3.$$"' _ "$build_dir" {} "$log"
if [ -s "$log" ]; then
  grep -E "error:|warning:|tidy: FAILED" "$log" | sort -u
  echo "tidy: findings above (see .clang-tidy)" >&2
  exit 1
fi
echo "tidy: ${#files[@]} files clean"
