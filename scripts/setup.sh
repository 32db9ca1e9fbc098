#!/usr/bin/env bash
# Installs what attend needs from Debian bookworm (only what is missing) and builds it into
# build/ (Release). Idempotent: a second run only rebuilds what changed.
#   ATTEND_BUILD_DIR   build directory (default: build)
#   ATTEND_JOBS        parallel compile jobs (default: number of CPUs)
#   ATTEND_BUILD_TARGETS  space-separated CMake targets to build (default: all)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/ccache_env.sh
source scripts/ccache_env.sh

packages=(
  cmake g++ make pkg-config
  ccache  # a second build of a fresh clone reuses the first one's objects
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler grpc-proto
  libabsl-dev libdnnl-dev prometheus-cpp-dev
  libxxhash-dev  # XXH3 checksums of KV-cache snapshots
  libcli11-dev  # the CLI's flag parsing
  ocl-icd-opencl-dev  # oneDNN's CMake config needs OpenCL; libdnnl-dev only recommends it
  libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-grpcio python3-numpy python3-protobuf
  python3-torch  # the Python package's torch paths, and the offload tests' Llama-shaped model
  # Debian's torch takes its matmuls from whatever libblas.so.3 is installed, the reference BLAS
  # by default: 1.6 GFLOP/s, which made the in-process peer and the model's dense layers in
  # bench/offload_step.py 18x slower than with OpenBLAS (a 1024x512x1376 linear: 442 ms, 25 ms).
  libopenblas0-pthread
  openssl
  clang libclang-rt-14-dev libomp-14-dev  # scripts/fuzz.sh: libFuzzer, and OpenMP for clang
  clang-tidy  # scripts/tidy.sh: .clang-tidy's checks on recently changed sources
  nginx prometheus python3-yaml  # deploy/: the local fleet's proxy, promtool, config tests
  librsvg2-bin  # rsvg-convert: the CLI's pictures are rendered to PNG in a test
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The Kubernetes manifests' schema test runs under Node.js; machines that bring their own Node.js
# (with its npm) keep it, since Debian's npm package would conflict with it.
if ! command -v npm >/dev/null; then
  echo "setup: installing nodejs npm"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
fi

build_dir=${ATTEND_BUILD_DIR:-build}
jobs=${ATTEND_JOBS:-$(nproc)}
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release >/dev/null
# ATTEND_BUILD_TARGETS: only these (scripts/serve.sh builds the server and the CLI); default all.
targets=()
for t in ${ATTEND_BUILD_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$build_dir" -j "$jobs" "${targets[@]}"
