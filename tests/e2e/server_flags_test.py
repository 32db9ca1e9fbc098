#!/usr/bin/python3
"""attend-server's and attend's command lines as operators use them: --version names the
version and the commit it was built from, --help lists attend-server's own flags, and size flags
take units on the command line and in ATTEND_* variables."""
import os
import re
import signal
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_test  # noqa: E402  (generate_stubs and the stub modules it fills in)
import lifecycle_test  # noqa: E402  (start)

ARGS = None
PB = e2e_test.PB
SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VERSION_LINE = re.compile(r"^(attend-server|attend) (\d+\.\d+\.\d+) \(commit ([0-9a-f]{12}"
                          r"(?:-dirty)?|unknown), \w+ build\)$")


def run(*command, env=None):
    return subprocess.run(list(command), capture_output=True, text=True, timeout=30, env=env)


def git_commit():
    """The checkout's short commit, or None outside git (a source archive)."""
    got = run("git", "-C", SOURCE, "rev-parse", "--short=12", "HEAD")
    return got.stdout.strip() if got.returncode == 0 else None


class Version(unittest.TestCase):
    def check_version(self, binary, program):
        got = run(binary, "--version")
        self.assertEqual(got.returncode, 0, got.stderr)
        match = VERSION_LINE.match(got.stdout.strip())
        self.assertIsNotNone(match, got.stdout)
        self.assertEqual(match.group(1), program)
        with open(os.path.join(SOURCE, "CMakeLists.txt")) as f:
            project = re.search(r"project\(attend VERSION (\S+)", f.read()).group(1)
        self.assertEqual(match.group(2), project)
        commit = git_commit()
        if commit is not None:
            # The build may be of a work tree with changes ("-dirty"), never of another commit.
            self.assertEqual(match.group(3).split("-")[0], commit)
        self.assertNotIn("NDEBUG", got.stdout)

    def test_server_version(self):
        self.check_version(ARGS.server, "attend-server")

    def test_cli_version(self):
        self.check_version(ARGS.cli, "attend")


class Help(unittest.TestCase):
    def test_help_lists_the_servers_own_flags_only(self):
        got = run(ARGS.server, "--help")
        # absl exits 1 after printing usage.
        self.assertIn(got.returncode, (0, 1))
        text = got.stdout + got.stderr
        for flag in ("--address", "--metrics_address", "--kv_cache_bytes", "--shutdown_grace",
                     "--tls_cert", "--auth_token_file", "--max_message_bytes"):
            self.assertIn(flag, text)
        self.assertIn("ATTEND_<FLAG>", text)
        # Abseil's own flags are for --helpfull.
        self.assertNotIn("--flagfile", text)
        self.assertIn("--flagfile", run(ARGS.server, "--helpfull").stdout)


class SizeFlags(unittest.TestCase):
    def capacity(self, *flags, env=None):
        """The KV capacity a server started with `flags` (and `env`) reports."""
        import grpc
        old = dict(os.environ)
        os.environ.update(env or {})
        try:
            proc, port, _ = lifecycle_test.start("--address=127.0.0.1:0", "--metrics_address=",
                                                 *flags)
        finally:
            os.environ.clear()
            os.environ.update(old)
        try:
            with grpc.insecure_channel("127.0.0.1:%d" % port) as channel:
                stats = PB["kv_grpc"].KvCacheStub(channel).Stats(
                    PB["kv"].StatsRequest(), timeout=10)
                return stats.capacity_bytes, stats.block_bytes
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            proc.stdout.close()
            proc.stderr.close()

    def test_units_on_the_command_line(self):
        self.assertEqual(self.capacity("--kv_cache_bytes=64MiB", "--kv_block_bytes=64KiB"),
                         (64 << 20, 64 << 10))
        self.assertEqual(self.capacity("--kv_cache_bytes", "32MB", "--kv_block_bytes=65536"),
                         (32_000_000 // 65536 * 65536, 65536))

    def test_units_in_the_environment(self):
        self.assertEqual(self.capacity(env={"ATTEND_KV_CACHE_BYTES": "16MiB"})[0], 16 << 20)

    def test_a_bad_size_is_refused_with_the_flag_named(self):
        for flags, env, flag in ((["--kv_cache_bytes=10G"], None, "kv_cache_bytes"),
                                 (["--max_message_bytes=lots"], None, "max_message_bytes"),
                                 ([], {"ATTEND_KV_BLOCK_BYTES": "-1KiB"}, "ATTEND_KV_BLOCK_BYTES")):
            got = run(ARGS.server, "--address=127.0.0.1:0", "--metrics_address=", *flags,
                      env=dict(os.environ, **(env or {})))
            self.assertNotEqual(got.returncode, 0, flags)
            self.assertIn(flag, got.stderr)
            self.assertIn("80GiB", got.stderr)  # the message shows how to write a size


class FlagRanges(unittest.TestCase):
    def test_out_of_range_values_are_usage_errors_naming_the_flag(self):
        cases = [
            (["--worker_threads=100000"], "--worker_threads", "1024"),
            (["--worker_threads=-1"], "--worker_threads", "1024"),
            (["--compute_threads=100000"], "--compute_threads", "1024"),
            (["--compute_threads=-3"], "--compute_threads", "1024"),
            (["--shutdown_grace=-5s"], "--shutdown_grace", "negative"),
            (["--stats_interval=-1s"], "--stats_interval", "0 (never) or at least 100ms"),
            (["--stats_interval=1ms"], "--stats_interval", "0 (never) or at least 100ms"),
            (["--kv_cache_bytes=1KiB"], "--kv_cache_bytes", "one block"),
            (["--kv_block_bytes=1GiB", "--kv_cache_bytes=64MiB"], "--kv_cache_bytes", "one block"),
            (["--simd_kernels=avx9000"], "--simd_kernels", "'avx9000' is no kernel set"),
        ]
        for flags, flag, words in cases:
            got = run(ARGS.server, "--address=127.0.0.1:0", "--metrics_address=", *flags)
            self.assertEqual(got.returncode, 2, (flags, got.stdout, got.stderr))
            self.assertIn(flag, got.stderr, flags)
            self.assertIn(words, got.stderr, flags)
            self.assertNotIn("terminate called", got.stderr, flags)


class SimdKernels(unittest.TestCase):
    def test_a_wrong_value_is_refused_naming_the_wrong_part(self):
        """Each mistake in --simd_kernels (or ATTEND_SIMD_KERNELS, which the message names then)
        is named, exit 2: not one message for every mistake."""
        def refused(value, env=False):
            if env:
                got = run(ARGS.server, "--address=127.0.0.1:0", "--metrics_address=",
                          env=dict(os.environ, ATTEND_SIMD_KERNELS=value))
            else:
                got = run(ARGS.server, "--address=127.0.0.1:0", "--metrics_address=",
                          "--simd_kernels=" + value)
            self.assertEqual(got.returncode, 2, (value, env, got.stdout, got.stderr))
            return got.stderr

        for value, words in (("f32:avx2", "names no set for bf16, int8"),
                             ("f32:avx2,bf16:avx2,int4:avx2", "'int4' is no storage type"),
                             ("AVX2", "names are lowercase: 'avx2'"),
                             ("avx2,", "item 2 of 2 is empty"),
                             ("f32:avx2,bf16:avx2,int8:avx2,f32:scalar", "names f32 twice")):
            for source, env in (("--simd_kernels '%s': " % value, False),
                                ("ATTEND_SIMD_KERNELS='%s': " % value, True)):
                message = refused(value, env).splitlines()[0]
                self.assertIn(source, message)
                self.assertIn(words, message)
        # A set of this build that this CPU cannot run: named, with the sets it runs.
        unknown = refused("avx9000")
        runs = re.search(r"this CPU runs ([\w, ]+)\)", unknown).group(1).split(", ")
        for lacking in ("avx512", "avx512_vnni", "avx512_bf16"):
            if lacking not in runs:
                self.assertIn("f32: this CPU cannot run %s (it runs %s)"
                              % (lacking, ", ".join(runs)),
                              refused("f32:%s,bf16:scalar,int8:scalar" % lacking))

    def test_a_chosen_set_is_the_one_that_runs(self):
        """--simd_kernels (or ATTEND_SIMD_KERNELS) picks the decode kernels, for every storage
        type or one per type: the start-up line names them, and each decode-sized call's engine
        the set of the storage type it read (f32 here)."""
        import grpc
        import numpy as np
        a, t = PB["attention"], PB["tensor"]
        per_type = "f32:scalar,bf16:avx2,int8:avx2"
        for flags, env, name, f32 in ((["--simd_kernels=scalar"], None, "scalar", "scalar"),
                                      ([], {"ATTEND_SIMD_KERNELS": "avx2"}, "avx2", "avx2"),
                                      (["--simd_kernels=" + per_type], None, per_type, "scalar")):
            got = subprocess.Popen([ARGS.server, "--address=127.0.0.1:0", "--metrics_address="]
                                   + flags, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, env=dict(os.environ, **(env or {})))
            try:
                line = got.stdout.readline()
                self.assertIn("kernels %s," % name, line)
                port = int(re.search(r"listening on [\d.]+:(\d+)", line).group(1))
                rng = np.random.default_rng(3)

                def tensor(shape):
                    values = rng.standard_normal(shape).astype(np.float32)
                    return t.Tensor(dtype=t.FLOAT32, shape=list(shape), data=values.tobytes())
                with grpc.insecure_channel("127.0.0.1:%d" % port) as channel:
                    response = PB["attention_grpc"].AttentionStub(channel).Attend(
                        a.AttendRequest(q=tensor((1, 4, 64)), k=tensor((33, 2, 64)),
                                        v=tensor((33, 2, 64))), timeout=30)
                self.assertTrue(response.stats.engine.endswith("+" + f32), response.stats.engine)
            finally:
                got.terminate()
                got.wait(timeout=30)
                got.stdout.close()
                got.stderr.close()


LOGFMT_PAIR = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S*)')


def logfmt(line):
    """The fields of one "attend-server: event=... k=v" line."""
    prefix = "attend-server: "
    assert line.startswith(prefix), line
    return {k: v[1:-1] if v.startswith('"') else v
            for k, v in LOGFMT_PAIR.findall(line[len(prefix):])}


class LogLines(unittest.TestCase):
    def test_start_stats_drain_and_stop_lines(self):
        import grpc
        proc, port, metrics_port = lifecycle_test.start(
            "--address=127.0.0.1:0", "--metrics_address=127.0.0.1:0", "--stats_interval=0.3s",
            "--kv_cache_bytes=64MiB")
        try:
            start = logfmt(proc.stdout.readline().strip())
            self.assertEqual(start["event"], "start")
            self.assertEqual(start["grpc"], "127.0.0.1:%d" % port)
            self.assertEqual(start["metrics"], "127.0.0.1:%d" % metrics_port)
            self.assertEqual(start["pid"], str(proc.pid))
            self.assertEqual(start["kv_cache_bytes"], str(64 << 20))
            self.assertEqual(start["security"], "plaintext")
            self.assertRegex(start["commit"], r"^([0-9a-f]{12}(-dirty)?|unknown)$")
            with grpc.insecure_channel("127.0.0.1:%d" % port) as channel:
                attention = PB["attention_grpc"].AttentionStub(channel)
                for _ in range(3):
                    attention.Softmax(PB["attention"].SoftmaxRequest(logits=[1, 2]), timeout=10)
                kv = PB["kv_grpc"].KvCacheStub(channel)
                with self.assertRaises(grpc.RpcError):
                    kv.GetSequence(PB["kv"].GetSequenceRequest(sequence_id="absent"), timeout=10)
            # The calls fall into one or two intervals: sum the stats lines until all 4 show.
            requests = failed_lines = 0
            while requests < 4:
                stats = logfmt(proc.stdout.readline().strip())
                self.assertEqual(stats["event"], "stats")
                self.assertEqual(stats["kv_capacity_bytes"], str(64 << 20))
                self.assertEqual(stats["sequences"], "0")
                requests += int(stats["requests"])
                if float(stats["error_ratio"]) > 0:
                    failed_lines += 1
            self.assertEqual(requests, 4)
            self.assertGreaterEqual(failed_lines, 1)
            proc.send_signal(signal.SIGTERM)
            rest = [line.strip() for line in proc.stdout.read().splitlines()]
            self.assertEqual(proc.wait(timeout=30), 0)
            events = [logfmt(line) for line in rest if "event=" in line]
            kinds = [e["event"] for e in events]
            self.assertIn("drain", kinds)
            self.assertEqual(kinds[-1], "stop")
            drain = events[kinds.index("drain")]
            self.assertEqual(drain["signal"], "SIGTERM")
            stop = events[-1]
            self.assertEqual(stop["requests"], "4")
            self.assertEqual(stop["failed"], "1")
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()
            proc.stderr.close()


def main():
    def use_args(args):
        global ARGS
        ARGS = lifecycle_test.ARGS = args
    e2e_test.run_tests(("--server", "--cli", "--proto"), use_args)


if __name__ == "__main__":
    main()
