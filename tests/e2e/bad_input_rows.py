"""The rows of bad_input_test.py's table, one method per service and topic.

BadInputRows is a mixin of BadInput: its methods use the stubs (self.attention, self.kv,
self.planner, self.health) and the helpers (self.raw, self.create, self.stream_items, ...)
that BadInput sets up, and BadInput.rows() joins them in order into one table.
"""
import struct

from bad_input_builders import (BAD_UTF8_ID, BF16_SEQ, D, G, H, HF_CONFIG_LIMIT, MAX_MESSAGE,
                                MAX_STREAMS, MAX_TENSOR, PB, SEQ, TIMEOUT, attend, append,
                                field_bytes, g_kv_str, g_kv_u32, gguf, gstr, hf_config,
                                padded_softmax, row, seq_config, step, tensor, with_value)

T = TIMEOUT
IA, RE, NF, OOR = ("INVALID_ARGUMENT", "RESOURCE_EXHAUSTED", "NOT_FOUND", "OUT_OF_RANGE")
nan, inf = float("nan"), float("inf")


class BadInputRows:
    def attend_shape_rows(self):
        """Attention.Attend: shapes, byte lengths and dtypes."""
        a, t, at = PB["attention"], PB["tensor"], self.attention
        return [
            # --- Attention.Attend: shapes ---
            row("attend: q missing", lambda: at.Attend(a.AttendRequest(
                k=tensor([3, 2, 8]), v=tensor([3, 2, 8])), timeout=T), IA, "q: missing",
                "[n_q, n_head, head_dim]"),
            row("attend: q shape empty", lambda: at.Attend(attend(
                q=t.Tensor(dtype=t.FLOAT32, data=b"\0" * 4)), timeout=T), IA, "q.shape: empty"),
            row("attend: q rank 2", lambda: at.Attend(attend(q=tensor([2, 32])), timeout=T),
                IA, "q.shape [2, 32]", "rank 3"),
            row("attend: zero dimension", lambda: at.Attend(attend(
                k=t.Tensor(dtype=t.FLOAT32, shape=[0, 2, 8], data=b"\0")), timeout=T), IA,
                "k.shape [0, 2, 8]", "dimension 0 is 0"),
            row("attend: negative dimension", lambda: at.Attend(attend(
                v=t.Tensor(dtype=t.FLOAT32, shape=[3, -2, 8], data=b"\0")), timeout=T), IA,
                "v.shape [3, -2, 8]", "dimension 1 is -2"),
            row("attend: head_dim mismatch", lambda: at.Attend(attend(
                k=tensor([3, 2, 16])), timeout=T), IA, "k.shape[2] (head_dim) is 16",
                "q.shape[2] is 8", "q [2, 4, 8], k [3, 2, 16], v [3, 2, 8]"),
            row("attend: v tokens differ from k", lambda: at.Attend(attend(
                v=tensor([5, 2, 8])), timeout=T), IA, "v.shape[0:2] is [5, 2]",
                "k.shape[0:2] is [3, 2]"),
            row("attend: n_head not a multiple of n_head_kv", lambda: at.Attend(attend(
                q=tensor([2, 6, 8]), k=tensor([3, 4, 8]), v=tensor([3, 4, 8])), timeout=T), IA,
                "n_head 6", "n_head_kv 4"),
            # --- byte lengths and dtypes ---
            row("attend: f32 data 4 bytes short", lambda: at.Attend(attend(
                q=tensor([2, 4, 8], nbytes=252)), timeout=T), IA, "q.data: 252 bytes",
                "[2, 4, 8]", "needs 256"),
            row("attend: bf16 data 2 bytes long", lambda: at.Attend(attend(
                k=tensor([3, 2, 8], dtype=t.BFLOAT16, nbytes=98)), timeout=T), IA,
                "k.data: 98 bytes", "needs 96"),
            row("attend: f16 data sized as f32", lambda: at.Attend(attend(
                v=tensor([3, 2, 8], dtype=t.FLOAT16, nbytes=192)), timeout=T), IA,
                "v.data: 192 bytes", "needs 96"),
            row("attend: both data and values", lambda: at.Attend(attend(
                q=t.Tensor(shape=[2, 4, 8], data=b"\0" * 256, values=[0.0] * 64)), timeout=T),
                IA, "q: both data", "set exactly one"),
            row("attend: neither data nor values", lambda: at.Attend(attend(
                k=t.Tensor(shape=[3, 2, 8])), timeout=T), IA, "k: neither data nor values",
                "[3, 2, 8]"),
            row("attend: values with dtype BFLOAT16", lambda: at.Attend(attend(
                q=t.Tensor(dtype=t.BFLOAT16, shape=[2, 4, 8], values=[0.0] * 64)), timeout=T),
                IA, "q: values are float32", "bfloat16"),
            row("attend: values count differs from the shape", lambda: at.Attend(attend(
                q=t.Tensor(shape=[2, 4, 8], values=[0.0] * 63)), timeout=T), IA,
                "q.values: 63 values", "has 64 elements"),
            row("attend: unknown tensor dtype 99", lambda: at.Attend(attend(
                q=tensor([2, 4, 8], dtype=99, nbytes=256)), timeout=T), IA,
                "q.dtype: unknown value 99"),
            row("attend: INT8 as a tensor dtype", lambda: at.Attend(attend(
                v=tensor([3, 2, 8], dtype=t.INT8, nbytes=48)), timeout=T), IA, "v.dtype: INT8",
                "storage type"),
        ]

    def attend_value_rows(self):
        """Attention.Attend: 64-bit products, NaN and infinities, unknown enum values."""
        a, t, at = PB["attention"], PB["tensor"], self.attention
        return [
            # --- 64-bit products ---
            row("attend: element count overflows int64", lambda: at.Attend(attend(
                q=tensor([1 << 32, 1 << 32, 2], nbytes=16)), timeout=T), IA, "q.shape",
                "overflows 64 bits"),
            row("attend: product that wraps to the data length", lambda: at.Attend(attend(
                q=tensor([(1 << 62) + 1, 4, 1], nbytes=16)), timeout=T), IA,
                "q.shape [4611686018427387905, 4, 1]", "overflows 64 bits"),
            row("attend: int64 max dimension", lambda: at.Attend(attend(
                k=tensor([(1 << 63) - 1, 2, 8], nbytes=64)), timeout=T), IA, "k.shape",
                "overflows 64 bits"),
            # --- NaN and infinities ---
            row("attend: NaN in q (f32 data)", lambda: at.Attend(attend(
                q=with_value([2, 4, 8], 3, nan)), timeout=T), IA,
                "q holds a non-finite value (NaN) at element 3"),
            row("attend: +inf in k", lambda: at.Attend(attend(
                k=with_value([3, 2, 8], 47, inf)), timeout=T), IA,
                "k holds a non-finite value (+inf) at element 47"),
            row("attend: -inf in v (f16 data)", lambda: at.Attend(attend(
                q=tensor([2, 4, 8], dtype=t.FLOAT16), k=tensor([3, 2, 8], dtype=t.FLOAT16),
                v=with_value([3, 2, 8], 0, -inf, dtype=t.FLOAT16)), timeout=T), IA,
                "v holds a non-finite value (-inf) at element 0"),
            row("attend: NaN in values", lambda: at.Attend(attend(
                q=t.Tensor(shape=[1, 1, 2], values=[0.5, nan]), k=t.Tensor(
                    shape=[1, 1, 2], values=[1, 1]), v=t.Tensor(shape=[1, 1, 2], values=[1, 1])),
                timeout=T), IA, "q holds a non-finite value (NaN) at element 1"),
            row("attend: scores that overflow float32", lambda: at.Attend(attend(
                q=tensor([1, 1, 8], fill=3e38), k=tensor([1, 1, 8], fill=3e38),
                v=tensor([1, 1, 8])), timeout=T), IA, "finite"),
            row("attend: NaN scale", lambda: at.Attend(attend(scale=nan), timeout=T), IA,
                "scale: nan", "finite"),
            row("attend: infinite scale", lambda: at.Attend(attend(scale=inf), timeout=T), IA,
                "scale: inf", "finite"),
            row("attend: negative window", lambda: at.Attend(attend(
                mask=a.MaskOptions(window_tokens=-1)), timeout=T), IA, "window", "-1"),
            # --- unknown enum values ---
            row("attend: unknown precision 7", lambda: at.Attend(attend(precision=7), timeout=T),
                IA, "precision: unknown value 7"),
            row("attend: unknown output_dtype 42", lambda: at.Attend(attend(output_dtype=42),
                                                                    timeout=T), IA,
                "output_dtype", "42"),
            row("attend: INT8 output_dtype", lambda: at.Attend(attend(output_dtype=t.INT8),
                                                              timeout=T), IA,
                "output_dtype", "INT8"),
            row("attend: output beyond float16", lambda: at.Attend(attend(
                v=tensor([3, 2, 8], fill=1e5), output_dtype=t.FLOAT16), timeout=T), IA,
                "output: element 0 is 100000", "float16"),
        ]

    def attend_limit_rows(self):
        """Attention: limits at and one over, unparseable bytes."""
        a, at = PB["attention"], self.attention
        return [
            # --- limits, at and one over ---
            row("attend: q at the tensor limit", lambda: at.Attend(attend(
                q=tensor([16, 1, MAX_TENSOR // 16]), k=tensor([1, 1, MAX_TENSOR // 16]),
                v=tensor([1, 1, 1])), timeout=T), "OK"),
            row("attend: q one over the tensor limit", lambda: at.Attend(attend(
                q=tensor([MAX_TENSOR + 1, 1, 1]), k=tensor([1, 1, 1]), v=tensor([1, 1, 1])),
                timeout=T), RE, "q.shape [65537, 1, 1]", "65537 elements",
                "over the limit of 65536"),
            row("attend: scores at the limit", lambda: at.Attend(attend(
                q=tensor([10, 1, 1]), k=tensor([10000, 1, 1]), v=tensor([10000, 1, 1])),
                timeout=T), "OK"),
            row("attend: scores one over the limit", lambda: at.Attend(attend(
                q=tensor([11, 1, 1]), k=tensor([9091, 1, 1]), v=tensor([9091, 1, 1])),
                timeout=T), RE, "1 x 11 x 9091", "over the limit of 100000"),
            row("attend: response over --max_message_bytes", lambda: at.Attend(attend(
                q=tensor([64, 64, 1]), k=tensor([1, 64, 1]), v=tensor([1, 64, 1024])),
                timeout=T), RE, "16777216 bytes of output", "maximum message size of 2097152"),
            row("softmax: request exactly --max_message_bytes", lambda: self.raw(
                "/attend.v1.Attention/Softmax", padded_softmax(MAX_MESSAGE),
                a.SoftmaxResponse.FromString), "OK"),
            row("softmax: request one byte over --max_message_bytes", lambda: self.raw(
                "/attend.v1.Attention/Softmax", padded_softmax(MAX_MESSAGE + 1),
                a.SoftmaxResponse.FromString), RE, "2097153", "2097152"),
            # --- unparseable bytes ---
            row("attend: garbage bytes", lambda: self.raw(
                "/attend.v1.Attention/Attend", b"\xff\xff\xff\xff"), IA,
                "could not parse the request", "attend.v1.AttendRequest"),
            row("attend: truncated message", lambda: self.raw(
                "/attend.v1.Attention/Attend", attend().SerializeToString()[:-5]), IA,
                "could not parse the request", "attend.v1.AttendRequest"),
            row("unknown method", lambda: self.raw("/attend.v1.Attention/Nope", b""),
                "UNIMPLEMENTED"),
        ]

    def attention_method_rows(self):
        """Attention.MultiHeadAttend, Softmax and ScalingExperiment."""
        a, at = PB["attention"], self.attention
        return [
            # --- MultiHeadAttend ---
            row("mha: x missing", lambda: at.MultiHeadAttend(a.MultiHeadAttendRequest(
                wq=tensor([8, 8]), wk=tensor([8, 8]), wv=tensor([8, 8]), n_head=2), timeout=T),
                IA, "x: missing"),
            row("mha: x rank 3", lambda: at.MultiHeadAttend(a.MultiHeadAttendRequest(
                x=tensor([2, 2, 8]), wq=tensor([8, 8]), wk=tensor([8, 8]), wv=tensor([8, 8]),
                n_head=2), timeout=T), IA, "x.shape [2, 2, 8]", "rank 2"),
            row("mha: n_head 0", lambda: at.MultiHeadAttend(a.MultiHeadAttendRequest(
                x=tensor([2, 8]), wq=tensor([8, 8]), wk=tensor([8, 8]), wv=tensor([8, 8]),
                n_head=0), timeout=T), IA, "n_head: 0"),
            row("mha: n_head_kv does not divide n_head", lambda: at.MultiHeadAttend(
                a.MultiHeadAttendRequest(x=tensor([2, 8]), wq=tensor([8, 12]),
                                         wk=tensor([8, 8]), wv=tensor([8, 8]), n_head=3,
                                         n_head_kv=2), timeout=T), IA, "n_head_kv"),
            row("mha: wq rows differ from d_model", lambda: at.MultiHeadAttend(
                a.MultiHeadAttendRequest(x=tensor([2, 8]), wq=tensor([6, 8]), wk=tensor([8, 8]),
                                         wv=tensor([8, 8]), n_head=2), timeout=T), IA, "wq"),
            row("mha: n_head x n x n one over the score limit", lambda: at.MultiHeadAttend(
                a.MultiHeadAttendRequest(x=tensor([317, 2]), wq=tensor([2, 1]),
                                         wk=tensor([2, 1]), wv=tensor([2, 1]), n_head=1),
                timeout=T), RE, "1 x 317 x 317", "over the limit of 100000"),
            # --- MultiHeadAttend: init (inputs drawn as the lessons draw them) ---
            row("mha: init together with x", lambda: at.MultiHeadAttend(
                a.MultiHeadAttendRequest(init=a.LessonInit(seed=1, n=4, d_model=4, head_dim=2),
                                         x=tensor([4, 4]), n_head=1), timeout=T), IA,
                "init and x are both set"),
            row("mha: init n 0", lambda: at.MultiHeadAttend(a.MultiHeadAttendRequest(
                init=a.LessonInit(n=0, d_model=4), n_head=1), timeout=T), IA, "init.n: 0",
                ">= 1"),
            row("mha: init negative d_model", lambda: at.MultiHeadAttend(
                a.MultiHeadAttendRequest(init=a.LessonInit(n=4, d_model=-4), n_head=1),
                timeout=T), IA, "init.d_model: -4"),
            row("mha: init stddev NaN", lambda: at.MultiHeadAttend(a.MultiHeadAttendRequest(
                init=a.LessonInit(n=4, d_model=4, stddev=nan), n_head=1), timeout=T), IA,
                "init.stddev: nan", "finite and > 0"),
            row("mha: init stddev inf", lambda: at.MultiHeadAttend(a.MultiHeadAttendRequest(
                init=a.LessonInit(n=4, d_model=4, stddev=inf), n_head=1), timeout=T), IA,
                "init.stddev: inf"),
            row("mha: init stddev negative", lambda: at.MultiHeadAttend(
                a.MultiHeadAttendRequest(init=a.LessonInit(n=4, d_model=4, stddev=-0.5),
                                         n_head=1), timeout=T), IA, "init.stddev: -0.5"),
            row("mha: init x one over the tensor limit", lambda: at.MultiHeadAttend(
                a.MultiHeadAttendRequest(init=a.LessonInit(n=1, d_model=MAX_TENSOR + 1,
                                                           head_dim=1), n_head=1), timeout=T),
                RE, "init: x [n, d_model] [1, 65537]", "over the limit of 65536"),
            row("mha: init huge head_dim", lambda: at.MultiHeadAttend(a.MultiHeadAttendRequest(
                init=a.LessonInit(n=4, d_model=4, head_dim=2**31 - 1), n_head=1), timeout=T),
                RE, "init: wq [d_model, n_head * head_dim]", "over the limit of 65536"),
            row("mha: init d_out without with_wo", lambda: at.MultiHeadAttend(
                a.MultiHeadAttendRequest(init=a.LessonInit(n=4, d_model=4, d_out=3), n_head=1),
                timeout=T), IA, "init.d_out: 3", "with_wo"),
            row("mha: return_inputs without init", lambda: at.MultiHeadAttend(
                a.MultiHeadAttendRequest(x=tensor([2, 8]), wq=tensor([8, 8]), wk=tensor([8, 8]),
                                         wv=tensor([8, 8]), n_head=2, return_inputs=True),
                timeout=T), IA, "return_inputs", "only with init"),
            row("mha: init Example 9 with scores and inputs", lambda: at.MultiHeadAttend(
                a.MultiHeadAttendRequest(init=a.LessonInit(seed=3, n=4, d_model=8, with_wo=True),
                                         n_head=2, return_scores=True, return_inputs=True),
                timeout=T), "OK"),
            # --- return_scores and the score limit ---
            row("attend: return_scores at the score limit (316 x 316)", lambda: at.Attend(
                a.AttendRequest(q=tensor([316, 1, 1]), k=tensor([316, 1, 1]),
                                v=tensor([316, 1, 1]), return_scores=True), timeout=T), "OK"),
            row("attend: return_scores one over the score limit (317 x 317)", lambda: at.Attend(
                a.AttendRequest(q=tensor([317, 1, 1]), k=tensor([317, 1, 1]),
                                v=tensor([317, 1, 1]), return_scores=True), timeout=T), RE,
                "1 x 317 x 317", "over the limit of 100000"),
            row("mha: init return_scores over the score limit", lambda: at.MultiHeadAttend(
                a.MultiHeadAttendRequest(init=a.LessonInit(n=224, d_model=1, head_dim=1),
                                         n_head=2, return_scores=True), timeout=T), RE,
                "2 x 224 x 224", "over the limit of 100000"),
            # --- Softmax ---
            row("softmax: empty", lambda: at.Softmax(a.SoftmaxRequest(), timeout=T), IA,
                "logits: empty"),
            row("softmax: NaN logit", lambda: at.Softmax(a.SoftmaxRequest(
                logits=[1, nan, 2]), timeout=T), IA, "logits[1] is nan", "finite"),
            row("softmax: +inf logit", lambda: at.Softmax(a.SoftmaxRequest(
                logits=[1, 2, inf]), timeout=T), IA, "logits[2]"),
            row("softmax: temperature 0", lambda: at.Softmax(a.SoftmaxRequest(
                logits=[1, 2], temperature=0), timeout=T), IA, "temperature"),
            row("softmax: NaN temperature", lambda: at.Softmax(a.SoftmaxRequest(
                logits=[1, 2], temperature=nan), timeout=T), IA, "temperature"),
            row("softmax: logits at the tensor limit", lambda: at.Softmax(a.SoftmaxRequest(
                logits=[0.5] * MAX_TENSOR), timeout=T), "OK"),
            row("softmax: logits one over the tensor limit", lambda: at.Softmax(
                a.SoftmaxRequest(logits=[0.5] * (MAX_TENSOR + 1)), timeout=T), RE,
                "65537 values", "over the limit of 65536"),
            row("softmax: jacobian at the limit (256 x 256)", lambda: at.Softmax(
                a.SoftmaxRequest(logits=[0.5] * 256, jacobian=True), timeout=T), "OK"),
            row("softmax: jacobian one row over (257 x 257)", lambda: at.Softmax(
                a.SoftmaxRequest(logits=[0.5] * 257, jacobian=True), timeout=T), RE,
                "jacobian: 257 x 257", "over the limit of 65536"),
            # --- ScalingExperiment ---
            row("scaling: head_dim 0", lambda: at.ScalingExperiment(
                a.ScalingExperimentRequest(head_dims=[4, 0]), timeout=T), IA, "head_dims[1]: 0"),
            row("scaling: negative pairs", lambda: at.ScalingExperiment(
                a.ScalingExperimentRequest(pairs=-5), timeout=T), IA, "pairs: -5"),
            row("scaling: draws over the limit", lambda: at.ScalingExperiment(
                a.ScalingExperimentRequest(head_dims=[65536], pairs=2000000000), timeout=T),
                RE, "limit of 268435456 random draws"),
        ]

    def create_rows(self):
        """KvCache.CreateSequence: configs, reservations, --max_sequences."""
        kv, t, kvs = PB["kv"], PB["tensor"], self.kv
        return [
            # --- KvCache.CreateSequence ---
            row("create: config missing", lambda: kvs.CreateSequence(
                kv.CreateSequenceRequest(sequence_id="bi-x"), timeout=T), IA, "config: missing"),
            row("create: layers 0", lambda: self.create("bi-x", layers=0), IA,
                "config.layers: 0", "between 1 and 4096"),
            row("create: layers at the limit (4096)", lambda: self.created_then_released(
                "bi-x", layers=4096), "OK"),
            row("create: layers one over (4097)", lambda: self.create("bi-x", layers=4097), IA,
                "config.layers: 4097", "between 1 and 4096"),
            row("create: n_head one over (4097)", lambda: self.create(
                "bi-x", n_head=4097, n_head_kv=1), IA, "config.n_head: 4097"),
            row("create: head_dim one over (16385)", lambda: self.create(
                "bi-x", head_dim=16385), IA, "config.head_dim: 16385"),
            row("create: negative head_dim_v", lambda: self.create("bi-x", head_dim_v=-1), IA,
                "config.head_dim_v: -1"),
            row("create: n_head_kv does not divide n_head", lambda: self.create(
                "bi-x", n_head=4, n_head_kv=3), IA, "config.n_head_kv: 3 does not divide n_head 4"),
            row("create: FLOAT16 storage", lambda: self.create("bi-x", kv_dtype=t.FLOAT16), IA,
                "config.kv_dtype", "FLOAT32, BFLOAT16 or INT8"),
            row("create: unknown kv_dtype 9", lambda: self.create("bi-x", kv_dtype=9), IA,
                "config.kv_dtype: unknown value 9"),
            row("create: NaN scale", lambda: self.create("bi-x", scale=nan), IA, "config.scale",
                "finite"),
            row("create: negative window", lambda: self.create("bi-x", window_tokens=-1), IA,
                "config.window_tokens: -1"),
            row("create: one token larger than a block", lambda: self.create(
                "bi-x", n_head=1024, n_head_kv=1024, head_dim=16), IA,
                "more than a block of 16384 bytes", "--kv_block_bytes"),
            row("create: negative reserve_tokens", lambda: self.create(
                "bi-x", reserve_tokens=-1), IA, "reserve_tokens: -1"),
            row("create: reserve_tokens 2^40 + 1", lambda: self.create(
                "bi-x", reserve_tokens=(1 << 40) + 1), IA, "reserve_tokens: 1099511627777",
                "2^40"),
            row("create: reserve_tokens 2^40 (valid, over the budget)", lambda: self.create(
                "bi-x", reserve_tokens=1 << 40), RE, "blocks", "free"),
            row("create: reservation of every free block", lambda: self.budget_then(0), "OK"),
            row("create: reservation one token over the budget", lambda: self.budget_then(1), RE,
                "reserving", "needs", "blocks of 16.00 KiB were free"),
            row("create: --max_sequences sequences", lambda: self.fill_sequences_then(
                lambda: None), "OK"),
            row("create: one over --max_sequences", lambda: self.fill_sequences_then(
                lambda: self.create("bi-one-more")), RE, "holds 8 sequences", "--max_sequences"),
        ]

    def sequence_id_rows(self):
        """KvCache: hostile sequence ids; GetSequence and Release."""
        kv, kvs = PB["kv"], self.kv
        return [
            # --- hostile sequence ids ---
            row("create: id of 128 characters", lambda: self.created_then_released("i" * 128),
                "OK"),
            row("create: id of 129 characters", lambda: self.create("i" * 129), IA,
                "sequence_id: length 129", "1 to 128"),
            row("create: huge id (1 MiB)", lambda: self.create("i" * (1 << 20)), IA,
                "sequence_id: length 1048576"),
            row("create: id with a control character", lambda: self.create("bad\x01id"), IA,
                "sequence_id: 'bad\\x01id'", "outside [A-Za-z0-9._:/-]"),
            row("create: id with a slash and spaces", lambda: self.create("../etc passwd"), IA,
                "sequence_id", "outside [A-Za-z0-9._:/-]"),
            row("create: id with a '..' part", lambda: self.create("../etc/passwd"), IA,
                "sequence_id: '../etc/passwd'", "'..' part"),
            row("create: id starting with '/'", lambda: self.create("/abs"), IA,
                "sequence_id: '/abs'", "empty"),
            row("create: id with an empty part", lambda: self.create("a//b"), IA,
                "sequence_id: 'a//b'", "empty"),
            row("create: id with a NUL byte", lambda: self.create("a\x00b"), IA,
                "sequence_id: 'a\\x00"),
            row("create: id not UTF-8", lambda: self.raw(
                "/attend.v1.KvCache/CreateSequence",
                field_bytes(1, seq_config().SerializeToString()) + field_bytes(2, b"id-\xc3\x28")),
                IA, "could not parse the request", "attend.v1.CreateSequenceRequest"),
            row("create: id in use", lambda: self.create(SEQ), "ALREADY_EXISTS",
                "'bi-seq' already exists"),
            row("get: empty id", lambda: kvs.GetSequence(kv.GetSequenceRequest(), timeout=T), IA,
                "sequence_id: empty"),
            row("get: unknown id", lambda: kvs.GetSequence(kv.GetSequenceRequest(
                sequence_id="bi-nobody"), timeout=T), NF, "'bi-nobody'"),
            row("get: released id", lambda: kvs.GetSequence(kv.GetSequenceRequest(
                sequence_id="bi-gone"), timeout=T), NF, "'bi-gone' was released"),
            row("get: id with control characters is echoed escaped", lambda: kvs.GetSequence(
                kv.GetSequenceRequest(sequence_id="x\x1b[31m\n"), timeout=T), NF,
                "'x\\x1b[31m\\n'"),
            row("get: huge id is cut to 64 characters", lambda: kvs.GetSequence(
                kv.GetSequenceRequest(sequence_id="\x7f" * 100000), timeout=T), NF,
                "(100000 bytes)"),
            row("release: id not UTF-8", lambda: self.raw(
                "/attend.v1.KvCache/Release", BAD_UTF8_ID), IA, "could not parse the request",
                "attend.v1.ReleaseRequest"),
            row("release: unknown id", lambda: kvs.Release(kv.ReleaseRequest(
                sequence_id="bi-nobody"), timeout=T), NF, "'bi-nobody'"),
            row("release: empty id", lambda: kvs.Release(kv.ReleaseRequest(), timeout=T), IA,
                "sequence_id: empty"),
        ]

    def append_rows(self):
        """KvCache.Append, and empty ids elsewhere."""
        kv, kvs = PB["kv"], self.kv
        return [
            # --- Append ---
            row("append: unknown id", lambda: kvs.Append(append("bi-nobody"), timeout=T), NF,
                "no sequence 'bi-nobody'"),
            row("append: released id", lambda: kvs.Append(append("bi-gone"), timeout=T), NF,
                "'bi-gone' was released"),
            row("append: layer out of range", lambda: kvs.Append(append(layer=2), timeout=T), IA,
                "layer 2 is out of range", "2 layers"),
            row("append: negative layer", lambda: kvs.Append(append(layer=-1), timeout=T), IA,
                "layer -1 is out of range"),
            row("append: k missing", lambda: kvs.Append(append(k=None), timeout=T), IA,
                "k: missing"),
            row("append: k with 3 heads for 2", lambda: kvs.Append(append(
                k=tensor([1, 3, D])), timeout=T), IA, "k.shape", "[1, 3, 8]"),
            row("append: v head_dim_v 4 for 8", lambda: kvs.Append(append(
                v=tensor([1, G, 4])), timeout=T), IA, "v.shape", "[1, 2, 4]"),
            row("append: q with 2 tokens for 1", lambda: kvs.Append(append(
                q=tensor([2, H, D])), timeout=T), IA, "q.shape", "[2, 4, 8]"),
            row("append: k rank 2", lambda: kvs.Append(append(k=tensor([1, 16])), timeout=T), IA,
                "k.shape is [1, 16]"),
            row("append: k data short", lambda: kvs.Append(append(
                k=tensor([1, G, D], nbytes=60)), timeout=T), IA, "k.data: 60 bytes", "needs 64"),
            row("append: NaN in k", lambda: kvs.Append(append(
                k=with_value([1, G, D], 5, nan)), timeout=T), IA,
                "k holds a non-finite value (NaN) at element 5"),
            row("append: -inf in q", lambda: kvs.Append(append(
                q=with_value([1, H, D], 31, -inf)), timeout=T), IA,
                "q holds a non-finite value (-inf) at element 31"),
            row("append: k beyond bfloat16 storage", lambda: kvs.Append(kv.AppendRequest(
                sequence_id=BF16_SEQ, k=with_value([1, 1, 4], 2, 3.4e38),
                v=tensor([1, 1, 4])), timeout=T), IA, "k holds", "bfloat16"),
            row("append: unknown output_dtype", lambda: kvs.Append(append(output_dtype=17),
                                                                   timeout=T), IA,
                "output_dtype", "17"),
            row("append: garbage bytes", lambda: self.raw("/attend.v1.KvCache/Append",
                                                          b"\x0a\xff\xff\xff\xff\x0f"), IA,
                "could not parse the request", "attend.v1.AppendRequest"),
            row("append: more tokens than the cache has room for", self.append_when_full, RE,
                "appending 1 tokens to layer 0 of sequence 'bi-bf16'", "0 of 64 blocks"),
            row("append: empty id", lambda: kvs.Append(append(""), timeout=T), IA,
                "sequence_id: empty"),
            row("truncate: empty id", lambda: kvs.Truncate(kv.TruncateRequest(tokens=0),
                                                           timeout=T), IA, "sequence_id: empty"),
            row("fork: empty source_id", lambda: kvs.Fork(kv.ForkRequest(), timeout=T), IA,
                "source_id: empty"),
            row("decode: empty id in the second step", lambda: kvs.DecodeBatch(
                kv.DecodeBatchRequest(steps=[step(), step("")]), timeout=T), IA,
                "steps[1].sequence_id: empty"),
        ]

    def decode_rows(self):
        """KvCache.DecodeBatch and DecodeStream."""
        kv, kvs = PB["kv"], self.kv
        return [
            # --- DecodeBatch ---
            row("decode: no steps", lambda: kvs.DecodeBatch(kv.DecodeBatchRequest(), timeout=T),
                IA, "steps: empty"),
            row("decode: step without q", lambda: kvs.DecodeBatch(kv.DecodeBatchRequest(
                steps=[kv.DecodeStep(sequence_id=SEQ, k=tensor([1, G, D]),
                                     v=tensor([1, G, D]))]), timeout=T), IA,
                "steps[0]: q, k and v are required"),
            row("decode: a sequence twice", lambda: kvs.DecodeBatch(kv.DecodeBatchRequest(
                steps=[step(), step()]), timeout=T), IA, "steps[1]", "'bi-seq' appears twice"),
            row("decode: unknown id in the second step", lambda: kvs.DecodeBatch(
                kv.DecodeBatchRequest(steps=[step(), step("bi-nobody")]), timeout=T), NF,
                "steps[1]", "'bi-nobody'"),
            row("decode: two tokens in a step", lambda: kvs.DecodeBatch(kv.DecodeBatchRequest(
                steps=[step(n=2)]), timeout=T), IA, "steps[0]", "a decode step appends 1 token"),
            row("decode: NaN in q", lambda: kvs.DecodeBatch(kv.DecodeBatchRequest(
                steps=[step(q=with_value([1, H, D], 0, nan))]), timeout=T), IA,
                "steps[0] (sequence 'bi-seq')", "q holds a non-finite value (NaN)"),
            row("decode: step's q data long", lambda: kvs.DecodeBatch(kv.DecodeBatchRequest(
                steps=[step(q=tensor([1, H, D], nbytes=132))]), timeout=T), IA,
                "steps[0].q.data: 132 bytes", "needs 128"),
            row("decode: layer out of range", lambda: kvs.DecodeBatch(kv.DecodeBatchRequest(
                layer=5, steps=[step()]), timeout=T), IA, "layer 5 is out of range"),
            row("decode: unknown precision", lambda: kvs.DecodeBatch(kv.DecodeBatchRequest(
                precision=3, steps=[step()]), timeout=T), IA, "precision: unknown value 3"),
            # --- DecodeStream: an error fails its message, not the stream ---
            row("stream: unknown id, then valid messages", lambda: self.stream_items([
                kv.DecodeBatchRequest(request_id=7, steps=[step("bi-nobody")]),
                kv.DecodeBatchRequest(request_id=8, steps=[step()]),
                kv.DecodeBatchRequest(request_id=9, steps=[step()])],
                want=[True, False, False]), NF, "'bi-nobody'"),
            row("stream: NaN, duplicate, then valid", lambda: self.stream_items([
                kv.DecodeBatchRequest(request_id=1, steps=[step()]),
                kv.DecodeBatchRequest(request_id=2, steps=[step(q=with_value([1, H, D], 2, nan))]),
                kv.DecodeBatchRequest(request_id=3, steps=[step(), step()]),
                kv.DecodeBatchRequest(request_id=4, steps=[step()])],
                want=[False, True, True, False]), IA, "q holds a non-finite value (NaN)"),
            row("stream: garbage bytes, then a valid message", lambda: self.stream_items([
                b"\xff\xff\xff", kv.DecodeBatchRequest(request_id=5, steps=[step()])
                .SerializeToString()], raw=True, want=[True, False]), IA,
                "could not parse stream message 1", "attend.v1.DecodeBatchRequest"),
            row("stream: id not UTF-8, then a valid message", lambda: self.stream_items([
                field_bytes(2, BAD_UTF8_ID), kv.DecodeBatchRequest(
                    request_id=6, steps=[step()]).SerializeToString()], raw=True,
                want=[True, False]), IA, "could not parse stream message 1"),
            row("stream: --max_concurrent_streams open", lambda: self.open_streams_then(
                MAX_STREAMS, lambda: None), "OK"),
            row("stream: one over --max_concurrent_streams", lambda: self.open_streams_then(
                MAX_STREAMS, self.one_more_stream), RE, "4 decode streams are open",
                "--max_concurrent_streams"),
        ]

    def fork_truncate_list_rows(self):
        """KvCache.Fork, Truncate and ListSequences."""
        kv, kvs = PB["kv"], self.kv
        return [
            # --- Fork, Truncate, List ---
            row("fork: unknown source", lambda: kvs.Fork(kv.ForkRequest(
                source_id="bi-nobody"), timeout=T), NF, "'bi-nobody'"),
            row("fork: past the end", lambda: kvs.Fork(kv.ForkRequest(
                source_id=SEQ, tokens=99), timeout=T), OOR, "fork at 99 tokens", "holds 3"),
            row("fork: negative tokens", lambda: kvs.Fork(kv.ForkRequest(
                source_id=SEQ, tokens=-1), timeout=T), IA, "tokens: -1"),
            row("fork: bad new_id", lambda: kvs.Fork(kv.ForkRequest(
                source_id=SEQ, new_id="new id"), timeout=T), IA, "new_id", "outside"),
            row("fork: new_id in use", lambda: kvs.Fork(kv.ForkRequest(
                source_id=SEQ, new_id=BF16_SEQ), timeout=T), "ALREADY_EXISTS", "'bi-bf16'"),
            row("truncate: past the end", lambda: kvs.Truncate(kv.TruncateRequest(
                sequence_id=SEQ, tokens=4), timeout=T), OOR, "truncate to 4 tokens",
                "holds only 3"),
            row("truncate: negative", lambda: kvs.Truncate(kv.TruncateRequest(
                sequence_id=SEQ, tokens=-(1 << 62)), timeout=T), IA, "tokens: -4611686018427387904"),
            row("list: page_size 1000", lambda: kvs.ListSequences(kv.ListSequencesRequest(
                page_size=1000), timeout=T), "OK"),
            row("list: page_size 1001", lambda: kvs.ListSequences(kv.ListSequencesRequest(
                page_size=1001), timeout=T), IA, "page_size: 1001", "between 1 and 1000"),
            row("list: negative page_size", lambda: kvs.ListSequences(kv.ListSequencesRequest(
                page_size=-1), timeout=T), IA, "page_size: -1"),
            row("list: page_token that is no id", lambda: kvs.ListSequences(
                kv.ListSequencesRequest(page_token="\x00\xff".encode("latin-1").decode(
                    "latin-1")), timeout=T), IA, "page_token"),
        ]

    def planner_rows(self):
        """Planner: GetModel, PlanKvCache, EstimateCost."""
        pl, plan = PB["planner"], self.planner
        llama = pl.ModelRef(name="llama-3-8b")
        return [
            # --- Planner ---
            row("get model: unknown", lambda: plan.GetModel(pl.GetModelRequest(
                name="gpt-17"), timeout=T), NF, "gpt-17", "llama-3-8b"),
            row("get model: empty name", lambda: plan.GetModel(pl.GetModelRequest(), timeout=T),
                IA, "name: empty"),
            row("plan: model missing", lambda: plan.PlanKvCache(pl.PlanKvCacheRequest(),
                                                                timeout=T), IA,
                "model: missing"),
            row("plan: unknown kv_dtype 99", lambda: plan.PlanKvCache(pl.PlanKvCacheRequest(
                model=llama, kv_dtype=99), timeout=T), IA, "kv_dtype", "99"),
            row("plan: n_head_kv does not divide n_head", lambda: plan.PlanKvCache(
                pl.PlanKvCacheRequest(model=pl.ModelRef(spec=pl.ModelSpec(
                    name="x", layers=2, n_head=32, n_head_kv=3, head_dim=128))), timeout=T), IA,
                "model.spec.n_head_kv: 3 does not divide n_head 32"),
            row("plan: negative context", lambda: plan.PlanKvCache(pl.PlanKvCacheRequest(
                model=llama, context_tokens=-5), timeout=T), IA, "context_tokens", "-5"),
            row("plan: batch that overflows int64 bytes", lambda: plan.PlanKvCache(
                pl.PlanKvCacheRequest(model=llama, context_tokens=1 << 40, batch=1 << 40),
                timeout=T), IA, "batch"),
            row("plan: negative replica memory", lambda: plan.PlanKvCache(pl.PlanKvCacheRequest(
                model=llama, context_tokens=8192, replica_memory_bytes=-1), timeout=T), IA,
                "replica_memory_bytes: -1"),
            row("plan: the largest batch on replicas of one sequence each", lambda:
                plan.PlanKvCache(pl.PlanKvCacheRequest(
                    model=llama, context_tokens=8192, batch=1 << 24,
                    replica_memory_bytes=8192 * 131072), timeout=T), "OK"),
            row("cost: unknown hardware profile", lambda: plan.EstimateCost(
                pl.EstimateCostRequest(model=llama, prompt_tokens=16, profile="tpu-v9"),
                timeout=T), NF, "tpu-v9", "h100"),
            row("cost: hardware missing", lambda: plan.EstimateCost(pl.EstimateCostRequest(
                model=llama, prompt_tokens=16), timeout=T), IA, "hardware: missing"),
            row("cost: zero bandwidth", lambda: plan.EstimateCost(pl.EstimateCostRequest(
                model=llama, prompt_tokens=16, custom=pl.HardwareProfile(
                    peak_flops_bf16=1e15, memory_bandwidth_bytes_per_second=0)), timeout=T), IA,
                "custom.memory_bandwidth_bytes_per_second", "> 0"),
            row("cost: NaN peak", lambda: plan.EstimateCost(pl.EstimateCostRequest(
                model=llama, prompt_tokens=16, custom=pl.HardwareProfile(
                    peak_flops_bf16=nan, memory_bandwidth_bytes_per_second=1e12)), timeout=T), IA,
                "custom.peak_flops_bf16"),
            row("cost: unknown compute_dtype", lambda: plan.EstimateCost(pl.EstimateCostRequest(
                model=llama, prompt_tokens=16, profile="h100", compute_dtype="float7"),
                timeout=T), IA, "compute_dtype", "float7"),
        ]

    def import_config_rows(self):
        """Planner.ImportModel: hostile config.json."""
        pl, plan = PB["planner"], self.planner
        return [
            # --- ImportModel: hostile config.json ---
            row("import: no source", lambda: plan.ImportModel(pl.ImportModelRequest(), timeout=T),
                IA, "source: neither"),
            row("import: config.json not JSON", lambda: plan.ImportModel(pl.ImportModelRequest(
                hf_config_json="{\"num_hidden_layers\": 2,,}"), timeout=T), IA,
                "hf_config_json: config.json", "line 1"),
            row("import: config.json top level an array", lambda: plan.ImportModel(
                pl.ImportModelRequest(hf_config_json="[1, 2]"), timeout=T), IA, "not an object"),
            row("import: config.json nested 100000 deep", lambda: plan.ImportModel(
                pl.ImportModelRequest(hf_config_json="[" * 100000 + "]" * 100000), timeout=T), IA,
                "hf_config_json: config.json", "deep"),
            row("import: config.json duplicate key", lambda: plan.ImportModel(
                pl.ImportModelRequest(hf_config_json=hf_config()[:-1] + ", \"hidden_size\": 64}"),
                timeout=T), IA, "hidden_size", "duplicate"),
            # Python's NaN parses (transformers writes it), but never where a count belongs.
            row("import: config.json NaN as a count", lambda: plan.ImportModel(
                pl.ImportModelRequest(
                    hf_config_json=hf_config()[:-1] + ", \"sliding_window\": NaN}"),
                timeout=T), IA, "sliding_window"),
            row("import: config.json lone surrogate", lambda: plan.ImportModel(
                pl.ImportModelRequest(hf_config_json="{\"model_type\": \"\\ud800\"}"), timeout=T),
                IA, "hf_config_json: config.json"),
            row("import: config.json layers missing", lambda: plan.ImportModel(
                pl.ImportModelRequest(hf_config_json="{\"model_type\": \"llama\"}"), timeout=T),
                IA, "num_hidden_layers is missing"),
            row("import: config.json layers 1e30", lambda: plan.ImportModel(pl.ImportModelRequest(
                hf_config_json=hf_config(num_hidden_layers=1e30)), timeout=T), IA,
                "num_hidden_layers"),
            row("import: config.json negative heads", lambda: plan.ImportModel(
                pl.ImportModelRequest(hf_config_json=hf_config(num_attention_heads=-4)),
                timeout=T), IA, "num_attention_heads: -4"),
            row("import: config.json at the 1 MiB limit", lambda: plan.ImportModel(
                pl.ImportModelRequest(hf_config_json=hf_config().ljust(HF_CONFIG_LIMIT)),
                timeout=T), "OK"),
            row("import: config.json one byte over 1 MiB", lambda: plan.ImportModel(
                pl.ImportModelRequest(hf_config_json=hf_config().ljust(HF_CONFIG_LIMIT + 1)),
                timeout=T), RE, "hf_config_json: 1048577 bytes", "over the limit of 1048576"),
            row("import: name of 257 bytes", lambda: plan.ImportModel(pl.ImportModelRequest(
                hf_config_json=hf_config(), name="n" * 257), timeout=T), IA, "name: 257 bytes",
                "at most 256"),
            row("import: name with a control character", lambda: plan.ImportModel(
                pl.ImportModelRequest(hf_config_json=hf_config(), name="evil\x07name"),
                timeout=T), IA, "name", "control"),
            row("import: config.json not UTF-8", lambda: self.raw(
                "/attend.v1.Planner/ImportModel", field_bytes(1, b"{\"a\": \"\xff\"}")), IA,
                "could not parse the request", "attend.v1.ImportModelRequest"),
        ]

    def import_gguf_rows(self):
        """Planner.ImportModel: hostile GGUF bytes."""
        pl, plan = PB["planner"], self.planner
        return [
            # --- ImportModel: hostile GGUF bytes ---
            row("gguf: empty", lambda: plan.ImportModel(pl.ImportModelRequest(gguf=b""),
                                                        timeout=T), IA,
                "gguf: the input is 0 bytes"),
            row("gguf: bad magic", lambda: plan.ImportModel(pl.ImportModelRequest(
                gguf=gguf(magic=b"GGML")), timeout=T), IA, "gguf: bad magic 'GGML'"),
            row("gguf: version 1", lambda: plan.ImportModel(pl.ImportModelRequest(
                gguf=gguf(version=1)), timeout=T), IA, "gguf: version 1 is not supported"),
            row("gguf: big-endian", lambda: plan.ImportModel(pl.ImportModelRequest(
                gguf=gguf(version=0x03000000)), timeout=T), IA, "big-endian"),
            row("gguf: tensor_count 2^64 - 1", lambda: plan.ImportModel(pl.ImportModelRequest(
                gguf=gguf(tensors=(1 << 64) - 1)), timeout=T), IA,
                "gguf: tensor_count 18446744073709551615"),
            row("gguf: kv_count 2^63", lambda: plan.ImportModel(pl.ImportModelRequest(
                gguf=gguf(kvs=1 << 63)), timeout=T), IA, "gguf: kv_count 9223372036854775808"),
            row("gguf: truncated header", lambda: plan.ImportModel(pl.ImportModelRequest(
                gguf=gguf()[:10]), timeout=T), IA, "gguf: ", "past the end"),
            row("gguf: key length 2^64 - 1", lambda: plan.ImportModel(pl.ImportModelRequest(
                gguf=gguf(kvs=1, body=struct.pack("<Q", (1 << 64) - 1) + b"\0" * 16)),
                timeout=T), IA, "key length 18446744073709551615", "past the end"),
            row("gguf: unknown value type", lambda: plan.ImportModel(pl.ImportModelRequest(
                gguf=gguf(kvs=1, body=gstr(b"general.architecture") + struct.pack("<I", 99) +
                          b"\0" * 16)), timeout=T), IA, "value type 99 is not a GGUF type"),
            row("gguf: array of 2^62 elements", lambda: plan.ImportModel(pl.ImportModelRequest(
                gguf=gguf(kvs=1, body=gstr(b"llama.x") + struct.pack("<IIQ", 9, 4, 1 << 62) +
                          b"\0" * 16)), timeout=T), IA, "array of 4611686018427387904",
                "past the end"),
            row("gguf: arrays nested 1000 deep", lambda: plan.ImportModel(pl.ImportModelRequest(
                gguf=gguf(kvs=1, body=gstr(b"llama.x") + struct.pack("<I", 9) +
                          struct.pack("<IQ", 9, 1) * 1000 + struct.pack("<IQI", 4, 1, 7))),
                timeout=T), IA, "arrays nested deeper than"),
            row("gguf: architecture missing", lambda: plan.ImportModel(pl.ImportModelRequest(
                gguf=gguf(kvs=1, body=g_kv_u32(b"llama.block_count", 2))), timeout=T), IA,
                "'general.architecture' is missing"),
            row("gguf: head_count missing", lambda: plan.ImportModel(pl.ImportModelRequest(
                gguf=gguf(kvs=2, body=g_kv_str(b"general.architecture", b"llama") +
                          g_kv_u32(b"llama.block_count", 2))), timeout=T), IA,
                "gguf: 'llama.", "is missing"),
        ]

    def health_rows(self):
        """Health."""
        h, health = PB["health"], self.health
        return [
            # --- Health ---
            row("health: unknown service", lambda: health.Check(h.HealthCheckRequest(
                service="attend.v1.Nope"), timeout=T), NF),
            row("health: garbage bytes", lambda: self.raw("/grpc.health.v1.Health/Check",
                                                          b"\xff\xff\xff"), IA),
        ]
