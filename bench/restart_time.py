#!/usr/bin/python3
"""A warm restart timed end to end: an attend-server with --snapshot_dir holding --bytes of KV
cache (bf16, 32 layers x 8 KV heads x d 128: 128 KiB a token, in sequences of --tokens) is
stopped with SIGTERM (the snapshot is written after the drain) and started again (the snapshot
is restored before the port opens). Prints the server's own save and restore lines, the time
from start to a SERVING health check, and, in the same run, the disk's sequential write (with
fsync) and read (after dropping the file from the page cache) of the same number of bytes.

    PYTHONPATH=build/python /usr/bin/python3 bench/restart_time.py --bytes 1GiB --dir /tmp/snap
"""
import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
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


def disk_speeds(directory, nbytes):
    """Sequential write (8 MiB writes, then fsync) and read (after POSIX_FADV_DONTNEED) in GB/s."""
    path = os.path.join(directory, "disk-probe")
    block = os.urandom(8 << 20)
    start = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    written = 0
    while written < nbytes:
        written += os.write(fd, block)
    os.fsync(fd)
    os.close(fd)
    write = written / (time.perf_counter() - start) / 1e9
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    start = time.perf_counter()
    read = 0
    while True:
        chunk = os.read(fd, 8 << 20)
        if not chunk:
            break
        read += len(chunk)
    os.close(fd)
    os.unlink(path)
    return write, read / (time.perf_counter() - start) / 1e9


def start(server, directory, capacity):
    begin = time.perf_counter()
    proc = subprocess.Popen([server, "--address=127.0.0.1:0", "--metrics_address=",
                             "--snapshot_dir=%s" % directory, "--kv_cache_bytes=%d" % capacity,
                             "--snapshot_grace=600s"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    port = re.search(r"listening on [\d.]+:(\d+)", line).group(1)
    # The start-up lines up to the restore's (a kernels line comes before it on a restart).
    lines = []
    while not lines or "event=restore " not in lines[-1]:
        lines.append(proc.stdout.readline())
        if not lines[-1]:
            sys.exit("attend-server ended before its restore line: %r" % "".join(lines))
    return proc, "127.0.0.1:%s" % port, begin, lines


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bytes", default="1GiB", help="KV cache to fill (e.g. 512MiB, 2GiB)")
    p.add_argument("--tokens", type=int, default=512, help="tokens per sequence")
    p.add_argument("--dir", default="/tmp/attend-restart-bench")
    p.add_argument("--server", default=os.path.join(REPO, "build", "server", "attend-server"))
    args = p.parse_args()
    import attend

    nbytes = size(args.bytes)
    token_bytes = LAYERS * KV_HEADS * DIM * 2 * 2
    sequences = max(1, nbytes // (token_bytes * args.tokens))
    shutil.rmtree(args.dir, ignore_errors=True)
    os.makedirs(args.dir)
    capacity = nbytes * 2 + (256 << 20)
    proc, target, _, _ = start(args.server, args.dir, capacity)
    rng = np.random.default_rng(0)
    kv = attend.float32_to_bfloat16(
        rng.standard_normal((2, args.tokens, KV_HEADS, DIM), dtype=np.float32))
    with attend.Client(target, deadline=600) as c:
        for i in range(sequences):
            sid = "bench/%d" % i
            c.create_sequence(sid, layers=LAYERS, n_head=KV_HEADS, n_head_kv=KV_HEADS,
                              head_dim=DIM, kv_dtype="bfloat16")
            ids = [sid]
            for layer in range(LAYERS):
                c.append_batch(layer, ids, None, kv[0], kv[1], counts=[args.tokens])
        held = c.stats().used_bytes
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=900)[0]
    saved = re.search(r"event=snapshot sequences=(\d+) bytes=(\d+) seconds=([\d.]+)", out)
    # A cold restore, as after a reboot or on another node: the files out of the page cache.
    for root, _, names in os.walk(args.dir):
        for name in names:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
    proc, target, begin, lines = start(args.server, args.dir, capacity)
    with attend.Client(target, deadline=60) as c:
        while c.health() != "SERVING":
            time.sleep(0.01)
    serving = time.perf_counter() - begin
    restored = re.search(r"event=restore sequences=(\d+) bytes=(\d+) seconds=([\d.]+)",
                         "".join(lines))
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=900)
    write, read = disk_speeds(args.dir, int(saved.group(2)))
    shutil.rmtree(args.dir, ignore_errors=True)

    save_bytes, save_s = int(saved.group(2)), float(saved.group(3))
    load_bytes, load_s = int(restored.group(2)), float(restored.group(3))
    print("machine: %d CPUs; %d sequences x %d tokens (%.2f GiB held in the cache)"
          % (os.cpu_count(), sequences, args.tokens, held / (1 << 30)))
    print("| step | GB/s | seconds | against the disk |")
    print("| --- | ---: | ---: | ---: |")
    print("| disk write + fsync | %.2f | | |" % write)
    print("| disk read, cold | %.2f | | |" % read)
    print("| snapshot after the drain (%d sequences) | %.2f | %.2f | %.2fx the write |"
          % (int(saved.group(1)), save_bytes / save_s / 1e9, save_s,
             save_bytes / save_s / 1e9 / write))
    print("| restore before the port opens (%d) | %.2f | %.2f | %.2fx the read |"
          % (int(restored.group(1)), load_bytes / load_s / 1e9, load_s,
             load_bytes / load_s / 1e9 / read))
    print("| start to SERVING | | %.2f | read time + %.2f s |"
          % (serving, serving - load_bytes / (read * 1e9)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
