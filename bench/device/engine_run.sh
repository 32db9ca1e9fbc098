#!/usr/bin/env bash
# The engine's figures on a lent machine, in one command (bench/device/README.md says how to pack
# the binaries and the exact device call): the binaries packed by ../shared/tools/pack-binaries.sh
# are unpacked to /tmp, then, each part under a time cap, everything into $OUT:
#   engine.log           the machine (nproc, lscpu, AMX?), each binary's probe line, every part's
#                        console output and how long it took
#   decode_kernels.json  decode_bench: BM_KernelChoice, BM_DecodeKernel (every kernel set),
#                        BM_InstructionRate
#   decode.json          decode_bench: DecodeBatch f32/bf16/int8 at 4096 tokens, batch 1 and 16
#   attention.json       attention_bench: causal prefill f32 and bf16, 8/8 heads, d 128, n 2048, 8192,
#                        with the shared tiles packed and (packed:0) plain; one prefill tile's
#                        matmuls on one core, weights plain and packed
#   peers.json           bench/compare_peers.py --json (PyTorch matmul and SDPA peers; its table is
#                        in engine.log)
#   decode_scaling.json  decode_bench --scaling_threads=1,2,4,8,16: f32/bf16/int8, batch 1, 2 and
#                        16 at 4096 tokens (last: the part most likely to meet the budget's end)
#
#   bash bench/device/engine_run.sh [--quick] ARCHIVE      (from the repository root)
#
# --quick (or ENGINE_QUICK=1): tiny sizes, to test the whole script on a small machine (about
# 2 minutes on 2 cores). ENGINE_BUDGET_S (default 480, quick 240): the whole run's time; a part
# gets its own cap or what is left of the budget, whichever is less. OUT defaults to ./engine-out.
# ENGINE_PYTHON: the Python for compare_peers.py (default python3).
set -uo pipefail

quick=${ENGINE_QUICK:-0}
if [[ ${1:-} == --quick ]]; then
  quick=1
  shift
fi
if (($# != 1)) || [[ ! -f $1 ]]; then
  sed -n 2,20p "$0" >&2
  exit 2
fi
archive=$1
repo=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$PWD/engine-out}
mkdir -p "$OUT"
budget=${ENGINE_BUDGET_S:-$((quick ? 240 : 480))}
python=${ENGINE_PYTHON:-python3}
log=$OUT/engine.log
: >"$log"
# Everything into the log (it comes back even when the device call is cut off); at the end its
# last part to the console, which the device call returns.
echo "engine_run: logging to $log"
exec 3>&1 >>"$log" 2>&1
trap 'tail -c 11000 "$log" >&3' EXIT
export PYTHONUNBUFFERED=1
start=$SECONDS

section() { printf '\n=== %s (at %d s)\n' "$*" $((SECONDS - start)); }

# capped SECONDS COMMAND...: the command under timeout, for at most SECONDS or what is left of
# the budget; says how long it took and how it ended.
capped() {
  local cap=$1 left=$((budget - (SECONDS - start))) t0=$SECONDS rc
  shift
  ((cap > left)) && cap=$left
  if ((cap < 5)); then
    echo "engine_run: skipped, the budget of ${budget} s is spent: $*"
    echo "$(basename "$1") (skipped: budget spent)" >>"$failures"
    return 124
  fi
  timeout -k 5 "$cap" "$@"
  rc=$?
  if ((rc == 124 || rc == 137)); then
    echo "engine_run: stopped at its cap of ${cap} s: $*"
  elif ((rc != 0)); then
    echo "engine_run: exit status $rc: $*"
  fi
  ((rc == 0)) || echo "$(basename "$1") (status $rc)" >>"$failures"
  echo "engine_run: took $((SECONDS - t0)) s"
  return $rc
}

section "unpack $archive"
dir=/tmp/attend-bins
rm -rf "$dir"
mkdir -p "$dir"
failures=$dir/failures
: >"$failures"
# Python's tarfile where tar has no xz.
tar xJf "$archive" -C "$dir" ||
  "$python" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
    "$archive" "$dir" || { echo "engine_run: cannot unpack $archive"; exit 1; }
# One wrapper per binary sets LD_LIBRARY_PATH for it alone: Python and its torch keep the
# machine's own libraries (the archive holds Debian's libgomp, libssl, zlib, ...).
mkdir -p "$dir/run"
for b in "$dir"/bin/*; do
  name=$(basename "$b")
  # shellcheck disable=SC2016  # ${LD_LIBRARY_PATH...} is for the wrapper to expand
  printf '#!/bin/sh\nLD_LIBRARY_PATH=%s/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} exec %s "$@"\n' \
    "$dir" "$b" >"$dir/run/$name"
  chmod +x "$dir/run/$name"
done
echo "$(cd "$dir/bin" && echo *) ($(find "$dir/lib" -type f | wc -l) libraries in $dir/lib)"
for b in "$dir"/bin/*; do
  missing=$(LD_LIBRARY_PATH=$dir/lib ldd "$b" 2>&1 | grep -E 'not found|version .* not found')
  [[ -n $missing ]] && echo "engine_run: $(basename "$b") lacks: $missing"
done
run=$dir/run

section "machine"
echo "nproc: $(nproc)"
lscpu | grep -E '^(Model name|Socket|Core|Thread|NUMA node\(s\)|L[123][di]? cache|CPU\(s\))' || true
flags=$(grep -m1 '^flags' /proc/cpuinfo)
printf 'AVX-512/AMX flags:'
for f in avx2 fma avx512f avx512bw avx512_vnni avx512_bf16 avx512_fp16 amx_tile amx_bf16 amx_int8; do
  [[ " $flags " == *" $f "* ]] && printf ' %s' "$f"
done
echo
grep -E '^(MemTotal|MemAvailable|HugePages_Total)' /proc/meminfo
echo "THP: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null)"
echo "glibc: $(ldd --version 2>&1 | head -1)"
env | grep -E '^(OMP|KMP|GOMP|ONEDNN|DNNL|ATTEND)_' || true
echo "python: $(command -v "$python") $("$python" --version 2>&1)"
"$python" -c 'import torch
cpu = getattr(torch.backends, "cpu", None)
print("torch", torch.__version__, "cpu capability",
      cpu.get_cpu_capability() if cpu and hasattr(cpu, "get_cpu_capability") else "?",
      "threads", torch.get_num_threads())' 2>&1 | tail -1 | sed 's/^/torch: /'

section "probe lines"
"$run/attend-server" --version
"$run/attend-server" --address 127.0.0.1:0 --metrics_address= --kv_cache_bytes 256MiB \
  >"$dir/server.log" 2>&1 &
server=$!
for _ in $(seq 1 60); do
  grep -q 'listening' "$dir/server.log" && break
  sleep 0.5
done
kill "$server" 2>/dev/null
wait "$server" 2>/dev/null
grep -m1 'listening' "$dir/server.log" || { echo "engine_run: attend-server printed no start-up line:"; cat "$dir/server.log"; }
# The benchmarks' probe line ("machine: ..."), from one short case each.
capped 30 "$run/decode_bench" --benchmark_filter='BM_KernelChoice/storage:0$' \
  --benchmark_min_time=0.05 2>&1 | grep -E '^machine:|KernelChoice|^engine_run'
capped 30 "$run/attention_bench" --benchmark_filter='BM_CausalPrefill/n:512/heads:8/kv_heads:8/d:128/bf16:1/threads:0' \
  2>&1 | grep -E '^machine:|CausalPrefill|^engine_run'

# shellcheck disable=SC2054  # the flags take comma-separated lists
if ((quick)); then
  kernels='^BM_KernelChoice|^BM_InstructionRate/kind:0'
  context=1024
  scaling=(--scaling_threads=1,2 --scaling_contexts=1024 --scaling_batches=1,2 --scaling_storages=0)
  prefill='^BM_CausalPrefill/n:512/heads:8/kv_heads:8/d:128/bf16:[01]/threads:0/|^BM_PrefillTileMatmul/bf16:1'
  peers=(--small)
else
  kernels='^BM_KernelChoice|^BM_DecodeKernel|^BM_InstructionRate'
  context=4096
  scaling=(--scaling_threads=1,2,4,8,16 --scaling_contexts=4096 --scaling_batches=1,2,16
           --scaling_storages=0,1,2)
  prefill='^BM_CausalPrefill/n:(2048|8192)/heads:8/kv_heads:8/d:128/bf16:[01]/threads:0/|^BM_PrefillTileMatmul'
  peers=()
fi

section "decode_bench: kernel sets"
capped 60 "$run/decode_bench" --benchmark_filter="$kernels" \
  --benchmark_out="$OUT/decode_kernels.json" --benchmark_out_format=json

section "decode_bench: DecodeBatch at $context tokens, batch 1 and 16, f32/bf16/int8, all threads"
capped 60 "$run/decode_bench" \
  --benchmark_filter="^BM_DecodeBatch/context:$context/batch:(1|16)/storage:[012]/threads:0/idle:0" \
  --benchmark_out="$OUT/decode.json" --benchmark_out_format=json

section "attention_bench: causal prefill f32 and bf16, 8/8 heads, d 128"
capped 90 "$run/attention_bench" --benchmark_filter="$prefill" \
  --benchmark_out="$OUT/attention.json" --benchmark_out_format=json

section "compare_peers.py ${peers[*]}"
capped 180 "$python" "$repo/bench/compare_peers.py" --bench_dir "$run" \
  --threads "$(nproc)" --json "$OUT/peers.json" "${peers[@]}"

section "decode_bench: thread scaling ${scaling[*]}"
if "$run/decode_bench" --scaling_threads=1 --benchmark_list_tests 2>/dev/null | grep -q Scaling; then
  capped 180 "$run/decode_bench" "${scaling[@]}" --benchmark_filter='^BM_DecodeScaling' \
    --benchmark_out="$OUT/decode_scaling.json" --benchmark_out_format=json
else
  echo "engine_run: skipped, this decode_bench has no --scaling_threads (packed from an older build)"
fi

section "done"
ls -l "$OUT"
if [[ -s $failures ]]; then
  echo "engine_run: parts that failed or were stopped: $(tr '\n' ' ' <"$failures")"
  exit 1
fi
echo "engine_run: every part ran to its end"
