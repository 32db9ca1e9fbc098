#!/usr/bin/env bash
# Installs, builds and starts attend-server with its defaults: gRPC on 0.0.0.0:50051,
# Prometheus metrics on 0.0.0.0:9464. Extra arguments go to the server (see --help).
set -euo pipefail
cd "$(dirname "$0")/.."
# The server and the CLI only (the first ten commands use both): the tests and benchmarks are
# scripts/test.sh's to build, which on a fresh clone took most of the ten minutes to SERVING.
ATTEND_BUILD_TARGETS="attend-server attend" bash scripts/setup.sh
exec "${ATTEND_BUILD_DIR:-build}/server/attend-server" "$@"
