#!/usr/bin/python3
"""The Python package attend against the real attend-server: a round trip through every RPC,
NumPy and torch tensors in float32 / bfloat16 / float16, errors as exceptions with their codes,
AppendBatch against per-sequence Append on random ragged batches, chunked prefill under a small
message limit against one unchunked call, bad batches that change nothing, and TLS with mutual
TLS and a bearer token.

    PYTHONPATH=build/python tests/client/python/client_e2e_test.py --server build/server/attend-server
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import unittest

import grpc
import numpy as np

import attend
from attend.v1 import kv_cache_pb2, kv_cache_pb2_grpc

try:
    import torch
except ImportError:
    torch = None

ARGS = None


class Server:
    """attend-server on a free loopback port (no metrics port), stopped with SIGTERM."""

    def __init__(self, *flags):
        self.log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            [ARGS.server, "--address=127.0.0.1:0", "--metrics_address="] + list(flags),
            stdout=subprocess.PIPE, stderr=self.log, text=True)
        line = self.proc.stdout.readline()
        match = re.search(r"listening on [\d.]+:(\d+)", line)
        if not match:
            self.proc.kill()
            self.log.seek(0)
            raise RuntimeError("server did not start: %r %s" % (line, self.log.read()))
        self.port = int(match.group(1))
        self.target = "127.0.0.1:%d" % self.port

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.communicate(timeout=30)
        self.log.close()


def rand(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def reference_attention(q, k, v, causal=True):
    """NumPy attention in float64: q [n_q, H, d], k/v [n_kv, G, d]; query head h reads key/value
    head h // (H / G); queries aligned to the end of the keys."""
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


def as_float32(a):
    """A float32 NumPy copy of an output in any representation (bf16 bits, float16, torch)."""
    if torch is not None and isinstance(a, torch.Tensor):
        return a.float().numpy()
    if a.dtype == np.uint16:
        return attend.bfloat16_to_float32(a)
    return a.astype(np.float32)


class RoundTrips(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server("--kv_cache_bytes=256MiB")
        cls.client = attend.Client(cls.server.target, deadline=60)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.server.stop()

    def test_health(self):
        self.assertEqual(self.client.health(), "SERVING")
        self.assertEqual(self.client.health("attend.v1.KvCache"), "SERVING")

    def test_kv_cache_calls_round_trip(self):
        c, rng = self.client, np.random.default_rng(1)
        shape = dict(layers=2, n_head=4, n_head_kv=2, head_dim=16, kv_dtype="float32")
        info = c.create_sequence("rt-1", **shape)
        self.assertEqual((info.sequence_id, info.config.n_head_kv), ("rt-1", 2))
        generated = c.create_sequence(**shape).sequence_id
        self.assertRegex(generated, r"^seq-[0-9a-f]{16}$")

        q, k, v = rand(rng, (6, 4, 16)), rand(rng, (6, 2, 16)), rand(rng, (6, 2, 16))
        prefill = c.append("rt-1", 0, q, k, v, return_weights=True)
        np.testing.assert_allclose(prefill.output, reference_attention(q, k, v), rtol=1e-4,
                                   atol=1e-5)
        self.assertEqual((prefill.first_position, prefill.layer_tokens), (0, 6))
        self.assertEqual(prefill.weights.shape, (4, 6, 6))
        self.assertGreater(prefill.stats.attention_flops, 0)
        c.append(generated, 0, q, k, v)
        self.assertIsNone(c.append("rt-1", 1, None, k, v).output)  # only appends

        # A decode step for both through DecodeBatch, then two through a stream.
        def step(seed):
            r = np.random.default_rng(seed)
            return rand(r, (2, 4, 16)), rand(r, (2, 2, 16)), rand(r, (2, 2, 16))
        sq, sk, sv = step(2)
        batch = c.decode_batch(0, ["rt-1", generated], sq, sk, sv)
        self.assertEqual(batch.layer_tokens, [7, 7])
        self.assertEqual(batch.sequence_ids, ["rt-1", generated])
        for row in range(2):
            np.testing.assert_allclose(
                batch.output[row], reference_attention(
                    sq[row:row + 1], np.concatenate([k, sk[row:row + 1]]),
                    np.concatenate([v, sv[row:row + 1]]))[0], rtol=1e-4, atol=1e-5)
        replies = list(c.decode_stream([(0, ["rt-1", generated]) + step(3),
                                        (5, ["rt-1"]) + tuple(t[:1] for t in step(4)),
                                        (0, ["rt-1", generated]) + step(5)]))
        self.assertEqual([r.request_id for r in replies], [1, 2, 3])
        self.assertEqual(replies[0].result.layer_tokens, [8, 8])
        self.assertIsInstance(replies[1].error, attend.InvalidArgument)  # layer 5 of 2
        self.assertEqual(replies[2].result.layer_tokens, [9, 9])
        with c.open_decode_stream() as stream:
            sq, sk, sv = step(6)
            stream.write(0, ["rt-1"], sq[:1], sk[:1], sv[:1])
            stream.write(1, ["rt-1"], sq[:1], sk[:1], sv[:1])
            self.assertEqual(stream.read().result.layer_tokens, [10])
            self.assertEqual(stream.read().result.layer_tokens, [7])

        self.assertEqual(list(c.get_sequence("rt-1").layer_tokens), [10, 7])
        listed = [s.sequence_id for s in c.list_sequences(page_size=1)]
        self.assertIn("rt-1", listed)
        self.assertIn(generated, listed)
        self.assertGreaterEqual(c.stats().sequences, 2)

        fork = c.fork("rt-1", "rt-1/alt", tokens=5)
        self.assertEqual((fork.sequence_id, list(fork.layer_tokens)), ("rt-1/alt", [5, 5]))
        self.assertTrue(c.fork("rt-1").sequence_id.startswith("rt-1/"))
        self.assertEqual(list(c.truncate("rt-1", 3).layer_tokens), [3, 3])
        self.assertGreater(c.release(generated), 0)
        with self.assertRaises(attend.NotFound):
            c.get_sequence(generated)
        for info in c.list_sequences():
            c.release(info.sequence_id)
        self.assertEqual(c.stats().sequences, 0)

    def test_attention_calls(self):
        c, rng = self.client, np.random.default_rng(2)
        q, k, v = rand(rng, (5, 4, 8)), rand(rng, (7, 2, 8)), rand(rng, (7, 2, 8))
        r = c.attend(q, k, v, causal=True, return_weights=True, return_scores=True)
        np.testing.assert_allclose(r.output, reference_attention(q, k, v), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(r.weights.sum(axis=2), 1, rtol=1e-5)
        self.assertEqual(r.scores.shape, (4, 5, 7))
        self.assertTrue(np.isneginf(r.masked_scores[0, 0, -1]))
        m = c.multi_head_attend(n_head=2, init=dict(seed=5, n=4, d_model=8), causal=True,
                                return_weights=True, return_projections=True)
        self.assertEqual((m.output.shape, m.weights.shape, m.q.shape), ((4, 8), (2, 4, 4),
                                                                        (4, 2, 4)))
        self.assertEqual(m.parameters.wq, 64)
        x, wq = rand(rng, (3, 8)), rand(rng, (8, 8))
        m = c.multi_head_attend(x, wq, wq, wq, n_head=2)
        self.assertEqual(m.output.shape, (3, 8))
        s = c.softmax([2, 1, 0.5], jacobian=True)
        self.assertEqual([round(p, 2) for p in s.probabilities], [0.63, 0.23, 0.14])
        np.testing.assert_allclose(s.jacobian.sum(axis=1), 0, atol=1e-12)
        rows = c.scaling_experiment(seed=5).rows
        self.assertEqual([round(row.score_std, 2) for row in rows], [2.00, 8.23, 31.67])

    def test_planner_calls(self):
        c = self.client
        names = [m.name for m in c.list_models()]
        self.assertIn("llama-3-8b", names)
        model = c.get_model("llama-3-8b")
        self.assertEqual((model.layers, model.n_head_kv, model.head_dim), (32, 8, 128))
        imported = c.import_model(hf_config_json=json.dumps(dict(
            model_type="llama", num_hidden_layers=4, num_attention_heads=8,
            num_key_value_heads=2, hidden_size=512)), name="tiny")
        self.assertEqual((imported.name, imported.layers, imported.n_head_kv), ("tiny", 4, 2))
        plan = c.plan_kv_cache(model="llama-3-8b", kv_dtype="bfloat16", context_tokens=8192)
        self.assertIn("131072", str(plan))  # 2 * 32 layers * 8 heads * 128 * 2 bytes per token
        plan = c.plan_kv_cache(model=imported, kv_dtype="KV_FLOAT32", context_tokens=16)
        self.assertTrue(str(plan))
        cost = c.estimate_cost(model="llama-3-8b", prompt_tokens=1024, profile="h100")
        self.assertIn(cost.decode.bound, ("compute", "memory"))
        with self.assertRaises(attend.NotFound):
            c.get_model("no-such-model")

    def check_dtypes(self, make, dtypes, tolerance):
        """Append and attend with inputs made by make(array, dtype): the output comes back in
        the input's dtype and within the dtype's tolerance of float64 attention over the
        rounded inputs."""
        c, rng = self.client, np.random.default_rng(3)
        for dtype in dtypes:
            q, k, v = rand(rng, (5, 4, 8)), rand(rng, (5, 2, 8)), rand(rng, (5, 2, 8))
            tq, tk, tv = (make(a, dtype) for a in (q, k, v))
            rq, rk, rv = (as_float32(t) for t in (tq, tk, tv))
            expected = reference_attention(rq, rk, rv)
            sid = "dtype-%s-%s" % (type(tq).__name__, dtype)
            c.create_sequence(sid, layers=1, n_head=4, n_head_kv=2, head_dim=8,
                              kv_dtype="float32")
            for output in (c.append(sid, 0, tq, tk, tv).output,
                           c.attend(tq, tk, tv, causal=True).output,
                           c.append_batch(0, [sid], tq[:1], tk[:1], tv[:1]).output):
                self.assertEqual(type(output), type(tq))
                self.assertEqual(output.dtype, tq.dtype)
                self.assertEqual(tuple(output.shape)[1:], (4, 8))
            out = as_float32(c.attend(tq, tk, tv, causal=True).output)
            np.testing.assert_allclose(out, expected, rtol=tolerance[dtype],
                                       atol=tolerance[dtype])
            # Another output dtype on request.
            out32 = c.attend(tq, tk, tv, causal=True, output_dtype="float32").output
            self.assertEqual(as_float32(out32).dtype, np.float32)
            c.release(sid)

    def test_numpy_dtypes(self):
        def make(a, dtype):
            return {"f32": lambda: a, "f16": lambda: a.astype(np.float16),
                    "bf16": lambda: attend.float32_to_bfloat16(a)}[dtype]()
        self.check_dtypes(make, ("f32", "f16", "bf16"),
                          {"f32": 1e-4, "f16": 4e-3, "bf16": 3e-2})

    @unittest.skipIf(torch is None, "torch is not installed")
    def test_torch_dtypes(self):
        def make(a, dtype):
            return torch.from_numpy(a).to({"f32": torch.float32, "f16": torch.float16,
                                           "bf16": torch.bfloat16}[dtype])
        self.check_dtypes(make, ("f32", "f16", "bf16"),
                          {"f32": 1e-4, "f16": 4e-3, "bf16": 3e-2})

    def test_errors_carry_their_codes(self):
        c = self.client
        c.create_sequence("err-1", layers=1, n_head=2, n_head_kv=1, head_dim=4)
        cases = [(lambda: c.get_sequence("err-missing"), attend.NotFound, "err-missing"),
                 (lambda: c.create_sequence("err-1", layers=1, n_head=2, head_dim=4),
                  attend.AlreadyExists, "err-1"),
                 (lambda: c.truncate("err-1", 5), attend.OutOfRange, ""),
                 (lambda: c.append("err-1", 0, np.zeros((1, 3, 4), np.float32),
                                   np.zeros((1, 1, 4), np.float32),
                                   np.zeros((1, 1, 4), np.float32)),
                  attend.InvalidArgument, "q"),
                 (lambda: c.softmax([1, float("nan")]), attend.InvalidArgument, "")]
        for call, cls, text in cases:
            with self.assertRaises(cls) as caught:
                call()
            self.assertEqual(caught.exception.code, cls.code)
            self.assertIn(text, caught.exception.message)
        c.release("err-1")


class AppendBatch(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server("--kv_cache_bytes=512MiB")
        cls.client = attend.Client(cls.server.target, deadline=120)
        # A server whose message limit makes prompts of a few hundred tokens need several calls.
        cls.small = Server("--kv_cache_bytes=512MiB", "--max_message_bytes=1MiB")

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.server.stop()
        cls.small.stop()

    def tearDown(self):
        for client in (self.client,):
            for info in client.list_sequences():
                client.release(info.sequence_id)

    def create(self, client, ids, shape):
        for sid in ids:
            client.create_sequence(sid, **shape)

    def test_matches_per_sequence_append_on_random_ragged_batches(self):
        c = self.client
        rng = np.random.default_rng(4)
        for trial in range(4):
            n_head_kv = int(rng.choice([1, 2]))
            n_head = n_head_kv * int(rng.choice([1, 2, 4]))
            head_dim = int(rng.choice([8, 16, 32]))
            head_dim_v = int(rng.choice([head_dim, 8]))
            shape = dict(layers=2, n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim,
                         head_dim_v=head_dim_v, kv_dtype="float32")
            n = int(rng.integers(1, 6))
            batch_ids = ["ab%d-b/%d" % (trial, i) for i in range(n)]
            single_ids = ["ab%d-s/%d" % (trial, i) for i in range(n)]
            self.create(c, batch_ids + single_ids, shape)
            layer = int(rng.integers(0, 2))
            for round_ in range(2):  # a ragged prefill, then prompts and decode steps mixed
                counts = [int(rng.choice([1, rng.integers(1, 40)])) for _ in range(n)]
                rows = sum(counts)
                q = rand(rng, (rows, n_head, head_dim))
                k = rand(rng, (rows, n_head_kv, head_dim))
                v = rand(rng, (rows, n_head_kv, head_dim_v))
                result = c.append_batch(layer, batch_ids, q, k, v, counts=counts)
                self.assertEqual(result.calls, 1)
                self.assertEqual(result.output.shape, (rows, n_head, head_dim_v))
                offset = 0
                for i, count in enumerate(counts):
                    rows_i = slice(offset, offset + count)
                    single = c.append(single_ids[i], layer, q[rows_i], k[rows_i], v[rows_i])
                    np.testing.assert_allclose(result.output[rows_i], single.output, rtol=1e-5,
                                               atol=1e-6, err_msg="trial %d round %d seq %d"
                                               % (trial, round_, i))
                    self.assertEqual(result.first_positions[i], single.first_position)
                    self.assertEqual(result.layer_tokens[i], single.layer_tokens)
                    offset += count

    def test_bf16_batch_and_only_appending(self):
        c = self.client
        rng = np.random.default_rng(5)
        shape = dict(layers=1, n_head=4, n_head_kv=2, head_dim=16)  # bf16 storage
        self.create(c, ["bf/0", "bf/1", "bf/2", "bf/3"], shape)
        counts = [3, 9]
        k, v = rand(rng, (12, 2, 16)), rand(rng, (12, 2, 16))
        appended = c.append_batch(0, ["bf/0", "bf/1"], None, k, v, counts=counts)
        self.assertIsNone(appended.output)
        self.assertEqual(appended.layer_tokens, counts)
        for i, sid in enumerate(["bf/2", "bf/3"]):
            rows = slice(sum(counts[:i]), sum(counts[:i + 1]))
            c.append(sid, 0, None, k[rows], v[rows])
        q, k, v = (attend.float32_to_bfloat16(rand(rng, s)) for s in
                   ((2, 4, 16), (2, 2, 16), (2, 2, 16)))
        batch = c.append_batch(0, ["bf/0", "bf/1"], q, k, v)
        self.assertEqual(batch.output.dtype, np.uint16)
        for i, sid in enumerate(["bf/2", "bf/3"]):
            single = c.append(sid, 0, q[i:i + 1], k[i:i + 1], v[i:i + 1])
            np.testing.assert_array_equal(batch.output[i:i + 1], single.output)

    def test_bad_batches_change_nothing(self):
        c = self.client
        shape = dict(layers=1, n_head=2, n_head_kv=1, head_dim=8, kv_dtype="float32")
        self.create(c, ["bad/0", "bad/1"], shape)
        rng = np.random.default_rng(6)
        q, k, v = rand(rng, (4, 2, 8)), rand(rng, (4, 1, 8)), rand(rng, (4, 1, 8))
        c.append_batch(0, ["bad/0", "bad/1"], q, k, v, counts=[1, 3])
        cases = [(["bad/0", "bad/0"], [1, 3], attend.InvalidArgument),
                 (["bad/0", "bad/1"], [1, 2], attend.InvalidArgument),
                 (["bad/0", "bad/unknown"], [1, 3], attend.NotFound),
                 (["bad/1", "bad/0"], [2, 2], None)]  # valid: the control
        for ids, counts, error in cases:
            if error is None:
                continue
            with self.assertRaises(error):
                c.append_batch(0, ids, q, k, v, counts=counts)
            self.assertEqual([list(c.get_sequence(s).layer_tokens) for s in ("bad/0", "bad/1")],
                             [[1], [3]], ids)
        # The server refuses them on its own too (the client checks the first two itself).
        stub = kv_cache_pb2_grpc.KvCacheStub(c.channel)
        raw = kv_cache_pb2.AppendBatchRequest(
            layer=0, sequence_ids=["bad/0", "bad/0"], token_counts=[1, 3],
            k=attend.tensors.to_proto(k), v=attend.tensors.to_proto(v))
        for request in (raw, kv_cache_pb2.AppendBatchRequest(
                layer=0, sequence_ids=["bad/0", "bad/1"], token_counts=[1, 2],
                k=raw.k, v=raw.v)):
            with self.assertRaises(grpc.RpcError) as caught:
                stub.AppendBatch(request, metadata=[("x-attend-sequence-key", "bad")])
            self.assertEqual(caught.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertEqual([list(c.get_sequence(s).layer_tokens) for s in ("bad/0", "bad/1")],
                         [[1], [3]])

    def prompts(self, seed, counts, shape):
        rng = np.random.default_rng(seed)
        rows = sum(counts)
        return (rand(rng, (rows, shape["n_head"], shape["head_dim"])),
                rand(rng, (rows, shape["n_head_kv"], shape["head_dim"])),
                rand(rng, (rows, shape["n_head_kv"], shape["head_dim"])))

    def test_chunked_prefill_equals_one_call(self):
        # 3 KiB of q/k/v per token: about 330 tokens fit a 1 MiB message.
        shape = dict(layers=1, n_head=8, n_head_kv=2, head_dim=64, kv_dtype="float32")
        counts = [1200, 40, 500, 1]
        ids = ["chunk/%d" % i for i in range(len(counts))]
        q, k, v = self.prompts(7, counts, shape)
        self.create(self.client, ids, shape)
        whole = self.client.append_batch(0, ids, q, k, v, counts=counts)
        self.assertEqual(whole.calls, 1)
        with attend.Client(self.small.target, max_message_bytes=1 << 20) as small:
            try:
                self.create(small, ids, shape)
                chunked = small.append_batch(0, ids, q, k, v, counts=counts)
                self.assertGreaterEqual(chunked.calls, 6)
                np.testing.assert_allclose(chunked.output, whole.output, rtol=1e-4, atol=1e-5)
                self.assertEqual(chunked.first_positions, [0] * 4)
                self.assertEqual(chunked.layer_tokens, counts)
                # The same for Append, and a decode step after the chunked prefill agrees too.
                self.create(small, ["chunk-append"], shape)
                rows = slice(0, 1200)
                appended = small.append("chunk-append", 0, q[rows], k[rows], v[rows])
                self.assertGreater(appended.calls, 3)
                np.testing.assert_allclose(appended.output, whole.output[rows], rtol=1e-4,
                                           atol=1e-5)
                sq, sk, sv = self.prompts(8, [1], shape)
                np.testing.assert_allclose(
                    small.decode_batch(0, ["chunk/0"], sq, sk, sv).output,
                    self.client.decode_batch(0, ["chunk/0"], sq, sk, sv).output,
                    rtol=1e-4, atol=1e-5)
            finally:
                for info in small.list_sequences():
                    small.release(info.sequence_id)

    def test_a_client_learns_the_servers_lower_limit(self):
        shape = dict(layers=1, n_head=8, n_head_kv=2, head_dim=64, kv_dtype="float32")
        counts = [500, 300]
        q, k, v = self.prompts(9, counts, shape)
        with attend.Client(self.small.target) as small:  # 64 MiB: more than the server's
            try:
                self.create(small, ["learn/0", "learn/1"], shape)
                result = small.append_batch(0, ["learn/0", "learn/1"], q, k, v, counts=counts)
                self.assertGreater(result.calls, 2)
                self.assertEqual(result.layer_tokens, counts)
                self.assertEqual(small.connection.effective_message_limit(), 1 << 20)
            finally:
                for info in small.list_sequences():
                    small.release(info.sequence_id)

    def test_a_split_batch_with_an_unknown_sequence_appends_nothing(self):
        shape = dict(layers=1, n_head=8, n_head_kv=2, head_dim=64, kv_dtype="float32")
        counts = [400, 400]
        q, k, v = self.prompts(10, counts, shape)
        with attend.Client(self.small.target, max_message_bytes=1 << 20) as small:
            try:
                self.create(small, ["split/0"], shape)
                with self.assertRaises(attend.NotFound):
                    small.append_batch(0, ["split/0", "split/unknown"], q, k, v, counts=counts)
                self.assertEqual(list(small.get_sequence("split/0").layer_tokens), [0])
            finally:
                for info in small.list_sequences():
                    small.release(info.sequence_id)


class AppendBatchAsync(unittest.TestCase):
    """append_batch_async: the calls of two halves of a batch in flight together answer as
    append_batch does; a split batch (worker thread), a batch the server refuses for its size
    (learnt limit, sent again) and failures come back through result()."""

    @classmethod
    def setUpClass(cls):
        cls.server = Server("--kv_cache_bytes=512MiB")
        cls.small = Server("--kv_cache_bytes=512MiB", "--max_message_bytes=1MiB")

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        cls.small.stop()

    def test_halves_in_flight_together_match_one_synchronous_call(self):
        rng = np.random.default_rng(21)
        with attend.Client(self.server.target) as c:
            for trial in range(3):
                shape = dict(layers=2, n_head=4, n_head_kv=2, head_dim=16, kv_dtype="float32")
                n = int(rng.integers(2, 7))
                sync_ids = ["as%d-s/%d" % (trial, i) for i in range(n)]
                async_ids = ["as%d-a/%d" % (trial, i) for i in range(n)]
                for sid in sync_ids + async_ids:
                    c.create_sequence(sid, **shape)
                for layer in (0, 1, 0):  # prompts, then more tokens to the same layer
                    counts = [int(rng.integers(1, 30)) for _ in range(n)]
                    rows = sum(counts)
                    q, k, v = (rand(rng, (rows, h, 16)) for h in (4, 2, 2))
                    want = c.append_batch(layer, sync_ids, q, k, v, counts=counts)
                    half = n // 2
                    cut = sum(counts[:half])
                    first = c.append_batch_async(layer, async_ids[:half], q[:cut], k[:cut],
                                                 v[:cut], counts=counts[:half])
                    second = c.append_batch_async(layer, async_ids[half:], q[cut:], k[cut:],
                                                  v[cut:], counts=counts[half:])
                    # The arrays may change once the calls are started.
                    q[:] = 0
                    got = [second.result(), first.result()]
                    self.assertTrue(first.done() and second.done())
                    np.testing.assert_allclose(
                        np.concatenate([got[1].output, got[0].output]), want.output,
                        rtol=1e-5, atol=1e-6)
                    self.assertEqual(got[1].layer_tokens + got[0].layer_tokens,
                                     want.layer_tokens)
                    self.assertEqual(got[1].first_positions + got[0].first_positions,
                                     want.first_positions)
                    self.assertGreater(got[0].stats.compute_seconds, 0)
                for sid in sync_ids + async_ids:
                    c.release(sid)

    def test_split_and_refused_batches_and_failures(self):
        shape = dict(layers=1, n_head=8, n_head_kv=2, head_dim=64, kv_dtype="float32")
        rng = np.random.default_rng(22)
        counts = [500, 300]  # 3 KiB a token: more than a 1 MiB message
        q, k, v = (rand(rng, (800, h, 64)) for h in (8, 2, 2))
        with attend.Client(self.server.target) as big:
            for sid in ("ref/0", "ref/1"):
                big.create_sequence(sid, **shape)
            want = big.append_batch(0, ["ref/0", "ref/1"], q, k, v, counts=counts)
            for sid in ("ref/0", "ref/1"):
                big.release(sid)
        # The client knows the limit: the batch is split, on the client's worker thread.
        with attend.Client(self.small.target, max_message_bytes=1 << 20) as c:
            for sid in ("split/0", "split/1"):
                c.create_sequence(sid, **shape)
            pending = c.append_batch_async(0, ["split/0", "split/1"], q, k, v, counts=counts)
            got = pending.result(timeout=120)
            self.assertGreater(got.calls, 2)
            np.testing.assert_allclose(got.output, want.output, rtol=1e-4, atol=1e-5)
            for sid in ("split/0", "split/1"):
                c.release(sid)
        # The client does not know it: one call, refused for its size, sent again split.
        with attend.Client(self.small.target) as c:
            for sid in ("learn/0", "learn/1"):
                c.create_sequence(sid, **shape)
            got = c.append_batch_async(0, ["learn/0", "learn/1"], q, k, v,
                                       counts=counts).result()
            self.assertGreater(got.calls, 2)
            self.assertEqual(got.layer_tokens, counts)
            np.testing.assert_allclose(got.output, want.output, rtol=1e-4, atol=1e-5)
            # Failures: raised by result(), every time it is asked, and nothing applied.
            failing = c.append_batch_async(0, ["learn/0", "nobody"], q[:2], k[:2], v[:2])
            for _ in range(2):
                with self.assertRaises(attend.NotFound) as caught:
                    failing.result()
                self.assertIn("nobody", str(caught.exception))
            self.assertEqual(list(c.get_sequence("learn/0").layer_tokens), [500])
            # Bad arguments fail at once, before any call.
            with self.assertRaises(attend.InvalidArgument):
                c.append_batch_async(0, ["learn/0", "learn/0"], q[:2], k[:2], v[:2])
            for sid in ("learn/0", "learn/1"):
                c.release(sid)


class AppendBatchAsyncFaults(unittest.TestCase):
    """What an outside tester found: a split batch read the caller's arrays after
    append_batch_async returned, cancel() did not stop a split batch, and closing the client
    with calls in flight raised ValueError."""

    @classmethod
    def setUpClass(cls):
        cls.small = Server("--kv_cache_bytes=512MiB", "--max_message_bytes=1MiB")

    @classmethod
    def tearDownClass(cls):
        cls.small.stop()

    SHAPE = dict(layers=1, n_head=8, n_head_kv=2, head_dim=64, kv_dtype="float32")

    def batch(self, seed, counts):
        rng = np.random.default_rng(seed)
        rows = sum(counts)
        return [rand(rng, (rows, h, 64)) for h in (8, 2, 2)]

    def test_a_split_batch_reads_what_the_call_was_given(self):
        counts = [700, 600, 500]  # 3 KiB a token: several 1 MiB calls
        for client_limit in (1 << 20, None):  # the client knows the limit / learns it
            with attend.Client(self.small.target, **(
                    {"max_message_bytes": client_limit} if client_limit else {})) as c:
                ids = ["copy%s/%d" % (client_limit, i) for i in range(3)]
                twins = ["twin%s/%d" % (client_limit, i) for i in range(3)]
                for sid in ids + twins:
                    c.create_sequence(sid, **self.SHAPE)
                q, k, v = self.batch(31, counts)
                want = c.append_batch(0, twins, q, k, v, counts=counts)
                pending = c.append_batch_async(0, ids, q, k, v, counts=counts)
                for a in (q, k, v):
                    a[:] = 0  # allowed once the call returned
                got = pending.result(timeout=120)
                self.assertGreater(got.calls, 1)
                np.testing.assert_array_equal(got.output, want.output)
                for sid in ids + twins:
                    c.release(sid)

    def test_cancel_stops_a_split_batch_between_its_calls(self):
        counts = [1500] * 12  # about 55 calls of 1 MiB
        with attend.Client(self.small.target, max_message_bytes=1 << 20) as c:
            ids = ["cancel/%d" % i for i in range(len(counts))]
            for sid in ids:
                c.create_sequence(sid, **self.SHAPE)
            q, k, v = self.batch(32, counts)
            pending = c.append_batch_async(0, ids, q, k, v, counts=counts)
            finished = pending.done()
            cancelled = pending.cancel()
            self.assertTrue(cancelled or finished, "cancel() left a running batch running")
            if cancelled:
                with self.assertRaises(attend.Cancelled) as caught:
                    pending.result(timeout=120)
                held = {sid: c.get_sequence(sid).layer_tokens[0] for sid in ids}
                self.assertLess(sum(held.values()), sum(counts))
                self.assertEqual({s: n for s, n in held.items() if n},
                                 getattr(caught.exception, "partial", None) or {})
            for sid in ids:
                c.release(sid)

    def test_closing_the_client_with_calls_in_flight(self):
        c = attend.Client(self.small.target)
        ids = ["closing/%d" % i for i in range(4)]
        for sid in ids:
            c.create_sequence(sid, **self.SHAPE)
        q, k, v = self.batch(33, [200] * 4)
        pending = [c.append_batch_async(0, [sid], q[i * 200:(i + 1) * 200],
                                        k[i * 200:(i + 1) * 200], v[i * 200:(i + 1) * 200],
                                        counts=[200]) for i, sid in enumerate(ids)]
        c.close()
        for p in pending:
            try:
                p.result(timeout=60)
            except attend.Cancelled:
                pass  # not ValueError
        with self.assertRaises(attend.Cancelled):
            c.get_sequence(ids[0])
        with attend.Client(self.small.target) as again:
            for sid in ids:
                again.release(sid)


class Security(unittest.TestCase):
    """Mutual TLS and a bearer token, with the client's options."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="attend_py_tls_")
        script = (
            "set -e\n"
            "key() { openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \"$@\"; }\n"
            "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key "
            "-out ca.pem -days 2 -subj /CN=py-ca\n"
            "key -keyout server.key -out server.csr -subj /CN=localhost\n"
            "printf 'subjectAltName=DNS:localhost\\n' > san.ext\n"
            "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 "
            "-extfile san.ext -out server.pem\n"
            "key -keyout client.key -out client.csr -subj /CN=py-client\n"
            "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 "
            "-out client.pem\n"
            "printf 'py-token-123\\n' > token\n")
        subprocess.run(["bash", "-c", script], cwd=cls.dir, check=True, capture_output=True)
        cls.server = Server("--tls_cert=" + cls.path("server.pem"),
                            "--tls_key=" + cls.path("server.key"),
                            "--tls_client_ca=" + cls.path("ca.pem"),
                            "--auth_token_file=" + cls.path("token"))

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        shutil.rmtree(cls.dir, ignore_errors=True)

    @classmethod
    def path(cls, name):
        return os.path.join(cls.dir, name)

    def client(self, target=None, **options):
        settings = dict(tls=True, ca_cert=self.path("ca.pem"),
                        client_cert=self.path("client.pem"), client_key=self.path("client.key"),
                        deadline=20)
        settings.update(options)
        return attend.Client(target or "localhost:%d" % self.server.port,
                             **{k: v for k, v in settings.items() if v is not None})

    def test_token_and_client_certificate(self):
        with self.client(token_file=self.path("token")) as c:
            self.assertEqual(round(c.softmax([2, 1, 0.5]).probabilities[0], 2), 0.63)
        with open(self.path("ca.pem"), "rb") as f:
            ca = f.read()
        with self.client(ca_cert=ca, token="py-token-123") as c:  # PEM bytes, not a path
            self.assertEqual(c.stats().sequences, 0)

    def test_server_name_checks_the_certificate_when_dialling_an_address(self):
        with self.client("127.0.0.1:%d" % self.server.port, server_name="localhost",
                         token="py-token-123") as c:
            self.assertEqual(len(c.softmax([1, 1]).probabilities), 2)

    def test_without_the_token_only_health_answers(self):
        with self.client() as c:
            self.assertEqual(c.health(), "SERVING")
            with self.assertRaises(attend.Unauthenticated):
                c.softmax([1, 2])
        with self.client(token="wrong") as c:
            with self.assertRaises(attend.Unauthenticated):
                c.stats()

    def test_without_a_client_certificate_the_handshake_fails(self):
        with self.client(client_cert=None, client_key=None, token="py-token-123",
                         deadline=5) as c:
            with self.assertRaises((attend.Unavailable, attend.DeadlineExceeded)):
                c.softmax([1, 2])


def main():
    global ARGS
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
