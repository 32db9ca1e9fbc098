#!/usr/bin/python3
"""Writes the seed corpora of tests/fuzz into tests/fuzz/corpus/<target>/seed-*.

Seeds are valid inputs that reach deep: serialized requests (python3-protobuf, with the
proto/ files compiled by protoc into a temporary directory), config.json texts, GGUF headers,
.npy files and KV-cache programs, and the minimal reproducers of what fuzzing found
(regress-*). Other files in the corpora are kept; these are rewritten. Run from anywhere: python3 tests/fuzz/make_corpus.py
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CORPUS = os.path.join(HERE, "corpus")


def load_protos():
    out = tempfile.mkdtemp(prefix="attend-protos-")
    protos = [os.path.join("attend/v1", p) for p in
              ("tensor.proto", "attention.proto", "kv_cache.proto", "planner.proto")]
    subprocess.check_call(["protoc", "-I", os.path.join(ROOT, "proto"), "--python_out", out]
                          + protos)
    sys.path.insert(0, out)
    from attend.v1 import attention_pb2, kv_cache_pb2, planner_pb2, tensor_pb2
    return attention_pb2, kv_cache_pb2, planner_pb2, tensor_pb2


def record(selector, message):
    data = message if isinstance(message, bytes) else message.SerializeToString()
    assert len(data) < 65536
    return bytes([selector]) + struct.pack("<H", len(data)) + data


def write(target, name, data, prefix="seed-"):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, prefix + name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def values(n, start=0.25):
    return [((i * 7) % 11 - 5) * start for i in range(n)]


def tensor(t, shape, dtype=None):
    m = t.Tensor()
    m.shape.extend(shape)
    n = 1
    for d in shape:
        n *= d
    v = values(n)
    if dtype is None:
        m.values.extend(v)
    elif dtype == "f32":
        m.dtype = t.FLOAT32
        m.data = struct.pack("<%df" % n, *v)
    elif dtype == "bf16":
        m.dtype = t.BFLOAT16
        m.data = b"".join(struct.pack("<f", x)[2:] for x in v)
    elif dtype == "f16":
        m.dtype = t.FLOAT16
        m.data = struct.pack("<%de" % n, *v)
    return m


def attention_seeds(a, t):
    r = a.AttendRequest(q=tensor(t, [2, 2, 4]), k=tensor(t, [3, 1, 4]), v=tensor(t, [3, 1, 4]))
    write("attention_service", "attend", record(0, r))
    r = a.AttendRequest(q=tensor(t, [3, 1, 4], "bf16"), k=tensor(t, [3, 1, 4], "bf16"),
                        v=tensor(t, [3, 1, 2], "bf16"), return_weights=True, scale=0.5,
                        output_dtype=t.FLOAT16)
    r.mask.causal = True
    r.mask.window_tokens = 2
    write("attention_service", "attend-bf16-causal", record(0, r))
    r = a.AttendRequest(q=tensor(t, [1, 4, 8], "f32"), k=tensor(t, [5, 2, 8], "f16"),
                        v=tensor(t, [5, 2, 8], "f32"), precision=t.PRECISION_BFLOAT16)
    write("attention_service", "attend-gqa-mixed", record(0, r))
    r = a.MultiHeadAttendRequest(x=tensor(t, [3, 8]), wq=tensor(t, [8, 8]), wk=tensor(t, [8, 4]),
                                 wv=tensor(t, [8, 4]), wo=tensor(t, [8, 8]), n_head=2,
                                 n_head_kv=1, return_weights=True, return_projections=True)
    r.mask.causal = True
    write("attention_service", "multi-head", record(1, r))
    write("attention_service", "softmax",
          record(2, a.SoftmaxRequest(logits=[1.0, 2.0, -3.0], temperature=0.5, jacobian=True)))
    write("attention_service", "scaling",
          record(3, a.ScalingExperimentRequest(head_dims=[4, 16], pairs=8, trials=4, keys=8,
                                               seed=7)))
    write("attention_service", "all-four",
          record(2, a.SoftmaxRequest(logits=[0.0, 1e30])) +
          record(3, a.ScalingExperimentRequest(head_dims=[1], pairs=1, trials=1, keys=1)) +
          record(0, a.AttendRequest(q=tensor(t, [1, 1, 1]), k=tensor(t, [1, 1, 1]),
                                    v=tensor(t, [1, 1, 1]))))


def kv_service_seeds(kv, t):
    cfg = kv.SequenceConfig(layers=2, n_head=2, n_head_kv=1, head_dim=4)

    def create(i, dtype=0, window=0, reserve=0):
        c = kv.SequenceConfig()
        c.CopyFrom(cfg)
        c.kv_dtype = dtype
        c.window_tokens = window
        return record(0, kv.CreateSequenceRequest(config=c, sequence_id=i, reserve_tokens=reserve))

    def append(i, layer, n, q=True, dtype=None):
        r = kv.AppendRequest(sequence_id=i, layer=layer, k=tensor(t, [n, 1, 4], dtype),
                             v=tensor(t, [n, 1, 4], dtype), return_weights=q)
        if q:
            r.q.CopyFrom(tensor(t, [n, 2, 4], dtype))
        return record(1, r)

    def decode(layer, ids, selector=2):
        r = kv.DecodeBatchRequest(layer=layer, request_id=9)
        for i in ids:
            r.steps.add(sequence_id=i, q=tensor(t, [1, 2, 4]), k=tensor(t, [1, 1, 4]),
                        v=tensor(t, [1, 1, 4]))
        return record(selector, r)

    life = (create("a") + append("a", 0, 3) + append("a", 1, 3, dtype="bf16") + decode(0, ["a"])
            + decode(1, ["a"], selector=3) + record(4, kv.ForkRequest(source_id="a", new_id="b"))
            + append("b", 0, 2, q=False) + record(5, kv.TruncateRequest(sequence_id="a", tokens=1))
            + record(7, kv.GetSequenceRequest(sequence_id="b"))
            + record(8, kv.ListSequencesRequest(page_size=1)) + record(9, kv.StatsRequest())
            + record(6, kv.ReleaseRequest(sequence_id="a")))
    write("kv_cache_service", "lifecycle", life)
    write("kv_cache_service", "int8-window",
          create("w", dtype=t.INT8, window=4, reserve=8) + append("w", 0, 6) + append("w", 1, 6)
          + decode(0, ["w"]) + record(4, kv.ForkRequest(source_id="w", new_id="x", tokens=5))
          + decode(0, ["w", "x"]))
    write("kv_cache_service", "f32-batch",
          create("p", dtype=t.FLOAT32) + create("q", dtype=t.FLOAT32) + append("p", 0, 1)
          + append("q", 0, 2, dtype="f32") + decode(0, ["p", "q"]) + decode(0, ["p", "q"], 3))
    write("kv_cache_service", "reserve-too-much", create("r", reserve=1 << 20))
    write("kv_cache_service", "stats", record(9, kv.StatsRequest()))

    # Found by fuzzing: int8 rows whose largest magnitude is below 127 / FLT_MAX were quantized
    # by +inf (zeros became NaN, undefined when converted to int8; UBSan aborts).
    tiny = [1e-38, 5e-39, 0.0, -1e-38]
    c = kv.SequenceConfig(layers=1, n_head=1, n_head_kv=1, head_dim=4, kv_dtype=t.INT8)
    r = kv.AppendRequest(sequence_id="t", q=t.Tensor(shape=[1, 1, 4], values=[0.0] * 4),
                         k=t.Tensor(shape=[1, 1, 4], values=tiny),
                         v=t.Tensor(shape=[1, 1, 4], values=tiny))
    write("kv_cache_service", "int8-tiny-row",
          record(0, kv.CreateSequenceRequest(config=c, sequence_id="t")) + record(1, r),
          prefix="regress-")


def hf_configs():
    llama = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
             "intermediate_size": 14336, "max_position_embeddings": 8192,
             "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
             "vocab_size": 128256, "torch_dtype": "bfloat16", "tie_word_embeddings": False,
             "_name_or_path": "meta-llama/Meta-Llama-3-8B"}
    mistral = {"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336,
               "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
               "vocab_size": 32000, "sliding_window": 4096, "torch_dtype": "bfloat16",
               "max_position_embeddings": 32768}
    qwen2 = {"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864,
             "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
             "vocab_size": 151936, "use_sliding_window": True, "sliding_window": 32768,
             "max_window_layers": 21, "tie_word_embeddings": True, "torch_dtype": "bfloat16"}
    gemma2 = {"model_type": "gemma2", "hidden_size": 2304, "intermediate_size": 9216,
              "num_attention_heads": 8, "num_hidden_layers": 26, "num_key_value_heads": 4,
              "head_dim": 256, "vocab_size": 256000, "sliding_window": 4096,
              "torch_dtype": "float32"}
    gemma3 = {"model_type": "gemma3", "text_config": {
        "model_type": "gemma3_text", "hidden_size": 2560, "intermediate_size": 10240,
        "num_attention_heads": 8, "num_hidden_layers": 6, "num_key_value_heads": 4,
        "head_dim": 256, "sliding_window": 1024, "sliding_window_pattern": 6,
        "vocab_size": 262208}}
    layer_types = dict(mistral, num_hidden_layers=4,
                       layer_types=["sliding_attention", "full_attention"] * 2)
    mixtral = dict(mistral, model_type="mixtral", num_local_experts=8, num_experts_per_tok=2)
    falcon = {"model_type": "falcon", "hidden_size": 4544, "n_head": 71, "n_layer": 32,
              "multi_query": True, "vocab_size": 65024, "parallel_attn": True}
    refined = {"model_type": "RefinedWeb", "hidden_size": 8192, "n_head": 128, "n_layer": 60,
               "n_head_kv": 8, "vocab_size": 65024}
    # Layer kinds other than plain attention (planner/import/hf_layers.h), small shapes.
    deepseek = {"model_type": "deepseek_v3", "hidden_size": 512, "num_attention_heads": 8,
                "num_key_value_heads": 8, "num_hidden_layers": 4, "kv_lora_rank": 64,
                "qk_rope_head_dim": 16, "qk_nope_head_dim": 32, "v_head_dim": 32,
                "n_routed_experts": 8, "num_experts_per_tok": 2, "vocab_size": 1000}
    jamba = {"model_type": "jamba", "hidden_size": 256, "num_attention_heads": 8,
             "num_key_value_heads": 2, "num_hidden_layers": 8, "attn_layer_period": 4,
             "attn_layer_offset": 2, "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_expand": 2}
    qwen_next = {"model_type": "qwen3_next", "hidden_size": 256, "num_attention_heads": 4,
                 "num_key_value_heads": 2, "head_dim": 64, "num_hidden_layers": 8,
                 "full_attention_interval": 4, "linear_conv_kernel_dim": 4,
                 "linear_key_head_dim": 32, "linear_value_head_dim": 32,
                 "linear_num_key_heads": 4, "linear_num_value_heads": 8}
    nemotron_h = {"model_type": "nemotron_h", "hidden_size": 256, "num_attention_heads": 4,
                  "num_key_value_heads": 2, "head_dim": 64, "hybrid_override_pattern": "M-M*",
                  "mamba_num_heads": 8, "mamba_head_dim": 64, "ssm_state_size": 16,
                  "n_groups": 2, "conv_kernel": 4}
    mamba2 = {"model_type": "mamba2", "hidden_size": 256, "num_hidden_layers": 4,
              "num_heads": 8, "head_dim": 64, "expand": 2, "state_size": 16, "n_groups": 1,
              "conv_kernel": 4, "time_step_limit": [0.0, float("inf")]}
    return {"llama3": llama, "mistral": mistral, "qwen2": qwen2, "gemma2": gemma2,
            "gemma3": gemma3, "layer-types": layer_types, "mixtral": mixtral,
            "falcon": falcon, "refinedweb": refined, "deepseek-v3": deepseek, "jamba": jamba,
            "qwen3-next": qwen_next, "nemotron-h": nemotron_h, "mamba2": mamba2}


GGUF_U8, GGUF_I8, GGUF_U16, GGUF_I16, GGUF_U32, GGUF_I32, GGUF_F32, GGUF_BOOL, GGUF_STRING, \
    GGUF_ARRAY, GGUF_U64, GGUF_I64, GGUF_F64 = range(13)


def gguf_string(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def gguf(kvs, version=3, tensors=0):
    """kvs: (key, type, packed value bytes) triples."""
    body = b"".join(gguf_string(k) + struct.pack("<I", ty) + v for k, ty, v in kvs)
    return b"GGUF" + struct.pack("<IQQ", version, tensors, len(kvs)) + body


def u32(k, v):
    return (k, GGUF_U32, struct.pack("<I", v))


def arr(k, ty, fmt, vs):
    return (k, GGUF_ARRAY, struct.pack("<IQ", ty, len(vs)) + b"".join(struct.pack(fmt, x)
                                                                      for x in vs))


def gguf_headers():
    def arch(name, layers=4, heads=8, kv=2, embed=256):
        return [("general.architecture", GGUF_STRING, gguf_string(name)),
                ("general.name", GGUF_STRING, gguf_string("tiny " + name)),
                u32("general.file_type", 1), u32(name + ".block_count", layers),
                u32(name + ".embedding_length", embed), u32(name + ".context_length", 2048),
                u32(name + ".feed_forward_length", 4 * embed),
                u32(name + ".attention.head_count", heads),
                u32(name + ".attention.head_count_kv", kv)]
    tokens = ("tokenizer.ggml.tokens", GGUF_ARRAY,
              struct.pack("<IQ", GGUF_STRING, 4) + b"".join(gguf_string(s)
                                                            for s in ["a", "b", "c", "d"]))
    nested = ("x.nested", GGUF_ARRAY, struct.pack("<IQ", GGUF_ARRAY, 2)
              + struct.pack("<IQ", GGUF_U8, 2) + b"\x01\x02" + struct.pack("<IQ", GGUF_U8, 0))
    every = [("x.u8", GGUF_U8, b"\x01"), ("x.i8", GGUF_I8, b"\xff"),
             ("x.u16", GGUF_U16, b"\x01\x00"), ("x.i16", GGUF_I16, b"\xff\xff"),
             ("x.i32", GGUF_I32, struct.pack("<i", -1)), ("x.f32", GGUF_F32, struct.pack("<f", 1)),
             ("x.bool", GGUF_BOOL, b"\x01"), ("x.u64", GGUF_U64, struct.pack("<Q", 1)),
             ("x.i64", GGUF_I64, struct.pack("<q", -1)), ("x.f64", GGUF_F64, struct.pack("<d", 2))]
    return {
        "llama": gguf(arch("llama") + [u32("llama.vocab_size", 32000)]),
        "deepseek2-mla": gguf(arch("deepseek2", kv=1) + [
            u32("deepseek2.attention.kv_lora_rank", 64), u32("deepseek2.rope.dimension_count", 16),
            u32("deepseek2.attention.key_length", 80), u32("deepseek2.attention.value_length", 64),
            u32("deepseek2.attention.key_length_mla", 48),
            u32("deepseek2.attention.value_length_mla", 32)]),
        "jamba-ssm": gguf(arch("jamba")[:-1] + [
            arr("jamba.attention.head_count_kv", GGUF_U32, "<I", [0, 2, 0, 0]),
            u32("jamba.ssm.conv_kernel", 4), u32("jamba.ssm.inner_size", 512),
            u32("jamba.ssm.state_size", 16)]),
        "llama-v2-tokens": gguf(arch("llama") + [tokens], version=2),
        "per-layer-kv": gguf(arch("llama")[:-1] + [arr("llama.attention.head_count_kv", GGUF_U32,
                                                       "<I", [2, 4, 2, 8])]),
        "gemma2-window": gguf(arch("gemma2") + [u32("gemma2.attention.sliding_window", 512),
                                                u32("gemma2.attention.key_length", 64),
                                                u32("gemma2.attention.value_length", 32)]),
        "gemma3-pattern": gguf(arch("gemma3") + [u32("gemma3.attention.sliding_window", 128),
                                                 arr("gemma3.attention.sliding_window_pattern",
                                                     GGUF_BOOL, "<?", [True, False, True, True])]),
        "moe": gguf(arch("qwen2moe") + [u32("qwen2moe.expert_count", 8),
                                        u32("qwen2moe.expert_used_count", 2)]),
        "every-type": gguf(arch("llama") + every + [nested]),
    }


def npy(descr, shape, payload, version=1):
    shape_text = "(" + "".join("%d, " % d for d in shape).rstrip(" ")
    shape_text = (shape_text[:-1] if len(shape) > 1 else shape_text) + ")"
    header = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape_text)
    length_bytes = 2 if version == 1 else 4
    pad = (-(10 + (length_bytes - 2) + len(header) + 1)) % 64
    header = header + " " * pad + "\n"
    length = struct.pack("<H" if version == 1 else "<I", len(header))
    return b"\x93NUMPY" + bytes([version, 0]) + length + header.encode() + payload


def npy_files():
    return {
        "f4-2x3": npy("<f4", [2, 3], struct.pack("<6f", *values(6))),
        "f8-4": npy("<f8", [4], struct.pack("<4d", 1e300, -0.0, 1.5, float("nan"))),
        "f2-v2-2x2": npy("<f2", [2, 2], struct.pack("<4e", 1, 2, 65504, -1), version=2),
        "f4-v3-scalar": npy("<f4", [], struct.pack("<f", 3.0), version=3),
        "f4-empty": npy("<f4", [0, 3], b""),
    }


def json_inputs():
    def t(shape):
        n = 1
        for d in shape:
            n *= d
        return {"shape": shape, "values": values(n)}
    attend = {"q": t([2, 2, 4]), "k": t([3, 1, 4]), "v": t([3, 1, 4]),
              "mask": {"causal": True, "window_tokens": 2}, "scale": 0.5}
    mha = {"x": t([3, 8]), "wq": t([8, 8]), "wk": t([8, 4]), "wv": t([8, 4]), "wo": t([8, 8]),
           "n_head": 2, "n_head_kv": 1, "mask": {"causal": False}}
    return {"attend": b"\x00" + json.dumps(attend, indent=1).encode(),
            "attend-minimal": b"\x00" + json.dumps({"q": t([1, 1, 1]), "k": t([1, 1, 1]),
                                                    "v": t([1, 1, 1])}).encode(),
            "multi-head": b"\x01" + json.dumps(mha).encode(),
            "multi-head-no-wo": b"\x01" + json.dumps({k: v for k, v in mha.items()
                                                     if k != "wo"}).encode()}


def planner_seeds(p):
    write("planner_service", "list", record(0, p.ListModelsRequest()))
    write("planner_service", "get", record(1, p.GetModelRequest(name="llama-3-8b")))
    write("planner_service", "import-hf",
          record(2, p.ImportModelRequest(hf_config_json=json.dumps(hf_configs()["gemma2"]))))
    write("planner_service", "import-gguf",
          record(2, p.ImportModelRequest(gguf=gguf_headers()["per-layer-kv"], name="tiny")))
    r = p.PlanKvCacheRequest(kv_dtype=p.KV_Q8_0, context_tokens=8192, batch=4, block_tokens=16,
                             memory_budget_bytes=80 << 30, subtract_weights=True,
                             weights_dtype="bfloat16")
    r.model.name = "mistral-7b"
    write("planner_service", "plan-name", record(3, r))
    spec = p.ModelSpec(name="mine", layers=4, n_head=8, n_head_kv=2, head_dim=64, d_model=512,
                       vocab_size=1000, intermediate_size=2048, max_context_tokens=4096,
                       parameters=20_000_000, weights_dtype="bfloat16")
    spec.layer_specs.add(n_head_kv=2, window_tokens=128)
    for _ in range(3):
        spec.layer_specs.add()
    r = p.PlanKvCacheRequest(context_tokens=1000, weights_bytes=1 << 20, subtract_weights=True,
                             memory_budget_bytes=1 << 30)
    r.model.spec.CopyFrom(spec)
    write("planner_service", "plan-spec", record(3, r))
    r = p.EstimateCostRequest(prompt_tokens=512, context_tokens=1024, batch=2, profile="h100",
                              compute_dtype="fp8", kv_dtype=p.KV_INT8)
    r.model.name = "llama-3-70b"
    write("planner_service", "cost-profile", record(4, r))
    r = p.EstimateCostRequest(prompt_tokens=16, non_causal=True)
    r.model.spec.CopyFrom(spec)
    r.custom.CopyFrom(p.HardwareProfile(name="box", peak_flops_f32=1e12, peak_flops_bf16=2e12,
                                        peak_flops_fp8=4e12,
                                        memory_bandwidth_bytes_per_second=1e11,
                                        memory_bytes=1 << 34))
    write("planner_service", "cost-custom", record(4, r))


# KV-cache programs: a header (flags, capacity, shape, window and magnitude), then
# (op | id << 3, a, b) triples; see kv_cache_fuzz.cc.
KV_CREATE, KV_APPEND, KV_DECODE, KV_FORK, KV_TRUNCATE, KV_RELEASE, KV_ALL_LAYERS, KV_LIST = range(8)


def op(o, i, a=0, b=0):
    return bytes([o | (i << 3), a, b])


def kv_life():
    return (op(KV_CREATE, 0, 4) + op(KV_APPEND, 0, 0, 0x83) + op(KV_ALL_LAYERS, 0, 5, 1)
            + op(KV_DECODE, 0, 0, 0b0001) + op(KV_FORK, 0, 1) + op(KV_ALL_LAYERS, 1, 2, 1)
            + op(KV_DECODE, 0, 1, 0b0011) + op(KV_TRUNCATE, 0, 2) + op(KV_LIST, 0, 1)
            + op(KV_RELEASE, 0) + op(KV_ALL_LAYERS, 1, 1, 0))


def kv_programs():
    create, append, decode, fork, trunc, release, all_layers, lst = range(8)
    life = kv_life()
    evict = b"".join(op(create, i) + op(all_layers, i, 15, 1) for i in range(4))
    return {
        "bf16-lifecycle": bytes([2, 60, 0b0111, 0]) + life,
        "int8-window": bytes([4 | 8, 60, 0b1011, 3]) + life,
        "f32-lru-evicts": bytes([1, 0, 0b1111, 0]) + evict,
        "none-full": bytes([0, 0, 0b1111, 0]) + evict,
        "bf16-subnormal": bytes([2, 60, 0b1111, 0xF0]) + life,
        "f32-large": bytes([0, 60, 0b0101, 0x00]) + life,
        "fork-prefix": bytes([2, 20, 1, 0]) + op(create, 2) + op(all_layers, 2, 9, 0)
        + op(fork, 2, 3, 0x80 | 4) + op(all_layers, 3, 1, 1) + op(fork, 3, 0, 0x80 | 40)
        + op(decode, 0, 0, 0b11100),
    }


def main():
    attention_pb2, kv_cache_pb2, planner_pb2, tensor_pb2 = load_protos()
    attention_seeds(attention_pb2, tensor_pb2)
    kv_service_seeds(kv_cache_pb2, tensor_pb2)
    planner_seeds(planner_pb2)
    for name, cfg in hf_configs().items():
        write("hf_config", name + ".json", json.dumps(cfg, indent=2))
    for name, data in gguf_headers().items():
        write("gguf", name + ".gguf", data)
    for name, data in npy_files().items():
        write("npy", name + ".npy", data)
    for name, data in json_inputs().items():
        write("json_input", name, data)
    for name, data in kv_programs().items():
        write("kv_cache", name, data)
    # Found by fuzzing: int8 rows below 127 / FLT_MAX were stored as +-127 (and zeros as NaN).
    write("kv_cache", "int8-tiny-values", bytes([4, 60, 0b0111, 0xF0]) + kv_life(), "regress-")


if __name__ == "__main__":
    main()
