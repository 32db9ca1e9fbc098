#!/usr/bin/env bash
# Soak: 32 concurrent clients against the real attend-server with a small KV budget, creating,
# appending, decoding (DecodeBatch, DecodeStream), forking, truncating and releasing sequences.
# Passes only with no unexpected status codes, a bounded resident set and an empty cache at
# the end (see tests/e2e/soak.py).
#
#   bash scripts/soak.sh                       # build if needed, 60 s
#   bash scripts/soak.sh --minutes 30          # by hand, longer
#   bash scripts/soak.sh --server build/server/attend-server --seconds 20 [soak.py flags]
set -euo pipefail
cd "$(dirname "$0")/.."
server=""
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --server) server=$2; shift 2 ;;
    --server=*) server=${1#--server=}; shift ;;
    -h|--help) sed -n 2,9p "$0"; /usr/bin/python3 tests/e2e/soak.py --help; exit 0 ;;
    *) args+=("$1"); shift ;;
  esac
done
if [ -z "$server" ]; then
  build_dir=${ATTEND_BUILD_DIR:-build}
  server=$build_dir/server/attend-server
  if [ ! -x "$server" ]; then
    export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$(dirname "$PWD")}
    cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build "$build_dir" -j "${ATTEND_JOBS:-$(nproc)}" --target attend-server
  fi
fi
exec /usr/bin/python3 tests/e2e/soak.py --server "$server" --proto proto --seconds 60 "${args[@]}"
