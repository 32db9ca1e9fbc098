#!/usr/bin/python3
"""`attend example` with the real binaries: every name `attend example list` prints runs
against a real attend-server and prints the key lines of its lesson's printout (typed from the
lessons), so an example added without a row here fails; and each one's --json parses."""
import json
import os
import signal
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_test  # noqa: E402  (run_tests and start_server)

ARGS = None

# Key lines of each lesson's printout, whole lines (lesson 003) or the values after "# →"
# (lesson 000's Python sessions).
KEY_LINES = {
    "it": ["[2.0, 1.0, 0.5]", "[0.63, 0.23, 0.14]", "[0.77, 0.37]"],
    "softmax": ["[7.39, 2.72, 1.65]", "11.76", "[0.63, 0.23, 0.14]"],
    "dot": ["# → 4.0"],
    "variance": ["# → 4\n", "# → 1.0\n", "# → 11.3\n"],
    "context-mixing": ["after mixing with river: [0.6, 0.15, 0.6]\n",
                       "after mixing with money: [0.15, 0.6, 0.5]\n",
                       "cosine(river-bank, river) = 0.88, cosine(river-bank, money) = 0.25\n",
                       "cosine(money-bank, river) = 0.38, cosine(money-bank, money) = 0.82\n"],
    "uniform-average": ["position 2: average of 3 vector(s) = [0.6666667, 0.6666667]\n",
                        "position 3: average of 4 vector(s) = [1.0, 0.5]\n"],
    "weighted-average": ["scores  = [2.0, 0.0, 2.0, 4.0]\n",
                         "weights = 0.105 0.014 0.105 0.776\n"],
    "qkv": ["q1 =   0.43  -1.10\n", "k1 =   0.64   0.86\n", "v3 =  -0.68  -0.49\n",
            "score(2 asks 1) = q2.k1 = 0.407, score(1 asks 2) = q1.k2 = -0.417\n"],
    "scaling": ["  1024        31.67          32.00                      0.965"
                "                    0.358\n"],
    "causal": ["    1.000-Infinity-Infinity-Infinity\n",
               "    0.167    0.276    0.455    0.102\n"],
    "full-attention": ["   0.237   0.270   0.269   0.224\n", "position 3:   0.490   0.000\n"],
    "matrix-form": ["position 1:   1.305   0.457\n",
                    "largest difference to the loop version below 1e-6: true\n"],
    "multi-head": ["head 0 weights of the last position: 0.322 0.268 0.056 0.355\n",
                   "head 1 weights of the last position: 0.137 0.140 0.217 0.507\n",
                   "parameters in Wq, Wk, Wv, Wo: 256\n"],
    "gqa": ["query head 5 -> key/value head 1\n",
            "tiny model, 4096 tokens: 4,194,304 bytes = 4.00 MiB of KV cache\n",
            "per layer: Wq 16,777,216  Wk 4,194,304  Wv 4,194,304  Wo 16,777,216 parameters\n",
            " 8 key/value heads: 131,072 bytes of KV cache per token (128 KiB); 8192 tokens = "
            "1.00 GiB\n"],
    "variants": ["multi-query (MQA)           1     32         16                 0.50\n"],
    "cost": ["   1024            0.3 TFLOP         16.4 TFLOP          0.5 GFLOP        16.0 GFLOP\n",
             " 131072         4503.6 TFLOP       2097.2 TFLOP         68.7 GFLOP        16.0 GFLOP\n"],
    "previous-token": ["   0.007   0.007   0.980   0.007\n",
                       "position 3: own content (2, 0) -> output (1.00, 0.99)\n"],
}


class Examples(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.proc, port, _ = e2e_test.start_server(["--address=127.0.0.1:0",
                                                   "--metrics_address="], {})
        cls.target = "127.0.0.1:%d" % port

    @classmethod
    def tearDownClass(cls):
        cls.proc.send_signal(signal.SIGTERM)
        cls.proc.communicate(timeout=30)

    def cli(self, *args):
        return subprocess.run([ARGS.cli, "--target", self.target] + list(args),
                              capture_output=True, text=True, timeout=120)

    def names(self):
        got = self.cli("--json", "example", "list")
        self.assertEqual(got.returncode, 0, got.stderr)
        return [e["name"] for e in json.loads(got.stdout)["examples"]]

    def test_every_listed_example_prints_its_lessons_key_lines(self):
        names = self.names()
        self.assertEqual(sorted(names), sorted(KEY_LINES))
        for name in names:
            with self.subTest(example=name):
                got = self.cli("example", name)
                self.assertEqual(got.returncode, 0, got.stderr)
                for line in KEY_LINES[name]:
                    self.assertIn(line, got.stdout)

    def test_every_example_has_json(self):
        for name in self.names():
            with self.subTest(example=name):
                got = self.cli("--json", "example", name)
                self.assertEqual(got.returncode, 0, got.stderr)
                parsed = json.loads(got.stdout)
                self.assertEqual(parsed["example"], name)
                self.assertGreater(len(parsed), 2)

    def test_heatmap_of_the_previous_token_head(self):
        path = os.path.join(os.environ.get("TMPDIR", "/tmp"), "examples_test_%d.svg" % os.getpid())
        try:
            got = self.cli("example", "previous-token", "--heatmap", path)
            self.assertEqual(got.returncode, 0, got.stderr)
            with open(path) as f:
                self.assertIn("<svg", f.read())
        finally:
            if os.path.exists(path):
                os.remove(path)


def main():
    def use_args(args):
        global ARGS
        ARGS = e2e_test.ARGS = args
    e2e_test.run_tests(("--server", "--cli", "--proto"), use_args)


if __name__ == "__main__":
    main()
