#!/usr/bin/python3
"""KV caches that outlive the process, against the real attend-server with --snapshot_dir:

  - SIGTERM then a restart: every sequence is back and decodes bit-identically (the package's
    save_sequence / load_sequence too); a fork shares its source's blocks again layer by layer,
    so that a cache as full as before the restart (or an import into one) holds them all;
  - SIGKILL at random moments while the shutdown's snapshot is being written: the next start
    never loads a torn or partial set: it restores the new generation whole, or nothing when the
    kill came before it was complete (the generation it replaces was restored already, and is
    never brought back behind what clients sent since); files saved with save_sequence load
    whatever happens to the server; no temporary file or older generation is left;
  - a crash after a restore restores nothing (the restored generation is not brought back
    behind what clients sent since);
  - export_sequence / import_sequence between two servers, and hand_off to the server a
    --handoff_target answers for: bit-identical, forks sharing again, damage refused.

    PYTHONPATH=build/python tests/client/python/persistence_test.py --server build/server/attend-server
"""
import argparse
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import numpy as np

import attend

ARGS = None
SHAPE = dict(layers=4, n_head=8, n_head_kv=4, head_dim=64)


class Server:
    """attend-server with a snapshot directory, on a free loopback port."""

    def __init__(self, snapshot_dir, *flags, start_timeout=120):
        self.log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            [ARGS.server, "--address=127.0.0.1:0", "--metrics_address=",
             "--snapshot_dir=%s" % snapshot_dir, "--kv_cache_bytes=1GiB",
             "--kv_block_bytes=64KiB"] + list(flags),  # 64 tokens a block: forks share some
            stdout=subprocess.PIPE, stderr=self.log, text=True)
        # A start that hangs (a FIFO in the directory once did) is killed, so that the test fails
        # rather than hanging ctest: the reads below then see the end of the output.
        watchdog = threading.Timer(start_timeout, self.proc.kill)
        watchdog.start()
        try:
            line = self.proc.stdout.readline()
            match = re.search(r"listening on [\d.]+:(\d+)", line)
            if not match:
                self.proc.kill()
                self.proc.wait(timeout=30)
                self.proc.stdout.close()
                self.log.seek(0)
                err = self.log.read()
                self.log.close()
                raise RuntimeError("server did not start within %s s (exit %s): %r %s" % (
                    start_timeout, self.proc.returncode, line, err))
            self.target = "127.0.0.1:%s" % match.group(1)
            self.lines = [line]
            # The start, kernels and restore log lines follow the first one.
            for _ in range(8):
                self.lines.append(self.proc.stdout.readline())
                if "event=restore" in self.lines[-1]:
                    break
        finally:
            watchdog.cancel()

    def kernels(self):
        """The decode kernel sets the start-up line names ("avx2", "f32:avx512,bf16:avx2,...")."""
        match = re.search(r", kernels ([\w:,]+),", self.lines[0])
        if not match:
            raise AssertionError("no kernels on the start-up line %r" % self.lines[0])
        return match.group(1)

    def restored(self):
        for line in self.lines:
            match = re.search(r"event=restore sequences=(\d+).*skipped=(\d+)", line)
            if match:
                return int(match.group(1)), int(match.group(2))
        raise AssertionError("no restore line in %r" % self.lines)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        out = self.proc.communicate(timeout=120)[0]
        self.log.close()
        return out

    def kill(self):
        self.proc.kill()
        self.proc.wait(timeout=30)
        self.proc.stdout.close()
        self.log.close()


def fill(client, prefix, count, tokens, seed):
    """`count` sequences of `tokens` tokens in each layer (bf16 storage), with seeded K/V."""
    rng = np.random.default_rng(seed)
    ids = ["%s/%d" % (prefix, i) for i in range(count)]
    for sid in ids:
        client.create_sequence(sid, kv_dtype="bfloat16", **SHAPE)
        for layer in range(SHAPE["layers"]):
            kv = attend.float32_to_bfloat16(
                rng.standard_normal((2, tokens, SHAPE["n_head_kv"], SHAPE["head_dim"]),
                                    dtype=np.float32))
            client.append(sid, layer, None, kv[0], kv[1])
    return ids


def step(client, sid, seed):
    """The next decode step of every layer of `sid` on a throwaway fork: output bytes."""
    rng = np.random.default_rng(seed)
    probe = sid + "/probe"
    client.fork(sid, probe)
    out = []
    try:
        for layer in range(SHAPE["layers"]):
            q = rng.standard_normal((1, SHAPE["n_head"], SHAPE["head_dim"]), dtype=np.float32)
            kv = rng.standard_normal((2, 1, SHAPE["n_head_kv"], SHAPE["head_dim"]),
                                     dtype=np.float32)
            out.append(client.append(probe, layer, q, kv[0], kv[1]).output.tobytes())
    finally:
        client.release(probe)
    return b"".join(out)


class Persistence(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="attend-persistence-")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def test_restart_restores_every_sequence_bit_identically(self):
        server = Server(self.dir)
        with attend.Client(server.target) as c:
            ids = fill(c, "warm", 6, 300, 1)
            c.fork(ids[0], ids[0] + "/alt")
            want = {sid: step(c, sid, 7) for sid in ids + [ids[0] + "/alt"]}
            saved = c.save_sequence(ids[1], "kept")
            self.assertGreater(saved.bytes, 0)
        out = server.stop()
        self.assertIn("event=snapshot sequences=7", out)
        server = Server(self.dir)
        try:
            self.assertEqual(server.restored(), (7, 0))
            with attend.Client(server.target) as c:
                for sid, expected in want.items():
                    self.assertEqual(step(c, sid, 7), expected, sid)
                self.assertGreater(c.get_sequence(ids[0] + "/alt").shared_blocks, 0)
                c.load_sequence("kept", "warm/1-copy")
                self.assertEqual(step(c, "warm/1-copy", 7), want[ids[1]])
                with self.assertRaises(attend.AlreadyExists):
                    c.load_sequence("kept")
                with self.assertRaises(attend.NotFound):
                    c.load_sequence("never-saved")
        finally:
            server.stop()

    def test_a_restart_keeps_the_kernels_the_sequences_were_computed_with(self):
        # Kernel sets sum in different orders; a restart that measured again and chose another
        # set would decode the restored sequences differently in the last bits. "scalar" is a
        # set no measurement chooses on a CPU with vector sets.
        server = Server(self.dir, "--simd_kernels=scalar")
        self.assertEqual(server.kernels(), "scalar")
        with attend.Client(server.target) as c:
            ids = fill(c, "k", 2, 130, 6)
            want = {sid: step(c, sid, 8) for sid in ids}
        server.stop()
        server = Server(self.dir)
        try:
            self.assertEqual(server.kernels(), "scalar")
            self.assertTrue(any("kernels_kept" in line for line in server.lines), server.lines)
            with attend.Client(server.target) as c:
                for sid, expected in want.items():
                    self.assertEqual(step(c, sid, 8), expected, sid)
        finally:
            server.stop()
        # A flag still chooses: the record follows it.
        server = Server(self.dir, "--simd_kernels=" + server.kernels().split(",")[0])
        server.stop()
        with open(os.path.join(self.dir, "KERNELS")) as f:
            self.assertEqual(f.read().split()[0], "scalar")

    def event(self, server, name):
        """The fields of the start's `event=<name>` line, or None."""
        for line in server.lines:
            if "event=%s " % name in line:
                return dict(re.findall(r'(\w+)=("(?:[^"\\]|\\.)*"|\S*)', line))
        return None

    def test_a_kernels_record_that_is_no_regular_file_is_ignored(self):
        # A FIFO at KERNELS once blocked the start forever (and SIGTERM, held until the server
        # serves, could not stop it); a directory made it exit 1 when the record was written.
        # Both are named and ignored: the sets are measured, the server serves and stops cleanly.
        for kind in ("FIFO", "directory"):
            with self.subTest(kind):
                snapshot_dir = tempfile.mkdtemp(dir=self.dir)
                path = os.path.join(snapshot_dir, "KERNELS")
                if kind == "FIFO":
                    os.mkfifo(path)
                else:
                    os.mkdir(path)
                server = Server(snapshot_dir, start_timeout=30)
                try:
                    ignored = self.event(server, "kernels_record_ignored")
                    self.assertIsNotNone(ignored, server.lines)
                    self.assertIn("is a %s, not a regular file" % kind, ignored["why"])
                    failed = self.event(server, "kernels_record_failed")
                    if kind == "directory":
                        # Not written either: said, with what it costs, and serving goes on.
                        self.assertIsNotNone(failed, server.lines)
                        self.assertIn("Is a directory", failed["error"])
                        self.assertIn("measures", failed["effect"])
                        self.assertTrue(os.path.isdir(path))
                    else:
                        # The record replaces the FIFO.
                        self.assertIsNone(failed, server.lines)
                        with open(path) as f:
                            self.assertEqual(f.read().split()[0], server.kernels())
                    self.assertFalse(os.path.exists(path + ".tmp"))
                    with attend.Client(server.target) as c:
                        c.create_sequence("s", **SHAPE)
                finally:
                    out = server.stop()
                self.assertEqual(server.proc.returncode, 0, out)
                self.assertIn("event=snapshot sequences=1", out)

    def test_a_record_that_is_not_kept_is_logged(self):
        # A record the start does not run (a flag chose other sets, or the record is a link to
        # nothing) is replaced by this start's sets: restored sequences then decode with other
        # sums, which the log says.
        server = Server(self.dir)
        measured = server.kernels()
        server.stop()
        if measured == "scalar":
            self.skipTest("this CPU runs no vector set")
        path = os.path.join(self.dir, "KERNELS")
        with open(path, "w") as f:
            f.write("scalar\n")
        server = Server(self.dir, "--simd_kernels=" + measured)
        server.stop()
        overridden = self.event(server, "kernels_record_overridden")
        self.assertIsNotNone(overridden, server.lines)
        self.assertEqual((overridden["was"], overridden["now"]), ("scalar", measured))
        os.remove(path)
        os.symlink("gone", path)
        server = Server(self.dir)
        server.stop()
        ignored = self.event(server, "kernels_record_ignored")
        self.assertIsNotNone(ignored, server.lines)
        self.assertIn("is a symbolic link to 'gone', which does not exist", ignored["why"])

    def test_a_kill_during_the_snapshot_never_loads_a_partial_set(self):
        random.seed(3)
        server = Server(self.dir)
        with attend.Client(server.target) as c:
            first = fill(c, "a", 8, 256, 2)
            c.save_sequence(first[0], "pinned")
        server.stop()
        outcomes = []
        for trial in range(6):
            # The set a started server holds, written again by its shutdown while it is killed.
            server = Server(self.dir)
            restored, skipped = server.restored()
            self.assertEqual(skipped, 0)
            with attend.Client(server.target) as c:
                held = sorted(info.sequence_id for info in c.list_sequences())
                self.assertEqual(len(held), restored)
                if restored == 0:  # a crash consumed what there was: start a new set
                    held = fill(c, "t%d" % trial, 8, 256, 10 + trial)
                want = {sid: step(c, sid, 5) for sid in held}
            server.proc.send_signal(signal.SIGTERM)
            time.sleep(random.uniform(0.0, 0.25))
            server.kill()
            server = Server(self.dir)
            try:
                got, skipped = server.restored()
                self.assertEqual(skipped, 0)
                with attend.Client(server.target) as c:
                    now = sorted(info.sequence_id for info in c.list_sequences())
                    # All of them (the save finished) or none (it did not: the set it was
                    # replacing was restored already, and is not brought back stale).
                    self.assertIn(now, (sorted(want), []), "trial %d" % trial)
                    outcomes.append("whole" if now else "none")
                    for sid in now:
                        self.assertEqual(step(c, sid, 5), want[sid], sid)
                    # A file saved on request loads whatever happened to the server.
                    c.load_sequence("pinned", "pinned-%d" % trial)
                    c.release("pinned-%d" % trial)
            finally:
                server.stop()
            # No leftovers: at most one generation and no temporary file.
            names = os.listdir(self.dir)
            self.assertLessEqual(sum(n.startswith("gen-") for n in names), 1, names)
            self.assertFalse([n for n in names if n.endswith(".tmp")], names)
        print("kills during the snapshot, what the next start restored: %s" % outcomes)

    def test_a_cache_as_full_as_before_restores_a_fork_sharing_layer_by_layer(self):
        # An outside tester's repro: a fork made mid-block, then one token appended to its
        # source in layer 0 only, which copies that layer's block; layer 1's stays shared. With
        # one count of shared tokens for all layers in the snapshot, the restart gave the fork a
        # block of its own in layer 1 too, and in this cache, full before the restart, refused
        # it ("cw/f needs 2 blocks; 1 of 4 blocks free"): a sequence lost.
        shape = dict(layers=2, n_head=4, n_head_kv=1, head_dim=32)  # 512 tokens a block
        flags = ("--kv_cache_bytes=256KiB",)  # 4 blocks of 64 KiB

        def kv(rng, tokens):
            return rng.standard_normal((2, tokens, 1, 32), dtype=np.float32)

        server = Server(self.dir, *flags)
        rng = np.random.default_rng(12)
        with attend.Client(server.target) as c:
            c.create_sequence("cw", kv_dtype="bfloat16", **shape)
            for layer in range(2):
                k, v = kv(rng, 300)
                c.append("cw", layer, None, k, v)
            c.fork("cw", "cw/f", tokens=200)
            k, v = kv(rng, 1)
            c.append("cw", 0, None, k, v)
            c.create_sequence("other", kv_dtype="bfloat16", **dict(shape, layers=1))
            k, v = kv(rng, 10)
            c.append("other", 0, None, k, v)
            self.assertEqual((c.stats().blocks_used, c.stats().blocks_free), (4, 0))
            before = {sid: c.get_sequence(sid) for sid in ("cw", "cw/f", "other")}
            self.assertEqual(before["cw/f"].shared_blocks, 1)
            exported = {sid: c.export_sequence(sid) for sid in ("cw", "cw/f", "other")}
        server.stop()

        def check(c):
            self.assertEqual((c.stats().blocks_used, c.stats().blocks_free), (4, 0))
            for sid, info in before.items():
                got = c.get_sequence(sid)
                self.assertEqual((got.shared_blocks, list(got.layer_tokens)),
                                 (info.shared_blocks, list(info.layer_tokens)), sid)

        server = Server(self.dir, *flags)
        try:
            self.assertEqual(server.restored(), (3, 0))
            with attend.Client(server.target) as c:
                check(c)
        finally:
            server.stop()
        # Imported into another server as full: the fork shares its source's blocks again.
        shutil.rmtree(self.dir)
        os.mkdir(self.dir)
        server = Server(self.dir, *flags)
        try:
            with attend.Client(server.target) as c:
                for sid in ("cw", "cw/f", "other"):
                    c.import_sequence(exported[sid])
                check(c)
        finally:
            server.stop()

    def test_a_crash_after_a_restore_restores_nothing(self):
        server = Server(self.dir)
        with attend.Client(server.target) as c:
            fill(c, "c", 2, 64, 4)
        server.stop()
        server = Server(self.dir)
        self.assertEqual(server.restored(), (2, 0))
        with attend.Client(server.target) as c:
            c.release("c/0")  # what the clients did since
        server.kill()
        server = Server(self.dir)
        try:
            self.assertEqual(server.restored(), (0, 0))
        finally:
            server.stop()


class Transfer(unittest.TestCase):
    """Sequences moving between servers without a shared disk: export_sequence /
    import_sequence, and hand_off to the server a --handoff_target answers for."""

    def setUp(self):
        self.dirs = [tempfile.mkdtemp(prefix="attend-transfer-") for _ in range(2)]

    def tearDown(self):
        for d in self.dirs:
            shutil.rmtree(d, ignore_errors=True)

    def test_export_import_and_hand_off_are_bit_identical(self):
        receiver = Server(self.dirs[0])
        # Bit-identical across two servers when they compute with the same kernel sets: each
        # measures its own at start-up unless told (fleet.sh pins a fleet to its first replica's).
        sender = Server(self.dirs[1], "--handoff_target=" + receiver.target,
                        "--simd_kernels=" + receiver.kernels())
        try:
            with attend.Client(sender.target) as a, attend.Client(receiver.target) as b:
                ids = fill(a, "mv", 4, 200, 5)
                a.fork(ids[2], ids[2] + "/alt")
                want = {sid: step(a, sid, 11) for sid in ids + [ids[2] + "/alt"]}
                data = a.export_sequence(ids[0])
                self.assertEqual(attend.kv_cache.snapshot_sequence_id(data), ids[0])
                info = b.import_sequence(data, ids[0] + "-copy")
                self.assertEqual(info.sequence_id, ids[0] + "-copy")
                self.assertEqual(step(b, ids[0] + "-copy", 11), want[ids[0]])
                with self.assertRaises(attend.DataLoss):
                    b.import_sequence(data[:-100], "mv/trunc")
                with self.assertRaises(attend.InvalidArgument):
                    b.import_sequence(b"not a snapshot at all, no", "mv/x")
                with self.assertRaises(attend.NotFound):
                    a.export_sequence("mv/none")
                # A client that takes small messages only gets (and sends) small pieces.
                with attend.Client(sender.target, max_message_bytes=16 << 10) as tiny:
                    self.assertGreater(len(data), 4 * (16 << 10))
                    self.assertEqual(tiny.export_sequence(ids[0]), data)
                    tiny.import_sequence(data, ids[0] + "-tiny")
                self.assertEqual(step(b, ids[0] + "-copy", 11), step(a, ids[0] + "-tiny", 11))

                moved = a.hand_off()
                self.assertEqual((moved.moved, moved.kept, len(moved.failed)), (6, 0, 0))
                self.assertEqual(list(a.list_sequences()), [])
                for sid, expected in want.items():
                    self.assertEqual(step(b, sid, 11), expected, sid)
                self.assertGreater(b.get_sequence(ids[2] + "/alt").shared_blocks, 0)
                with self.assertRaises(attend.FailedPrecondition):
                    b.hand_off()
        finally:
            sender.stop()
            receiver.stop()


def main():
    global ARGS
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
