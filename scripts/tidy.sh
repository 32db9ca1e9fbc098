#!/usr/bin/env bash
# Runs clang-tidy on recently changed C++ sources, remembering clean results: see scripts/tidy.py
# (ATTEND_TIDY_HOURS, ATTEND_TIDY_COMMITS, ATTEND_TIDY_CACHE, ATTEND_BUILD_DIR, ATTEND_JOBS). Exit 1 on findings.
set -euo pipefail
exec python3 "$(dirname "$0")/tidy.py" "$@"
