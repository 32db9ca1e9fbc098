#!/usr/bin/python3
"""Bad input against the real attend-server, one table across every service.

Each row is a request a careless or hostile client could send, the gRPC code a user should get
for it (INVALID_ARGUMENT for malformed input, RESOURCE_EXHAUSTED for a limit, NOT_FOUND for an
unknown id, OUT_OF_RANGE past the end of a sequence, ...) and fragments the message must hold
(the field, the shape, the limit). Limits are tested exactly at the limit (answered) and one
over (refused), on a server started with small limits so that the at-limit calls are cheap.
After every row a valid request must be answered by the same process; at the end the sequences
the test made are released and the KV cache's Stats show nothing left.
"""
import os
import queue
import signal
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lifecycle_test  # noqa: E402  (start: runs the server and reads its ports)
from bad_input_builders import (BF16_SEQ, D, FLAGS, G, H, LAYERS, MAX_SEQUENCES,  # noqa: E402
                                PB, PREFILL, SEQ, TIMEOUT, Outcome, append, seq_config,
                                step, t_pb, tensor)
from bad_input_rows import BadInputRows  # noqa: E402  (the table's rows, by service)



class BadInput(BadInputRows, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import grpc
        cls.grpc = grpc
        cls.proc, cls.port, _ = lifecycle_test.start(*FLAGS)
        options = [("grpc.max_send_message_length", 64 << 20),
                   ("grpc.max_receive_message_length", 64 << 20)]
        cls.channel = grpc.insecure_channel("127.0.0.1:%d" % cls.port, options=options)
        cls.attention = PB["attention_grpc"].AttentionStub(cls.channel)
        cls.kv = PB["kv_grpc"].KvCacheStub(cls.channel)
        cls.planner = PB["planner_grpc"].PlannerStub(cls.channel)
        cls.health = PB["health_grpc"].HealthStub(cls.channel)
        kv = PB["kv"]
        cls.kv.CreateSequence(kv.CreateSequenceRequest(
            sequence_id=SEQ, config=seq_config(layers=LAYERS, n_head=H, n_head_kv=G, head_dim=D)),
            timeout=TIMEOUT)
        for layer in range(LAYERS):
            cls.kv.Append(append(layer=layer, n=PREFILL), timeout=TIMEOUT)
        cls.kv.CreateSequence(kv.CreateSequenceRequest(
            sequence_id=BF16_SEQ, config=seq_config(kv_dtype=t_pb().BFLOAT16)), timeout=TIMEOUT)
        # A released id, so that NOT_FOUND can say so.
        cls.kv.CreateSequence(kv.CreateSequenceRequest(sequence_id="bi-gone", config=seq_config()),
                              timeout=TIMEOUT)
        cls.kv.Release(kv.ReleaseRequest(sequence_id="bi-gone"), timeout=TIMEOUT)

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        if cls.proc.poll() is None:
            cls.proc.send_signal(signal.SIGTERM)
        cls.proc.communicate(timeout=30)

    # ---- helpers the rows use ----

    def raw(self, path, data, deserializer=None):
        call = self.channel.unary_unary(path, request_serializer=None,
                                        response_deserializer=deserializer)
        return call(data, timeout=TIMEOUT)

    def stream(self, messages, raw=False):
        """Sends `messages` one at a time over one DecodeStream, each after the previous
        response; returns the responses."""
        kv = PB["kv"]
        if raw:
            method = self.channel.stream_stream(
                "/attend.v1.KvCache/DecodeStream", request_serializer=None,
                response_deserializer=kv.DecodeBatchResponse.FromString)
        else:
            method = self.kv.DecodeStream
        outbox = queue.Queue()
        responses = method(iter(outbox.get, None), timeout=TIMEOUT)
        got = []
        for message in messages:
            outbox.put(message)
            got.append(next(responses))
        outbox.put(None)
        self.assertEqual(list(responses), [])
        return got

    def create(self, sequence_id="", **config):
        kv = PB["kv"]
        reserve = config.pop("reserve_tokens", 0)
        return self.kv.CreateSequence(kv.CreateSequenceRequest(
            sequence_id=sequence_id, config=seq_config(**config), reserve_tokens=reserve),
            timeout=TIMEOUT)

    def release(self, sequence_id):
        self.kv.Release(PB["kv"].ReleaseRequest(sequence_id=sequence_id), timeout=TIMEOUT)

    def created_then_released(self, sequence_id="", **config):
        """Creates a sequence that must be accepted and releases it; returns its info."""
        info = self.create(sequence_id, **config)
        self.release(info.sequence_id)
        return info

    def fill_sequences_then(self, extra):
        """Creates sequences up to --max_sequences (every one accepted), then `extra(ctx)`;
        releases what it created."""
        kv = PB["kv"]
        have = self.kv.Stats(kv.StatsRequest(), timeout=TIMEOUT).sequences
        made = []
        try:
            for i in range(MAX_SEQUENCES - have):
                made.append(self.create("bi-fill-%d" % i).sequence_id)
            self.assertEqual(self.kv.Stats(kv.StatsRequest(), timeout=TIMEOUT).sequences,
                             MAX_SEQUENCES)
            return extra()
        finally:
            for sequence_id in made:
                self.release(sequence_id)

    def budget_then(self, extra_tokens):
        """Reserves every free block of the cache in one sequence (accepted when extra_tokens is
        0), or one token more (refused); releases what it made."""
        kv = PB["kv"]
        probe = self.created_then_released(layers=1, n_head=2, n_head_kv=1, head_dim=4)
        free = self.kv.Stats(kv.StatsRequest(), timeout=TIMEOUT).blocks_free
        info = self.create("bi-budget", layers=1, n_head=2, n_head_kv=1, head_dim=4,
                           reserve_tokens=free * probe.tokens_per_block + extra_tokens)
        self.assertEqual(self.kv.Stats(kv.StatsRequest(), timeout=TIMEOUT).blocks_free, 0)
        self.release(info.sequence_id)
        return info

    def append_when_full(self):
        """Appends to BF16_SEQ (no blocks yet) while another sequence reserves every free
        block; the refused append leaves it empty."""
        kv = PB["kv"]
        probe = self.created_then_released(layers=1, n_head=2, n_head_kv=1, head_dim=4)
        free = self.kv.Stats(kv.StatsRequest(), timeout=TIMEOUT).blocks_free
        hog = self.create("bi-hog", layers=1, n_head=2, n_head_kv=1, head_dim=4,
                          reserve_tokens=free * probe.tokens_per_block)
        try:
            self.kv.Append(kv.AppendRequest(sequence_id=BF16_SEQ, k=tensor([1, 1, 4]),
                                            v=tensor([1, 1, 4])), timeout=TIMEOUT)
        finally:
            self.release(hog.sequence_id)
            info = self.kv.GetSequence(kv.GetSequenceRequest(sequence_id=BF16_SEQ),
                                       timeout=TIMEOUT)
            self.assertEqual(list(info.layer_tokens), [0])

    def open_streams_then(self, count, extra):
        """Holds `count` DecodeStreams open (each answered once), then runs `extra()`."""
        kv = PB["kv"]
        outboxes, streams = [], []
        try:
            for i in range(count):
                outbox = queue.Queue()
                responses = self.kv.DecodeStream(iter(outbox.get, None), timeout=TIMEOUT)
                outbox.put(kv.DecodeBatchRequest(request_id=i + 1, steps=[step()]))
                first = next(responses)
                self.assertFalse(first.HasField("error"), first.error.message)
                outboxes.append(outbox)
                streams.append(responses)
            return extra()
        finally:
            for outbox in outboxes:
                outbox.put(None)
            for responses in streams:
                list(responses)
            # Undo the decode steps so that the fixture keeps its length.
            self.kv.Truncate(kv.TruncateRequest(sequence_id=SEQ, tokens=PREFILL), timeout=TIMEOUT)

    def one_more_stream(self):
        kv = PB["kv"]
        responses = self.kv.DecodeStream(iter([kv.DecodeBatchRequest(steps=[step()])]),
                                         timeout=TIMEOUT)
        got = list(responses)
        self.kv.Truncate(kv.TruncateRequest(sequence_id=SEQ, tokens=PREFILL), timeout=TIMEOUT)
        return got

    def stream_items(self, messages, raw=False, want=None):
        """The responses of one DecodeStream as an Outcome: the first error (its code and
        message), after checking that the stream went on and that each message without an
        error was applied. `want` lists, per message, whether it should fail."""
        kv = PB["kv"]
        got = self.stream(messages, raw=raw)
        self.assertEqual(len(got), len(messages))
        outcome = None
        for i, response in enumerate(got):
            failed = response.HasField("error")
            if want is not None:
                self.assertEqual(failed, want[i], "stream message %d: %s" % (i + 1, response))
            if failed and outcome is None:
                outcome = Outcome(self.grpc.StatusCode(
                    next(c for c in self.grpc.StatusCode if c.value[0] == response.error.code)),
                    response.error.message)
                if not raw:
                    self.assertEqual(response.request_id, messages[i].request_id)
                self.assertEqual(len(response.results), 0)
        self.kv.Truncate(kv.TruncateRequest(sequence_id=SEQ, tokens=PREFILL), timeout=TIMEOUT)
        return outcome or got[-1]

    # ---- the table ----

    def rows(self):
        """Every row, in order: Attention, KvCache, Planner, Health."""
        return (self.attend_shape_rows() + self.attend_value_rows() +
                self.attend_limit_rows() + self.attention_method_rows() +
                self.create_rows() + self.sequence_id_rows() + self.append_rows() +
                self.decode_rows() + self.fork_truncate_list_rows() +
                self.planner_rows() + self.import_config_rows() +
                self.import_gguf_rows() + self.health_rows())


    # ---- the test ----

    def run_row(self, r):
        try:
            response = r.call()
        except self.grpc.RpcError as e:
            return Outcome(e.code(), e.details() or "")
        if isinstance(response, Outcome):
            return response
        return Outcome(self.grpc.StatusCode.OK, "")

    def check_serving(self, after):
        self.assertIsNone(self.proc.poll(), "the server died after %r" % after)
        a = PB["attention"]
        try:
            response = self.attention.Softmax(a.SoftmaxRequest(logits=[2, 1, 0.5]), timeout=10)
        except self.grpc.RpcError as e:
            self.fail("after %r a valid request failed: %s %s" % (after, e.code(), e.details()))
        self.assertEqual([round(p, 2) for p in response.probabilities], [0.63, 0.23, 0.14])

    def test_every_bad_input_gets_its_code_and_message_and_the_server_keeps_serving(self):
        kv = PB["kv"]
        rows = self.rows()
        print("%d rows" % len(rows), file=sys.stderr)
        self.assertGreaterEqual(len(rows), 60)
        self.assertEqual(len({r.name for r in rows}), len(rows), "row names must be unique")
        failed = []
        for r in rows:
            with self.subTest(r.name):
                if r.skip:
                    self.skipTest(r.skip)
                try:
                    outcome = self.run_row(r)
                    self.assertEqual(outcome.code.name, r.code,
                                     "%s: got %s %r" % (r.name, outcome.code.name, outcome.details))
                    for fragment in r.fragments:
                        self.assertIn(fragment, outcome.details, r.name)
                    if r.code not in ("OK", "UNIMPLEMENTED"):  # gRPC's own, without one
                        self.assertTrue(outcome.details, "%s: no message" % r.name)
                        # Hostile inputs are never echoed whole.
                        self.assertLess(len(outcome.details), 2048, r.name)
                except AssertionError:
                    failed.append(r.name)
                    raise
                finally:
                    self.check_serving(r.name)
        # Every failed request left the fixtures as they were.
        info = self.kv.GetSequence(kv.GetSequenceRequest(sequence_id=SEQ), timeout=TIMEOUT)
        self.assertEqual(list(info.layer_tokens), [PREFILL] * LAYERS)
        info = self.kv.GetSequence(kv.GetSequenceRequest(sequence_id=BF16_SEQ), timeout=TIMEOUT)
        for sequence_id in (SEQ, BF16_SEQ):
            self.release(sequence_id)
        stats = self.kv.Stats(kv.StatsRequest(), timeout=TIMEOUT)
        self.assertEqual((stats.used_bytes, stats.sequences, stats.blocks_used), (0, 0, 0),
                         str(stats))
        self.assertIsNone(self.proc.poll())
        if failed:
            print("failed rows: %s" % failed, file=sys.stderr)


if __name__ == "__main__":
    lifecycle_test.main()  # parses --server and --proto for start()
