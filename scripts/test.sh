#!/usr/bin/env bash
# Installs, builds and runs every test: unit, in-process server, CLI and end-to-end (Python),
# then the concurrency tests again under ThreadSanitizer (a second build in build-tsan, label
# tsan; ATTEND_SKIP_TSAN=1 skips it) and the KV cache and engine tests under AddressSanitizer
# with UndefinedBehaviorSanitizer (build-asan, label asan; ATTEND_SKIP_ASAN=1 skips it).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
build_dir=${ATTEND_BUILD_DIR:-build}
jobs=${ATTEND_JOBS:-$(nproc)}
ctest --test-dir "$build_dir" --output-on-failure -j "$jobs"

if [ "${ATTEND_SKIP_TSAN:-0}" != 1 ]; then
  tsan_dir=${build_dir}-tsan
  cmake -S . -B "$tsan_dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DATTEND_SANITIZE=thread \
    -DATTEND_BUILD_BENCH=OFF >/dev/null
  cmake --build "$tsan_dir" -j "$jobs" --target kv_cache_test kv_cache_lifecycle_test kv_cache_limits_test \
    scratch_pool_test
  # One OpenMP thread: libgomp is not built with TSan (see tests/CMakeLists.txt).
  OMP_NUM_THREADS=1 \
    TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$PWD/tests/tsan.supp" \
    ctest --test-dir "$tsan_dir" -L tsan --output-on-failure -j "$jobs"
fi

if [ "${ATTEND_SKIP_ASAN:-0}" != 1 ]; then
  # The KV cache and the engine under AddressSanitizer and UndefinedBehaviorSanitizer (label
  # asan): use after release, reads past a tensor, leaked blocks.
  asan_dir=${build_dir}-asan
  cmake -S . -B "$asan_dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DATTEND_SANITIZE=address,undefined \
    -DATTEND_BUILD_BENCH=OFF >/dev/null
  cmake --build "$asan_dir" -j "$jobs" --target kv_cache_test kv_cache_lifecycle_test kv_cache_limits_test \
    attention_engine_test
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    ctest --test-dir "$asan_dir" -L asan --output-on-failure -j "$jobs"
fi
