#!/usr/bin/python3
"""The real attend-server binary through its lifecycle: draining on SIGTERM (health NOT_SERVING,
new calls refused, in-flight work finished or cancelled at the end of the grace, exit 0 in time),
ports that are in use, and a metrics port that answers scrapes while idle connections are open.
"""
import os
import queue as queue_module
import random
import re
import signal
import socket
import subprocess
import sys
import time
import unittest
import urllib.request

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_test  # noqa: E402  (generate_stubs and the stub modules it fills in)

ARGS = None
PB = e2e_test.PB


def free_port():
    """A free loopback port outside the kernel's ephemeral range. A port bound to 0 and released
    comes from that range, and the servers the test starts next on port 0 may be handed the same
    one before the test binds it again (seen: nginx's bind failing with EADDRINUSE)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    candidates = list(range(10000, low)) + list(range(high + 1, 65536))
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.choice(candidates)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port outside the ephemeral range %d-%d" % (low, high))


def start(*flags):
    """Starts attend-server with `flags`; returns (process, gRPC port, metrics port)."""
    proc = subprocess.Popen([ARGS.server] + list(flags), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    match = re.search(r"listening on [\d.]+:(\d+)(?:, metrics on http://[\d.]+:(\d+))?", line)
    if not match:
        proc.kill()
        raise RuntimeError("server did not start: %r %s" % (line, proc.stderr.read()))
    return proc, int(match.group(1)), int(match.group(2) or 0)


def bf16_tensor(shape, seed):
    """A BFLOAT16 tensor of random values (the top halves of float32s)."""
    t = PB["tensor"]
    values = np.random.default_rng(seed).uniform(-1, 1, size=shape).astype(np.float32)
    halves = (values.view(np.uint32) >> 16).astype(np.uint16)
    return t.Tensor(dtype=t.BFLOAT16, shape=list(shape), data=halves.tobytes())


def long_attend(n_kv):
    """An Attend of 8192 queries over n_kv keys, 8 heads of 128: seconds of work on one core."""
    return PB["attention"].AttendRequest(q=bf16_tensor((8192, 8, 128), 1),
                                         k=bf16_tensor((n_kv, 8, 128), 2),
                                         v=bf16_tensor((n_kv, 8, 128), 3))


# Flags of the servers the drain tests start: one compute thread, so that the long calls take
# seconds, and room for their messages.
SLOW = ["--address=127.0.0.1:0", "--metrics_address=127.0.0.1:0", "--compute_threads=1",
        "--max_message_bytes=134217728"]


class Lifecycle(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import grpc
        cls.grpc = grpc
        # How long the long call takes on this machine, so that the tests below can place their
        # signals inside it (the time grows with the keys).
        proc, port, _ = start(*SLOW)
        try:
            with grpc.insecure_channel("127.0.0.1:%d" % port, options=cls.options()) as channel:
                stub = PB["attention_grpc"].AttentionStub(channel)
                stub.Attend(long_attend(1024))  # warm-up
                begin = time.monotonic()
                stub.Attend(long_attend(8192))
                cls.seconds_per_8k = time.monotonic() - begin
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=30)

    @staticmethod
    def options():
        return [("grpc.max_send_message_length", 128 << 20),
                ("grpc.max_receive_message_length", 128 << 20)]

    def wait_in_flight(self, metrics_port, call):
        """Waits until the server reports a call in flight (the long call reached it)."""
        for _ in range(300):
            with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % metrics_port,
                                        timeout=5) as response:
                text = response.read().decode()
            match = re.search(r"^attend_requests_in_flight (\S+)", text, re.M)
            if match and float(match.group(1)) >= 1:
                return
            self.assertFalse(call.done(), "the long call ended before the test could signal")
            time.sleep(0.02)
        self.fail("the long call never reached the server")

    def health(self, channel, service=""):
        stub = PB["health_grpc"].HealthStub(channel)
        return stub.Check(PB["health"].HealthCheckRequest(service=service), timeout=2).status

    def test_sigterm_drains_then_exits_zero(self):
        """Health turns NOT_SERVING at once and stays answerable, new work is refused with
        UNAVAILABLE, the call in flight finishes within the grace, and the process exits 0 soon
        after it."""
        grpc = self.grpc
        proc, port, metrics_port = start(*(SLOW + ["--shutdown_grace=30s"]))
        with grpc.insecure_channel("127.0.0.1:%d" % port, options=self.options()) as channel:
            stub = PB["attention_grpc"].AttentionStub(channel)
            self.assertEqual(self.health(channel), PB["health"].HealthCheckResponse.SERVING)
            call = stub.Attend.future(long_attend(8192))
            self.wait_in_flight(metrics_port, call)
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.2)
            serving = PB["health"].HealthCheckResponse
            self.assertEqual(self.health(channel), serving.NOT_SERVING)
            for service in ("attend.v1.Attention", "attend.v1.KvCache", "attend.v1.Planner"):
                self.assertEqual(self.health(channel, service), serving.NOT_SERVING)
            with self.assertRaises(grpc.RpcError) as refused:
                stub.Softmax(PB["attention"].SoftmaxRequest(logits=[1, 2]), timeout=5)
            self.assertEqual(refused.exception.code(), grpc.StatusCode.UNAVAILABLE)
            self.assertIn("shutting down", refused.exception.details())
            self.assertFalse(call.done())
            response = call.result(timeout=60)  # finishes: the grace is longer than the work
            finished = time.monotonic()
            self.assertEqual(len(response.output.data), 8192 * 8 * 128 * 4)
        proc.communicate(timeout=30)
        self.assertEqual(proc.returncode, 0)
        self.assertLess(time.monotonic() - finished, 1.5 + e2e_test.SANITIZER_EXIT_SECONDS,
                        "exit long after the last call ended")

    def test_a_stream_open_before_sigterm_keeps_working_during_the_drain(self):
        """A DecodeStream opened before SIGTERM is served through the drain; one opened after
        is refused UNAVAILABLE; once the stream closes the process exits."""
        grpc = self.grpc
        kv, t = PB["kv"], PB["tensor"]
        proc, port, _ = start("--address=127.0.0.1:0", "--metrics_address=",
                              "--shutdown_grace=30s")
        with grpc.insecure_channel("127.0.0.1:%d" % port) as channel:
            stub = PB["kv_grpc"].KvCacheStub(channel)
            stub.CreateSequence(kv.CreateSequenceRequest(
                sequence_id="s", config=kv.SequenceConfig(layers=1, n_head=2, n_head_kv=1,
                                                          head_dim=4, kv_dtype=t.FLOAT32)))

            def step(request_id):
                def tensor(heads):
                    return t.Tensor(shape=[1, heads, 4], values=[0.5] * (heads * 4))
                return kv.DecodeBatchRequest(request_id=request_id, steps=[kv.DecodeStep(
                    sequence_id="s", q=tensor(2), k=tensor(1), v=tensor(1))])

            outbox = queue_module.Queue()
            responses = stub.DecodeStream(iter(outbox.get, None))
            outbox.put(step(1))
            self.assertEqual(next(responses).results[0].layer_tokens, 1)
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.3)
            outbox.put(step(2))
            second = next(responses)
            self.assertFalse(second.HasField("error"), second.error.message)
            self.assertEqual(second.results[0].layer_tokens, 2)
            with self.assertRaises(grpc.RpcError) as refused:
                list(stub.DecodeStream(iter([step(3)]), timeout=5))
            self.assertEqual(refused.exception.code(), grpc.StatusCode.UNAVAILABLE)
            self.assertIsNone(proc.poll(), "exited while a stream was open")
            outbox.put(None)
            self.assertEqual(list(responses), [])
            closed = time.monotonic()
        proc.communicate(timeout=30)
        self.assertEqual(proc.returncode, 0)
        self.assertLess(time.monotonic() - closed, 1.5)

    def test_the_end_of_the_grace_cancels_work_and_bounds_the_exit(self):
        """Work longer than the grace is cancelled when it ends; the process exits 0 within the
        grace plus a second, also with an idle client connected, every time."""
        grpc = self.grpc
        # 24576 keys: the largest call that fits in the message limit, 3 x seconds_per_8k.
        work = 3 * self.seconds_per_8k
        for grace in (1, 2, 1):
            if work < grace + 1.5:
                self.skipTest("the long call takes only %.1f s here" % work)
            proc, port, metrics_port = start(*(SLOW + ["--shutdown_grace=%ds" % grace]))
            idle = grpc.insecure_channel("127.0.0.1:%d" % port)
            self.assertEqual(self.health(idle), PB["health"].HealthCheckResponse.SERVING)
            with grpc.insecure_channel("127.0.0.1:%d" % port, options=self.options()) as channel:
                stub = PB["attention_grpc"].AttentionStub(channel)
                call = stub.Attend.future(long_attend(24576))
                self.wait_in_flight(metrics_port, call)
                signalled = time.monotonic()
                proc.send_signal(signal.SIGTERM)
                proc.communicate(timeout=60)
                exited = time.monotonic() - signalled
                print("grace %d s: exited %.2f s after SIGTERM" % (grace, exited), file=sys.stderr)
                self.assertEqual(proc.returncode, 0)
                self.assertLess(exited, grace + 1.0 + e2e_test.SANITIZER_EXIT_SECONDS,
                                "grace %d s" % grace)
                with self.assertRaises(grpc.RpcError) as ended:
                    call.result(timeout=10)
                self.assertIn(ended.exception.code(),
                              (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE))
            idle.close()

    def test_an_idle_server_exits_at_once(self):
        grpc = self.grpc
        proc, port, _ = start("--address=127.0.0.1:0", "--metrics_address=127.0.0.1:0",
                              "--shutdown_grace=10s")
        idle = grpc.insecure_channel("127.0.0.1:%d" % port)
        self.assertEqual(self.health(idle), PB["health"].HealthCheckResponse.SERVING)
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
        self.assertEqual(proc.returncode, 0)
        self.assertLess(time.monotonic() - signalled, 1.0 + e2e_test.SANITIZER_EXIT_SECONDS)
        idle.close()

    def test_a_second_server_on_a_busy_port_refuses_to_start(self):
        port, metrics_port = free_port(), free_port()
        proc, _, _ = start("--address=127.0.0.1:%d" % port,
                           "--metrics_address=127.0.0.1:%d" % metrics_port)
        try:
            for flags, what in (
                    (["--address=127.0.0.1:%d" % port, "--metrics_address="], str(port)),
                    (["--address=127.0.0.1:0", "--metrics_address=127.0.0.1:%d" % metrics_port],
                     str(metrics_port))):
                second = subprocess.run([ARGS.server] + flags, capture_output=True, text=True,
                                        timeout=30)
                self.assertNotEqual(second.returncode, 0, second.stdout)
                self.assertIn("in use", second.stderr)
                self.assertIn(what, second.stderr)
                self.assertNotIn("null context", second.stderr)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=30)

    def test_idle_connections_do_not_block_scrapes(self):
        proc, _, metrics_port = start("--address=127.0.0.1:0", "--metrics_address=127.0.0.1:0")
        idle = []
        try:
            # Fewer than the exposer's 64 threads, more than the 16 it had when 40 idle sockets
            # held every scrape up for seconds.
            for _ in range(40):
                s = socket.create_connection(("127.0.0.1", metrics_port))
                idle.append(s)
            # A slow client that sends half a request and stops.
            slow = socket.create_connection(("127.0.0.1", metrics_port))
            slow.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            idle.append(slow)
            time.sleep(0.2)
            for _ in range(3):
                begin = time.monotonic()
                with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % metrics_port,
                                            timeout=5) as response:
                    body = response.read().decode()
                self.assertIn("attend_build_info", body)
                self.assertLess(time.monotonic() - begin, 1.0)
        finally:
            for s in idle:
                s.close()
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=30)


class ShapeChurn(unittest.TestCase):
    def test_memory_stays_bounded_when_shapes_come_and_go(self):
        """3000 sequences of 3000 different shapes, each created and released: what the server
        keeps per shape (primitives, warmed shapes) is bounded, so its resident memory is too."""
        import grpc
        kv, t = PB["kv"], PB["tensor"]
        proc, port, metrics_port = start("--address=127.0.0.1:0", "--metrics_address=127.0.0.1:0")

        def rss_mib():
            with open("/proc/%d/status" % proc.pid) as status:
                for line in status:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) / 1024.0
            return 0.0

        def metric(text, name):
            return float(re.search(r"^%s (\S+)" % name, text, re.M).group(1))

        try:
            with grpc.insecure_channel("127.0.0.1:%d" % port) as channel:
                stub = PB["kv_grpc"].KvCacheStub(channel)
                time.sleep(2.5)  # after the background measurement of the local hardware profile
                before = rss_mib()
                for i in range(3000):
                    config = kv.SequenceConfig(layers=1, n_head=1 + i % 16, head_dim=8 + 4 * (i // 16),
                                               kv_dtype=(t.FLOAT32, t.BFLOAT16)[i % 2])
                    stub.CreateSequence(kv.CreateSequenceRequest(sequence_id="s%d" % i,
                                                                 config=config))
                    stub.Release(kv.ReleaseRequest(sequence_id="s%d" % i))
                grown = rss_mib() - before
                with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % metrics_port,
                                            timeout=5) as response:
                    text = response.read().decode()
            print("RSS %.0f MiB before, grew %.0f MiB over 3000 shapes" % (before, grown),
                  file=sys.stderr)
            self.assertLess(grown, 200 + e2e_test.SANITIZER_RSS_MIB)
            self.assertLessEqual(metric(text, "attend_matmul_cache_primitives"),
                                 metric(text, "attend_matmul_cache_capacity"))
            self.assertGreater(metric(text, "attend_matmul_cache_evictions_total"), 0)
            self.assertLessEqual(metric(text, "attend_kv_cache_warmed_shapes"), 1024)
            self.assertEqual(metric(text, "attend_kv_cache_used_bytes"), 0)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=30)


def main():
    """Runs the unittest cases of the script being run (this one, or one that imports it for
    start()) against --server, with the stubs generated from --proto."""
    def use_args(args):
        global ARGS
        ARGS = args
    e2e_test.run_tests(("--server", "--proto"), use_args)


if __name__ == "__main__":
    main()
