#!/usr/bin/python3
"""bench/compare_peers.py's arguments and messages, without torch and without the benchmarks.

Bad arguments (--python, --json, --threads, --bench_dir/--build) must be usage errors (exit 2,
naming the flag) before any benchmark runs: the script is pointed at a folder of fake
attention_bench and decode_bench that leave a mark when run, and the mark must not appear. A
failed PyTorch child must say what failed (exit status, last stderr line), with the
"python3-torch provides it" hint only where importing torch failed. The BLAS named in the JSON and
on the printed line come from the same field; the tables' "-" under attend has a footnote.

    /usr/bin/python3 tests/bench/compare_peers_test.py [--repo .]
"""
import argparse
import io
import os
import stat
import subprocess
import sys
import tempfile
import unittest
from unittest import mock

parser = argparse.ArgumentParser()
parser.add_argument("--repo", default=os.path.join(os.path.dirname(__file__), "..", ".."))
ARGS, rest = parser.parse_known_args()
BENCH = os.path.join(os.path.abspath(ARGS.repo), "bench")
SCRIPT = os.path.join(BENCH, "compare_peers.py")
sys.path.insert(0, BENCH)
import compare_peers  # noqa: E402
import torch_peer  # noqa: E402


def write_executable(path, text):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


class Fixture(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name
        # Fake benchmarks: they leave a mark and fail, so a run that gets to them shows.
        self.bench = os.path.join(self.dir, "bench")
        os.mkdir(self.bench)
        self.mark = os.path.join(self.dir, "benchmark-ran")
        for name in ("attention_bench", "decode_bench"):
            write_executable(os.path.join(self.bench, name),
                             "#!/bin/sh\ntouch '%s'\nexit 1\n" % self.mark)

    def tearDown(self):
        self.tmp.cleanup()

    def run_script(self, *args, cwd=None):
        run = subprocess.run([sys.executable, SCRIPT] + list(args), capture_output=True,
                             text=True, cwd=cwd or self.dir, timeout=30)
        return run.returncode, run.stdout + run.stderr

    def assertUsageError(self, args, *words):
        """Exit 2, an argparse-style message with `words`, no traceback, no benchmark run."""
        code, output = self.run_script("--bench_dir", self.bench, *args)
        self.assertEqual(code, 2, (args, output))
        self.assertIn("compare_peers.py: error:", output, args)
        for word in words:
            self.assertIn(word, output, (args, output))
        self.assertNotIn("Traceback", output, args)
        self.assertFalse(os.path.exists(self.mark), ("a benchmark ran", args, output))
        return output


class Arguments(Fixture):
    def test_python_must_be_an_executable(self):
        self.assertUsageError(["--python", "/nonexistent/python3"], "--python",
                              "/nonexistent/python3", "no such file")
        self.assertUsageError(["--python", self.dir], "--python", "is a folder")
        text = os.path.join(self.dir, "python-text")
        with open(text, "w") as f:
            f.write("not a program\n")
        os.chmod(text, 0o644)  # no x bit: not executable, for root too
        self.assertUsageError(["--python", text], "--python", "not executable")
        self.assertUsageError(["--python", "no-such-python-here"], "--python",
                              "not found on PATH")

    def test_json_must_be_writable_file(self):
        self.assertUsageError(["--json", "/nonexistent/dir/x.json"], "--json",
                              "/nonexistent/dir", "no such folder")
        self.assertUsageError(["--json", self.dir], "--json", "is a folder")
        a_file = os.path.join(self.dir, "a-file")
        open(a_file, "w").close()
        self.assertUsageError(["--json", os.path.join(a_file, "x.json")], "--json",
                              "not a folder")
        if os.geteuid() != 0:  # root writes anywhere
            locked = os.path.join(self.dir, "locked")
            os.mkdir(locked, 0o555)
            self.assertUsageError(["--json", os.path.join(locked, "x.json")], "--json",
                                  "not writable")

    def test_threads_must_be_positive(self):
        for bad in ("0", "-3", "two"):
            self.assertUsageError(["--threads", bad], "--threads", "positive integer")

    def test_explicit_bench_dir_without_binaries(self):
        empty = os.path.join(self.dir, "empty")
        os.mkdir(empty)
        code, output = self.run_script("--bench_dir", empty)
        self.assertEqual(code, 2, output)
        self.assertIn("--bench_dir", output)
        self.assertIn("attention_bench is not in %s" % empty, output)
        self.assertNotIn("setup.sh", output)
        # --build: its bench/ folder.
        code, output = self.run_script("--build", empty)
        self.assertEqual(code, 2, output)
        self.assertIn("--build", output)
        self.assertIn("not in %s" % os.path.join(empty, "bench"), output)
        self.assertNotIn("setup.sh", output)
        # Neither given: build/bench under the working folder, and the setup hint as before.
        code, output = self.run_script(cwd=empty)
        self.assertEqual(code, 1, output)
        self.assertIn("setup.sh", output)
        self.assertFalse(os.path.exists(self.mark))

    def test_good_arguments_get_to_the_benchmarks(self):
        """The fixture's own check: with good arguments the fake benchmark runs."""
        code, output = self.run_script("--bench_dir", self.bench, "--python", sys.executable,
                                       "--json", os.path.join(self.dir, "out.json"),
                                       "--threads", "1", "--small")
        self.assertNotEqual(code, 0)
        self.assertTrue(os.path.exists(self.mark), output)


class TorchChild(Fixture):
    def run_torch(self, python, env=None):
        with mock.patch.dict(os.environ, env or {}):
            return compare_peers.run_torch(python, 1, [], [])

    def test_a_failing_program_says_its_status(self):
        results, reason = self.run_torch("/bin/false")
        self.assertIsNone(results)
        self.assertIn("exit status 1", reason)
        self.assertIn("no stderr", reason)
        self.assertNotIn("python3-torch", reason)

        noisy = os.path.join(self.dir, "noisy")
        write_executable(noisy, "#!/bin/sh\necho first >&2\necho 'Boom: last line' >&2\nexit 5\n")
        results, reason = self.run_torch(noisy)
        self.assertIsNone(results)
        self.assertIn("exit status 5", reason)
        self.assertIn("Boom: last line", reason)
        self.assertNotIn("first", reason)
        self.assertNotIn("python3-torch", reason)

        killed = os.path.join(self.dir, "killed")
        write_executable(killed, "#!/bin/sh\nkill -9 $$\n")
        results, reason = self.run_torch(killed)
        self.assertIn("signal 9 (SIGKILL)", reason)

    def test_no_json_is_a_failure_not_a_traceback(self):
        results, reason = self.run_torch("/bin/true")
        self.assertIsNone(results)
        self.assertIn("no JSON", reason)

    def test_a_python_without_torch_gets_the_hint(self):
        # This Python with neither site-packages nor PYTHON* variables: no torch.
        bare = os.path.join(self.dir, "bare-python")
        write_executable(bare, '#!/bin/sh\nexec "%s" -I -S "$@"\n' % sys.executable)
        results, reason = self.run_torch(bare)
        self.assertIsNone(results)
        self.assertIn("No module named 'torch'", reason)
        self.assertIn("Debian's python3-torch provides it", reason)
        # A torch whose import fails with an ImportError (a missing library) gets it too.
        fake = os.path.join(self.dir, "fake-torch")
        os.mkdir(fake)
        with open(os.path.join(fake, "torch.py"), "w") as f:
            f.write("raise ImportError('libtorch_cpu.so: cannot open shared object file')\n")
        results, reason = self.run_torch(sys.executable, {"PYTHONPATH": fake})
        self.assertIn("ImportError: libtorch_cpu.so", reason)
        self.assertIn("python3-torch provides it", reason)
        # Any other failure of the import does not.
        with open(os.path.join(fake, "torch.py"), "w") as f:
            f.write("raise RuntimeError('broken build')\n")
        results, reason = self.run_torch(sys.executable, {"PYTHONPATH": fake})
        self.assertIn("RuntimeError: broken build", reason)
        self.assertIn("exit status 1", reason)
        self.assertNotIn("python3-torch", reason)

    def test_skip_line_through_the_script(self):
        """--python /bin/false: the skip line names the status, no Debian hint (fake benchmarks
        that succeed with no rows)."""
        ok = os.path.join(self.dir, "ok")
        os.mkdir(ok)
        for name in ("attention_bench", "decode_bench"):
            write_executable(os.path.join(ok, name), '#!/bin/sh\necho \'{"benchmarks": []}\'\n')
        out = os.path.join(self.dir, "out.json")
        code, output = self.run_script("--bench_dir", ok, "--python", "/bin/false", "--small",
                                       "--json", out)
        self.assertEqual(code, 0, output)
        skip = [line for line in output.splitlines() if line.startswith("PyTorch: skipped")]
        self.assertEqual(len(skip), 1, output)
        self.assertIn("exit status 1", skip[0])
        self.assertNotIn("python3-torch", skip[0])
        self.assertTrue(os.path.exists(out))


LIB = "/usr/lib/x86_64-linux-gnu/"
OPENBLAS = LIB + "openblas-pthread/libopenblasp-r0.3.21.so"


class Blas(unittest.TestCase):
    # As /proc/self/maps has them in Debian's torch with the OpenBLAS alternative.
    PATHS = ["/usr/lib/python3/dist-packages/torch/lib/libtorch_cpu.so",
             LIB + "openblas-pthread/libblas.so.3", LIB + "openblas-pthread/libblas.so.3",
             OPENBLAS, LIB + "openblas-pthread/liblapack.so.3"]
    MAPS = "".join("7f%02d-7f%02d r--p 0 08:01 %d %s\n" % (i, i + 1, i, path)
                   for i, path in enumerate(PATHS)) + "7f10-7f11 rw-p 0 00:00 0 [heap]\n"

    def test_loaded_blas_prefers_the_implementation(self):
        self.assertEqual(torch_peer.loaded_blas(self.MAPS), OPENBLAS)
        reference = ("7f0-7f1 r--p 0 08:01 2 %sblas/libblas.so.3.11.0\n"
                     "7f1-7f2 r--p 0 08:01 1 %slibtorch_cpu.so\n" % (LIB, LIB))
        self.assertEqual(torch_peer.loaded_blas(reference), LIB + "blas/libblas.so.3.11.0")
        self.assertEqual(torch_peer.loaded_blas("7f0-7f1 r--p 0 00:00 0 [heap]\n"), "")

    def test_printed_blas_is_the_json_one(self):
        """describe_torch prints the child's "blas" whatever --python is: it once printed this
        machine's libblas.so.3 alternative for /usr/bin/python3 while the JSON said "generic"."""
        for python in ("/usr/bin/python3", "/opt/venv/bin/python"):
            for blas, info in ((OPENBLAS, "generic"), ("mkl", "mkl")):
                t = {"version": "2.5.0", "blas": blas, "blas_info": info,
                     "sdpa": {"used": False, "reason": "x"}, "results": []}
                line = compare_peers.describe_torch(t, python, 2)[0]
                self.assertIn("BLAS %s" % blas, line)
                self.assertEqual("OPENBLAS_CORETYPE" in line, "openblas" in blas, line)
                if info != blas:
                    self.assertIn("BLAS_INFO %s" % info, line)


class Footnote(unittest.TestCase):
    def test_dashes_under_attend_are_explained(self):
        prefill = [{"name": "BM_CausalPrefill/n:512/heads:8/kv_heads:8/d:128/bf16:%d/threads:0"
                    % bf16, "useful_GFLOPs": 1.5, "ratio": 0.5, "matmul_GFLOPs": 3.0,
                    "label": "x"} for bf16 in (0, 1)]
        decoded = [{"name": "BM_DecodeBatch/context:1024/batch:%d/storage:%d/threads:0/idle:0"
                    % (b, s), "KV_GBs": 2.0, "ratio": 0.4, "read_bw_GBs": 5.0}
                   for b in (1, 16) for s in (0, 1, 2)]
        ggml = {("decode", "float16", (32, 8, 1024, 1)): 3.0}
        for small in (True, False):
            out = io.StringIO()
            compare_peers.print_tables(prefill, decoded, None, ggml, compare_peers.SMALL_PREFILL,
                                       compare_peers.SMALL_DECODE, out=out, small=small)
            text = out.getvalue()
            suffix = " in --small" if small else ""
            for binary in ("attention_bench", "decode_bench"):
                self.assertIn('attend "-": %s has no case of that shape and dtype%s'
                              % (binary, suffix), text)
        # All rows attend's: no footnote.
        out = io.StringIO()
        compare_peers.print_tables(prefill, decoded, None, {}, compare_peers.SMALL_PREFILL[:1],
                                   compare_peers.SMALL_DECODE, out=out, small=True)
        self.assertNotIn("has no case", out.getvalue())


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]] + rest)
