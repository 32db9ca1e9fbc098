"""Typed calls of attend.v1.Attention: stateless attention, the full multi-head layer, softmax and
the sqrt(d) experiment. These calls name no sequence and send no routing key.
"""
import numpy as np

from . import errors
from .tensors import dtype_enum, encode, from_proto, precision_enum, serialize_with_tensors
from .v1 import attention_pb2

__all__ = ["AttentionMixin", "AttendResult", "MultiHeadAttendResult", "SoftmaxResult"]

_SERVICE = "/attend.v1.Attention/"


class AttendResult:
    """output [n_q, n_head, head_dim_v]; weights, scores, masked_scores [n_head, n_q, n_kv]
    float32 when asked for (else None); stats: ComputeStats."""

    def __init__(self, output, weights, scores, masked_scores, stats):
        self.output = output
        self.weights = weights
        self.scores = scores
        self.masked_scores = masked_scores
        self.stats = stats


class MultiHeadAttendResult:
    """output [n, d_out] (or [n, n_head * head_dim_v] without wo); weights / scores /
    masked_scores [n_head, n, n] when asked for; q, k, v (return_projections); x, wq, wk, wv,
    wo (return_inputs, with init); parameters (ParameterCounts), head_dim, head_dim_v, stats.
    Fields not returned are None."""

    _TENSORS = ("output", "weights", "q", "k", "v", "scores", "masked_scores", "x", "wq", "wk",
                "wv", "wo")

    def __init__(self, response, like):
        for name in self._TENSORS:
            setattr(self, name,
                    from_proto(getattr(response, name), like) if response.HasField(name) else None)
        self.parameters = response.parameters
        self.head_dim = response.head_dim
        self.head_dim_v = response.head_dim_v
        self.stats = response.stats


class SoftmaxResult:
    """probabilities [n] float64; jacobian [n, n] (diag(p) - p p^T) when asked for, else None;
    log_sum_exp; entropy_nats."""

    def __init__(self, response):
        self.probabilities = np.asarray(response.probabilities, dtype=np.float64)
        n = len(self.probabilities)
        self.jacobian = (np.asarray(response.jacobian, dtype=np.float64).reshape(n, n)
                         if len(response.jacobian) else None)
        self.log_sum_exp = response.log_sum_exp
        self.entropy_nats = response.entropy_nats


def _mask(causal, window_tokens):
    return attention_pb2.MaskOptions(causal=causal, window_tokens=window_tokens)


def _logits(logits):
    """Softmax's logits as Python floats, or InvalidArgument: NumPy would read None as NaN
    and the string "12" as 12.0, which the server would then answer for."""
    if isinstance(logits, (str, bytes)):
        raise errors.InvalidArgument("logits: %r is a string, not numbers" % (logits,))
    try:
        values = np.asarray(logits)
    except ValueError as e:  # ragged nesting
        raise errors.InvalidArgument("logits: %s" % e) from None
    if values.dtype == object or not (np.issubdtype(values.dtype, np.number) or
                                      values.dtype == np.bool_):
        raise errors.InvalidArgument("logits: %r holds something that is not a number"
                                     % (logits,))
    return [float(x) for x in values.astype(np.float64).ravel()]


class AttentionMixin:
    """The Attention calls of attend.Client (which provides `_connection`)."""

    def attend(self, q, k, v, *, causal=False, window_tokens=0, scale=None, precision=None,
               return_weights=False, return_scores=False, output_dtype=None):
        """Scaled dot-product attention of q [n_q, n_head, head_dim] over k [n_kv, n_head_kv,
        head_dim] and v [n_kv, n_head_kv, head_dim_v] (query head h reads key/value head
        h / (n_head / n_head_kv)). Queries are aligned to the end of the keys; causal hides
        later keys; window_tokens keeps a sliding window. scale: default 1/sqrt(head_dim).
        output_dtype: default q's. Returns an AttendResult."""
        qe, ke, ve = encode(q, "q"), encode(k, "k"), encode(v, "v")
        request = attention_pb2.AttendRequest(
            mask=_mask(causal, window_tokens), precision=precision_enum(precision),
            return_weights=return_weights, return_scores=return_scores,
            output_dtype=dtype_enum(output_dtype, "output_dtype") if output_dtype is not None
            else qe.dtype)
        if scale is not None:
            request.scale = scale
        response = self._connection.call(
            self._connection.method(_SERVICE + "Attend", attention_pb2.AttendResponse),
            serialize_with_tensors(request, {1: qe, 2: ke, 3: ve}))

        def opt(name, like=None):
            return from_proto(getattr(response, name), like) if response.HasField(name) else None

        return AttendResult(from_proto(response.output, qe.like), opt("weights"), opt("scores"),
                            opt("masked_scores"), response.stats)

    def multi_head_attend(self, x=None, wq=None, wk=None, wv=None, wo=None, *, n_head,
                          n_head_kv=None, causal=False, window_tokens=0, scale=None,
                          precision=None, return_weights=False, return_projections=False,
                          return_scores=False, output_dtype=None, init=None,
                          return_inputs=False):
        """A whole attention layer: x [n, d_model] projected by wq [d_model, n_head *
        head_dim], wk and wv [d_model, n_head_kv * head_dim(_v)], attention per head, heads
        concatenated and, with wo [n_head * head_dim_v, d_out], projected. n_head_kv defaults
        to n_head. init (an attention_pb2.LessonInit or a dict of its fields) draws x and the
        weights on the server as the lessons do; then x, wq, wk, wv and wo must be None.
        Returns a MultiHeadAttendResult."""
        tensors = {}
        like = None
        for number, (name, value) in enumerate((("x", x), ("wq", wq), ("wk", wk), ("wv", wv),
                                                ("wo", wo)), start=1):
            if value is not None:
                tensors[number] = encode(value, name)
                like = like or tensors[number].like
        request = attention_pb2.MultiHeadAttendRequest(
            n_head=n_head, n_head_kv=n_head_kv or 0, mask=_mask(causal, window_tokens),
            precision=precision_enum(precision), return_weights=return_weights,
            return_projections=return_projections, return_scores=return_scores,
            output_dtype=dtype_enum(output_dtype, "output_dtype"), return_inputs=return_inputs)
        if scale is not None:
            request.scale = scale
        if init is not None:
            request.init.CopyFrom(init if isinstance(init, attention_pb2.LessonInit)
                                  else attention_pb2.LessonInit(**init))
        response = self._connection.call(
            self._connection.method(_SERVICE + "MultiHeadAttend",
                                    attention_pb2.MultiHeadAttendResponse),
            serialize_with_tensors(request, tensors))
        return MultiHeadAttendResult(response, like)

    def softmax(self, logits, *, temperature=None, jacobian=False):
        """Numerically stable softmax of `logits` (-inf gives exactly 0; NaN and +inf are
        refused), divided by `temperature` first when given. Returns a SoftmaxResult."""
        request = attention_pb2.SoftmaxRequest(logits=_logits(logits), jacobian=jacobian)
        if temperature is not None:
            request.temperature = temperature
        return SoftmaxResult(self._connection.call(self._connection.method(
            _SERVICE + "Softmax", attention_pb2.SoftmaxResponse, attention_pb2.SoftmaxRequest),
            request))

    def scaling_experiment(self, head_dims=(), *, pairs=0, trials=0, keys=0, seed=None):
        """The sqrt(d_head) experiment (ScalingExperimentResponse): seed 5 and the defaults
        reproduce the lesson's table."""
        request = attention_pb2.ScalingExperimentRequest(head_dims=list(head_dims), pairs=pairs,
                                                         trials=trials, keys=keys)
        if seed is not None:
            request.seed = seed
        return self._connection.call(self._connection.method(
            _SERVICE + "ScalingExperiment", attention_pb2.ScalingExperimentResponse,
            attention_pb2.ScalingExperimentRequest), request)
