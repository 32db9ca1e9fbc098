#!/usr/bin/python3
"""Where one layer call's time goes, from the Python package to attend and back: the offload
path's per-call cost, phase by phase, for a decode step and a prompt chunk of a batch.

For each case it times, per call (median of --calls):

  client encode    the request's bytes made from the arrays (attend.tensors.serialize_with_tensors)
  wait             the gRPC call with those bytes, until the response's bytes are back
  client decode    the response parsed and its output turned into an array
  server phases    from the response's ComputeStats: queue (waiting for a worker), prepare
                   (checking the request, viewing its tensors), cache (locking, taking blocks,
                   writing the new K/V in the storage dtype), compute (the attention), respond
                   (encoding the output)
  gRPC + transport wait minus the server phases: both sides' gRPC (the server's parse of the
                   request and serialization of the response included), the loopback socket and
                   the thread hand-offs

and, beside them, an empty unary call (grpc.health.v1 Check) on the same channel: the floor of
any call. The decode case lets the sequences grow by one token a call, as decoding does (a
new block every few hundred calls). The prompt case appends --chunk tokens to every sequence
and truncates them back (outside the timing), so that every call sees the same cache and takes
its blocks afresh, as a prefill does.

Starts its own attend-server (build/server/attend-server) unless --target is given:

  PYTHONPATH=build/python /usr/bin/python3 bench/call_cost.py --batch 16 --tokens 2048
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np

from batch_calls import REPO, start_server

PHASES = ("queue", "prepare", "cache", "compute", "respond")


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=16, help="sequences per call")
    p.add_argument("--tokens", type=int, default=2048, help="cached tokens per sequence")
    p.add_argument("--chunk", type=int, default=128,
                   help="tokens per sequence in the prompt case (0: no prompt case)")
    p.add_argument("--n_head", type=int, default=32)
    p.add_argument("--n_head_kv", type=int, default=8)
    p.add_argument("--head_dim", type=int, nargs="+", default=[64])
    p.add_argument("--kv_dtype", choices=["bf16", "f32"], default="bf16")
    p.add_argument("--calls", type=int, default=30, help="timed calls per case, after 3 warm-up")
    p.add_argument("--target", help="an attend server (host:port); default: start one")
    p.add_argument("--server", default=os.path.join(REPO, "build", "server", "attend-server"))
    p.add_argument("--server_flags", default="", help="extra flags for the started server")
    p.add_argument("--channel_args", nargs="*", default=[],
                   help="gRPC channel arguments for the client (name=integer), e.g. "
                        "grpc.http2.lookahead_bytes=8388608")
    args = p.parse_args()

    import grpc
    import attend
    from attend.tensors import encode, float32_to_bfloat16, from_proto, serialize_with_tensors
    from attend.v1 import kv_cache_pb2

    proc = None
    target = args.target
    if target is None:
        proc, target = start_server(args.server, args.server_flags.split())
        time.sleep(1.0)
    rows = []
    try:
        channel = None
        if args.channel_args:
            channel = grpc.insecure_channel(target, [
                (k_, int(v_)) for k_, v_ in (kv.split("=") for kv in args.channel_args)] + [
                ("grpc.max_send_message_length", 64 << 20),
                ("grpc.max_receive_message_length", 64 << 20)])
        with attend.Client(target, deadline=300, channel=channel) as c:
            raw = c._connection.channel.unary_unary("/attend.v1.KvCache/AppendBatch")
            health = c._connection.channel.unary_unary("/grpc.health.v1.Health/Check")
            rng = np.random.default_rng(1)
            empty = []
            for _ in range(args.calls + 3):
                begin = time.perf_counter()
                health(b"", timeout=30)
                empty.append(time.perf_counter() - begin)
            empty_p50 = statistics.median(empty[3:])
            print("machine: %d CPUs; server %s; empty unary p50 %.3f ms"
                  % (os.cpu_count(), target, empty_p50 * 1e3))
            for d in args.head_dim:
                h, g, b, n = args.n_head, args.n_head_kv, args.batch, args.tokens
                ids = ["cost-%d-%d" % (d, i) for i in range(b)]
                for sid in ids:
                    c.create_sequence(sid, layers=1, n_head=h, n_head_kv=g, head_dim=d,
                                      kv_dtype=args.kv_dtype)
                for sid in ids:  # the cached context
                    kv = float32_to_bfloat16(rng.standard_normal((2, n, g, d), dtype=np.float32))
                    c.append(sid, 0, None, kv[0], kv[1])

                def bf16(*shape):
                    return float32_to_bfloat16(rng.standard_normal(shape, dtype=np.float32))

                cases = [("decode", 1)] + ([("prompt", args.chunk)] if args.chunk else [])
                for case, per in cases:
                    q, k, v = bf16(b * per, h, d), bf16(b * per, g, d), bf16(b * per, g, d)
                    request = kv_cache_pb2.AppendBatchRequest(
                        layer=0, sequence_ids=ids, token_counts=[per] * b,
                        output_dtype=attend.tensors.DType.Value("BFLOAT16"))
                    times = {k_: [] for k_ in ("encode", "wait", "decode") + PHASES}
                    for call in range(args.calls + 3):
                        t0 = time.perf_counter()
                        body = serialize_with_tensors(request, {4: encode(q), 5: encode(k),
                                                                6: encode(v)})
                        t1 = time.perf_counter()
                        answer = raw(body, timeout=300, metadata=())
                        t2 = time.perf_counter()
                        response = kv_cache_pb2.AppendBatchResponse.FromString(answer)
                        out = from_proto(response.output)
                        t3 = time.perf_counter()
                        assert out.shape == (b * per, h, d), out.shape
                        if case == "prompt":  # back to the context, outside the timing
                            for sid in ids:
                                c.truncate(sid, n)
                        if call < 3:
                            continue
                        s = response.stats
                        for name, value in (("encode", t1 - t0), ("wait", t2 - t1),
                                            ("decode", t3 - t2),
                                            ("queue", s.queue_seconds),
                                            ("prepare", s.prepare_seconds),
                                            ("cache", s.cache_seconds),
                                            ("compute", s.compute_seconds),
                                            ("respond", s.respond_seconds)):
                            times[name].append(value)
                    med = {k_: statistics.median(v_) for k_, v_ in times.items()}
                    server = sum(med[k_] for k_ in PHASES)
                    rows.append((d, case, per, med, server,
                                 q.nbytes + k.nbytes + v.nbytes, len(answer)))
                for sid in ids:
                    c.release(sid)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait()

    print("batch %d x %d cached tokens, %d/%d heads, %s KV, bf16 q/k/v and output; "
          "medians of %d calls, ms" % (args.batch, args.tokens, args.n_head, args.n_head_kv,
                                       args.kv_dtype, args.calls))
    head = ("| d | case | request | response | client encode | " + " | ".join(PHASES)
            + " | gRPC + transport | client decode | wait | wait / compute | "
            "overhead / empty unary |")
    print(head)
    print("|" + " --- |" * (head.count("|") - 1))
    for d, case, per, med, server, req_bytes, resp_bytes in rows:
        rest = med["wait"] - server
        overhead = med["encode"] + med["wait"] + med["decode"] - med["compute"]
        cells = ["%d" % d, "%s (%d/seq)" % (case, per), _size(req_bytes), _size(resp_bytes),
                 "%.3f" % (med["encode"] * 1e3)]
        cells += ["%.3f" % (med[k_] * 1e3) for k_ in PHASES]
        cells += ["%.3f" % (rest * 1e3), "%.3f" % (med["decode"] * 1e3),
                  "%.3f" % (med["wait"] * 1e3),
                  "%.2fx" % (med["wait"] / med["compute"]) if med["compute"] else "-",
                  "%.1fx" % (overhead / empty_p50)]
        print("| " + " | ".join(cells) + " |")
    return 0


def _size(n):
    return "%.0f KiB" % (n / 1024) if n < 1 << 20 else "%.1f MiB" % (n / (1 << 20))


if __name__ == "__main__":
    sys.exit(main())
