#!/usr/bin/env bash
# Installs, builds and starts attend-server with its defaults: gRPC on 0.0.0.0:50051,
# Prometheus metrics on 0.0.0.0:9464. Extra arguments go to the server (see --help).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec "${ATTEND_BUILD_DIR:-build}/server/attend-server" "$@"
