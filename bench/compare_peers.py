#!/usr/bin/python3
"""Side-by-side: attend's engine, Debian's PyTorch and ggml on the same attention shapes.

Runs attend's benchmark programs (build/bench/attention_bench and decode_bench), the same shapes
through PyTorch (matmul + masked softmax + matmul, as a straightforward implementation does) and
through ggml's flash attention (the CPU attention of llama.cpp, build/bench/ggml_peer), and
prints one table with all three and this machine's limits measured by attend in the same run. A
peer that is not installed is skipped, saying so.

ggml is not a Debian package: bash bench/ggml/build.sh builds ggml_peer from the ggml sources of
a pinned npm package (see there). Its K/V take the same dtype as attend's (f32, bf16); the
decode table also gives ggml with f16 K/V, its usual cache type.

Debian's PyTorch takes its BLAS from the libblas.so.3 alternative: the reference BLAS unless
OpenBLAS is installed (apt-get install python3-torch libopenblas0-pthread), which this script
reports. OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE, which some machines set, mislead OpenBLAS, so
they are removed for the PyTorch measurements only (a child process).

    /usr/bin/python3 bench/compare_peers.py [--build build]
"""
import argparse
import json
import os
import subprocess
import sys

PREFILL = [  # (heads, kv_heads, n, d)
    (8, 8, 2048, 128),
    (32, 8, 2048, 128),
    (8, 8, 2048, 64),
]
DECODE = [  # (heads, kv_heads, context, batch)
    (32, 8, 4096, 1),
    (32, 8, 16384, 1),
    (32, 8, 4096, 16),
]

TORCH_CHILD = r"""
import json, sys, time
import torch
torch.set_num_threads(int(sys.argv[1]))
spec = json.loads(sys.argv[2])
results = []

def best(fn, reps=3):
    fn()
    t = float("inf")
    for _ in range(reps):
        start = time.perf_counter(); fn(); t = min(t, time.perf_counter() - start)
    return t

for dtype_name in ("float32", "bfloat16"):
    dtype = getattr(torch, dtype_name)
    for heads, kv, n, d in spec["prefill"]:
        q = torch.randn(heads, n, d, dtype=dtype)
        k = torch.randn(kv, n, d, dtype=dtype).repeat_interleave(heads // kv, 0)
        v = torch.randn(kv, n, d, dtype=dtype).repeat_interleave(heads // kv, 0)
        mask = torch.triu(torch.ones(n, n, dtype=torch.bool), 1)
        def run():
            s = (q @ k.transpose(1, 2)) * (d ** -0.5)
            s = s.masked_fill(mask, float("-inf"))
            return torch.softmax(s.float(), -1).to(dtype) @ v
        seconds = best(run)
        pairs = heads * n * (n + 1) // 2
        results.append({"kind": "prefill", "dtype": dtype_name, "shape": [heads, kv, n, d],
                        "seconds": seconds, "useful_flops": 4.0 * d * pairs / seconds})
    for heads, kv, context, batch in spec["decode"]:
        d = 128
        group = heads // kv
        qs = [torch.randn(kv, group, d, dtype=dtype) for _ in range(batch)]
        ks = [torch.randn(kv, context, d, dtype=dtype) for _ in range(batch)]
        vs = [torch.randn(kv, context, d, dtype=dtype) for _ in range(batch)]
        def run():
            for q, k, v in zip(qs, ks, vs):
                torch.softmax(((q @ k.transpose(1, 2)) * d ** -0.5).float(), -1).to(dtype) @ v
        seconds = best(run)
        kv_bytes = 2.0 * batch * context * kv * d * (4 if dtype_name == "float32" else 2)
        results.append({"kind": "decode", "dtype": dtype_name, "shape": [heads, kv, context, batch],
                        "seconds": seconds, "kv_bytes_per_second": kv_bytes / seconds})
print(json.dumps({"version": torch.__version__, "results": results}))
"""


def run_ggml(binary, threads, heads, kv, n_q, n_kv, d, kv_type, causal, batch, reps, evict):
    """ggml_peer's JSON for one shape, or None (with the reason printed) when it fails."""
    args = [binary] + [str(x) for x in (heads, kv, n_q, n_kv, d, kv_type, int(causal), batch,
                                        threads, reps, int(evict))]
    run = subprocess.run(args, capture_output=True, text=True)
    if run.returncode != 0:
        print("ggml %s: failed (%s)" % (" ".join(args[1:]), run.stderr.strip()))
        return None
    return json.loads(run.stdout)


def run_bench(binary, filter_regex):
    run = subprocess.run([binary, "--benchmark_format=json", "--benchmark_filter=" + filter_regex],
                         capture_output=True, text=True, check=True)
    machine = [line for line in run.stderr.splitlines() if line.startswith("machine:")]
    return (machine[0] if machine else ""), json.loads(run.stdout)["benchmarks"]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build", default="build")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    args = parser.parse_args()

    attention = os.path.join(args.build, "bench", "attention_bench")
    decode = os.path.join(args.build, "bench", "decode_bench")
    for binary in (attention, decode):
        if not os.path.exists(binary):
            sys.exit("%s is missing: run bash scripts/setup.sh first" % binary)

    machine, prefill = run_bench(attention, "CausalPrefill/n:2048/.*/threads:0")
    _, decoded = run_bench(decode, "(context:(4096|16384)/batch:1/|context:4096/batch:16/)storage:[012]/threads:0")
    print(machine)
    # attend's ratios are against the limits probed around each of its cases; the peers', which
    # run later, against the best probe of the run.
    # Each prefill case's probe is the matmul of its own dtype (f32 or bf16): the peers' ratios are
    # against the probe of the same dtype.
    def prefill_dtype(b):
        fields = dict(part.split(":") for part in b["name"].split("/")[1:] if ":" in part)
        return "bfloat16" if fields["bf16"] == "1" else "float32"
    matmul = {dtype: max([b["matmul_GFLOPs"] for b in prefill if prefill_dtype(b) == dtype] or [0.0])
              for dtype in ("float32", "bfloat16")}
    bandwidth = max(b["read_bw_GBs"] for b in decoded)

    torch_results = None
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    spec = json.dumps({"prefill": PREFILL, "decode": DECODE})
    child = subprocess.run(["/usr/bin/python3", "-c", TORCH_CHILD, str(args.threads), spec],
                           capture_output=True, text=True, env=env)
    if child.returncode != 0:
        reason = child.stderr.strip().splitlines()[-1] if child.stderr.strip() else "failed"
        print("PyTorch: skipped (%s; Debian's python3-torch provides it)" % reason)
    else:
        torch_results = json.loads(child.stdout)
        blas = os.path.realpath("/usr/lib/x86_64-linux-gnu/libblas.so.3")
        print("PyTorch %s with %d threads, BLAS %s (OPENBLAS_CORETYPE/L2_SIZE unset)"
              % (torch_results["version"], args.threads, blas))

    ggml_binary = os.path.join(args.build, "bench", "ggml_peer")
    ggml = {}
    if not os.path.exists(ggml_binary):
        print("ggml: skipped (%s is not built; bash bench/ggml/build.sh builds it)" % ggml_binary)
    else:
        print("ggml (llama.rn's copy, see bench/ggml/build.sh) with %d threads, f32 accumulation"
              % args.threads)
        ggml_type = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}
        for dtype in ("float32", "bfloat16"):
            for heads, kv, n, d in PREFILL:
                r = run_ggml(ggml_binary, args.threads, heads, kv, n, n, d, ggml_type[dtype],
                             True, 1, 3, False)
                if r:
                    ggml[("prefill", dtype, (heads, kv, n, d))] = r["useful_flops"] / 1e9
        for dtype in ("float32", "bfloat16", "float16"):
            for heads, kv, context, batch in DECODE:
                r = run_ggml(ggml_binary, args.threads, heads, kv, 1, context, 128,
                             ggml_type[dtype], False, batch, 10, True)
                if r:
                    ggml[("decode", dtype, (heads, kv, context, batch))] = (
                        r["kv_bytes_per_second"] / 1e9)

    def ggml_figure(kind, dtype, shape):
        return ggml.get((kind, dtype, tuple(shape)), "-")

    def torch_figure(kind, dtype, shape):
        if not torch_results:
            return "-"
        for r in torch_results["results"]:
            if r["kind"] == kind and r["dtype"] == dtype and r["shape"] == list(shape):
                return r["useful_flops"] / 1e9 if kind == "prefill" else r["kv_bytes_per_second"] / 1e9
        return "-"

    def fmt(x, digits=1):
        return ("%." + str(digits) + "f") % x if isinstance(x, float) else str(x)

    print()
    print("attend and ggml: median iteration; PyTorch: best of its runs")
    # Where attend runs bf16 on the f32 matmul (its engine says "-emulated"), the bf16 cases'
    # probe is the f32 matmul's.
    emulated = any("emulated" in b.get("label", "") for b in prefill if prefill_dtype(b) == "bfloat16")
    print("prefill, causal: useful GFLOP/s (4 x d per attended pair); best matmul probes: "
          "f32 %.1f GFLOP/s, bf16 %.1f GFLOP/s%s; each case against its dtype's"
          % (matmul["float32"], matmul["bfloat16"],
             " (the f32 matmul, which bf16 runs on here)" if emulated else ""))
    print("%-34s %10s %7s %10s %7s %10s %7s" % ("shape (heads/kv, n, d, dtype)", "attend", "ratio",
                                               "PyTorch", "ratio", "ggml", "ratio"))
    for b in prefill:
        name = b["name"]
        fields = dict(part.split(":") for part in name.split("/")[1:] if ":" in part)
        heads, kv, n, d = (int(fields[x]) for x in ("heads", "kv_heads", "n", "d"))
        dtype = prefill_dtype(b)
        peak = matmul[dtype]
        t = torch_figure("prefill", dtype, (heads, kv, n, d))
        g = ggml_figure("prefill", dtype, (heads, kv, n, d))
        print("%-34s %10.1f %7.2f %10s %7s %10s %7s" % (
            "%d/%d, %d, %d, %s" % (heads, kv, n, d, dtype), b["useful_GFLOPs"], b["ratio"], fmt(t),
            fmt(t / peak, 2) if t != "-" else "-", fmt(g), fmt(g / peak, 2) if g != "-" else "-"))
    print()
    print("decode over the cache: K/V GB/s read; best read bandwidth probe %.1f GB/s" % bandwidth)
    print("%-34s %10s %7s %10s %7s %10s %7s" % ("shape (heads/kv, context, batch, dtype)", "attend",
                                               "ratio", "PyTorch", "ratio", "ggml", "ratio"))
    for b in decoded:
        fields = dict(part.split(":") for part in b["name"].split("/")[1:] if ":" in part)
        context, batch = int(fields["context"]), int(fields["batch"])
        dtype = {"0": "float32", "1": "bfloat16", "2": "int8"}[fields["storage"]]
        t = torch_figure("decode", dtype, (32, 8, context, batch))
        g = ggml_figure("decode", dtype, (32, 8, context, batch))
        print("%-34s %10.1f %7.2f %10s %7s %10s %7s" % (
            "32/8, %d, %d, %s" % (context, batch, dtype), b["KV_GBs"], b["ratio"], fmt(t),
            fmt(t / bandwidth, 2) if t != "-" else "-", fmt(g), fmt(g / bandwidth, 2) if g != "-" else "-"))
    for heads, kv, context, batch in DECODE:
        g = ggml_figure("decode", "float16", (heads, kv, context, batch))
        if g != "-":
            print("%-34s %10s %7s %10s %7s %10s %7s" % (
                "%d/%d, %d, %d, float16" % (heads, kv, context, batch), "-", "-", "-", "-", fmt(g),
                fmt(g / bandwidth, 2)))


if __name__ == "__main__":
    main()
