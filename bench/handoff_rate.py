#!/usr/bin/python3
"""Sequences moving between two replicas (KvCache.HandOff), timed, against the machine's own
limit measured in the same run: a plain TCP copy of the same bytes over loopback, as fast as
Python's sockets go (one sender thread, one receiver thread, 1 MiB writes).

A sender (--handoff_target = the receiver, standing in for the fleet's proxy) holds --bytes of KV
cache (bf16, 32 layers x 8 KV heads x d 128: 128 KiB a token, in sequences of --tokens); one
HandOff moves everything. Prints the answer's bytes and seconds, the rate, and the loopback
copy's rate; --runs repeats the whole.

    PYTHONPATH=build/python /usr/bin/python3 bench/handoff_rate.py --bytes 512MiB --runs 3
"""
import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAYERS, KV_HEADS, DIM = 32, 8, 128


def size(text):
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    for unit, factor in units.items():
        if text.endswith(unit):
            return int(float(text[:-len(unit)]) * factor)
    return int(text)


def loopback_rate(nbytes):
    """GB/s of one TCP stream over 127.0.0.1 carrying nbytes in 1 MiB writes."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    got = [0]

    def receive():
        conn, _ = listener.accept()
        buf = bytearray(1 << 20)
        while True:
            n = conn.recv_into(buf)
            if not n:
                break
            got[0] += n
        conn.close()

    t = threading.Thread(target=receive)
    t.start()
    block = os.urandom(1 << 20)
    start = time.perf_counter()
    with socket.create_connection(listener.getsockname()) as s:
        sent = 0
        while sent < nbytes:
            s.sendall(block)
            sent += len(block)
    t.join()
    seconds = time.perf_counter() - start
    listener.close()
    return got[0] / seconds / 1e9


def start(server, capacity, *flags):
    proc = subprocess.Popen([server, "--address=127.0.0.1:0", "--metrics_address=",
                             "--kv_cache_bytes=%d" % capacity] + list(flags),
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    port = re.search(r"listening on [\d.]+:(\d+)", line).group(1)
    return proc, "127.0.0.1:%s" % port


def one_run(args, attend):
    nbytes = size(args.bytes)
    token_bytes = LAYERS * KV_HEADS * DIM * 2 * 2
    sequences = max(1, nbytes // (token_bytes * args.tokens))
    capacity = nbytes + (256 << 20)
    receiver, receiver_target = start(args.server, capacity)
    sender, sender_target = start(args.server, capacity, "--handoff_target=" + receiver_target)
    try:
        rng = np.random.default_rng(0)
        kv = attend.float32_to_bfloat16(
            rng.standard_normal((2, args.tokens, KV_HEADS, DIM), dtype=np.float32))
        with attend.Client(sender_target, deadline=600) as c:
            for i in range(sequences):
                sid = "bench%d/s" % i
                c.create_sequence(sid, layers=LAYERS, n_head=KV_HEADS, n_head_kv=KV_HEADS,
                                  head_dim=DIM, kv_dtype="bfloat16")
                for layer in range(LAYERS):
                    c.append_batch(layer, [sid], None, kv[0], kv[1], counts=[args.tokens])
            held = c.stats().used_bytes
            wall = time.perf_counter()
            moved = c.hand_off()
            wall = time.perf_counter() - wall
        if moved.failed or moved.moved != sequences:
            raise RuntimeError("hand-off left sequences behind: %s" % moved)
    finally:
        for proc in (sender, receiver):
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=600)
    loop = loopback_rate(moved.bytes)
    return sequences, held, moved.bytes, moved.seconds, wall, loop


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bytes", default="512MiB", help="KV cache to move (e.g. 256MiB, 1GiB)")
    p.add_argument("--tokens", type=int, default=512, help="tokens per sequence")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--server", default=os.path.join(REPO, "build", "server", "attend-server"))
    args = p.parse_args()
    import attend

    print("machine: %d CPUs" % os.cpu_count())
    print("| run | sequences | GiB held | bytes moved | seconds (server) | hand-off GB/s | "
          "loopback TCP GB/s | against loopback |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for run in range(args.runs):
        sequences, held, moved, seconds, wall, loop = one_run(args, attend)
        rate = moved / seconds / 1e9
        print("| %d | %d | %.2f | %d | %.2f (call %.2f) | %.2f | %.2f | %.2fx |"
              % (run + 1, sequences, held / (1 << 30), moved, seconds, wall, rate, loop,
                 rate / loop))
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
