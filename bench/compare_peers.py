#!/usr/bin/python3
"""Side-by-side: attend's engine, PyTorch and ggml on the same attention shapes.

Runs attend's benchmark programs (build/bench/attention_bench and decode_bench), the same shapes
through PyTorch (bench/torch_peer.py, in a child process: matmul + masked softmax + matmul, as a
straightforward implementation does; and, with torch >= 2.1, its fused
torch.nn.functional.scaled_dot_product_attention, "SDPA") and through ggml's flash attention (the
CPU attention of llama.cpp, build/bench/ggml_peer), and prints one table with all of them and
this machine's limits measured by attend in the same run. A peer that is not installed is
skipped, saying so (Debian's torch 1.13 has no SDPA: "PyTorch SDPA: skipped (torch 1.13 < 2.1)").

SDPA gets K/V repeated to the query heads for prefill, as the matmul peer does; where the torch
has enable_gqa (2.5 and later) and a shape has fewer KV heads than query heads, it is also
measured with enable_gqa=True (column "SDPA gqa"). For decode both peers take each KV head's
group of query heads as its query rows. Before measuring, each SDPA variant is checked against
the matmul peer on a small shape (causal, GQA, scale d^-0.5) and the largest difference printed.

ggml is not a Debian package: bash bench/ggml/build.sh builds ggml_peer from the ggml sources of
a pinned npm package (see there). Its K/V take the same dtype as attend's (f32, bf16); the
decode table also gives ggml with f16 K/V, its usual cache type.

Debian's PyTorch takes its BLAS from the libblas.so.3 alternative: the reference BLAS unless
OpenBLAS is installed (apt-get install python3-torch libopenblas0-pthread). The BLAS line and the
JSON's torch.blas name the BLAS library the PyTorch child has loaded (torch.blas_info: torch's
build-time BLAS_INFO, "generic" for Debian's). OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE, which some
machines set, mislead OpenBLAS, so they are removed for the PyTorch measurements only (a child
process).

    /usr/bin/python3 bench/compare_peers.py [--build build] [--bench_dir DIR] [--python PY]
        [--threads N] [--small] [--json FILE]

--bench_dir: where attention_bench, decode_bench (and ggml_peer) are, default BUILD/bench (for
binaries unpacked elsewhere, bench/device/engine_run.sh). --python: the Python that runs the
PyTorch peers; default the one running this script if it has torch, else /usr/bin/python3
(Debian's python3-torch). --small: small shapes (n 512, context 1024), to check that everything
runs, not figures to quote. --json: every figure of the run (attend's benchmark rows, PyTorch's,
ggml's) written to FILE as well. --threads: a positive integer (default all CPUs).

The arguments are checked before any benchmark runs: --python must name an executable (a path,
or a name on PATH), --json a file that can be written (its folder exists, it is not a folder),
--threads a positive integer, and an explicit --bench_dir (or --build's bench/) must hold
attention_bench and decode_bench; a usage error (exit 2) names the flag. Where the PyTorch child
fails, "PyTorch: skipped (...)" says how (its exit status and last stderr line); the hint that
Debian's python3-torch provides torch comes only where importing torch failed.
"""
import argparse
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys

import torch_peer  # bench/torch_peer.py (imports no torch itself)

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
# attend's cases of those shapes (threads:0: all threads).
PREFILL_FILTER = "CausalPrefill/n:2048/.*/threads:0/packed:1"
DECODE_FILTER = "(context:(4096|16384)/batch:1/|context:4096/batch:16/)storage:[012]/threads:0"
# --small: cases attention_bench and decode_bench have at these sizes.
SMALL_PREFILL = [(8, 8, 512, 128), (32, 8, 512, 128)]
SMALL_DECODE = [(32, 8, 1024, 1), (32, 8, 1024, 16)]
SMALL_PREFILL_FILTER = "CausalPrefill/n:512/.*/threads:0/packed:1"
SMALL_DECODE_FILTER = "context:1024/batch:(1|16)/storage:[012]/threads:0/idle:0"

# The PyTorch peers: (bench/torch_peer.py's name, column heading).
TORCH_PEERS = [("matmul", "PyTorch"), ("sdpa", "SDPA"), ("sdpa_gqa", "SDPA gqa")]
# Width of the tables' first column.
LABEL_WIDTH = 40


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


def fields_of(benchmark):
    """A benchmark's name as its arguments: {"n": "2048", "heads": "8", ...}."""
    return dict(part.split(":", 1) for part in benchmark["name"].split("/")[1:] if ":" in part)


def prefill_dtype(benchmark):
    return "bfloat16" if fields_of(benchmark)["bf16"] == "1" else "float32"


def default_python():
    """The Python for the PyTorch peers: this one if it has torch, else Debian's."""
    if importlib.util.find_spec("torch") or not os.path.exists("/usr/bin/python3"):
        return sys.executable
    return "/usr/bin/python3"


def run_torch(python, threads, prefill_shapes, decode_shapes):
    """bench/torch_peer.py's JSON and "", or None and what failed, for "PyTorch: skipped (...)":
    the child's exit status and last stderr line, with the hint that Debian's python3-torch
    provides torch only where importing torch failed (torch_peer.NO_TORCH)."""
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    spec = json.dumps({"prefill": prefill_shapes, "decode": decode_shapes})
    try:
        child = subprocess.run([python, torch_peer.__file__, str(threads), spec],
                               capture_output=True, text=True, env=env)
    except OSError as e:  # executable, yet not a program (exec format error)
        return None, "%s could not be run: %s" % (python, e.strerror or e)
    lines = child.stderr.strip().splitlines()
    last = lines[-1].strip() if lines else ""
    if child.returncode == torch_peer.NO_TORCH and last.startswith(torch_peer.NO_TORCH_PREFIX):
        return None, "%s cannot import torch: %s; Debian's python3-torch provides it" % (
            python, last[len(torch_peer.NO_TORCH_PREFIX):])
    if child.returncode != 0:
        if child.returncode < 0:
            try:
                name = signal.Signals(-child.returncode).name
            except ValueError:
                name = "?"
            status = "killed by signal %d (%s)" % (-child.returncode, name)
        else:
            status = "exit status %d" % child.returncode
        return None, "%s bench/torch_peer.py failed: %s, %s" % (
            python, status, "last stderr line: " + last if last else "no stderr")
    try:
        return json.loads(child.stdout), ""
    except ValueError:
        return None, "%s bench/torch_peer.py exited 0 but printed no JSON%s" % (
            python, " (last stderr line: %s)" % last if last else "")


def describe_torch(torch_results, python, threads):
    """The lines that say which PyTorch ran and how its SDPA peer fared."""
    t = torch_results
    lines = []
    # The child's own word (torch_peer.measure): the JSON says the same.
    blas = t.get("blas") or "?"
    notes = []
    if t.get("blas_info") and t["blas_info"] != blas:
        notes.append("torch's BLAS_INFO %s" % t["blas_info"])
    if "openblas" in blas.lower():
        notes.append("OPENBLAS_CORETYPE/L2_SIZE unset")
    if notes:
        blas += " (%s)" % "; ".join(notes)
    lines.append("PyTorch %s (%s) with %d threads, BLAS %s%s" % (
        t["version"], python, threads, blas,
        ", cpu capability %s" % t["cpu_capability"] if t.get("cpu_capability") else ""))
    sdpa = t.get("sdpa", {})
    if not sdpa.get("used"):
        lines.append("PyTorch SDPA: skipped (%s)" % sdpa.get("reason", "unknown"))
        return lines
    lines.append("PyTorch SDPA: torch.nn.functional.scaled_dot_product_attention, K/V repeated "
                 "to the query heads%s" % ("; SDPA gqa: enable_gqa=True" if sdpa.get("enable_gqa")
                                           else " (no enable_gqa in this torch)"))
    checks = []
    for dtype in torch_peer.DTYPES:
        diffs = t.get("check", {}).get(dtype, {})
        limit = torch_peer.AGREE[dtype]
        checks.append("%s: %s" % (dtype, ", ".join(
            "%s %.1e%s" % (peer, diff, "" if diff <= limit else " DISAGREES (above %.0e)" % limit)
            for peer, diff in sorted(diffs.items()))))
    lines.append("PyTorch SDPA against the matmul peer on a small causal GQA shape, max |diff|: "
                 + "; ".join(checks))
    return lines


def torch_figure(torch_results, peer, kind, dtype, shape):
    """GFLOP/s (prefill) or K/V GB/s (decode) of one PyTorch peer, or "-"."""
    if not torch_results:
        return "-"
    for r in torch_results["results"]:
        if (r.get("peer", "matmul") == peer and r["kind"] == kind and r["dtype"] == dtype
                and r["shape"] == list(shape)):
            return r["useful_flops"] / 1e9 if kind == "prefill" else r["kv_bytes_per_second"] / 1e9
    return "-"


def fmt(x, digits=1):
    return ("%." + str(digits) + "f") % x if isinstance(x, float) else str(x)


def print_tables(prefill, decoded, torch_results, ggml, prefill_shapes, decode_shapes,
                 out=sys.stdout, small=False):
    """The two tables: one row per attend case, then the peers' shapes attend has no case of
    (a footnote under the table says so). prefill, decoded: the benchmark programs' JSON rows;
    ggml: {(kind, dtype, shape): figure}; small: the run is --small's."""
    def emit(line=""):
        print(line, file=out)

    no_case = []  # rows of the current table without an attend case

    def footnote(binary):
        if no_case:
            emit('attend "-": %s has no case of that shape and dtype%s'
                 % (binary, " in --small" if small else ""))
        del no_case[:]

    # attend's ratios are against the limits probed around each of its cases; the peers', which
    # run later, against the best probe of the run.
    # Each prefill case's probe is the matmul of its own dtype (f32 or bf16): the peers' ratios are
    # against the probe of the same dtype.
    matmul = {dtype: max([b["matmul_GFLOPs"] for b in prefill if prefill_dtype(b) == dtype] or [0.0])
              for dtype in ("float32", "bfloat16")}
    bandwidth = max([b["read_bw_GBs"] for b in decoded] or [0.0])
    measured = {r.get("peer", "matmul") for r in (torch_results or {}).get("results", [])}
    # PyTorch and SDPA always (a dash where not measured); SDPA gqa where measured.
    peers = [(p, h) for p, h in TORCH_PEERS if p != "sdpa_gqa" or p in measured]
    headings = ["attend"] + [h for _, h in peers] + ["ggml"]
    cell = "%10s %7s"

    def header(first):
        emit(first.ljust(LABEL_WIDTH) + "".join(" " + cell % (h, "ratio") for h in headings))

    def row(label, attend, attend_ratio, kind, dtype, shape, peak):
        figures = [torch_figure(torch_results, p, kind, dtype, shape) for p, _ in peers]
        figures.append(ggml.get((kind, dtype, tuple(shape)), "-"))
        if attend == "-":
            no_case.append(label)
        cells = [(fmt(attend), fmt(attend_ratio, 2))]
        cells += [(fmt(f), fmt(f / peak, 2) if f != "-" and peak else "-") for f in figures]
        emit(label.ljust(LABEL_WIDTH) + "".join(" " + cell % c for c in cells))

    emit()
    emit("attend and ggml: median iteration; PyTorch and SDPA: best of their runs")
    # Where attend runs bf16 on the f32 matmul (its engine says "-emulated"), the bf16 cases'
    # probe is the f32 matmul's.
    emulated = any("emulated" in b.get("label", "") for b in prefill if prefill_dtype(b) == "bfloat16")
    emit("prefill, causal: useful GFLOP/s (4 x d per attended pair); best matmul probes: "
         "f32 %.1f GFLOP/s, bf16 %s GFLOP/s%s; each case against its dtype's"
         % (matmul["float32"], fmt(matmul["bfloat16"]) if matmul["bfloat16"] else "-",
            " (the f32 matmul, which bf16 runs on here)" if emulated else ""))
    header("shape (heads/kv, n, d, dtype)")
    done = set()
    for b in prefill:
        f = fields_of(b)
        shape = tuple(int(f[x]) for x in ("heads", "kv_heads", "n", "d"))
        dtype = prefill_dtype(b)
        done.add((dtype, shape))
        row("%d/%d, %d, %d, %s" % (shape + (dtype,)), b["useful_GFLOPs"], b["ratio"], "prefill",
            dtype, shape, matmul[dtype])
    for dtype in ("float32", "bfloat16"):
        for shape in map(tuple, prefill_shapes):
            if (dtype, shape) not in done:
                row("%d/%d, %d, %d, %s" % (shape + (dtype,)), "-", "-", "prefill", dtype, shape,
                    matmul[dtype] or matmul["float32"])
    footnote("attention_bench")
    emit()
    emit("decode over the cache: K/V GB/s read; best read bandwidth probe %.1f GB/s" % bandwidth)
    header("shape (heads/kv, context, batch, dtype)")
    done = set()
    for b in decoded:
        f = fields_of(b)
        shape = (32, 8, int(f["context"]), int(f["batch"]))
        dtype = {"0": "float32", "1": "bfloat16", "2": "int8"}[f["storage"]]
        done.add((dtype, shape))
        row("32/8, %d, %d, %s" % (shape[2], shape[3], dtype), b["KV_GBs"], b["ratio"], "decode",
            dtype, shape, bandwidth)
    for dtype in ("float32", "bfloat16", "float16"):
        for shape in map(tuple, decode_shapes):
            if (dtype, shape) in done:
                continue
            figures = [torch_figure(torch_results, p, "decode", dtype, shape) for p, _ in peers]
            if all(x == "-" for x in figures) and ("decode", dtype, shape) not in ggml:
                continue
            row("%d/%d, %d, %d, %s" % (shape + (dtype,)), "-", "-", "decode", dtype, shape,
                bandwidth)
    footnote("decode_bench")


def positive_int(text):
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError("expected a positive integer, got %r" % text)
    return value


def executable_problem(program):
    """Why `program` (a path, or a name looked up on PATH) cannot be run, or None."""
    if os.sep not in program:
        return None if shutil.which(program) else "not found on PATH"
    if not os.path.exists(program):
        return "no such file"
    if os.path.isdir(program):
        return "is a folder"
    if not os.access(program, os.X_OK):
        return "not executable"
    return None


def output_problem(path):
    """Why the file `path` cannot be written, or None."""
    if os.path.isdir(path):
        return "is a folder"
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.exists(parent):
        return "no such folder %s" % parent
    if not os.path.isdir(parent):
        return "%s is not a folder" % parent
    if os.path.exists(path):
        return None if os.access(path, os.W_OK) else "not writable"
    return None if os.access(parent, os.W_OK | os.X_OK) else "folder %s is not writable" % parent


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", default=None, help="attend's build folder (build)")
    parser.add_argument("--bench_dir", default=None,
                        help="folder of attention_bench, decode_bench, ggml_peer (BUILD/bench)")
    parser.add_argument("--python", default=None,
                        help="Python with torch for the PyTorch peers (this one if it has "
                             "torch, else /usr/bin/python3)")
    parser.add_argument("--threads", type=positive_int, default=os.cpu_count(),
                        help="threads for PyTorch and ggml (all CPUs)")
    parser.add_argument("--small", action="store_true",
                        help="small shapes (n 512, context 1024): a check that all runs")
    parser.add_argument("--json", default=None,
                        help="also write every figure of the run to this file")
    args = parser.parse_args()
    bench_dir = args.bench_dir or os.path.join(args.build or "build", "bench")
    python = args.python or default_python()
    prefill_shapes = SMALL_PREFILL if args.small else PREFILL
    decode_shapes = SMALL_DECODE if args.small else DECODE

    # Every argument before the benchmarks, which take a while.
    if args.python and executable_problem(args.python):
        parser.error("argument --python: %s: %s" % (args.python, executable_problem(args.python)))
    if args.json and output_problem(args.json):
        parser.error("argument --json: %s: %s" % (args.json, output_problem(args.json)))
    attention = os.path.join(bench_dir, "attention_bench")
    decode = os.path.join(bench_dir, "decode_bench")
    flag = "--bench_dir" if args.bench_dir else "--build" if args.build else None
    for binary in (attention, decode):
        name = os.path.basename(binary)
        if os.path.isfile(binary) and os.access(binary, os.X_OK):
            continue
        if not flag:
            sys.exit("%s is missing: run bash scripts/setup.sh first" % binary)
        parser.error("argument %s: %s %s" % (
            flag, name, "is not in %s" % bench_dir if not os.path.isfile(binary)
            else "in %s is not executable" % bench_dir))

    machine, prefill = run_bench(attention,
                                 SMALL_PREFILL_FILTER if args.small else PREFILL_FILTER)
    _, decoded = run_bench(decode, SMALL_DECODE_FILTER if args.small else DECODE_FILTER)
    print(machine)

    torch_results, reason = run_torch(python, args.threads, prefill_shapes, decode_shapes)
    if torch_results is None:
        print("PyTorch: skipped (%s)" % reason)
        print("PyTorch SDPA: skipped (no PyTorch)")
    else:
        for line in describe_torch(torch_results, python, args.threads):
            print(line)

    ggml_binary = os.path.join(bench_dir, "ggml_peer")
    ggml = {}
    if not os.path.exists(ggml_binary):
        print("ggml: skipped (%s is not built; bash bench/ggml/build.sh builds it)" % ggml_binary)
    else:
        print("ggml (llama.rn's copy, see bench/ggml/build.sh) with %d threads, f32 accumulation"
              % args.threads)
        ggml_type = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}
        for dtype in ("float32", "bfloat16"):
            for heads, kv, n, d in prefill_shapes:
                r = run_ggml(ggml_binary, args.threads, heads, kv, n, n, d, ggml_type[dtype],
                             True, 1, 3, False)
                if r:
                    ggml[("prefill", dtype, (heads, kv, n, d))] = r["useful_flops"] / 1e9
        for dtype in ("float32", "bfloat16", "float16"):
            for heads, kv, context, batch in decode_shapes:
                r = run_ggml(ggml_binary, args.threads, heads, kv, 1, context, 128,
                             ggml_type[dtype], False, batch, 10, True)
                if r:
                    ggml[("decode", dtype, (heads, kv, context, batch))] = (
                        r["kv_bytes_per_second"] / 1e9)

    print_tables(prefill, decoded, torch_results, ggml, prefill_shapes, decode_shapes,
                 small=args.small)
    if args.json:
        figures = {"machine": machine, "attend_prefill": prefill, "attend_decode": decoded,
                   "torch": torch_results, "torch_python": python,
                   "ggml": [{"kind": k, "dtype": d, "shape": list(s), "figure": v}
                            for (k, d, s), v in sorted(ggml.items())]}
        try:
            with open(args.json, "w") as f:
                json.dump(figures, f, indent=1)
        except OSError as e:  # checked up front; the folder may have gone since
            sys.exit("compare_peers.py: --json %s: %s (the tables above hold the figures)"
                     % (args.json, e.strerror or e))


if __name__ == "__main__":
    main()
