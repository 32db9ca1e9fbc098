"""Limits, fixtures, the row type and the request builders of bad_input_test.py.

PB is e2e_test's dict of generated stub modules. generate_stubs fills it in at start-up, after
this module is imported, so every builder here looks its stub module up in PB when it is
called, never at import.
"""
import collections
import struct

import numpy as np

import e2e_test

PB = e2e_test.PB

# The server's limits for this test (flags below); rows test them at and one over.
MAX_TENSOR = 65536
MAX_SCORE = 100000
MAX_MESSAGE = 2 << 20
KV_BYTES = 1 << 20
KV_BLOCK = 16384
MAX_SEQUENCES = 8
MAX_STREAMS = 4
# PlannerOptions.max_hf_config_json_bytes (docs/planner.md: config.json 1 MiB)
HF_CONFIG_LIMIT = 1 << 20
FLAGS = ["--address=127.0.0.1:0", "--metrics_address=", "--compute_threads=1",
         "--max_tensor_elements=%d" % MAX_TENSOR, "--max_score_elements=%d" % MAX_SCORE,
         "--max_message_bytes=%d" % MAX_MESSAGE, "--kv_cache_bytes=%d" % KV_BYTES,
         "--kv_block_bytes=%d" % KV_BLOCK, "--max_sequences=%d" % MAX_SEQUENCES,
         "--max_concurrent_streams=%d" % MAX_STREAMS, "--shutdown_grace=5s"]
TIMEOUT = 30

# The fixture sequence most KvCache rows aim at: 2 layers, GQA 4/2, head_dim 8, f32, 3 tokens.
SEQ, LAYERS, H, G, D, PREFILL = "bi-seq", 2, 4, 2, 8, 3
BF16_SEQ = "bi-bf16"  # 1 layer, 2/1 heads of 4, bfloat16 storage

Row = collections.namedtuple("Row", "name call code fragments skip")


def row(name, call, code, *fragments, skip=None):
    """`call(ctx)` makes the request: it returns a response (code OK), an Outcome, or raises
    grpc.RpcError. `code` is a grpc.StatusCode name."""
    return Row(name, call, code, fragments, skip)


Outcome = collections.namedtuple("Outcome", "code details")


# ---- request builders ----

def t_pb():
    return PB["tensor"]


def tensor(shape, dtype=None, fill=0.25, nbytes=None, data=None):
    """A tensor of `shape` as raw data of `dtype` (FLOAT32 default); `nbytes` cuts or pads the
    data to that length; `data` gives the bytes outright."""
    t = t_pb()
    dtype = t.FLOAT32 if dtype is None else dtype
    if data is None:
        count = int(np.prod(shape)) if all(0 < d < 1 << 24 for d in shape) else 1
        np_type = {t.FLOAT32: np.float32, t.BFLOAT16: np.uint16, t.FLOAT16: np.float16}.get(
            dtype, np.float32)
        if np_type is np.uint16:
            values = (np.full(count, fill, np.float32).view(np.uint32) >> 16).astype(np.uint16)
        else:
            values = np.full(count, fill, np_type)
        data = values.tobytes()
    if nbytes is not None:
        data = (data + b"\0" * nbytes)[:nbytes]
    return t.Tensor(dtype=dtype, shape=list(shape), data=data)


def with_value(shape, index, value, dtype=None):
    """A FLOAT32 (or FLOAT16) tensor of 0.25 with `value` at flat `index`."""
    t = t_pb()
    np_type = np.float16 if dtype == t.FLOAT16 else np.float32
    a = np.full(int(np.prod(shape)), 0.25, np_type)
    a[index] = value
    return t.Tensor(dtype=dtype or t.FLOAT32, shape=list(shape), data=a.tobytes())


def attend(q=None, k=None, v=None, **kw):
    a = PB["attention"]
    q = tensor([2, 4, 8]) if q is None else q
    k = tensor([3, 2, 8]) if k is None else k
    v = tensor([3, 2, 8]) if v is None else v
    return a.AttendRequest(q=q, k=k, v=v, **kw)


def seq_config(**kw):
    kv = PB["kv"]
    fields = dict(layers=1, n_head=2, n_head_kv=1, head_dim=4, kv_dtype=t_pb().FLOAT32)
    fields.update(kw)
    return kv.SequenceConfig(**fields)


def step(sequence_id=SEQ, n=1, q_heads=H, kv_heads=G, q=None, k=None, v=None):
    kv = PB["kv"]
    return kv.DecodeStep(sequence_id=sequence_id,
                         q=q if q is not None else tensor([n, q_heads, D]),
                         k=k if k is not None else tensor([n, kv_heads, D]),
                         v=v if v is not None else tensor([n, kv_heads, D]))


def append(sequence_id=SEQ, layer=0, n=1, **kw):
    """An Append of n tokens to the fixture's shape; keyword tensors replace q, k or v."""
    kv = PB["kv"]
    fields = dict(q=tensor([n, H, D]), k=tensor([n, G, D]), v=tensor([n, G, D]))
    fields.update(kw)
    fields = {name: value for name, value in fields.items() if value is not None}
    return kv.AppendRequest(sequence_id=sequence_id, layer=layer, **fields)


def hf_config(**overrides):
    import json
    config = {"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "hidden_size": 64}
    config.update(overrides)
    return json.dumps(config)


# GGUF: little-endian; value types 4 = uint32, 8 = string, 9 = array.
def gguf(version=3, tensors=0, kvs=0, body=b"", magic=b"GGUF"):
    return magic + struct.pack("<IQQ", version, tensors, kvs) + body


def gstr(s):
    return struct.pack("<Q", len(s)) + s


def g_kv_str(key, value):
    return gstr(key) + struct.pack("<I", 8) + gstr(value)


def g_kv_u32(key, value):
    return gstr(key) + struct.pack("<I", 4) + struct.pack("<I", value)


def varint(n):
    out = b""
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out += bytes([byte | 0x80])
        else:
            return out + bytes([byte])


def field_bytes(number, payload):
    """A length-delimited protobuf field (wire type 2)."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def padded_softmax(total):
    """A SoftmaxRequest of exactly `total` serialized bytes: logits [1, 2] and an unknown field
    (number 99) that the server skips."""
    head = PB["attention"].SoftmaxRequest(logits=[1, 2]).SerializeToString()
    for pad in range(total, 0, -1):
        extra = field_bytes(99, b"x" * pad)
        if len(head) + len(extra) == total:
            return head + extra
    raise AssertionError("cannot pad to %d" % total)


# Field 1 (the sequence_id of a ReleaseRequest or a DecodeStep) holding bytes that are not UTF-8.
BAD_UTF8_ID = field_bytes(1, b"bad-\xff\xfe")
