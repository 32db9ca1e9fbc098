#!/usr/bin/python3
"""End-to-end tests: the real attend-server binary, the attend CLI, and a Python gRPC client.

Uses only Debian packages (python3-grpcio, python3-numpy, protoc with grpc_python_plugin): the
Python stubs are generated from the repository's protos at test time, which also proves that a
client in another language can call the API.
"""
import argparse
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import unittest
import urllib.request

import numpy as np

ARGS = None
PB = {}
# What a server built with AddressSanitizer may hold beyond an RSS bound: ASan keeps up to 256 MiB
# of freed memory in quarantine before reusing it, plus shadow memory. ATTEND_SANITIZED is set by
# the sanitized build's ctest (tests/e2e/CMakeLists.txt).
SANITIZER_RSS_MIB = 400 if os.environ.get("ATTEND_SANITIZED") else 0
# A sanitized server runs LeakSanitizer's whole-heap check after it has stopped serving and
# before it exits (server/main.cc): seconds more on a loaded machine, which the real binary does
# not spend. Exit-time bounds add this.
SANITIZER_EXIT_SECONDS = 3.0 if os.environ.get("ATTEND_SANITIZED") else 0.0


def generate_stubs(proto_root, out_dir):
    """Compiles attend.v1 plus the standard health and reflection protos into out_dir."""
    std_src = os.path.join(out_dir, "src", "std")
    os.makedirs(std_src)
    # Health and reflection live in package grpc.*; compiled under "std/" so that the generated
    # modules do not shadow the grpc package itself.
    shutil.copy("/usr/share/grpc-proto/grpc/health/v1/health.proto", std_src)
    shutil.copy("/usr/share/grpc-proto/grpc/reflection/v1alpha/reflection.proto", std_src)
    protos = ["attend/v1/tensor.proto", "attend/v1/attention.proto", "attend/v1/kv_cache.proto",
              "attend/v1/planner.proto", "std/health.proto", "std/reflection.proto"]
    subprocess.run(["protoc", "-I" + proto_root, "-I" + os.path.join(out_dir, "src"),
                    "--python_out=" + out_dir, "--grpc_out=" + out_dir,
                    "--plugin=protoc-gen-grpc=/usr/bin/grpc_python_plugin"] + protos, check=True)
    sys.path.insert(0, out_dir)
    import grpc  # noqa: F401  (imported after the path change on purpose)
    from attend.v1 import attention_pb2, attention_pb2_grpc, kv_cache_pb2, kv_cache_pb2_grpc
    from attend.v1 import planner_pb2, planner_pb2_grpc, tensor_pb2
    from std import health_pb2, health_pb2_grpc, reflection_pb2, reflection_pb2_grpc
    PB.update(attention=attention_pb2, attention_grpc=attention_pb2_grpc, tensor=tensor_pb2,
              kv=kv_cache_pb2, kv_grpc=kv_cache_pb2_grpc, planner=planner_pb2,
              planner_grpc=planner_pb2_grpc, health=health_pb2,
              health_grpc=health_pb2_grpc, reflection=reflection_pb2,
              reflection_grpc=reflection_pb2_grpc)


def start_server(extra_args=(), env_overrides=None):
    env = dict(os.environ)
    env.update(env_overrides or {})
    proc = subprocess.Popen([ARGS.server] + list(extra_args), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline()
    match = re.search(r"listening on ([\d.]+):(\d+)(?:, metrics on http://[\d.]+:(\d+))?", line)
    if not match:
        proc.kill()
        raise RuntimeError("server did not start: %r %s" % (line, proc.stderr.read()))
    return proc, int(match.group(2)), int(match.group(3) or 0)


def reference_attention(q, k, v, causal):
    """Independent numpy attention: q [n_q, H, d], k/v [n_kv, G, d]; query head h uses h // (H/G)."""
    n_q, n_head, d = q.shape
    n_kv, n_head_kv, _ = k.shape
    group = n_head // n_head_kv
    out = np.zeros((n_q, n_head, v.shape[2]))
    for h in range(n_head):
        g = h // group
        scores = q[:, h, :].astype(np.float64) @ k[:, g, :].astype(np.float64).T / np.sqrt(d)
        if causal:
            pos = np.arange(n_q)[:, None] + (n_kv - n_q)
            scores = np.where(np.arange(n_kv)[None, :] > pos, -np.inf, scores)
        scores -= scores.max(axis=1, keepdims=True)
        w = np.exp(scores)
        w /= w.sum(axis=1, keepdims=True)
        out[:, h, :] = w @ v[:, g, :].astype(np.float64)
    return out


class EndToEnd(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import grpc
        cls.grpc = grpc
        # The metrics address comes from the environment, to check ATTEND_* handling.
        cls.proc, cls.port, cls.metrics_port = start_server(
            ["--address=127.0.0.1:0"], {"ATTEND_METRICS_ADDRESS": "127.0.0.1:0"})
        cls.target = "127.0.0.1:%d" % cls.port
        cls.channel = grpc.insecure_channel(cls.target)
        cls.stub = PB["attention_grpc"].AttentionStub(cls.channel)

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        cls.proc.send_signal(signal.SIGTERM)
        out, _ = cls.proc.communicate(timeout=30)
        assert cls.proc.returncode == 0, "server exited %d after SIGTERM" % cls.proc.returncode
        assert "stopped" in out, out

    def cli(self, *args):
        return subprocess.run([ARGS.cli, "--target", self.target] + list(args),
                              capture_output=True, text=True, timeout=60)

    def test_cli_health_reports_serving(self):
        result = self.cli("health")
        self.assertEqual(result.returncode, 0, result.stderr)
        for service in ("attend.v1.Attention", "attend.v1.KvCache", "attend.v1.Planner"):
            self.assertRegex(result.stdout, service + r"\s+SERVING")

    def test_cli_softmax_gives_the_lesson_shares(self):
        result = self.cli("--json", "softmax", "2", "1", "0.5")
        self.assertEqual(result.returncode, 0, result.stderr)
        shares = [round(p, 2) for p in json.loads(result.stdout)["probabilities"]]
        self.assertEqual(shares, [0.63, 0.23, 0.14])

    def test_cli_reaches_a_dead_server_with_exit_code_3(self):
        result = subprocess.run([ARGS.cli, "--target", "127.0.0.1:1", "--deadline", "2", "health"],
                                capture_output=True, text=True, timeout=60)
        self.assertEqual(result.returncode, 3, result.stderr)

    def test_reflection_lists_the_attend_services(self):
        r = PB["reflection"]
        stub = PB["reflection_grpc"].ServerReflectionStub(self.channel)
        responses = stub.ServerReflectionInfo(iter([r.ServerReflectionRequest(list_services="")]))
        names = [s.name for resp in responses for s in resp.list_services_response.service]
        for service in ("attend.v1.Attention", "attend.v1.KvCache", "attend.v1.Planner",
                        "grpc.health.v1.Health"):
            self.assertIn(service, names)

    def test_python_client_gqa_matches_numpy(self):
        rng = np.random.default_rng(7)
        q = rng.standard_normal((37, 8, 64), dtype=np.float32)
        k = rng.standard_normal((50, 2, 64), dtype=np.float32)
        v = rng.standard_normal((50, 2, 32), dtype=np.float32)
        t = PB["tensor"]

        def tensor(a, dtype=t.FLOAT32):
            return t.Tensor(dtype=dtype, shape=list(a.shape), data=a.tobytes())

        a = PB["attention"]
        response = self.stub.Attend(a.AttendRequest(q=tensor(q), k=tensor(k), v=tensor(v),
                                                    mask=a.MaskOptions(causal=True)))
        self.assertEqual(list(response.output.shape), [37, 8, 32])
        got = np.frombuffer(response.output.data, dtype=np.float32).reshape(37, 8, 32)
        np.testing.assert_allclose(got, reference_attention(q, k, v, True), atol=2e-5)
        self.assertEqual(response.stats.attended_pairs, 8 * sum(range(14, 51)))

        # float16 inputs and output
        response = self.stub.Attend(a.AttendRequest(
            q=tensor(q.astype(np.float16), t.FLOAT16), k=tensor(k.astype(np.float16), t.FLOAT16),
            v=tensor(v.astype(np.float16), t.FLOAT16), output_dtype=t.FLOAT16))
        got = np.frombuffer(response.output.data, dtype=np.float16).reshape(37, 8, 32)
        np.testing.assert_allclose(got.astype(np.float64),
                                   reference_attention(q.astype(np.float16), k.astype(np.float16),
                                                       v.astype(np.float16), False), atol=5e-3)

    def test_bad_input_is_invalid_argument_and_the_server_keeps_serving(self):
        a = PB["attention"]
        t = PB["tensor"]
        with self.assertRaises(self.grpc.RpcError) as caught:
            self.stub.Attend(a.AttendRequest(
                q=t.Tensor(shape=[2, 6, 4], values=[0.0] * 48),
                k=t.Tensor(shape=[3, 4, 4], values=[0.0] * 48),
                v=t.Tensor(shape=[3, 4, 4], values=[0.0] * 48)))
        self.assertEqual(caught.exception.code(), self.grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("n_head 6", caught.exception.details())
        self.assertEqual(len(self.stub.Softmax(a.SoftmaxRequest(logits=[1, 2])).probabilities), 2)

    def test_unparseable_bytes_are_invalid_argument_and_counted_so(self):
        raw = self.channel.unary_unary("/attend.v1.Attention/Attend",
                                       request_serializer=lambda b: b,
                                       response_deserializer=lambda b: b)
        with self.assertRaises(self.grpc.RpcError) as caught:
            raw(b"\xff\xff\xff", timeout=10)
        self.assertEqual(caught.exception.code(), self.grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("could not parse the request", caught.exception.details())
        self.assertIn("attend.v1.AttendRequest", caught.exception.details())
        text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % self.metrics_port,
                                      timeout=10).read().decode()
        self.assertRegex(text, r'grpc_server_handled_total\{grpc_code="INVALID_ARGUMENT",'
                               r'grpc_method="Attend",grpc_service="attend.v1.Attention",'
                               r'grpc_type="unary"\} [1-9]')
        self.assertNotIn('grpc_code="UNIMPLEMENTED"', text)

    def test_metrics_show_request_counters(self):
        a = PB["attention"]
        self.stub.Softmax(a.SoftmaxRequest(logits=[2, 1, 0.5]))
        text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % self.metrics_port,
                                      timeout=10).read().decode()
        self.assertRegex(text, r'grpc_server_handled_total\{grpc_code="OK",grpc_method="Softmax",'
                               r'grpc_service="attend.v1.Attention",grpc_type="unary"\} [1-9]')
        self.assertIn("grpc_server_handling_seconds_bucket", text)
        self.assertIn("attend_build_info", text)


def f32_tensor(a):
    t = PB["tensor"]
    a = np.ascontiguousarray(a, dtype=np.float32)
    return t.Tensor(dtype=t.FLOAT32, shape=list(a.shape), data=a.tobytes())


def f32_array(tensor):
    return np.frombuffer(tensor.data, dtype=np.float32).reshape(tuple(tensor.shape))


class KvCacheEndToEnd(unittest.TestCase):
    """attend.v1.KvCache from Python: prefill, decode over a DecodeStream, and the CLI's view."""
    N_HEAD, N_HEAD_KV, HEAD_DIM, HEAD_DIM_V, LAYERS = 8, 2, 16, 8, 2

    @classmethod
    def setUpClass(cls):
        import grpc
        cls.grpc = grpc
        cls.proc, cls.port, _ = start_server(
            ["--address=127.0.0.1:0", "--kv_cache_bytes=8388608", "--kv_block_bytes=16384"],
            {"ATTEND_METRICS_ADDRESS": ""})
        cls.target = "127.0.0.1:%d" % cls.port
        cls.channel = grpc.insecure_channel(cls.target)
        cls.stub = PB["kv_grpc"].KvCacheStub(cls.channel)

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        cls.proc.send_signal(signal.SIGTERM)
        cls.proc.communicate(timeout=30)
        assert cls.proc.returncode == 0, "server exited %d after SIGTERM" % cls.proc.returncode

    def cli(self, *args):
        return subprocess.run([ARGS.cli, "--target", self.target] + list(args),
                              capture_output=True, text=True, timeout=60)

    def create(self, sequence_id):
        kv = PB["kv"]
        info = self.stub.CreateSequence(kv.CreateSequenceRequest(
            sequence_id=sequence_id,
            config=kv.SequenceConfig(layers=self.LAYERS, n_head=self.N_HEAD,
                                     n_head_kv=self.N_HEAD_KV, head_dim=self.HEAD_DIM,
                                     head_dim_v=self.HEAD_DIM_V,
                                     kv_dtype=PB["tensor"].FLOAT32)))
        self.assertEqual(info.sequence_id, sequence_id)
        self.assertEqual(list(info.layer_tokens), [0] * self.LAYERS)
        return info

    def tokens(self, rng, n):
        """q [n, H, d], k [n, G, d], v [n, G, dv] for every layer."""
        return [(rng.standard_normal((n, self.N_HEAD, self.HEAD_DIM), dtype=np.float32),
                 rng.standard_normal((n, self.N_HEAD_KV, self.HEAD_DIM), dtype=np.float32),
                 rng.standard_normal((n, self.N_HEAD_KV, self.HEAD_DIM_V), dtype=np.float32))
                for _ in range(self.LAYERS)]

    def test_prefill_then_stream_decode_match_numpy(self):
        kv = PB["kv"]
        self.create("py-stream")
        rng = np.random.default_rng(11)
        prefill, steps = 6, 3
        # Each layer's whole history: the prefill, then one token per decode step.
        history = self.tokens(rng, prefill + steps)

        for layer, (q, k, v) in enumerate(history):
            r = self.stub.Append(kv.AppendRequest(
                sequence_id="py-stream", layer=layer, q=f32_tensor(q[:prefill]),
                k=f32_tensor(k[:prefill]), v=f32_tensor(v[:prefill])))
            self.assertEqual((r.first_position, r.layer_tokens), (0, prefill))
            np.testing.assert_allclose(
                f32_array(r.output),
                reference_attention(q[:prefill], k[:prefill], v[:prefill], True), atol=2e-5)

        # A real bidirectional exchange: each message is written only after the previous
        # response was read, as a decoder that needs layer l's output for layer l + 1 would.
        outbox = queue.Queue()

        def requests():
            while True:
                message = outbox.get()
                if message is None:
                    return
                yield message

        responses = self.stub.DecodeStream(requests(), timeout=60)

        def exchange(message):
            outbox.put(message)
            return next(responses)

        def message(sequence_id, layer, request_id, q, k, v, position):
            one = slice(position, position + 1)
            return kv.DecodeBatchRequest(layer=layer, request_id=request_id, steps=[
                kv.DecodeStep(sequence_id=sequence_id, q=f32_tensor(q[one]),
                              k=f32_tensor(k[one]), v=f32_tensor(v[one]))])

        request_id = 0
        for step in range(steps):
            position = prefill + step
            for layer, (q, k, v) in enumerate(history):
                if step == 1 and layer == 1:
                    # A message for an unknown sequence fails alone; the stream goes on.
                    request_id += 1
                    bad = exchange(message("py-nobody", layer, request_id, q, k, v, position))
                    self.assertEqual(bad.request_id, request_id)
                    self.assertEqual(bad.error.code, self.grpc.StatusCode.NOT_FOUND.value[0])
                    self.assertIn("py-nobody", bad.error.message)
                    self.assertEqual(len(bad.results), 0)
                request_id += 1
                response = exchange(message("py-stream", layer, request_id, q, k, v, position))
                self.assertEqual(response.request_id, request_id)
                self.assertFalse(response.HasField("error"), response.error)
                self.assertEqual(len(response.results), 1)
                result = response.results[0]
                self.assertEqual(result.sequence_id, "py-stream")
                self.assertEqual(result.layer_tokens, position + 1)
                # The new token's query over the layer's whole history, causal GQA.
                want = reference_attention(q[:position + 1], k[:position + 1], v[:position + 1],
                                           True)[-1:]
                np.testing.assert_allclose(f32_array(result.output), want, atol=2e-5)
                self.assertEqual(response.stats.attended_pairs, self.N_HEAD * (position + 1))
        outbox.put(None)
        self.assertEqual(list(responses), [])  # the server ends the stream after our last message

        info = self.stub.GetSequence(kv.GetSequenceRequest(sequence_id="py-stream"))
        self.assertEqual(list(info.layer_tokens), [prefill + steps] * self.LAYERS)

    def test_cli_seq_get_and_stats_show_what_python_cached(self):
        kv = PB["kv"]
        self.create("py-cli")
        rng = np.random.default_rng(5)
        for layer, (q, k, v) in enumerate(self.tokens(rng, 20)):
            n = 20 if layer == 0 else 17  # layers advance on their own
            self.stub.Append(kv.AppendRequest(sequence_id="py-cli", layer=layer,
                                              k=f32_tensor(k[:n]), v=f32_tensor(v[:n])))
        info = self.stub.GetSequence(kv.GetSequenceRequest(sequence_id="py-cli"))
        stats = self.stub.Stats(kv.StatsRequest())

        result = self.cli("seq", "get", "--id", "py-cli")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("sequence 'py-cli'", result.stdout)
        self.assertIn("2 layers, 8 query heads, 2 key/value heads (grouped-query), head_dim 16, "
                      "head_dim_v 8", result.stdout)
        self.assertIn("17 in every layer", result.stdout)
        self.assertRegex(result.stdout, r"\n\s*0\s+20\n\s*1\s+17\n")
        result = self.cli("--json", "seq", "get", "--id", "py-cli")
        self.assertEqual(result.returncode, 0, result.stderr)
        got = json.loads(result.stdout)
        self.assertEqual([int(t) for t in got["layer_tokens"]], [20, 17])
        self.assertEqual(int(got["blocks"]), info.blocks)
        self.assertEqual(int(got["bytes"]), info.bytes)

        result = self.cli("seq", "stats")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("8.00 MiB (8,388,608 bytes) in 512 blocks of 16.00 KiB", result.stdout)
        self.assertRegex(result.stdout, r"eviction\s+none;")
        result = self.cli("--json", "seq", "stats")
        self.assertEqual(result.returncode, 0, result.stderr)
        cli_stats = json.loads(result.stdout)
        self.assertEqual(int(cli_stats["capacity_bytes"]), 8 << 20)
        self.assertEqual(int(cli_stats["block_bytes"]), stats.block_bytes)
        self.assertGreaterEqual(int(cli_stats["used_bytes"]), info.bytes)

        result = self.cli("seq", "get", "--id", "py-missing")
        self.assertEqual(result.returncode, 4, result.stderr)
        self.assertIn("NOT_FOUND", result.stderr)


class Configuration(unittest.TestCase):
    def test_environment_sets_limits(self):
        import grpc
        proc, port, _ = start_server([], {"ATTEND_ADDRESS": "127.0.0.1:0", "ATTEND_METRICS_ADDRESS": "",
                                          "ATTEND_MAX_TENSOR_ELEMENTS": "10"})
        try:
            a, t = PB["attention"], PB["tensor"]
            with grpc.insecure_channel("127.0.0.1:%d" % port) as channel:
                with self.assertRaises(grpc.RpcError) as caught:
                    PB["attention_grpc"].AttentionStub(channel).Attend(a.AttendRequest(
                        q=t.Tensor(shape=[12, 1, 1], values=[0.0] * 12),
                        k=t.Tensor(shape=[1, 1, 1], values=[0.0]),
                        v=t.Tensor(shape=[1, 1, 1], values=[0.0])))
            self.assertEqual(caught.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
            self.assertIn("over the limit of 10", caught.exception.details())
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=30)
        self.assertEqual(proc.returncode, 0)

    def test_bad_flag_value_in_the_environment_is_refused(self):
        env = dict(os.environ, ATTEND_WORKER_THREADS="many")
        result = subprocess.run([ARGS.server, "--address=127.0.0.1:0"], env=env,
                                capture_output=True, text=True, timeout=30)
        self.assertEqual(result.returncode, 2)
        self.assertIn("ATTEND_WORKER_THREADS", result.stderr)


class Security(unittest.TestCase):
    """TLS and a bearer token configured through ATTEND_* variables, reached from Python (TLS
    credentials and the authorization header by hand) and from the CLI (its environment)."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="attend_e2e_tls_")
        script = (
            "set -e\n"
            "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key "
            "-out ca.pem -days 2 -subj /CN=e2e-ca\n"
            "openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout server.key "
            "-out server.csr -subj /CN=localhost\n"
            "printf 'subjectAltName=DNS:localhost\\n' > san.ext\n"
            "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 "
            "-extfile san.ext -out server.pem\n"
            "printf 'e2e-token-123\\n' > token\n")
        subprocess.run(["bash", "-c", script], cwd=cls.dir, check=True, capture_output=True)
        cls.proc, cls.port, _ = start_server([], {
            "ATTEND_ADDRESS": "127.0.0.1:0", "ATTEND_METRICS_ADDRESS": "",
            "ATTEND_TLS_CERT": cls.path("server.pem"), "ATTEND_TLS_KEY": cls.path("server.key"),
            "ATTEND_AUTH_TOKEN_FILE": cls.path("token")})
        cls.target = "localhost:%d" % cls.port

    @classmethod
    def tearDownClass(cls):
        cls.proc.send_signal(signal.SIGTERM)
        cls.proc.communicate(timeout=30)
        shutil.rmtree(cls.dir, ignore_errors=True)

    @classmethod
    def path(cls, name):
        return os.path.join(cls.dir, name)

    def channel(self):
        import grpc
        with open(self.path("ca.pem"), "rb") as f:
            credentials = grpc.ssl_channel_credentials(root_certificates=f.read())
        return grpc.secure_channel(self.target, credentials)

    def test_python_needs_the_token_except_for_health(self):
        import grpc
        a = PB["attention"]
        with self.channel() as channel:
            health = PB["health_grpc"].HealthStub(channel).Check(PB["health"].HealthCheckRequest())
            self.assertEqual(health.status, PB["health"].HealthCheckResponse.SERVING)
            stub = PB["attention_grpc"].AttentionStub(channel)
            for metadata in ([], [("authorization", "Bearer wrong")]):
                with self.assertRaises(grpc.RpcError) as caught:
                    stub.Softmax(a.SoftmaxRequest(logits=[2, 1, 0.5]), metadata=metadata)
                self.assertEqual(caught.exception.code(), grpc.StatusCode.UNAUTHENTICATED)
            r = stub.Softmax(a.SoftmaxRequest(logits=[2, 1, 0.5]),
                             metadata=[("authorization", "Bearer e2e-token-123")])
            self.assertEqual([round(p, 2) for p in r.probabilities], [0.63, 0.23, 0.14])

    def test_cli_connects_with_its_environment(self):
        env = dict(os.environ, ATTEND_TARGET=self.target, ATTEND_TLS="1",
                   ATTEND_CA_CERT=self.path("ca.pem"), ATTEND_TOKEN_FILE=self.path("token"))
        result = subprocess.run([ARGS.cli, "--json", "softmax", "2", "1", "0.5"], env=env,
                                capture_output=True, text=True, timeout=60)
        self.assertEqual(result.returncode, 0, result.stderr)
        del env["ATTEND_TOKEN_FILE"]
        result = subprocess.run([ARGS.cli, "softmax", "1"], env=env, capture_output=True,
                                text=True, timeout=60)
        self.assertEqual(result.returncode, 4, result.stderr)
        self.assertIn("UNAUTHENTICATED", result.stderr)
        del env["ATTEND_CA_CERT"]
        result = subprocess.run([ARGS.cli, "--deadline", "5", "health"], env=env,
                                capture_output=True, text=True, timeout=60)
        self.assertEqual(result.returncode, 3, result.stderr)
        self.assertIn("--ca_cert", result.stderr)

    def test_server_refuses_a_token_without_tls(self):
        result = subprocess.run([ARGS.server, "--address=127.0.0.1:0", "--metrics_address=",
                                 "--auth_token_file=" + self.path("token")],
                                capture_output=True, text=True, timeout=30)
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertIn("need TLS", result.stderr)
        self.assertNotIn("e2e-token-123", result.stderr + result.stdout)


def run_tests(flags, use_args):
    """Parses the required `flags` (e.g. "--server"; "--proto" among them), hands the parsed
    arguments to use_args, generates the stubs from --proto and runs the unittest cases of the
    script being run, with the arguments no flag took."""
    parser = argparse.ArgumentParser()
    for flag in flags:
        parser.add_argument(flag, required=True)
    args, rest = parser.parse_known_args()
    use_args(args)
    with tempfile.TemporaryDirectory() as out_dir:
        generate_stubs(args.proto, out_dir)
        unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


def main():
    def use_args(args):
        global ARGS
        ARGS = args
    run_tests(("--server", "--cli", "--proto"), use_args)


if __name__ == "__main__":
    main()
