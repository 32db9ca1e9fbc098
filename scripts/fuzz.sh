#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz with clang, ASan and UBSan into build-fuzz/ (only
# those targets and what they link) and fuzzes each for a while, two at a time. Exits non-zero
# when a target crashed, timed out, leaked, ran out of memory or failed one of its checks,
# naming the reproducer; rerun one with: build-fuzz/tests/fuzz/<target>_fuzz <reproducer>.
#
# Each target fuzzes a working copy of its corpus, build-fuzz/fuzz-work/<target>/corpus (kept
# between runs, refreshed from tests/fuzz/corpus/<target> each time); the committed corpus is
# only changed with ATTEND_FUZZ_MERGE=1, which merges the inputs that add coverage into it.
#
#   ATTEND_FUZZ_SECONDS    seconds per target (default 30)
#   ATTEND_FUZZ_TARGETS    targets to run, e.g. "gguf npy" (default: every target)
#   ATTEND_FUZZ_PARALLEL   targets fuzzed at once (default 2)
#   ATTEND_FUZZ_BUILD_DIR  build directory (default build-fuzz)
#   ATTEND_FUZZ_MERGE      1: merge new coverage into tests/fuzz/corpus/<target>
#   ATTEND_JOBS            parallel compile jobs (default 2)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/ccache_env.sh
source scripts/ccache_env.sh

seconds=${ATTEND_FUZZ_SECONDS:-30}
parallel=${ATTEND_FUZZ_PARALLEL:-2}
build_dir=${ATTEND_FUZZ_BUILD_DIR:-build-fuzz}
jobs=${ATTEND_JOBS:-2}
all_targets=(attention_service kv_cache_service planner_service kv_cache snapshot hf_config gguf
  json_input npy)
read -r -a targets <<<"${ATTEND_FUZZ_TARGETS:-${all_targets[*]}}"

start=$(date +%s)
CC=clang CXX=clang++ cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DATTEND_SANITIZE=address,undefined -DATTEND_FUZZ=ON -DATTEND_BUILD_BENCH=OFF >/dev/null
build_targets=()
for t in "${targets[@]}"; do build_targets+=(--target "${t}_fuzz"); done
cmake --build "$build_dir" -j "$jobs" "${build_targets[@]}"
echo "fuzz: built in $(($(date +%s) - start)) s"

# Fuzz one target; its log is fuzz-work/<target>/log.
fuzz_one() {
  local t=$1 work="$build_dir/fuzz-work/$1"
  mkdir -p "$work/corpus" "$work/artifacts"
  rm -f "$work"/artifacts/*
  cp -n tests/fuzz/corpus/"$t"/* "$work/corpus/" 2>/dev/null || true
  # One OpenMP thread: the machine is shared, and the targets compute tiny problems.
  OMP_NUM_THREADS=1 \
    ASAN_OPTIONS=detect_leaks=1 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$build_dir/tests/fuzz/${t}_fuzz" -max_total_time="$seconds" -timeout=10 \
    -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$work/artifacts/" \
    "$work/corpus" >"$work/log" 2>&1
}

failed=()
declare -A pids=()  # running fuzzers: pid -> target
report() {  # report <target> <exit status>
  local t=$1 rc=$2 work="$build_dir/fuzz-work/$1"
  local execs rate corpus
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$work/log" | tail -1)
  corpus=$(find "$work/corpus" -type f | wc -l)
  if ((rc == 0)); then
    echo "fuzz: $t ok: ${execs:-?} runs, ${rate:-?}/s, corpus $corpus files"
  else
    failed+=("$t")
    echo "fuzz: $t FAILED (exit $rc); log $work/log"
    grep -E "^(==[0-9]+==ERROR|SUMMARY|fuzz:|.*runtime error)" "$work/log" | head -5 | sed 's/^/    /'
    for f in "$work"/artifacts/*; do
      if [[ -e $f ]]; then echo "    reproducer: $f"; fi
    done
  fi
}
# Waits for one fuzzer to end and reports it.
reap_one() {
  local done_pid rc
  set +e
  wait -n -p done_pid
  rc=$?
  set -e
  report "${pids[$done_pid]}" "$rc"
  unset "pids[$done_pid]"
}
for t in "${targets[@]}"; do
  fuzz_one "$t" &
  pids[$!]=$t
  if ((${#pids[@]} >= parallel)); then reap_one; fi
done
while ((${#pids[@]})); do reap_one; done

if [[ ${ATTEND_FUZZ_MERGE:-0} == 1 ]]; then
  for t in "${targets[@]}"; do
    OMP_NUM_THREADS=1 "$build_dir/tests/fuzz/${t}_fuzz" -merge=1 -timeout=10 \
      "tests/fuzz/corpus/$t" "$build_dir/fuzz-work/$t/corpus" >/dev/null 2>&1 ||
      echo "fuzz: merging into tests/fuzz/corpus/$t failed"
  done
fi

echo "fuzz: ${#targets[@]} targets, ${seconds} s each, $(($(date +%s) - start)) s in all"
if ((${#failed[@]})); then
  echo "fuzz: FAILED: ${failed[*]}"
  exit 1
fi
