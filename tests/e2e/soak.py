#!/usr/bin/python3
"""Soak: concurrent clients against the real attend-server with a small KV budget.

Each client thread owns its sequences (ids "c<client>-<n>") and loops over CreateSequence,
Append (prefills), DecodeBatch, DecodeStream, Fork (of its own sequences and of other clients'),
Truncate and Release for a bounded time. Every response is checked against what the client
tracks (layer lengths), and every failure must be one the workload can legitimately cause:

  RESOURCE_EXHAUSTED  only from calls that allocate blocks (Create with a reservation, Append,
                      DecodeBatch, DecodeStream messages, Fork), and only when the server's own
                      message says more blocks were needed than were free;
  NOT_FOUND           only for a Fork of another client's sequence that its owner released (an
                      owner drops an id from the shared registry before it sends Release).

Anything else is unexpected and fails the run, as do a resident set (VmRSS, sampled) above
base + KV budget + slack, and a cache that is not empty (used_bytes, sequences) once every
client has released what it holds. Prints calls/s, per-code counts and RSS start/peak/end.
"""
import argparse
import collections
import os
import queue
import random
import re
import signal
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_test  # noqa: E402  (generate_stubs and the stub modules it fills in)
import lifecycle_test  # noqa: E402  (start: runs the server and reads its ports)

PB = e2e_test.PB
LAYERS, H, G, D = 2, 4, 2, 32
MAX_TOKENS = 256       # a client truncates a sequence that grows past this
MAX_OWN = 3            # sequences a client holds at once
ALLOCATING = {"CreateSequence", "Append", "DecodeBatch", "DecodeStream", "Fork"}
BUDGET_MESSAGE = re.compile(r"needs (\d+) blocks .*?; (\d+) of (\d+) blocks")
MIB = 1 << 20


def rss_bytes(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class Tally:
    """Per (method, code) counts and the unexpected failures, shared by the clients."""

    def __init__(self):
        self.lock = threading.Lock()
        self.counts = collections.Counter()
        self.unexpected = []
        self.calls = 0

    def add(self, method, code, problem=None):
        with self.lock:
            self.counts[(method, code)] += 1
            self.calls += 1
            if problem:
                self.unexpected.append("%s %s: %s" % (method, code, problem))


class Client(threading.Thread):
    def __init__(self, index, channel, registry, registry_lock, tally, stop, seed):
        super().__init__(daemon=True)
        self.index = index
        self.kv = PB["kv_grpc"].KvCacheStub(channel)
        self.registry, self.registry_lock = registry, registry_lock
        self.tally, self.stop = tally, stop
        self.rng = random.Random(seed)
        self.np_rng = np.random.default_rng(seed)
        self.own = collections.OrderedDict()  # id -> [tokens per layer]
        self.counter = 0
        # Tensors by token count, made once (the soak is about the server, not numpy).
        self.blobs = {}

    # ---- tensors and calls ----

    def tensor(self, n, heads):
        key = (n, heads)
        if key not in self.blobs:
            a = self.np_rng.uniform(-1, 1, size=(n, heads, D)).astype(np.float32)
            self.blobs[key] = PB["tensor"].Tensor(dtype=PB["tensor"].FLOAT32, shape=[n, heads, D],
                                                  data=a.tobytes())
        return self.blobs[key]

    def call(self, method, fn, allowed=()):
        """Runs fn(); returns (response or None, code name). A failure outside `allowed` (code
        -> check(details) returning a problem or None) is recorded as unexpected."""
        import grpc
        try:
            response = fn()
        except grpc.RpcError as e:
            code = e.code().name
            details = e.details() or ""
            check = dict(allowed).get(code)
            problem = ("%r" % details) if check is None else check(details)
            self.tally.add(method, code, problem)
            return None, code
        self.tally.add(method, "OK")
        return response, "OK"

    def budget(self, method):
        """RESOURCE_EXHAUSTED is expected from allocating calls whose message shows the need."""
        def check(details):
            if method not in ALLOCATING:
                return "from a call that allocates nothing: %r" % details
            match = BUDGET_MESSAGE.search(details)
            if not match:
                return "not the KV budget: %r" % details
            needed, free, _ = (int(g) for g in match.groups())
            if needed <= free:
                return "refused with enough free blocks: %r" % details
            return None
        return ("RESOURCE_EXHAUSTED", check)

    def expect(self, what, got, want):
        if got != want:
            with self.tally.lock:
                self.tally.unexpected.append("%s: got %s, expected %s" % (what, got, want))

    # ---- operations ----

    def create(self):
        kv = PB["kv"]
        self.counter += 1
        sequence_id = "c%d-%d" % (self.index, self.counter)
        dtype = self.rng.choice([PB["tensor"].FLOAT32, PB["tensor"].BFLOAT16, PB["tensor"].INT8])
        reserve = self.rng.choice([0, 0, 64, 256])
        info, code = self.call("CreateSequence", lambda: self.kv.CreateSequence(
            kv.CreateSequenceRequest(sequence_id=sequence_id, reserve_tokens=reserve,
                                     config=kv.SequenceConfig(layers=LAYERS, n_head=H,
                                                              n_head_kv=G, head_dim=D,
                                                              kv_dtype=dtype)), timeout=30),
            [self.budget("CreateSequence")])
        if code == "OK":
            self.expect("create %s" % sequence_id, list(info.layer_tokens), [0] * LAYERS)
            self.adopt(sequence_id, [0] * LAYERS)

    def adopt(self, sequence_id, tokens):
        self.own[sequence_id] = tokens
        with self.registry_lock:
            self.registry[sequence_id] = self.index

    def append(self):
        kv = PB["kv"]
        sequence_id = self.rng.choice(list(self.own))
        n = self.rng.choice([1, 4, 16, 64])
        for layer in range(LAYERS):
            with_q = self.rng.random() < 0.7
            r, code = self.call("Append", lambda: self.kv.Append(kv.AppendRequest(
                sequence_id=sequence_id, layer=layer,
                q=self.tensor(n, H) if with_q else None, k=self.tensor(n, G),
                v=self.tensor(n, G)), timeout=30), [self.budget("Append")])
            if code == "OK":
                tokens = self.own[sequence_id]
                self.expect("append %s layer %d" % (sequence_id, layer),
                            (r.first_position, r.layer_tokens), (tokens[layer], tokens[layer] + n))
                tokens[layer] += n
                if with_q:
                    self.expect("append output shape", list(r.output.shape), [n, H, D])

    def decode_request(self, layer, ids, request_id=0):
        kv = PB["kv"]
        return kv.DecodeBatchRequest(layer=layer, request_id=request_id, steps=[
            kv.DecodeStep(sequence_id=s, q=self.tensor(1, H), k=self.tensor(1, G),
                          v=self.tensor(1, G)) for s in ids])

    def decode_batch(self):
        ids = list(self.own)
        layer = self.rng.randrange(LAYERS)
        r, code = self.call("DecodeBatch", lambda: self.kv.DecodeBatch(
            self.decode_request(layer, ids), timeout=30), [self.budget("DecodeBatch")])
        if code == "OK":
            for s, result in zip(ids, r.results):
                self.expect("decode %s" % s, result.layer_tokens, self.own[s][layer] + 1)
                self.own[s][layer] += 1

    def decode_stream(self):
        """A few messages over one DecodeStream, each written after the previous response."""
        import grpc
        outbox = queue.Queue()
        responses = self.kv.DecodeStream(iter(outbox.get, None), timeout=30)
        try:
            for request_id in range(1, self.rng.randint(2, 6)):
                ids = list(self.own)
                layer = request_id % LAYERS
                outbox.put(self.decode_request(layer, ids, request_id))
                r = next(responses)
                self.expect("stream request_id", r.request_id, request_id)
                if r.HasField("error"):
                    code = next(c.name for c in grpc.StatusCode if c.value[0] == r.error.code)
                    check = dict([self.budget("DecodeStream")]).get(code)
                    problem = ("%r" % r.error.message) if check is None else check(
                        r.error.message)
                    self.tally.add("DecodeStream", code, problem)
                    continue
                self.tally.add("DecodeStream", "OK")
                for s, result in zip(ids, r.results):
                    self.expect("stream %s" % s, result.layer_tokens, self.own[s][layer] + 1)
                    self.own[s][layer] += 1
            outbox.put(None)
            rest = list(responses)
            self.expect("stream end", len(rest), 0)
        except grpc.RpcError as e:
            self.tally.add("DecodeStream", e.code().name, "the stream failed: %r" % e.details())
            outbox.put(None)

    def fork(self):
        kv = PB["kv"]
        with self.registry_lock:
            foreign = [s for s, owner in self.registry.items() if owner != self.index]
        mine = self.rng.random() < 0.5 or not foreign
        source = self.rng.choice(list(self.own)) if mine else self.rng.choice(foreign)
        self.counter += 1
        new_id = "c%d-%d" % (self.index, self.counter)

        def released(details):
            with self.registry_lock:
                live = source in self.registry
            if mine or live:
                return "NOT_FOUND for a live sequence: %r" % details
            return None
        # Forking a foreign sequence shares its common length, which its owner may be changing.
        info, code = self.call("Fork", lambda: self.kv.Fork(kv.ForkRequest(
            source_id=source, new_id=new_id), timeout=30),
            [self.budget("Fork"), ("NOT_FOUND", released)])
        if code == "OK":
            if mine:
                self.expect("fork of %s" % source, info.tokens, min(self.own[source]))
            self.adopt(new_id, list(info.layer_tokens))

    def truncate(self, sequence_id=None, tokens=None):
        kv = PB["kv"]
        sequence_id = sequence_id or self.rng.choice(list(self.own))
        if tokens is None:
            tokens = self.rng.randint(0, min(self.own[sequence_id]))
        info, code = self.call("Truncate", lambda: self.kv.Truncate(kv.TruncateRequest(
            sequence_id=sequence_id, tokens=tokens), timeout=30))
        if code == "OK":
            self.expect("truncate %s" % sequence_id, list(info.layer_tokens), [tokens] * LAYERS)
            self.own[sequence_id] = [tokens] * LAYERS

    def release(self, sequence_id=None):
        kv = PB["kv"]
        sequence_id = sequence_id or next(iter(self.own))
        with self.registry_lock:
            del self.registry[sequence_id]  # before Release: see the NOT_FOUND rule of fork
        del self.own[sequence_id]
        self.call("Release", lambda: self.kv.Release(kv.ReleaseRequest(
            sequence_id=sequence_id), timeout=30))

    def run(self):
        try:
            while not self.stop.is_set():
                if not self.own:
                    self.create()
                    continue
                for s, tokens in list(self.own.items()):
                    if max(tokens) > MAX_TOKENS:
                        # Layers advance on their own (a refused append may fail one only).
                        self.truncate(s, self.rng.randint(0, min(64, min(tokens))))
                room = len(self.own) < MAX_OWN  # forks count too
                op = self.rng.choices(
                    [self.create, self.append, self.decode_batch, self.decode_stream, self.fork,
                     self.truncate, self.release],
                    weights=[2 if room else 0, 6, 5, 3, 1 if room else 0, 1, 1 if room else 3])[0]
                op()
        except Exception as e:  # a bug in the client is a failed soak, not a hung one
            with self.tally.lock:
                self.tally.unexpected.append("client %d crashed: %r" % (self.index, e))
        finally:
            for s in list(self.own):
                self.release(s)


def main():
    import grpc
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--server", required=True)
    parser.add_argument("--proto", required=True)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--minutes", type=float, default=0, help="overrides --seconds")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--kv_cache_bytes", type=int, default=8 * MIB)
    parser.add_argument("--kv_block_bytes", type=int, default=64 * 1024)
    parser.add_argument("--rss_slack_bytes", type=int, default=128 * MIB,
                        help="allowed above base + KV budget: the server's 64 MiB of large "
                             "K/V copy buffers, matmul primitives, heap and gRPC buffers")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    seconds = args.minutes * 60 if args.minutes else args.seconds

    with tempfile.TemporaryDirectory() as out_dir:
        e2e_test.generate_stubs(args.proto, out_dir)
        lifecycle_test.ARGS = args
        proc, port, metrics_port = lifecycle_test.start(
            "--address=127.0.0.1:0", "--metrics_address=127.0.0.1:0",
            "--kv_cache_bytes=%d" % args.kv_cache_bytes,
            "--kv_block_bytes=%d" % args.kv_block_bytes, "--shutdown_grace=10s")
        # Drained all along, so that a chatty server never blocks on a full pipe.
        stderr_lines = []
        threading.Thread(target=lambda: stderr_lines.extend(proc.stderr), daemon=True).start()
        try:
            status = soak(args, seconds, proc, port, grpc)
            if stderr_lines:
                print("server stderr (%d lines), last ones:" % len(stderr_lines))
                sys.stdout.writelines("  " + line for line in stderr_lines[-10:])
            return status
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


def soak(args, seconds, proc, port, grpc):
    kv = PB["kv"]
    # The base: after start-up and the background measurement of the local hardware profile
    # (about a second after start), before any client.
    time.sleep(2.5)
    base = rss_bytes(proc.pid)
    bound = base + args.kv_cache_bytes + args.rss_slack_bytes + e2e_test.SANITIZER_RSS_MIB * MIB
    samples = [base]
    sampling = threading.Event()

    def sample():
        while not sampling.wait(0.2):
            samples.append(rss_bytes(proc.pid))
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()

    tally = Tally()
    stop = threading.Event()
    registry, registry_lock = {}, threading.Lock()
    channels = [grpc.insecure_channel("127.0.0.1:%d" % port) for _ in range(args.clients)]
    clients = [Client(i, channels[i], registry, registry_lock, tally, stop, args.seed * 1000 + i)
               for i in range(args.clients)]
    begin = time.monotonic()
    for c in clients:
        c.start()
    next_report = begin + 10
    while time.monotonic() - begin < seconds and proc.poll() is None:
        time.sleep(0.2)
        if time.monotonic() >= next_report:
            next_report += 10
            print("  %4.0f s: %d calls, RSS %.0f MiB, %d unexpected" % (
                time.monotonic() - begin, tally.calls, samples[-1] / MIB, len(tally.unexpected)),
                flush=True)
    stop.set()
    for c in clients:
        c.join(timeout=60)
    elapsed = time.monotonic() - begin
    hung = [c.index for c in clients if c.is_alive()]
    failures = list(tally.unexpected)
    if hung:
        failures.append("clients %s did not stop" % hung)
    if proc.poll() is not None:
        failures.append("the server exited with %s during the soak" % proc.returncode)
    else:
        stub = PB["kv_grpc"].KvCacheStub(channels[0])
        stats = stub.Stats(kv.StatsRequest(), timeout=30)
        print("stats at the end: used_bytes %d, sequences %d, blocks_used %d, rejections %d" % (
            stats.used_bytes, stats.sequences, stats.blocks_used, stats.rejections))
        if (stats.used_bytes, stats.sequences, stats.blocks_used) != (0, 0, 0):
            failures.append("the cache is not empty at the end: %s" % stats)
    sampling.set()
    sampler.join()
    end = rss_bytes(proc.pid) if proc.poll() is None else 0
    peak = max(samples)
    for c in channels:
        c.close()

    by_code = collections.Counter()
    for (method, code), n in tally.counts.items():
        by_code[code] += n
    print("soak: %d clients, %.1f s, %d calls, %.0f calls/s" % (
        args.clients, elapsed, tally.calls, tally.calls / elapsed))
    print("codes: %s" % ", ".join("%s %d" % kv_ for kv_ in sorted(by_code.items())))
    for (method, code), n in sorted(tally.counts.items()):
        print("  %-15s %-19s %d" % (method, code, n))
    print("RSS: start %.1f MiB, peak %.1f MiB, end %.1f MiB (bound %.1f MiB = base + KV budget "
          "%.0f MiB + slack %.0f MiB)" % (base / MIB, peak / MIB, end / MIB, bound / MIB,
                                           args.kv_cache_bytes / MIB,
                                           args.rss_slack_bytes / MIB))
    if peak > bound:
        failures.append("peak RSS %.1f MiB is over the bound %.1f MiB" % (peak / MIB, bound / MIB))
    if tally.calls == 0:
        failures.append("no calls were made")

    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
        if proc.returncode != 0:
            failures.append("exit %d after SIGTERM" % proc.returncode)
    if failures:
        print("FAILED: %d problems" % len(failures))
        for f in failures[:50]:
            print("  " + f)
        return 1
    print("PASSED")
    return 0


if __name__ == "__main__":
    sys.exit(main())
