#!/usr/bin/env bash
# Installs, builds and runs every test, then the nets for what tests written by hand miss:
#   1. build/ (Release): unit, in-process server, CLI, fuzz corpora, end-to-end (Python) tests,
#      the local fleet behind nginx, and deploy/'s configs (promtool, Kubernetes schemas, compose);
#   2. clang-tidy on the C++ sources the latest landing changed, then a 60 s soak of the real
#      server (scripts/tidy.sh, scripts/soak.sh; ATTEND_SKIP_TIDY=1, ATTEND_SKIP_SOAK=1);
#   3. the concurrent tests under ThreadSanitizer: the KV cache and the worker pool (build-tsan,
#      label tsan; ATTEND_SKIP_TSAN=1 skips it);
#   4. the whole suite, end-to-end tests included, under AddressSanitizer with
#      UndefinedBehaviorSanitizer and LeakSanitizer (build-asan; ATTEND_SKIP_ASAN=1 skips it);
#   5. each libFuzzer target for ATTEND_FUZZ_SECONDS (default 30) when clang is installed
#      (scripts/fuzz.sh, build-fuzz; ATTEND_SKIP_FUZZ=1 skips it).
# Sanitizer builds compile at -O1 -g1 and build no benchmarks, to keep all of it under 30 minutes
# on two cores.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/ccache_env.sh
source scripts/ccache_env.sh
phase_start=$SECONDS
# phase NAME: how long the phase that just ended took (CI's log keeps the time of each).
phase() {
  echo "test: $1 took $((SECONDS - phase_start)) s"
  phase_start=$SECONDS
}
bash scripts/setup.sh
phase "setup and the Release build"
# setup.sh installed promtool: the scrape lint must run, not skip.
export ATTEND_REQUIRE_PROMTOOL=1
# setup.sh installed librsvg2-bin: the PNG rendering test must run, not skip.
export ATTEND_REQUIRE_RSVG=1
build_dir=${ATTEND_BUILD_DIR:-build}
jobs=${ATTEND_JOBS:-$(nproc)}
ctest --test-dir "$build_dir" --output-on-failure -j "$jobs"
phase "the Release tests"

if [ "${ATTEND_SKIP_TIDY:-0}" != 1 ]; then
  # .clang-tidy's checks on the sources changed by the latest landing (the commits of the 12
  # hours before HEAD); clean results are cached by their preprocessed text, so a second run
  # checks only what changed (scripts/tidy.py).
  ATTEND_BUILD_DIR="$build_dir" bash scripts/tidy.sh
  phase "clang-tidy"
fi

if [ "${ATTEND_SKIP_SOAK:-0}" != 1 ]; then
  bash scripts/soak.sh --server "$build_dir/server/attend-server" --seconds "${ATTEND_SOAK_SECONDS:-60}"
  phase "the soak"
fi

if [ "${ATTEND_SKIP_TSAN:-0}" != 1 ]; then
  tsan_dir=${build_dir}-tsan
  cmake -S . -B "$tsan_dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DATTEND_SANITIZE=thread \
    -DATTEND_BUILD_BENCH=OFF >/dev/null
  # Not the in-process server tests: Debian's gRPC synchronises its threads with absl::Mutex
  # and atomics inside prebuilt libraries, so every request handed from one gRPC thread to
  # another reads as a race in attend's code too. The server's own concurrency (worker pool,
  # KV cache) is tested here without gRPC.
  cmake --build "$tsan_dir" -j "$jobs" --target \
    kv_cache_test kv_cache_lifecycle_test kv_cache_limits_test kv_cache_snapshot_test \
    scratch_pool_test \
    server_worker_pool_test server_idle_watch_test
  # One OpenMP thread: libgomp is not built with TSan (see tests/CMakeLists.txt). Only the
  # binaries built above have tests in the tsan label.
  OMP_NUM_THREADS=1 \
    TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$PWD/tests/tsan.supp" \
    ctest --test-dir "$tsan_dir" -L tsan --output-on-failure -j "$jobs"
  phase "ThreadSanitizer (build and tests)"
fi

if [ "${ATTEND_SKIP_ASAN:-0}" != 1 ]; then
  asan_dir=${build_dir}-asan
  cmake -S . -B "$asan_dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DATTEND_SANITIZE=address,undefined \
    -DATTEND_BUILD_BENCH=OFF >/dev/null
  cmake --build "$asan_dir" -j "$jobs"
  ASAN_OPTIONS=detect_leaks=1 LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp" \
    UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    ctest --test-dir "$asan_dir" --output-on-failure -j "$jobs"
  phase "AddressSanitizer (build and tests)"
fi

if [ "${ATTEND_SKIP_FUZZ:-0}" != 1 ]; then
  if command -v clang++ >/dev/null; then
    bash scripts/fuzz.sh
    phase "fuzzing (build and runs)"
  else
    echo "test: clang++ not found, no fuzzing (the corpora ran as regression tests above)"
  fi
fi
