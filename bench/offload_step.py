#!/usr/bin/python3
"""The offload path measured: a small Llama-shaped model (attend.llama, random weights) generating
teacher-forced with its attention (a) through attend (one append_batch per layer, the batch's new
tokens packed), (b) computed in-process on the CPU (the same cores as a local server), and (c)
computed by the accelerator itself when --device cuda and one is present. Prints prompt time,
decode step time, the share of attention in them, for attend the client's wait against the
server's compute (ComputeStats.compute_seconds summed from the responses), and the logits' max
|difference| between (a) and (b).

Without --target it starts its own attend-server (build/server/attend-server, or --server) on a
free loopback port and stops it at the end. The defaults are small enough for a 2-core machine.

    PYTHONPATH=build/python /usr/bin/python3 bench/offload_step.py --layers 2 --batch 2 \\
        --prompt 64 --steps 4 [--kv_dtype bf16|f32] [--device cpu|cuda] [--overlap] \\
        [--target host:port]
"""
import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def parse_args():
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Without --target the script starts its own attend-server (--server, default "
               "build/server/attend-server) on a free port and stops it afterwards.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--n_head", type=int, default=8)
    p.add_argument("--n_head_kv", type=int, default=2)
    p.add_argument("--head_dim", type=int, default=64)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--prompt", type=int, default=64, help="prompt tokens per sequence")
    p.add_argument("--steps", type=int, default=4, help="logits per sequence (1 prompt forward "
                   "+ steps-1 decode forwards)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per mode (after one "
                   "warm-up); the best is reported")
    p.add_argument("--target", help="an attend server to use (host:port); default: start one")
    p.add_argument("--server", default=os.path.join(ROOT, "build", "server", "attend-server"))
    p.add_argument("--server_flag", action="append", default=[],
                   help="extra flag for the server this script starts (repeatable)")
    p.add_argument("--kv_dtype", choices=["bf16", "f32"], default="bf16")
    p.add_argument("--overlap", action="store_true",
                   help="also run (a) overlapped: two halves of the batch pipelined, one half's "
                        "attention call in flight while the other half's dense layers run")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="where the model runs for (a) and (c); cuda when available")
    return p.parse_args()


def start_server(args):
    kv_bytes = max(256 << 20, 4 * args.batch * (args.prompt + args.steps) * args.layers
                   * args.n_head_kv * args.head_dim * 2 * 4)
    log = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen([args.server, "--address=127.0.0.1:0", "--metrics_address=",
                             "--kv_cache_bytes=%d" % kv_bytes] + args.server_flag,
                            stdout=subprocess.PIPE, stderr=log, text=True)
    line = proc.stdout.readline()
    match = re.search(r"listening on [\d.]+:(\d+)", line)
    if not match:
        proc.kill()
        log.seek(0)
        sys.exit("attend-server did not start: %r %s" % (line, log.read()))
    return proc, "127.0.0.1:%s" % match.group(1)


def best(runs):
    return min(runs, key=lambda r: r.prompt_seconds + sum(r.step_seconds))


def describe(name, r, steps):
    decode = sum(r.step_seconds)
    total = r.prompt_seconds + decode
    step = decode / max(len(r.step_seconds), 1)
    line = ("%-28s prompt %8.2f ms   step %8.3f ms   attention %5.1f%% of forward time"
            % (name, r.prompt_seconds * 1e3, step * 1e3,
               100.0 * r.attention_seconds / total if total else 0.0))
    if r.server_seconds:
        line += ("\n%-28s client wait %8.2f ms, server compute %8.2f ms (%4.1f%%), %d calls, "
                 "%.3f ms wait per call" % ("", r.attention_seconds * 1e3,
                                            r.server_seconds * 1e3,
                                            100.0 * r.server_seconds / r.attention_seconds,
                                            r.attention_calls,
                                            1e3 * r.attention_seconds / r.attention_calls))
    return line


def main():
    args = parse_args()
    try:
        import attend
    except ImportError:
        sys.path.insert(0, os.path.join(ROOT, "build", "python"))
        import attend
    import torch
    from attend import llama

    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: torch sees no CUDA device")
    config = llama.LlamaConfig(layers=args.layers, n_head=args.n_head, n_head_kv=args.n_head_kv,
                               head_dim=args.head_dim, vocab_size=args.vocab)
    model_cpu = llama.LlamaModel(config)
    model_dev = model_cpu if args.device == "cpu" else llama.LlamaModel(config, device="cuda")
    gen = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, args.vocab, (args.prompt,), generator=gen).tolist()
               for _ in range(args.batch)]
    teacher = torch.randint(0, args.vocab, (args.batch, args.steps), generator=gen).tolist()
    kv_dtype = {"bf16": "bfloat16", "f32": "float32"}[args.kv_dtype]

    server = None
    target = args.target
    if target is None:
        server, target = start_server(args)
    print("model: %r\nbatch %d x prompt %d tokens, %d steps, kv %s, device %s, server %s%s, "
          "torch %s (%d threads)" % (config, args.batch, args.prompt, args.steps, kv_dtype,
                                     args.device, target, " (started here)" if server else "",
                                     torch.__version__, torch.get_num_threads()))

    def measure(model, make_attention, overlap=False):
        runs = []
        for i in range(args.repeats + 1):
            r = model.generate(prompts, args.steps, teacher, attention=make_attention(),
                               overlap=overlap)
            if i:
                runs.append(r)
        return best(runs)

    try:
        with attend.Client(target, deadline=600) as client:
            results = [("(a) attend", measure(
                model_dev, lambda: llama.AttendAttention(client, kv_dtype=kv_dtype)))]
            if args.overlap:
                results.append(("(a) attend, overlapped", measure(
                    model_dev, lambda: llama.AttendAttention(client, kv_dtype=kv_dtype),
                    overlap=True)))
            left = client.stats()
        results.append(("(b) in-process CPU", measure(model_cpu, llama.LocalAttention)))
        if args.device == "cuda":
            results.append(("(c) %s attention" % torch.cuda.get_device_name(),
                            measure(model_dev, llama.LocalAttention)))
    finally:
        if server is not None:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=30)

    for name, r in results:
        print(describe(name, r, args.steps))
    a, b = results[0][1], results[-2 if args.device == "cuda" else -1][1]
    diff = max(float((x - y).abs().max()) for x, y in zip(a.logits, b.logits))
    scale = max(float(y.abs().max()) for y in b.logits)
    print("logits (a) vs (b): max |difference| %.3g (max |logit| %.3g, relative %.2g)"
          % (diff, scale, diff / scale))
    print("server afterwards: %d sequences, %d bytes used" % (left.sequences, left.used_bytes))


if __name__ == "__main__":
    main()
