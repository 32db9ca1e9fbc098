#!/usr/bin/python3
"""Faults around the real attend-server: a client that cancels a long prefill, a deadline that
passes while the call waits for a worker, clients killed while they hold DecodeStreams, SIGTERM
under concurrent load, and SIGKILL followed by a restart on the same ports.

lifecycle_test.py covers SIGTERM with one long call or one stream in flight, the end of the grace
and busy ports; these tests add what happens to the work, the slots and the state.
"""
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import unittest
import urllib.request

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_test  # noqa: E402  (generate_stubs and the stub modules it fills in)
import lifecycle_test  # noqa: E402  (start, free_port, bf16_tensor, long_attend, wait_in_flight)
from lifecycle_test import bf16_tensor, free_port, long_attend, start  # noqa: E402

PB = e2e_test.PB
BIG = [("grpc.max_send_message_length", 128 << 20),
       ("grpc.max_receive_message_length", 128 << 20)]
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    """User + system CPU time of process `pid` (all its threads) from /proc/PID/stat."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def metrics_text(port):
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=5) as response:
        return response.read().decode()


def metric(text, name, **labels):
    """The value of series `name` whose labels include `labels` (0 when absent)."""
    total = 0.0
    for match in re.finditer(r"^%s(\{[^}]*\})? (\S+)$" % re.escape(name), text, re.M):
        got = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1) or ""))
        if all(got.get(k) == v for k, v in labels.items()):
            total += float(match.group(2))
    return total


def poll(predicate, timeout, interval=0.05, what="condition"):
    """Calls predicate() until it is true or `timeout` seconds pass; returns its last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            if not value:
                raise AssertionError("timed out after %.0f s waiting for %s" % (timeout, what))
            return value
        time.sleep(interval)


def stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()


class Faults(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import grpc
        cls.grpc = grpc

    wait_in_flight = lifecycle_test.Lifecycle.wait_in_flight

    def prefill(self, sequence_id, n, heads=8, dim=128, seed=0):
        kv = PB["kv"]
        return kv.AppendRequest(sequence_id=sequence_id, q=bf16_tensor((n, heads, dim), seed),
                                k=bf16_tensor((n, heads, dim), seed + 1),
                                v=bf16_tensor((n, heads, dim), seed + 2))

    def test_a_cancelled_prefill_stops_computing_and_leaves_the_sequence_as_it_was(self):
        grpc, kv, t = self.grpc, PB["kv"], PB["tensor"]
        proc, port, metrics_port = start(
            "--address=127.0.0.1:0", "--metrics_address=127.0.0.1:0", "--compute_threads=1",
            "--max_message_bytes=134217728", "--kv_cache_bytes=536870912")
        try:
            with grpc.insecure_channel("127.0.0.1:%d" % port, options=BIG) as channel:
                stub = PB["kv_grpc"].KvCacheStub(channel)
                config = kv.SequenceConfig(layers=1, n_head=8, n_head_kv=8, head_dim=128,
                                           kv_dtype=t.BFLOAT16)
                measured = []  # the sequences that measured a whole prefill
                stub.CreateSequence(kv.CreateSequenceRequest(
                    sequence_id="cancelled", config=config), timeout=30)
                stub.Append(self.prefill("cancelled", 16), timeout=30)
                # How much CPU the prefill takes when it runs to the end, from a sequence of 16
                # tokens like "cancelled": doubled (four times the work) until it takes 2 CPU
                # seconds, so that a fast machine still leaves work to cancel. CPU time, not wall
                # time: other tests running beside this one stretch the wall clock, not the work.
                # 16384 tokens is the largest that fits the message limit.
                for big in (8192, 16384):
                    measured.append("whole-%d" % big)
                    stub.CreateSequence(kv.CreateSequenceRequest(
                        sequence_id=measured[-1], config=config), timeout=30)
                    stub.Append(self.prefill(measured[-1], 16), timeout=30)
                    begin = cpu_seconds(proc.pid)
                    stub.Append(self.prefill(measured[-1], big), timeout=120)
                    whole = cpu_seconds(proc.pid) - begin
                    print("prefill of %d tokens: %.2f CPU s" % (big, whole), file=sys.stderr)
                    if whole >= 2.0:
                        break
                if whole < 2.0:
                    self.skipTest("the prefill takes only %.2f CPU s here" % whole)
                before = stub.GetSequence(kv.GetSequenceRequest(sequence_id="cancelled"),
                                          timeout=30)
                used = stub.Stats(kv.StatsRequest(), timeout=30).used_bytes

                def handled(code):
                    return metric(metrics_text(metrics_port), "grpc_server_handled_total",
                                  grpc_method="Append", grpc_code=code)
                call = stub.Append.future(self.prefill("cancelled", big), timeout=120)
                self.wait_in_flight(metrics_port, call)
                # Computing: the server has spent 0.1 CPU s on it (an event, however long the
                # machine takes to get there), and it is still running.
                busy_from = cpu_seconds(proc.pid)
                poll(lambda: cpu_seconds(proc.pid) - busy_from >= 0.1 or call.done(), timeout=60,
                     interval=0.01, what="the prefill to compute")
                self.assertFalse(call.done(), "the prefill ended before it could be cancelled")
                self.assertTrue(call.cancel())
                at_cancel = cpu_seconds(proc.pid)
                # The server ends the call (it counts it CANCELLED), and its CPU time stops
                # growing: a 0.5 s window with under 0.05 s of CPU.
                poll(lambda: handled("CANCELLED") >= 1, timeout=max(whole, 5) * 4,
                     what="the server to end the cancelled call")

                def idle():
                    start_cpu = cpu_seconds(proc.pid)
                    time.sleep(0.5)
                    return cpu_seconds(proc.pid) - start_cpu < 0.05
                poll(idle, timeout=30, interval=0, what="the server to stop computing")
                spent = cpu_seconds(proc.pid) - at_cancel
                left = whole - (at_cancel - busy_from)
                print("%.2f CPU s after the cancel, of %.2f the prefill had left"
                      % (spent, left), file=sys.stderr)
                # Work that ignored the cancel would spend all of what was left.
                self.assertLess(spent, max(0.4 * left, 0.3))
                with self.assertRaises(grpc.FutureCancelledError):
                    call.result()

                after = stub.GetSequence(kv.GetSequenceRequest(sequence_id="cancelled"),
                                         timeout=30)
                self.assertEqual(list(after.layer_tokens), list(before.layer_tokens))
                self.assertEqual((after.blocks, after.bytes), (before.blocks, before.bytes))
                self.assertEqual(stub.Stats(kv.StatsRequest(), timeout=30).used_bytes, used)
                # Consistent: the next append starts where the sequence ended.
                r = stub.Append(self.prefill("cancelled", 4, seed=9), timeout=30)
                self.assertEqual((r.first_position, r.layer_tokens), (16, 20))
                handled = metrics_text(metrics_port)
                # The two appends of each measurement, and the two of "cancelled" that were not
                # cancelled.
                self.assertEqual(metric(handled, "grpc_server_handled_total", grpc_method="Append",
                                        grpc_code="OK"), 2 * len(measured) + 2)
                for sequence_id in measured + ["cancelled"]:
                    stub.Release(kv.ReleaseRequest(sequence_id=sequence_id), timeout=30)
                stats = stub.Stats(kv.StatsRequest(), timeout=30)
                self.assertEqual((stats.used_bytes, stats.sequences), (0, 0))
        finally:
            stop(proc)
        self.assertEqual(proc.returncode, 0)

    def test_a_deadline_that_passes_in_the_queue_is_deadline_exceeded_and_never_runs(self):
        grpc, kv, t = self.grpc, PB["kv"], PB["tensor"]
        proc, port, metrics_port = start(
            "--address=127.0.0.1:0", "--metrics_address=127.0.0.1:0", "--worker_threads=1",
            "--compute_threads=1", "--max_message_bytes=134217728")
        try:
            with grpc.insecure_channel("127.0.0.1:%d" % port, options=BIG) as channel:
                stub = PB["kv_grpc"].KvCacheStub(channel)
                attention = PB["attention_grpc"].AttentionStub(channel)
                stub.CreateSequence(kv.CreateSequenceRequest(
                    sequence_id="queued", config=kv.SequenceConfig(
                        layers=1, n_head=2, n_head_kv=1, head_dim=4, kv_dtype=t.FLOAT32)),
                    timeout=30)
                attention.Attend(long_attend(512), timeout=60)  # warm-up
                # The only worker is busy for seconds.
                begin = time.monotonic()
                long_call = attention.Attend.future(long_attend(8192), timeout=120)
                self.wait_in_flight(metrics_port, long_call)
                # In flight counts from the call's start, while its 48 MiB may still be arriving:
                # wait until the worker is taken (a side-effect-free Softmax has to wait).
                softmax = PB["attention"].SoftmaxRequest(logits=[1, 2])

                def worker_taken():
                    try:
                        attention.Softmax(softmax, timeout=0.3)
                        return False
                    except grpc.RpcError as e:
                        self.assertEqual(e.code(), grpc.StatusCode.DEADLINE_EXCEEDED)
                        return True
                poll(worker_taken, timeout=30, interval=0, what="the long call to take the worker")

                def tiny(heads):
                    return t.Tensor(shape=[1, heads, 4], values=[0.5] * (heads * 4))
                with self.assertRaises(grpc.RpcError) as caught:
                    stub.Append(kv.AppendRequest(sequence_id="queued", q=tiny(2), k=tiny(1),
                                                 v=tiny(1)), timeout=0.5)
                self.assertEqual(caught.exception.code(), grpc.StatusCode.DEADLINE_EXCEEDED)
                self.assertFalse(long_call.done(), "the worker was free: nothing was queued")
                long_call.result(timeout=120)
                print("long call %.2f s" % (time.monotonic() - begin), file=sys.stderr)

                # The queued Append was taken off the queue without running: nothing appended,
                # no attention counted for it, and the server says why it ended.
                info = stub.GetSequence(kv.GetSequenceRequest(sequence_id="queued"), timeout=30)
                self.assertEqual(list(info.layer_tokens), [0])

                def ended():
                    text = metrics_text(metrics_port)
                    return sum(metric(text, "grpc_server_handled_total", grpc_method="Append",
                                      grpc_code=code) for code in
                               ("DEADLINE_EXCEEDED", "CANCELLED")) >= 1 and text
                text = poll(ended, timeout=30, what="the queued Append to be counted")
                self.assertEqual(metric(text, "grpc_server_handled_total", grpc_method="Append",
                                        grpc_code="OK"), 0)
                self.assertEqual(metric(text, "attend_attention_flops_total",
                                        grpc_method="Append"), 0)
                # The worker is free again: the same call now runs.
                r = stub.Append(kv.AppendRequest(sequence_id="queued", q=tiny(2), k=tiny(1),
                                                 v=tiny(1)), timeout=30)
                self.assertEqual(r.layer_tokens, 1)
                stub.Release(kv.ReleaseRequest(sequence_id="queued"), timeout=30)
        finally:
            stop(proc)
        self.assertEqual(proc.returncode, 0)

    HOLDER = r"""
import sys, time, queue, grpc
target, message = sys.argv[1], bytes.fromhex(sys.argv[2])
channel = grpc.insecure_channel(target)
method = channel.stream_stream("/attend.v1.KvCache/DecodeStream", request_serializer=None,
                               response_deserializer=None)
outbox = queue.Queue()
outbox.put(message)
responses = method(iter(outbox.get, None))
next(responses)
print("ready", flush=True)
time.sleep(600)
"""

    def test_clients_killed_mid_stream_give_their_stream_slots_back(self):
        grpc, kv, t = self.grpc, PB["kv"], PB["tensor"]
        limit = 3
        proc, port, metrics_port = start("--address=127.0.0.1:0",
                                         "--metrics_address=127.0.0.1:0",
                                         "--max_concurrent_streams=%d" % limit)
        holders = []
        try:
            with grpc.insecure_channel("127.0.0.1:%d" % port) as channel:
                stub = PB["kv_grpc"].KvCacheStub(channel)
                config = kv.SequenceConfig(layers=1, n_head=2, n_head_kv=1, head_dim=4,
                                           kv_dtype=t.FLOAT32)

                def step(sequence_id):
                    def tensor(heads):
                        return t.Tensor(shape=[1, heads, 4], values=[0.5] * (heads * 4))
                    return kv.DecodeBatchRequest(request_id=1, steps=[kv.DecodeStep(
                        sequence_id=sequence_id, q=tensor(2), k=tensor(1), v=tensor(1))])

                for i in range(limit):
                    stub.CreateSequence(kv.CreateSequenceRequest(
                        sequence_id="held-%d" % i, config=config), timeout=30)
                    holder = subprocess.Popen(
                        [sys.executable, "-c", self.HOLDER, "127.0.0.1:%d" % port,
                         step("held-%d" % i).SerializeToString().hex()],
                        stdout=subprocess.PIPE, text=True)
                    holders.append(holder)
                    self.assertEqual(holder.stdout.readline().strip(), "ready")

                def one_stream():
                    """A DecodeStream of one message: its response, or the stream's error."""
                    try:
                        got = list(stub.DecodeStream(iter([step("held-0")]), timeout=10))
                        return got[0]
                    except grpc.RpcError as e:
                        return e
                refused = one_stream()
                self.assertIsInstance(refused, grpc.RpcError)
                self.assertEqual(refused.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
                self.assertIn("--max_concurrent_streams", refused.details())

                for holder in holders:
                    holder.send_signal(signal.SIGKILL)
                    holder.wait(timeout=10)
                killed = time.monotonic()

                # Every slot comes back: `limit` streams can be held open at once again.
                def all_slots_free():
                    outboxes, streams = [], []
                    try:
                        for i in range(limit):
                            outbox = queue.Queue()
                            responses = stub.DecodeStream(iter(outbox.get, None), timeout=10)
                            outbox.put(step("held-%d" % i))
                            first = next(responses)
                            self.assertFalse(first.HasField("error"), first.error.message)
                            outboxes.append(outbox)
                            streams.append(responses)
                        return True
                    except grpc.RpcError as e:
                        self.assertEqual(e.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
                        return False
                    finally:
                        for outbox in outboxes:
                            outbox.put(None)
                        for responses in streams:
                            try:
                                list(responses)
                            except grpc.RpcError:
                                pass
                poll(all_slots_free, timeout=30, interval=0.2, what="the killed streams' slots")
                print("slots back %.2f s after the kill" % (time.monotonic() - killed),
                      file=sys.stderr)
                for i in range(limit):
                    stub.Release(kv.ReleaseRequest(sequence_id="held-%d" % i), timeout=30)
                self.assertEqual(stub.Stats(kv.StatsRequest(), timeout=30).used_bytes, 0)
        finally:
            for holder in holders:
                if holder.poll() is None:
                    holder.kill()
                    holder.wait()
                holder.stdout.close()
            stop(proc)
        self.assertEqual(proc.returncode, 0)

    def load(self, port, threads, stop_event, record):
        """`threads` clients, each creating its own sequence and appending, decoding and
        attending in a loop until stop_event; record gets (start, end, code name) per call."""
        grpc, kv, a, t = self.grpc, PB["kv"], PB["attention"], PB["tensor"]
        rng = np.random.default_rng(3)
        q = e2e_test.f32_tensor(rng.standard_normal((64, 8, 64)))
        k = e2e_test.f32_tensor(rng.standard_normal((256, 2, 64)))
        v = e2e_test.f32_tensor(rng.standard_normal((256, 2, 64)))

        def client(index, channel):
            kv_stub = PB["kv_grpc"].KvCacheStub(channel)
            attention = PB["attention_grpc"].AttentionStub(channel)
            sequence_id = "load-%d" % index

            def timed(fn):
                begin = time.monotonic()
                code = "OK"
                try:
                    fn()
                except grpc.RpcError as e:
                    code = e.code().name
                record.append((begin, time.monotonic(), code))
                return code

            if timed(lambda: kv_stub.CreateSequence(kv.CreateSequenceRequest(
                    sequence_id=sequence_id, config=kv.SequenceConfig(
                        layers=1, n_head=8, n_head_kv=2, head_dim=64, kv_dtype=t.FLOAT32)),
                    timeout=30)) != "OK":
                return
            while not stop_event.is_set():
                calls = [
                    lambda: kv_stub.Append(kv.AppendRequest(
                        sequence_id=sequence_id, q=e2e_test.f32_tensor(
                            rng.standard_normal((8, 8, 64))),
                        k=e2e_test.f32_tensor(rng.standard_normal((8, 2, 64))),
                        v=e2e_test.f32_tensor(rng.standard_normal((8, 2, 64)))), timeout=30),
                    lambda: attention.Attend(a.AttendRequest(q=q, k=k, v=v), timeout=30),
                    lambda: kv_stub.Truncate(kv.TruncateRequest(sequence_id=sequence_id,
                                                                tokens=0), timeout=30)]
                for call in calls:
                    if timed(call) == "UNAVAILABLE":
                        return

        channels = [grpc.insecure_channel("127.0.0.1:%d" % port) for _ in range(threads)]
        workers = [threading.Thread(target=client, args=(i, channels[i]), daemon=True)
                   for i in range(threads)]
        for w in workers:
            w.start()
        return workers, channels

    def test_sigterm_under_load_finishes_what_is_in_flight_and_exits_zero(self):
        grace = 10
        proc, port, metrics_port = start("--address=127.0.0.1:0", "--metrics_address=127.0.0.1:0",
                                         "--shutdown_grace=%ds" % grace)
        stop_event = threading.Event()
        record = []
        workers, channels = self.load(port, 16, stop_event, record)
        try:
            poll(lambda: len(record) >= 200, timeout=60, what="200 calls under load")
            signalled = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=grace + 20)
            exited = time.monotonic() - signalled
        finally:
            stop_event.set()
            for w in workers:
                w.join(timeout=30)
            for c in channels:
                c.close()
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        codes = {}
        for _, _, code in record:
            codes[code] = codes.get(code, 0) + 1
        in_flight = [r for r in record if r[0] < signalled < r[1]]
        finished = [r for r in in_flight if r[2] == "OK"]
        print("SIGTERM under load: %d calls %s; %d in flight at the signal, %d of them OK; exit "
              "%.2f s after it" % (len(record), codes, len(in_flight), len(finished), exited),
              file=sys.stderr)
        self.assertEqual(proc.returncode, 0)
        self.assertLess(exited, grace + 1.0 + e2e_test.SANITIZER_EXIT_SECONDS)
        # Calls either finished or were refused or cut off as the drain promises; nothing else.
        # CANCELLED comes only from calls that had not been admitted (docs/api.md: one still
        # arriving "is refused or cut off like a new one"): admitted calls are waited for, and the
        # exit came long before the grace ended.
        self.assertEqual(set(codes) - {"OK", "UNAVAILABLE", "CANCELLED"}, set(), codes)
        self.assertGreater(codes.get("UNAVAILABLE", 0), 0, "no call was refused by the drain")
        # In-flight work at the signal finished (a call whose request had not arrived whole when
        # the signal came may be refused; docs/api.md: 'counts as started once its request
        # arrived').
        self.assertGreater(len(finished), 0)
        self.assertTrue(all(end < signalled + grace for _, end, _ in in_flight))

    def test_sigkill_then_a_restart_on_the_same_ports_serves_again(self):
        grpc, kv, t, h = self.grpc, PB["kv"], PB["tensor"], PB["health"]
        port, metrics_port = free_port(), free_port()
        flags = ["--address=127.0.0.1:%d" % port, "--metrics_address=127.0.0.1:%d" % metrics_port]
        proc, _, _ = start(*flags)
        stop_event = threading.Event()
        record = []
        workers, channels = self.load(port, 4, stop_event, record)
        try:
            poll(lambda: len(record) >= 50, timeout=60, what="50 calls under load")
            proc.send_signal(signal.SIGKILL)
            proc.communicate(timeout=30)
            self.assertEqual(proc.returncode, -signal.SIGKILL)
            killed = time.monotonic()
            # The same ports at once: no TIME_WAIT or leftover listener keeps them.
            proc, got_port, got_metrics = start(*flags)
            self.assertEqual((got_port, got_metrics), (port, metrics_port))
            print("restarted %.2f s after SIGKILL" % (time.monotonic() - killed), file=sys.stderr)
            stop_event.set()
            for w in workers:
                w.join(timeout=30)
            with grpc.insecure_channel("127.0.0.1:%d" % port) as channel:
                health = PB["health_grpc"].HealthStub(channel)
                poll(lambda: health.Check(h.HealthCheckRequest(), timeout=5).status ==
                     h.HealthCheckResponse.SERVING, timeout=30, what="SERVING")
                stub = PB["kv_grpc"].KvCacheStub(channel)
                # A new process: the cache starts empty, and the old ids can be used again.
                stats = stub.Stats(kv.StatsRequest(), timeout=30)
                self.assertEqual((stats.used_bytes, stats.sequences), (0, 0))
                stub.CreateSequence(kv.CreateSequenceRequest(
                    sequence_id="load-0", config=kv.SequenceConfig(
                        layers=1, n_head=2, head_dim=4, kv_dtype=t.FLOAT32)), timeout=30)
                r = PB["attention_grpc"].AttentionStub(channel).Softmax(
                    PB["attention"].SoftmaxRequest(logits=[2, 1, 0.5]), timeout=30)
                self.assertEqual([round(p, 2) for p in r.probabilities], [0.63, 0.23, 0.14])
                stub.Release(kv.ReleaseRequest(sequence_id="load-0"), timeout=30)
            self.assertIn("attend_build_info", metrics_text(metrics_port))
            # Existing channels reconnect to the new process.
            softmax = PB["attention_grpc"].AttentionStub(channels[0]).Softmax(
                PB["attention"].SoftmaxRequest(logits=[1, 1]), timeout=30, wait_for_ready=True)
            self.assertEqual(list(softmax.probabilities), [0.5, 0.5])
        finally:
            stop_event.set()
            for w in workers:
                w.join(timeout=30)
            for c in channels:
                c.close()
            stop(proc)
        self.assertEqual(proc.returncode, 0)


if __name__ == "__main__":
    lifecycle_test.main()  # parses --server and --proto for start()
