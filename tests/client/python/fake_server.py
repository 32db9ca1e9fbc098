"""An in-process KvCache / Attention / Planner server for the Python client's tests: it records
each call's routing metadata and request, answers with just enough to be decoded (outputs echo
q, which has head_dim_v == head_dim in these tests), and can fail chosen calls.
"""
from concurrent import futures

import grpc

from attend.routing import SEQUENCE_KEY_METADATA
from attend.v1 import (attention_pb2, attention_pb2_grpc, kv_cache_pb2, kv_cache_pb2_grpc,
                       planner_pb2, planner_pb2_grpc, tensor_pb2)


class Recorder:
    """Calls seen: (method, routing key or None, request, request bytes)."""

    def __init__(self):
        self.calls = []
        # method -> list of (code, message) to fail its next calls with, in order; None: answer.
        self.failures = {}
        # Sequences that GetSequence knows, with their config.
        self.configs = {}
        self.tokens = {}  # sequence id -> tokens appended (layer ignored)

    def record(self, method, request, context):
        key = dict(context.invocation_metadata()).get(SEQUENCE_KEY_METADATA)
        self.calls.append((method, key, request, request.ByteSize()))
        queue = self.failures.get(method)
        if queue:
            failure = queue.pop(0)
            if failure is not None:
                context.abort(*failure)

    def keys(self, method):
        return [key for m, key, _, _ in self.calls if m == method]

    def requests(self, method):
        return [r for m, _, r, _ in self.calls if m == method]


def _info(sequence_id):
    return kv_cache_pb2.SequenceInfo(sequence_id=sequence_id)


class KvCache(kv_cache_pb2_grpc.KvCacheServicer):
    def __init__(self, recorder):
        self.r = recorder

    def CreateSequence(self, request, context):
        self.r.record("CreateSequence", request, context)
        return _info(request.sequence_id or "generated")

    def Append(self, request, context):
        self.r.record("Append", request, context)
        n = request.k.shape[0]
        first = self.r.tokens.get(request.sequence_id, 0)
        self.r.tokens[request.sequence_id] = first + n
        return kv_cache_pb2.AppendResponse(output=request.q if request.HasField("q") else None,
                                           first_position=first, layer_tokens=first + n)

    def AppendBatch(self, request, context):
        self.r.record("AppendBatch", request, context)
        response = kv_cache_pb2.AppendBatchResponse()
        if request.HasField("q"):
            response.output.CopyFrom(request.q)
            if request.output_dtype:
                response.output.dtype = request.output_dtype
        for sid, n in zip(request.sequence_ids, request.token_counts):
            first = self.r.tokens.get(sid, 0)
            self.r.tokens[sid] = first + n
            response.first_positions.append(first)
            response.layer_tokens.append(first + n)
        response.stats.attended_pairs = sum(request.token_counts)
        response.stats.engine = "fake"
        return response

    def _decode(self, request):
        response = kv_cache_pb2.DecodeBatchResponse(request_id=request.request_id)
        for step in request.steps:
            n = self.r.tokens.get(step.sequence_id, 0) + 1
            self.r.tokens[step.sequence_id] = n
            response.results.add(sequence_id=step.sequence_id, output=step.q, layer_tokens=n)
        return response

    def DecodeBatch(self, request, context):
        self.r.record("DecodeBatch", request, context)
        return self._decode(request)

    def DecodeStream(self, request_iterator, context):
        key = dict(context.invocation_metadata()).get(SEQUENCE_KEY_METADATA)
        for request in request_iterator:
            self.r.calls.append(("DecodeStream", key, request, request.ByteSize()))
            if request.layer < 0:
                yield kv_cache_pb2.DecodeBatchResponse(
                    request_id=request.request_id,
                    error=tensor_pb2.ItemError(code=3, message="layer -1"))
                continue
            yield self._decode(request)

    def Fork(self, request, context):
        self.r.record("Fork", request, context)
        return _info(request.new_id or request.source_id + "/0123456789abcdef")

    def Truncate(self, request, context):
        self.r.record("Truncate", request, context)
        return _info(request.sequence_id)

    def Release(self, request, context):
        self.r.record("Release", request, context)
        return kv_cache_pb2.ReleaseResponse(freed_bytes=4096)

    def GetSequence(self, request, context):
        self.r.record("GetSequence", request, context)
        config = self.r.configs.get(request.sequence_id)
        if config is None:
            context.abort(grpc.StatusCode.NOT_FOUND, "no sequence '%s'" % request.sequence_id)
        return kv_cache_pb2.SequenceInfo(sequence_id=request.sequence_id, config=config)

    def ListSequences(self, request, context):
        self.r.record("ListSequences", request, context)
        ids = sorted(self.r.configs)
        start = int(request.page_token or 0)
        size = request.page_size or 100
        page = ids[start:start + size]
        more = start + size < len(ids)
        return kv_cache_pb2.ListSequencesResponse(
            sequences=[_info(i) for i in page], next_page_token=str(start + size) if more else "")

    def Stats(self, request, context):
        self.r.record("Stats", request, context)
        return kv_cache_pb2.CacheStats(sequences=len(self.r.configs))


class Attention(attention_pb2_grpc.AttentionServicer):
    def __init__(self, recorder):
        self.r = recorder

    def Attend(self, request, context):
        self.r.record("Attend", request, context)
        return attention_pb2.AttendResponse(output=request.q)

    def Softmax(self, request, context):
        self.r.record("Softmax", request, context)
        return attention_pb2.SoftmaxResponse(probabilities=[1.0])


class Planner(planner_pb2_grpc.PlannerServicer):
    def __init__(self, recorder):
        self.r = recorder

    def ListModels(self, request, context):
        self.r.record("ListModels", request, context)
        return planner_pb2.ListModelsResponse(models=[planner_pb2.ModelSpec(name="tiny")])


class FakeServer:
    """Serves the fakes on a free loopback port; `max_receive` limits request sizes (gRPC then
    refuses larger ones itself, as attend-server's gRPC does)."""

    def __init__(self, max_receive=None):
        self.recorder = Recorder()
        options = []
        if max_receive:
            options.append(("grpc.max_receive_message_length", max_receive))
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=options)
        kv_cache_pb2_grpc.add_KvCacheServicer_to_server(KvCache(self.recorder), self.server)
        attention_pb2_grpc.add_AttentionServicer_to_server(Attention(self.recorder), self.server)
        planner_pb2_grpc.add_PlannerServicer_to_server(Planner(self.recorder), self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        self.target = "127.0.0.1:%d" % self.port

    def stop(self):
        self.server.stop(None)
