#!/usr/bin/python3
"""A fleet: three attend-server replicas behind nginx (deploy/local/fleet.sh, deploy/nginx/).

Through the proxy, with x-attend-sequence-key in the metadata as the client library sends it:
50 sequences are created, prefilled and decoded (DecodeBatch, and a DecodeStream); every call
finds its sequence, and every replica, asked at its own address, holds some. Keyless
ListSequences/Stats all reach one replica (every page of a listing from the same one). The TLS
listener serves with a self-signed certificate.

Then one replica is SIGKILLed. What its sequences get through the proxy, as documented in
deploy/nginx/grpc.conf:
  - the first call for one of them: UNAVAILABLE (nginx cannot connect, answers 502, which the
    proxy's error_page turns into grpc-status 14; grpc_next_upstream off, so no retry);
  - later calls, while the peer is marked failed (max_fails=1, fail_timeout=10s): NOT_FOUND,
    from the replica the consistent hash picks instead, which never held the sequence;
  - after fail_timeout one call probes the dead peer again: UNAVAILABLE once more, then
    NOT_FOUND again.
A DecodeStream open on one of them (it had answered) ends with INTERNAL "RST_STREAM with error
code 2" (nginx cannot send a status once the response headers are out). The other sequences are
unaffected, and the client library's recovery (create the sequence again, prefill its tokens
again) works through the proxy. fleet.sh stop leaves no process.

A x-attend-sequence-key longer than 128 bytes (up to 40000 here) gets INVALID_ARGUMENT from the
proxy for that call only: the channel's other calls and an open DecodeStream go on.

fleet.sh: a SIGKILLed nginx master's workers (still serving) are reported by status and ended
by stop, and the port can be used again; bad arguments are refused with a message of its own.

Also: the ConfigMap of deploy/k8s/proxy.yaml holds the files of deploy/nginx/ unchanged (the
*.conf files but upstreams.conf, which k8s-upstreams.sh writes in the pod, and that script), the
Deployment runs the script from it, and nginx accepts that configuration.
"""
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_test  # noqa: E402  (generate_stubs and the stub modules it fills in)
from lifecycle_test import free_port  # noqa: E402

ARGS = None
PB = e2e_test.PB
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FLEET_SH = os.path.join(REPO, "deploy", "local", "fleet.sh")
NGINX_DIR = os.path.join(REPO, "deploy", "nginx")
PROXY_YAML = os.path.join(REPO, "deploy", "k8s", "proxy.yaml")
SCRIPT = "k8s-upstreams.sh"  # deploy/nginx/, in the ConfigMap too
KEY = "x-attend-sequence-key"
SEQUENCES = 50
PREFILL = 4
DECODES = 3
FAIL_TIMEOUT = 10  # fail_timeout on each server line that fleet.sh writes


def log(message):
    print("fleet_test: " + message, file=sys.stderr, flush=True)


def keyed(sequence_id):
    return ((KEY, sequence_id),)


def tensor(n, heads, dim, seed):
    values = [((seed * 31 + i * 7) % 13 - 6) / 6.0 for i in range(n * heads * dim)]
    return PB["tensor"].Tensor(dtype=PB["tensor"].FLOAT32, shape=[n, heads, dim], values=values)


CONFIG = dict(layers=1, n_head=2, n_head_kv=2, head_dim=8)


def prefill_request(sequence_id, seed):
    return PB["kv"].AppendRequest(sequence_id=sequence_id, q=tensor(PREFILL, 2, 8, seed),
                                  k=tensor(PREFILL, 2, 8, seed + 1),
                                  v=tensor(PREFILL, 2, 8, seed + 2))


def decode_request(sequence_ids, seed):
    kv = PB["kv"]
    return kv.DecodeBatchRequest(layer=0, steps=[
        kv.DecodeStep(sequence_id=s, q=tensor(1, 2, 8, seed), k=tensor(1, 2, 8, seed + 1),
                      v=tensor(1, 2, 8, seed + 2)) for s in sequence_ids])


def start_time(pid):
    """Field 22 of /proc/PID/stat, or None when the process is gone or a zombie (this
    container's init may not reap the replicas that fleet.sh left to it)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return None
    return None if fields[0] == "Z" else fields[19]


def children(pid):
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open("/proc/%s/stat" % entry) as f:
                    if f.read().rsplit(")", 1)[1].split()[1] == str(pid):
                        found.append(int(entry))
            except (FileNotFoundError, IndexError):
                pass
    return found


def list_all(stub, metadata=(), page_size=100):
    """Every sequence id of a listing, and the pages it took."""
    ids, token, pages = [], "", 0
    while True:
        page = stub.ListSequences(PB["kv"].ListSequencesRequest(page_size=page_size,
                                                               page_token=token),
                                  metadata=metadata, timeout=10)
        ids += [s.sequence_id for s in page.sequences]
        pages += 1
        token = page.next_page_token
        if not token:
            return ids, pages


class Fleet(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import grpc
        cls.grpc = grpc
        cls.began = time.monotonic()
        cls.dir = tempfile.mkdtemp(prefix="attend-fleet-test-")
        cls.cert = os.path.join(cls.dir, "cert.pem")
        key = os.path.join(cls.dir, "key.pem")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                        "-subj", "/CN=localhost", "-addext",
                        "subjectAltName=DNS:localhost,IP:127.0.0.1",
                        "-keyout", key, "-out", cls.cert],
                       check=True, capture_output=True)
        cls.env = dict(os.environ, ATTEND_SERVER=ARGS.server, ATTEND_CLI=ARGS.cli,
                       ATTEND_FLEET_DIR=os.path.join(cls.dir, "fleet"))
        cls.port, tls_port = free_port(), free_port()
        began = time.monotonic()
        result = cls.fleet("start", "--replicas", "3", "--port", str(cls.port),
                           "--tls_port", str(tls_port), "--tls_cert", cls.cert, "--tls_key", key,
                           "--", "--kv_cache_bytes=268435456", "--shutdown_grace=2s")
        if result.returncode != 0:
            raise RuntimeError("fleet.sh start failed: %s%s" % (result.stdout, result.stderr))
        log("fleet.sh start took %.2f s:\n%s" % (time.monotonic() - began, result.stdout))
        lines = result.stdout.splitlines()
        assert lines[0] == "proxy 127.0.0.1:%d" % cls.port, lines
        assert lines[1] == "proxy_tls 127.0.0.1:%d" % tls_port, lines
        cls.replicas = []  # (gRPC port, metrics port)
        for line in lines[2:]:
            match = re.fullmatch(r"replica 127\.0\.0\.1:(\d+) metrics 127\.0\.0\.1:(\d+)", line)
            assert match, line
            cls.replicas.append((int(match.group(1)), int(match.group(2))))
        assert len(cls.replicas) == 3, lines
        # The processes fleet.sh started (the pids file it keeps), and nginx's workers.
        cls.pids = {}
        with open(os.path.join(cls.env["ATTEND_FLEET_DIR"], "pids")) as f:
            for line in f:
                if line.startswith(("replica ", "nginx ")):
                    kind, pid, _, port = line.split()[:4]
                    cls.pids[(kind, int(port))] = int(pid)
        cls.workers = children(cls.pids[("nginx", cls.port)])
        assert cls.workers, "nginx has no workers"
        cls.channel = grpc.insecure_channel("127.0.0.1:%d" % cls.port)
        cls.stub = PB["kv_grpc"].KvCacheStub(cls.channel)
        with open(cls.cert, "rb") as f:
            root = f.read()
        cls.tls_channel = grpc.secure_channel(
            "127.0.0.1:%d" % tls_port, grpc.ssl_channel_credentials(root_certificates=root),
            options=[("grpc.ssl_target_name_override", "localhost")])
        cls.direct = {port: grpc.insecure_channel("127.0.0.1:%d" % port)
                      for port, _ in cls.replicas}
        cls.placement = {}  # sequence id -> gRPC port of the replica holding it

    @classmethod
    def tearDownClass(cls):
        for channel in [cls.channel, cls.tls_channel] + list(cls.direct.values()):
            channel.close()
        began = time.monotonic()
        result = cls.fleet("stop", "--port", str(cls.port))
        log("fleet.sh stop took %.2f s:\n%s" % (time.monotonic() - began, result.stdout))
        assert result.returncode == 0, result.stderr
        left = [pid for pid in list(cls.pids.values()) + cls.workers if start_time(pid)]
        assert not left, "processes left after fleet.sh stop: %s" % left
        status = cls.fleet("status", "--port", str(cls.port))
        assert status.returncode == 3 and "no fleet" in status.stdout, status
        shutil.rmtree(cls.dir)
        log("whole test %.1f s" % (time.monotonic() - cls.began))

    @classmethod
    def fleet(cls, *args):
        return subprocess.run(["bash", FLEET_SH] + list(args), env=cls.env, capture_output=True,
                              text=True, timeout=120)

    def kv(self, port):
        return PB["kv_grpc"].KvCacheStub(self.direct[port])

    def held(self):
        """Each replica's sequence ids, asked at its own address."""
        return {port: set(list_all(self.kv(port))[0]) for port, _ in self.replicas}

    def create_and_prefill(self, stub, sequence_id, seed):
        kv = PB["kv"]
        stub.CreateSequence(kv.CreateSequenceRequest(sequence_id=sequence_id,
                                                     config=kv.SequenceConfig(**CONFIG)),
                            metadata=keyed(sequence_id), timeout=10)
        out = stub.Append(prefill_request(sequence_id, seed), metadata=keyed(sequence_id),
                          timeout=10)
        self.assertEqual(out.layer_tokens, PREFILL)

    def code(self, call):
        try:
            call()
            return self.grpc.StatusCode.OK
        except self.grpc.RpcError as error:
            return error.code()

    def get(self, sequence_id):
        return self.stub.GetSequence(PB["kv"].GetSequenceRequest(sequence_id=sequence_id),
                                     metadata=keyed(sequence_id), timeout=10)

    def test_1_every_call_finds_its_sequence_and_every_replica_holds_some(self):
        began = time.monotonic()
        ids = ["fleet-seq-%02d" % i for i in range(SEQUENCES)]
        for i, sequence_id in enumerate(ids):
            self.create_and_prefill(self.stub, sequence_id, i)
        for step in range(DECODES):
            for i, sequence_id in enumerate(ids):
                out = self.stub.DecodeBatch(decode_request([sequence_id], 100 * step + i),
                                            metadata=keyed(sequence_id), timeout=10)
                self.assertEqual(out.results[0].layer_tokens, PREFILL + step + 1)
        for sequence_id in ids:
            self.assertEqual(self.get(sequence_id).tokens, PREFILL + DECODES)
        # A DecodeStream is keyed by its first step's sequence.
        responses = list(self.stub.DecodeStream(
            iter([decode_request([ids[0]], 1000 + n) for n in range(3)]),
            metadata=keyed(ids[0]), timeout=10))
        self.assertEqual([r.results[0].layer_tokens for r in responses],
                         [PREFILL + DECODES + n + 1 for n in range(3)])
        log("%d sequences x (create, prefill, %d decodes, get) + a stream: %.2f s"
            % (SEQUENCES, DECODES, time.monotonic() - began))

        held = self.held()
        per_replica = {port: len(s) for port, s in held.items()}
        log("sequences per replica: %s" % per_replica)
        self.assertTrue(all(per_replica.values()), per_replica)
        everything = [s for port in held for s in held[port]]
        self.assertEqual(sorted(everything), ids)  # each exactly once
        for port, sequences in held.items():
            stats = self.kv(port).Stats(PB["kv"].StatsRequest(), timeout=10)
            self.assertEqual(stats.sequences, len(sequences))
            for s in sequences:
                Fleet.placement[s] = port

    def test_2_keyless_calls_all_reach_one_replica(self):
        self.assertTrue(self.placement, "test_1 places the sequences")
        held = self.held()
        # Page by page (5 a page): every page from the same replica, or its tokens would fail.
        listed = set()
        for _ in range(3):
            ids, pages = list_all(self.stub, page_size=5)
            self.assertEqual(len(ids), len(set(ids)))
            self.assertIn(set(ids), held.values())
            listed.add(frozenset(ids))
            self.assertGreater(pages, 1)
        self.assertEqual(len(listed), 1, "keyless listings reached different replicas")
        stats = {self.stub.Stats(PB["kv"].StatsRequest(), timeout=10).sequences
                 for _ in range(6)}
        self.assertEqual(stats, {len(next(iter(listed)))})

    def test_3_the_tls_listener_serves(self):
        self.assertTrue(self.placement, "test_1 places the sequences")
        stub = PB["kv_grpc"].KvCacheStub(self.tls_channel)
        for sequence_id in sorted(self.placement)[:10]:
            info = stub.GetSequence(PB["kv"].GetSequenceRequest(sequence_id=sequence_id),
                                    metadata=keyed(sequence_id), timeout=10)
            self.assertEqual(info.sequence_id, sequence_id)
        stub.Stats(PB["kv"].StatsRequest(), timeout=10)
        health = PB["health_grpc"].HealthStub(self.tls_channel).Check(
            PB["health"].HealthCheckRequest(), timeout=10)
        self.assertEqual(health.status, PB["health"].HealthCheckResponse.SERVING)

    def test_4_an_oversized_sequence_key_fails_that_call_only(self):
        """A key over 128 bytes (the longest sequence id) gets INVALID_ARGUMENT from the proxy,
        for that call only: another call, and a DecodeStream open on the same channel (the same
        HTTP/2 connection), go on. Even a key larger than nginx's default header buffer (8k),
        which used to make nginx close the whole connection."""
        self.assertTrue(self.placement, "test_1 places the sequences")
        grpc = self.grpc
        sequence_id = sorted(self.placement)[0]
        steps = queue.Queue()
        stream = self.stub.DecodeStream(iter(steps.get, None), metadata=keyed(sequence_id),
                                        timeout=30)
        try:
            before = self.get(sequence_id).tokens
            steps.put(decode_request([sequence_id], 2000))
            self.assertEqual(next(stream).results[0].layer_tokens, before + 1)
            for size in (129, 200, 8100, 9000, 40000):
                try:
                    self.stub.GetSequence(PB["kv"].GetSequenceRequest(sequence_id=sequence_id),
                                          metadata=((KEY, "k" * size),), timeout=10)
                    self.fail("a %d-byte key was accepted" % size)
                except grpc.RpcError as error:
                    self.assertEqual(error.code(), grpc.StatusCode.INVALID_ARGUMENT,
                                     "%d-byte key: %s" % (size, error.details()))
                    self.assertIn(KEY, error.details())
                    self.assertIn("128 bytes", error.details())
                # The channel still works: a unary call, and the open stream.
                self.assertEqual(self.get(sequence_id).sequence_id, sequence_id)
                steps.put(decode_request([sequence_id], 2001))
                self.assertEqual(next(stream).results[0].layer_tokens, before + 2)
                before += 1
            # 128 bytes is a key like any other (a sequence id may be that long).
            self.assertEqual(self.code(lambda: self.stub.GetSequence(
                PB["kv"].GetSequenceRequest(sequence_id="s" * 128),
                metadata=((KEY, "s" * 128),), timeout=10)), grpc.StatusCode.NOT_FOUND)
        finally:
            steps.put(None)
        self.assertEqual(list(stream), [])

    def test_9_a_killed_replica_s_sequences_then_their_recovery(self):
        self.assertTrue(self.placement, "test_1 places the sequences")
        grpc = self.grpc
        victim = self.replicas[0][0]
        dead = sorted(s for s, port in self.placement.items() if port == victim)
        alive = sorted(s for s, port in self.placement.items() if port != victim)
        pid = self.pids[("replica", victim)]
        # A DecodeStream open on one of its sequences (a first step answered: nginx has sent
        # the response headers) ends with INTERNAL, "RST_STREAM with error code 2", not a gRPC
        # status: nginx cannot send trailers for a stream its upstream broke (grpc.conf, "A
        # replica that dies"). It does not mark the peer failed.
        steps = queue.Queue()
        stream = self.stub.DecodeStream(iter(steps.get, None), metadata=keyed(dead[0]),
                                        timeout=30)
        steps.put(decode_request([dead[0]], 3000))
        next(stream)
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while start_time(pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        killed_at = time.monotonic()
        steps.put(decode_request([dead[0]], 3001))
        with self.assertRaises(grpc.RpcError) as caught:
            next(stream)
        steps.put(None)
        log("the stream through the proxy: %s %r" % (caught.exception.code().name,
                                                      caught.exception.details()))
        self.assertEqual(caught.exception.code(), grpc.StatusCode.INTERNAL)
        self.assertIn("RST_STREAM", caught.exception.details())

        codes = [self.code(lambda s=s: self.get(s)) for s in dead]
        log("after SIGKILL of replica :%d (%d sequences), GetSequence of each through the "
            "proxy: %s" % (victim, len(dead), [c.name for c in codes]))
        self.assertEqual(codes[0], grpc.StatusCode.UNAVAILABLE)
        self.assertEqual(set(codes[1:]), {grpc.StatusCode.NOT_FOUND})
        try:
            self.get(dead[0])
        except grpc.RpcError as error:
            self.assertEqual(error.code(), grpc.StatusCode.NOT_FOUND)
        # A decode step gets the same.
        self.assertEqual(self.code(lambda: self.stub.DecodeBatch(
            decode_request([dead[0]], 7), metadata=keyed(dead[0]), timeout=10)),
            grpc.StatusCode.NOT_FOUND)

        # The others are unaffected: all there, and they decode.
        for i, sequence_id in enumerate(alive):
            before = self.get(sequence_id).tokens
            out = self.stub.DecodeBatch(decode_request([sequence_id], 500 + i),
                                        metadata=keyed(sequence_id), timeout=10)
            self.assertEqual(out.results[0].layer_tokens, before + 1)

        # The first call after fail_timeout tries the dead peer again. nginx counts it in whole
        # seconds and waits until more than fail_timeout has passed: 10 to 11 s after the failure.
        time.sleep(max(0.0, killed_at + FAIL_TIMEOUT + 1.2 - time.monotonic()))
        codes = [self.code(lambda s=s: self.get(s)) for s in dead[:3]]
        log("%.1f s after the kill: %s" % (time.monotonic() - killed_at, [c.name for c in codes]))
        self.assertEqual(codes, [grpc.StatusCode.UNAVAILABLE] + [grpc.StatusCode.NOT_FOUND] * 2)

        # Recovery as the client library documents it: create the sequence again, prefill again.
        began = time.monotonic()
        for i, sequence_id in enumerate(dead):
            self.create_and_prefill(self.stub, sequence_id, i)
            out = self.stub.DecodeBatch(decode_request([sequence_id], 900 + i),
                                        metadata=keyed(sequence_id), timeout=10)
            self.assertEqual(out.results[0].layer_tokens, PREFILL + 1)
            self.assertEqual(self.get(sequence_id).tokens, PREFILL + 1)
        log("recreated and prefilled %d sequences in %.2f s"
            % (len(dead), time.monotonic() - began))
        del self.direct[victim]
        self.replicas = [r for r in self.replicas if r[0] != victim]
        held = self.held()
        self.assertEqual(sorted(s for port in held for s in held[port]), sorted(self.placement))


def nginx_master(fleet_dir):
    """The pid of the nginx master of the fleet in fleet_dir (its pids file)."""
    with open(os.path.join(fleet_dir, "pids")) as f:
        return [int(line.split()[1]) for line in f if line.startswith("nginx ")][0]


class OrphanedNginxWorkers(unittest.TestCase):
    """nginx's master SIGKILLed: its workers, reparented, keep the port and serve. status says
    so (and exits non-zero), stop ends them (fleet.sh finds them by their process group), and a
    new fleet starts on the same port."""

    def test_stop_ends_the_workers_of_a_killed_master(self):
        with tempfile.TemporaryDirectory() as tmp:
            fleet_dir = os.path.join(tmp, "fleet")
            env = dict(os.environ, ATTEND_SERVER=ARGS.server, ATTEND_CLI=ARGS.cli,
                       ATTEND_FLEET_DIR=fleet_dir)
            port = str(free_port())

            def fleet(*args):
                return subprocess.run(["bash", FLEET_SH] + list(args) + ["--port", port],
                                      env=env, capture_output=True, text=True, timeout=60)
            started = fleet("start", "--replicas", "1")
            self.assertEqual(started.returncode, 0, started.stderr)
            try:
                master = nginx_master(fleet_dir)
                workers = children(master)
                self.assertTrue(workers, master)
                os.kill(master, signal.SIGKILL)
                deadline = time.monotonic() + 5
                while start_time(master) and time.monotonic() < deadline:
                    time.sleep(0.01)
                self.assertTrue(all(start_time(pid) for pid in workers))  # orphans now
                status = fleet("status")
                self.assertNotEqual(status.returncode, 0, status.stdout)
                self.assertIn("orphaned nginx worker", status.stdout)
                again = fleet("start", "--replicas", "1")
                self.assertNotEqual(again.returncode, 0, again.stdout)
                self.assertIn("already running", again.stderr)
                stopped = fleet("stop")
                self.assertEqual(stopped.returncode, 0, stopped.stderr)
                log("fleet.sh stop after the master's SIGKILL:\n" + stopped.stdout)
                self.assertEqual([pid for pid in workers if start_time(pid)], [])
                # The port is free again: a new fleet starts on it.
                restarted = fleet("start", "--replicas", "1")
                self.assertEqual(restarted.returncode, 0, restarted.stderr)
                self.assertEqual(restarted.stdout.splitlines()[0], "proxy 127.0.0.1:" + port)
                master = nginx_master(fleet_dir)
                workers = [master] + children(master)
            finally:
                stopped = fleet("stop")
                left = [pid for pid in workers if start_time(pid)]
                for pid in left:  # not to leave them to the next test
                    os.kill(pid, signal.SIGKILL)
            self.assertEqual(stopped.returncode, 0, stopped.stderr)
            self.assertEqual(left, [])


class FleetArguments(unittest.TestCase):
    """fleet.sh refuses what it cannot read as meant, with a message of its own, before it starts
    anything."""

    def run_fleet(self, *args):
        with tempfile.TemporaryDirectory() as tmp:
            env = dict(os.environ, ATTEND_SERVER=ARGS.server, ATTEND_CLI=ARGS.cli,
                       ATTEND_FLEET_DIR=os.path.join(tmp, "fleet"))
            result = subprocess.run(["bash", FLEET_SH] + list(args), env=env,
                                    capture_output=True, text=True, timeout=30)
            if os.path.exists(os.path.join(tmp, "fleet", "pids")):
                subprocess.run(["bash", FLEET_SH, "stop"], env=env, capture_output=True,
                               timeout=60)
                self.fail("%s started a fleet: %s" % (args, result.stdout))
        return result

    def refused(self, args, message):
        result = self.run_fleet(*args)
        self.assertNotEqual(result.returncode, 0, (args, result.stdout))
        self.assertIn(message, result.stderr, args)
        self.assertTrue(result.stderr.startswith("fleet.sh: "), (args, result.stderr))
        self.assertNotIn("line ", result.stderr, args)  # not a bash error

    def test_numbers_are_decimal_without_leading_zeros(self):
        port = str(free_port())
        for flag, value in [("--replicas", "010"), ("--replicas", "09"), ("--replicas", "0"),
                            ("--replicas", "65"), ("--replicas", "3x"), ("--port", "0100"),
                            ("--port", "08"), ("--port", "65536"), ("--port", "1e3"),
                            ("--tls_port", "0443"), ("--tls_port", "x")]:
            self.refused(["start", "--port", port, flag, value], flag + ": ")
            self.refused(["start", "--port", port, "%s=%s" % (flag, value)], flag + ": ")
        self.refused(["status", "--port", "0100"], "--port: ")
        self.refused(["stop", "--port", "0100"], "--port: ")

    def test_a_flag_without_its_value(self):
        for flag in ["--port", "--replicas", "--tls_port", "--tls_cert", "--tls_key"]:
            self.refused(["start", flag], flag + " needs a value")
        self.refused(["stop", "--port"], "--port needs a value")
        self.refused(["status", "--port"], "--port needs a value")

    def test_the_replicas_addresses_are_the_fleet_s(self):
        port = str(free_port())
        for extra in [["--address=127.0.0.1:1"], ["-address=127.0.0.1:1"],
                      ["--address", "127.0.0.1:1"], ["-address", "127.0.0.1:1"],
                      ["--metrics_address=127.0.0.1:1"], ["-metrics_address=127.0.0.1:1"],
                      ["--metrics_address", "127.0.0.1:1"], ["-metrics_address", "127.0.0.1:1"],
                      ["--kv_cache_bytes=1MiB", "-address=127.0.0.1:1"]]:
            self.refused(["start", "--port", port, "--"] + extra,
                         "the fleet chooses the replicas' addresses")

    def test_status_of_no_fleet_fails_and_stop_of_none_succeeds(self):
        port = str(free_port())
        status = self.run_fleet("status", "--port", port)
        self.assertEqual(status.returncode, 3, status)
        self.assertIn("no fleet in", status.stdout)
        stop = self.run_fleet("stop", "--port", port)  # idempotent: nothing to stop
        self.assertEqual(stop.returncode, 0, stop)
        self.assertIn("no fleet in", stop.stdout)


class ConfigMapMatchesDeployNginx(unittest.TestCase):
    """deploy/k8s/proxy.yaml's ConfigMap holds deploy/nginx/ but the upstream list, and the script
    that writes that list (deploy/nginx/k8s-upstreams.sh)."""

    def config_map(self):
        import yaml
        with open(PROXY_YAML) as f:
            docs = [d for d in yaml.safe_load_all(f) if d]
        maps = [d for d in docs if d["kind"] == "ConfigMap"]
        self.assertEqual(len(maps), 1)
        return docs, maps[0]

    def test_the_same_files_but_the_upstream_list(self):
        docs, config_map = self.config_map()
        data = config_map["data"]
        files = sorted([f for f in os.listdir(NGINX_DIR)
                        if f.endswith(".conf") and f != "upstreams.conf"] + [SCRIPT])
        self.assertEqual(sorted(data), files)
        for name in files:
            with open(os.path.join(NGINX_DIR, name)) as f:
                self.assertEqual(data[name], f.read(), name + " differs from deploy/nginx/")
        # The Deployment runs the script from that ConfigMap.
        deployment = [d for d in docs if d["kind"] == "Deployment"][0]
        pod = deployment["spec"]["template"]["spec"]
        volume = [v["name"] for v in pod["volumes"]
                  if v.get("configMap", {}).get("name") == config_map["metadata"]["name"]]
        self.assertEqual(len(volume), 1)
        container = pod["containers"][0]
        mount = [m["mountPath"] for m in container["volumeMounts"] if m["name"] == volume[0]]
        self.assertEqual(container["command"], ["/bin/sh", os.path.join(mount[0], SCRIPT)])

    def test_nginx_accepts_it(self):
        _, config_map = self.config_map()
        with tempfile.TemporaryDirectory() as conf:
            for name, text in config_map["data"].items():
                with open(os.path.join(conf, name), "w") as f:
                    f.write(text)
            # The script's list in the pod is deploy/nginx/upstreams.conf's server lines (cluster
            # names, which do not resolve here: tests/deploy/k8s_upstreams_test.py runs the script).
            with open(os.path.join(NGINX_DIR, "upstreams.conf")) as f:
                text = re.sub(r"^server \S+", "server 127.0.0.1:1", f.read(), flags=re.M)
            with open(os.path.join(conf, "upstreams.conf"), "w") as f:
                f.write(text)
            result = subprocess.run(
                ["/usr/sbin/nginx", "-t", "-p", conf + "/", "-e", "stderr",
                 "-c", os.path.join(conf, "nginx.conf"), "-g", "pid %s/nginx.pid;" % conf],
                capture_output=True, text=True)
            self.assertEqual(result.returncode, 0, result.stderr)


def main():
    def use_args(args):
        global ARGS
        ARGS = args
    e2e_test.run_tests(("--server", "--cli", "--proto"), use_args)


if __name__ == "__main__":
    main()
