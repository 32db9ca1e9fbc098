#!/usr/bin/env bash
# Installs, builds and runs every test: unit, in-process server, CLI and end-to-end (Python).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
build_dir=${ATTEND_BUILD_DIR:-build}
ctest --test-dir "$build_dir" --output-on-failure -j "${ATTEND_JOBS:-$(nproc)}"
