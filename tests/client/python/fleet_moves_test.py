#!/usr/bin/python3
"""A local fleet changes under load and loses no sequence (deploy/local/fleet.sh restart, scale).

Three replicas behind nginx; 30 sequences (f32, bf16 and int8 storage, sliding windows, forks
sharing their source's blocks) are created and prefilled through the proxy with the Python
client. Threads then decode every sequence, one step of every layer at a time, without pause,
while fleet.sh
  - restarts every replica in turn (rolling),
  - scales the fleet to 4 replicas,
  - and back to 3.
No call may fail (the client's move_wait sends the refusals of a sequence in the middle of a move
again). Afterwards every sequence is held by exactly one replica, is found through the proxy,
and every output of every step, those during the moves included, is bit-identical to the same
steps on one fresh server that never restarted.

    PYTHONPATH=build/python tests/client/python/fleet_moves_test.py \\
        --server build/server/attend-server --cli build/client/attend
"""
import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import numpy as np

import attend

ARGS = None
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
FLEET_SH = os.path.join(REPO, "deploy", "local", "fleet.sh")
SHAPE = dict(layers=2, n_head=4, n_head_kv=2, head_dim=32)
SEQUENCES = 27   # and 3 forks: 30
THREADS = 3
PAUSE = 0.05     # between one thread's rounds: bounds the steps the reference replays


def log(message):
    print("fleet_moves_test: " + message, file=sys.stderr, flush=True)


def free_port():
    """A loopback port outside the ephemeral range, free now (the fleet's proxy binds it)."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low, high = (int(x) for x in f.read().split())
    rng = np.random.default_rng()
    for _ in range(200):
        port = int(rng.integers(20000, 32000))
        if low <= port <= high:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    raise RuntimeError("no free port")


def inputs(sid, step):
    """The q, k, v of `sid`'s decode step `step` in every layer: seeded by both."""
    seed = (sum(map(ord, sid)) * 1000003 + step) % (1 << 32)
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(SHAPE["layers"]):
        q = rng.standard_normal((1, SHAPE["n_head"], SHAPE["head_dim"]), dtype=np.float32)
        kv = rng.standard_normal((2, 1, SHAPE["n_head_kv"], SHAPE["head_dim"]), dtype=np.float32)
        out.append((q, kv[0], kv[1]))
    return out


def decode(client, sid, step):
    return b"".join(client.append(sid, layer, q, k, v).output.tobytes()
                    for layer, (q, k, v) in enumerate(inputs(sid, step)))


def populate(client):
    """The 30 sequences, prefilled: {id: source id or None}."""
    made = {}
    dtypes = ("float32", "bfloat16", "int8")
    for i in range(SEQUENCES):
        sid = "s%02d/main" % i
        window = 96 if i % 5 == 4 else 0
        client.create_sequence(sid, kv_dtype=dtypes[i % 3], window_tokens=window, **SHAPE)
        rng = np.random.default_rng(i)
        tokens = 60 + 17 * i
        for layer in range(SHAPE["layers"]):
            kv = rng.standard_normal((2, tokens, SHAPE["n_head_kv"], SHAPE["head_dim"]),
                                     dtype=np.float32)
            client.append(sid, layer, None, kv[0], kv[1])
        made[sid] = None
    for i in (0, 1, 2):
        source = "s%02d/main" % i
        client.fork(source, "s%02d/fork" % i)
        made["s%02d/fork" % i] = source
    return made


class Fleet:
    def __init__(self, tmp, replicas=3):
        self.port = free_port()
        self.env = dict(os.environ, ATTEND_SERVER=ARGS.server, ATTEND_CLI=ARGS.cli,
                        ATTEND_FLEET_DIR=os.path.join(tmp, "fleet"))
        self.run("start", "--replicas", str(replicas), "--", "--kv_cache_bytes=256MiB",
                 "--kv_block_bytes=16KiB", "--shutdown_grace=10s", "--compute_threads=1")
        self.target = "127.0.0.1:%d" % self.port

    def run(self, command, *args, check=True):
        """fleet.sh COMMAND [N] --port P [ARGS...]: its output (check: fails the test unless it
        exits 0), else the CompletedProcess."""
        started = time.monotonic()
        head = [command] + ([args[0]] if command == "scale" else [])
        tail = list(args[1:] if command == "scale" else args)
        done = subprocess.run(["bash", FLEET_SH, *head, "--port", str(self.port), *tail],
                              env=self.env, capture_output=True, text=True, timeout=600)
        args = (command,) + args
        log("fleet.sh %s: rc %d in %.1f s\n%s%s" % (" ".join(args), done.returncode,
                                                    time.monotonic() - started, done.stdout,
                                                    done.stderr))
        if not check:
            return done
        if done.returncode != 0:
            raise AssertionError("fleet.sh %s failed (%d): %s %s" % (
                " ".join(args), done.returncode, done.stdout, done.stderr))
        return done.stdout

    def kernels(self):
        """The decode kernel sets the replicas ran, from every replica's start-up line (those
        of restarts and scales included): one answer, since fleet.sh pins them."""
        fleet_dir = self.env["ATTEND_FLEET_DIR"]
        names = {}
        for name in sorted(os.listdir(fleet_dir)):
            if re.fullmatch(r"replica-\d+\.log", name):
                with open(os.path.join(fleet_dir, name)) as f:
                    match = re.search(r", kernels ([\w:,]+),", f.read())
                if match:
                    names[name] = match.group(1)
        if len(set(names.values())) != 1:
            raise AssertionError("the replicas ran different kernel sets: %s" % names)
        return next(iter(names.values()))

    def replicas(self):
        out = self.run("status")
        return re.findall(r"^replica (127\.0\.0\.1:\d+) .* running$", out, re.M)


class Load:
    """THREADS threads decoding their share of the sequences through the proxy, step after step,
    until stopped; every output kept in order, every error kept."""

    def __init__(self, target, ids):
        self.stop = threading.Event()
        self.outputs = {sid: [] for sid in ids}
        self.errors = []
        shares = [ids[i::THREADS] for i in range(THREADS)]
        self.threads = [threading.Thread(target=self.run, args=(target, share))
                        for share in shares]
        for t in self.threads:
            t.start()

    def run(self, target, share):
        with attend.Client(target, move_wait=20.0) as client:
            while not self.stop.is_set():
                for sid in share:
                    try:
                        self.outputs[sid].append(decode(client, sid, len(self.outputs[sid])))
                    except Exception as e:  # noqa: BLE001  every failure is the test's
                        self.errors.append("%s step %d: %r" % (sid, len(self.outputs[sid]), e))
                        return
                time.sleep(PAUSE)

    def steps(self):
        return min(len(v) for v in self.outputs.values())

    def wait_steps(self, n):
        target = self.steps() + n
        deadline = time.monotonic() + 120
        while self.steps() < target and not self.errors and time.monotonic() < deadline:
            time.sleep(0.05)

    def finish(self):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=120)


class FleetMoves(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="attend-fleet-moves-")
        self.fleet = None
        self.reference = None

    def tearDown(self):
        if self.fleet is not None:
            subprocess.run(["bash", FLEET_SH, "stop", "--port", str(self.fleet.port)],
                           env=self.fleet.env, capture_output=True, timeout=120)
        if self.reference is not None and self.reference.poll() is None:
            self.reference.send_signal(signal.SIGTERM)
            self.reference.wait(timeout=60)
        if self.reference is not None:
            self.reference.stdout.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def holders(self):
        """{replica target: [sequence ids it holds]}, each replica asked at its own address."""
        held = {}
        for replica in self.fleet.replicas():
            with attend.Client(replica) as c:
                held[replica] = [info.sequence_id for info in c.list_sequences()]
        return held

    def assert_each_once(self, ids, replicas):
        held = self.holders()
        self.assertEqual(len(held), replicas, held)
        everywhere = sorted(sid for ids_ in held.values() for sid in ids_)
        self.assertEqual(everywhere, sorted(ids), "each sequence on exactly one replica")
        with attend.Client(self.fleet.target) as c:
            for sid in ids:
                self.assertEqual(c.get_sequence(sid).sequence_id, sid)
        return held

    def test_one_replica_dead_replicas_and_two_changes_at_once(self):
        self.fleet = Fleet(self.tmp, replicas=1)
        with attend.Client(self.fleet.target) as c:
            c.create_sequence("alone/main", **SHAPE)
        refused = self.fleet.run("restart", check=False)
        self.assertEqual(refused.returncode, 1, refused)
        self.assertIn("restart needs 2 or more replicas", refused.stderr)
        self.assertEqual(len(self.fleet.replicas()), 1)
        with attend.Client(self.fleet.target) as c:
            self.assertEqual(c.get_sequence("alone/main").sequence_id, "alone/main")
        # scale 2 then restart works, and scale 1 takes the sequences back.
        self.fleet.run("scale", "2")
        self.fleet.run("restart")
        self.fleet.run("scale", "1")
        with attend.Client(self.fleet.target) as c:
            self.assertEqual(c.get_sequence("alone/main").sequence_id, "alone/main")
        self.assertEqual(len(self.fleet.replicas()), 1)

        # A replica that was killed: restart starts it again, scale drops it.
        self.fleet.run("scale", "3")
        for command in (("restart",), ("scale", "2")):
            held = self.holders()
            victim = next(r for r, ids in held.items() if not ids)  # one holding nothing
            pids = {}
            with open(os.path.join(self.fleet.env["ATTEND_FLEET_DIR"], "pids")) as f:
                for line in f:
                    fields = line.split()
                    if fields[0] == "replica":
                        pids["127.0.0.1:" + fields[3]] = int(fields[1])
            os.kill(pids[victim], signal.SIGKILL)
            gone = self.fleet.run("status", check=False)
            self.assertEqual(gone.returncode, 1, gone.stdout)
            self.assertIn("was gone", self.fleet.run(*command))
            self.assertEqual(len(self.fleet.replicas()), 3 if command == ("restart",) else 2)
            with attend.Client(self.fleet.target) as c:
                self.assertEqual(c.get_sequence("alone/main").sequence_id, "alone/main")

        # Two changes at once: one runs, the other is refused, and nothing is lost.
        env = self.fleet.env
        both = [subprocess.Popen(["bash", FLEET_SH, "scale", n, "--port", str(self.fleet.port)],
                                 env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True) for n in ("4", "1")]
        results = [(p.wait(timeout=300), p.stderr.read()) for p in both]
        for p in both:
            p.stdout.close()
            p.stderr.close()
        refused = [err for rc, err in results if rc != 0]
        self.assertEqual(len(refused), 1, results)
        self.assertIn("another fleet.sh start, restart or scale is running", refused[0])
        self.assertIn(len(self.fleet.replicas()), (4, 1))
        with attend.Client(self.fleet.target) as c:
            self.assertEqual(c.get_sequence("alone/main").sequence_id, "alone/main")

    def test_rolling_restart_and_scale_lose_nothing(self):
        self.fleet = Fleet(self.tmp)
        with attend.Client(self.fleet.target) as c:
            made = populate(c)
        ids = sorted(made)
        before = self.assert_each_once(ids, 3)
        self.assertTrue(all(before.values()), "every replica holds some: %s" % before)

        load = Load(self.fleet.target, ids)
        try:
            load.wait_steps(3)
            self.fleet.run("restart")
            load.wait_steps(3)
            self.assertEqual(load.errors, [])
            self.assert_each_once(ids, 3)
            self.fleet.run("scale", "4")
            load.wait_steps(3)
            self.assertEqual(load.errors, [])
            grown = self.assert_each_once(ids, 4)
            new = [r for r in grown if r not in before]
            self.assertEqual(len(new), 1, grown)
            self.assertTrue(grown[new[0]], "the new replica took over some sequences: %s" % grown)
            self.fleet.run("scale", "3")
            load.wait_steps(3)
        finally:
            load.finish()
        self.assertEqual(load.errors, [])
        after = self.assert_each_once(ids, 3)
        self.assertEqual(sorted(after), sorted(before), "the newest replica went")
        log("steps per sequence: %d..%d" % (load.steps(),
                                             max(len(v) for v in load.outputs.values())))

        # The same steps on one server that never moved anything, with the fleet's kernels.
        self.reference = subprocess.Popen(
            [ARGS.server, "--address=127.0.0.1:0", "--metrics_address=",
             "--kv_cache_bytes=256MiB", "--kv_block_bytes=16KiB", "--compute_threads=1",
             "--simd_kernels=" + self.fleet.kernels()],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = self.reference.stdout.readline()
        match = re.search(r"listening on [\d.]+:(\d+)", line)
        self.assertIsNotNone(match, line)
        with attend.Client("127.0.0.1:" + match.group(1)) as ref:
            self.assertEqual(sorted(populate(ref)), ids)
            for sid in ids:
                got = load.outputs[sid]
                for step, output in enumerate(got):
                    self.assertEqual(decode(ref, sid, step), output,
                                     "%s step %d of %d" % (sid, step, len(got)))


def main():
    global ARGS
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    parser.add_argument("--cli", required=True)
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
