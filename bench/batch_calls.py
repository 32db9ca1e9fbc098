#!/usr/bin/python3
"""One decode step of a batch of sequences, as DecodeBatch (three tensor messages per sequence)
and as AppendBatch (q, k and v packed as one tensor each), from the Python package, side by side
in one run: the client's wait per call (median and best of --calls), the server's compute
(ComputeStats.compute_seconds) and what is left, the per-call overhead.

Starts its own attend-server (build/server/attend-server, --server to change) unless --target is
given. Run from the repository after the build:

  PYTHONPATH=build/python /usr/bin/python3 bench/batch_calls.py --batch 16 --tokens 2048
"""
import argparse
import os
import socket
import statistics
import subprocess
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(path, flags):
    port = free_port()
    proc = subprocess.Popen([path, "--address=127.0.0.1:%d" % port, "--metrics_address="] + flags,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, "127.0.0.1:%d" % port


def timed(calls, fn):
    """Per-call wall seconds and server compute seconds of `calls` calls of fn()."""
    wall, compute = [], []
    for _ in range(calls):
        begin = time.perf_counter()
        stats = fn()
        wall.append(time.perf_counter() - begin)
        compute.append(stats.compute_seconds)
    return wall, compute


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=16, help="sequences per call")
    p.add_argument("--tokens", type=int, default=2048, help="cached tokens per sequence")
    p.add_argument("--n_head", type=int, default=32)
    p.add_argument("--n_head_kv", type=int, default=8)
    p.add_argument("--head_dim", type=int, default=64)
    p.add_argument("--kv_dtype", choices=["bf16", "f32"], default="bf16")
    p.add_argument("--calls", type=int, default=50, help="timed calls per form, after 5 warm-up")
    p.add_argument("--target", help="an attend server (host:port); default: start one")
    p.add_argument("--server", default=os.path.join(REPO, "build", "server", "attend-server"))
    args = p.parse_args()

    import attend
    proc = None
    target = args.target
    if target is None:
        proc, target = start_server(args.server, [])
        time.sleep(1.0)
    try:
        with attend.Client(target, deadline=120) as c:
            ids = ["bench-%d" % i for i in range(args.batch)]
            rng = np.random.default_rng(1)
            h, g, d = args.n_head, args.n_head_kv, args.head_dim
            for sid in ids:
                c.create_sequence(sid, layers=1, n_head=h, n_head_kv=g, head_dim=d,
                                  kv_dtype=args.kv_dtype)
            n = args.tokens
            for sid in ids:  # the prompt, in pieces the message limit allows
                c.append(sid, 0, None, rng.standard_normal((n, g, d), dtype=np.float32),
                         rng.standard_normal((n, g, d), dtype=np.float32))
            b = args.batch
            q = rng.standard_normal((b, h, d), dtype=np.float32)
            k = rng.standard_normal((b, g, d), dtype=np.float32)
            v = rng.standard_normal((b, g, d), dtype=np.float32)
            forms = {
                "DecodeBatch": lambda: c.decode_batch(0, ids, q, k, v).stats,
                "AppendBatch": lambda: c.append_batch(0, ids, q, k, v, counts=[1] * b).stats,
            }
            for fn in forms.values():
                for _ in range(5):
                    fn()
            results = {}
            # Alternated, so that the machine's drift falls on both forms alike.
            for _ in range(2):
                for name, fn in forms.items():
                    wall, compute = timed(args.calls // 2, fn)
                    results.setdefault(name, ([], []))
                    results[name][0].extend(wall)
                    results[name][1].extend(compute)
            print("machine: %d CPUs; batch %d x %d tokens, %d/%d heads, d %d, %s KV; %d calls each"
                  % (os.cpu_count(), b, n, h, g, d, args.kv_dtype, args.calls))
            print("%-12s %12s %12s %14s %12s" % ("form", "wait p50", "wait best", "compute p50",
                                                 "overhead"))
            for name, (wall, compute) in results.items():
                w, cpt = statistics.median(wall), statistics.median(compute)
                print("%-12s %9.3f ms %9.3f ms %11.3f ms %9.3f ms"
                      % (name, w * 1e3, min(wall) * 1e3, cpt * 1e3, (w - cpt) * 1e3))
            for sid in ids:
                c.release(sid)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait()


if __name__ == "__main__":
    sys.exit(main())
