"""attend.v1.Tensor to and from NumPy arrays and torch tensors.

Wire format (proto/attend/v1/tensor.proto): a dtype, a shape and the elements as row-major
little-endian bytes (`data`), or float32 `values` for hand-written calls.

Inputs (anything that `encode` takes):
  - numpy float32 / float16 arrays: sent as FLOAT32 / FLOAT16.
  - numpy uint16 arrays: bfloat16 bit patterns (NumPy has no bfloat16), sent as BFLOAT16;
    `float32_to_bfloat16` makes them. An ml_dtypes.bfloat16 array is sent as BFLOAT16 too.
  - torch float32 / float16 / bfloat16 tensors: sent in their own dtype (bfloat16 through
    `.view(torch.int16)`, no conversion). Tensors on another device are copied to the CPU.
  - anything else NumPy turns into numbers (lists, float64, ints): converted to float32 (a copy).
A C-contiguous little-endian array is sent without a copy of its own: the RPCs that carry big
tensors (append, append_batch, attend, multi_head_attend) write the request's bytes around the
array's buffer in one pass (`serialize_with_tensors`), so the only copies are that pass and
gRPC's own. Arrays that are not contiguous are made contiguous first (one copy).

Outputs come back as NumPy arrays that view the response's bytes (read-only; `.copy()` to write),
or as torch tensors (CPU, or the device of the input they answer) when the input was torch:
FLOAT32 -> float32, FLOAT16 -> float16, BFLOAT16 -> uint16 bit patterns in NumPy (ml_dtypes'
bfloat16 when the input was one; `bfloat16_to_float32` widens them) and torch.bfloat16 in torch.
"""
import sys

import numpy as np

from .errors import Internal, InvalidArgument
from .v1 import tensor_pb2

__all__ = ["DType", "Precision", "dtype_enum", "precision_enum", "encode", "to_proto",
           "from_proto", "float32_to_bfloat16", "bfloat16_to_float32", "Encoded", "Like"]

DType = tensor_pb2.DType
Precision = tensor_pb2.Precision

_DTYPE_NAMES = {
    "float32": tensor_pb2.FLOAT32, "f32": tensor_pb2.FLOAT32, "fp32": tensor_pb2.FLOAT32,
    "bfloat16": tensor_pb2.BFLOAT16, "bf16": tensor_pb2.BFLOAT16,
    "float16": tensor_pb2.FLOAT16, "f16": tensor_pb2.FLOAT16, "fp16": tensor_pb2.FLOAT16,
    "half": tensor_pb2.FLOAT16, "int8": tensor_pb2.INT8,
}
_ELEMENT_BYTES = {tensor_pb2.FLOAT32: 4, tensor_pb2.BFLOAT16: 2, tensor_pb2.FLOAT16: 2}
_PRECISION_NAMES = {
    "float32": tensor_pb2.PRECISION_FLOAT32, "f32": tensor_pb2.PRECISION_FLOAT32,
    "bfloat16": tensor_pb2.PRECISION_BFLOAT16, "bf16": tensor_pb2.PRECISION_BFLOAT16,
}


def _torch():
    """The torch module when the program has imported it, else None: torch is optional, and a
    program that never imported it cannot be holding a torch tensor."""
    return sys.modules.get("torch")


def _is_torch_tensor(x):
    torch = _torch()
    return torch is not None and isinstance(x, torch.Tensor)


def dtype_enum(value, what="dtype", allow_int8=False):
    """The attend.v1.DType number of `value`: None (DTYPE_UNSPECIFIED), a DType number, a name
    ("float32", "bfloat16", "bf16", "float16", ...), a NumPy dtype (uint16 meaning bfloat16) or a
    torch dtype. INT8 only where `allow_int8` (a KV-cache storage type, never a tensor's)."""
    if value is None:
        return tensor_pb2.DTYPE_UNSPECIFIED
    number = None
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        number = int(value) if int(value) in DType.values() else None
    elif isinstance(value, str):
        number = _DTYPE_NAMES.get(value.lower())
        if number is None and value.upper() in DType.keys():
            number = DType.Value(value.upper())
    else:
        torch = _torch()
        if torch is not None and isinstance(value, torch.dtype):
            number = {torch.float32: tensor_pb2.FLOAT32, torch.float16: tensor_pb2.FLOAT16,
                      torch.bfloat16: tensor_pb2.BFLOAT16}.get(value)
        else:
            try:
                dt = np.dtype(value)
            except TypeError:
                dt = None
            if dt is not None:
                number = {"float32": tensor_pb2.FLOAT32, "float16": tensor_pb2.FLOAT16,
                          "uint16": tensor_pb2.BFLOAT16,
                          "bfloat16": tensor_pb2.BFLOAT16}.get(dt.name)
    if number is None or (number == tensor_pb2.INT8 and not allow_int8):
        raise InvalidArgument("%s: %r is not a dtype attend knows (float32, bfloat16, float16%s)"
                              % (what, value, ", int8" if allow_int8 else ""))
    return number


def precision_enum(value):
    """The attend.v1.Precision number of None (unspecified), a number, or "float32"/"bfloat16"."""
    if value is None:
        return tensor_pb2.PRECISION_UNSPECIFIED
    if isinstance(value, (int, np.integer)) and int(value) in Precision.values():
        return int(value)
    if isinstance(value, str):
        number = _PRECISION_NAMES.get(value.lower())
        if number is None and value.upper() in Precision.keys():
            number = Precision.Value(value.upper())
        if number is not None:
            return number
    raise InvalidArgument("precision: %r is not float32 or bfloat16" % (value,))


def element_bytes(dtype):
    """Bytes of one element of a tensor dtype (FLOAT32 4, BFLOAT16 and FLOAT16 2)."""
    return _ELEMENT_BYTES.get(dtype, 4)


class Like:
    """How to hand outputs back: as NumPy (and which bfloat16 representation) or as torch on a
    device. Taken from the input an output answers."""

    __slots__ = ("torch_device", "bf16_numpy_dtype")

    def __init__(self, torch_device=None, bf16_numpy_dtype=None):
        self.torch_device = torch_device
        self.bf16_numpy_dtype = bf16_numpy_dtype

    NUMPY = None  # set below


Like.NUMPY = Like()


class Encoded:
    """A tensor ready for the wire: `dtype` (DType number), `shape` (tuple), `array` (C-contiguous
    little-endian NumPy array holding exactly the wire bytes), `like` (how to answer)."""

    __slots__ = ("dtype", "shape", "array", "like")

    def __init__(self, dtype, shape, array, like):
        self.dtype = dtype
        self.shape = tuple(int(d) for d in shape)
        self.array = array
        self.like = like

    @property
    def nbytes(self):
        return self.array.nbytes

    def rows(self, start, stop):
        """Rows [start, stop) of the first dimension, as a view (no copy)."""
        assert 0 <= start <= stop <= self.shape[0], (start, stop, self.shape)
        return Encoded(self.dtype, (stop - start,) + self.shape[1:], self.array[start:stop],
                       self.like)

    def buffer(self):
        """The wire bytes as a flat byte memoryview of the array (no copy)."""
        return memoryview(self.array).cast("B") if self.array.size else memoryview(b"")


def _little_endian_contiguous(a, dtype):
    a = np.ascontiguousarray(a)
    if a.dtype.byteorder == ">" or (a.dtype.byteorder == "=" and sys.byteorder == "big"):
        a = a.astype(np.dtype(dtype).newbyteorder("<"))
    return a


def encode(x, what="tensor"):
    """`x` (see the module's list of inputs) as an Encoded, copying only where the input is not
    already contiguous little-endian data of a wire dtype. An Encoded is returned as is."""
    if isinstance(x, Encoded):
        return x
    if _is_torch_tensor(x):
        torch = _torch()
        like = Like(torch_device=x.device)
        t = x.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        if t.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            t = t.float()
        t = t.contiguous()
        if t.dtype == torch.bfloat16:
            # NumPy has no bfloat16: move the bits as int16 (a view, no conversion).
            return Encoded(tensor_pb2.BFLOAT16, t.shape,
                           _little_endian_contiguous(t.view(torch.int16).numpy().view(np.uint16),
                                                     np.uint16), like)
        dtype = tensor_pb2.FLOAT32 if t.dtype == torch.float32 else tensor_pb2.FLOAT16
        return Encoded(dtype, t.shape, _little_endian_contiguous(t.numpy(), t.numpy().dtype),
                       like)
    a = x if isinstance(x, np.ndarray) else np.asarray(x)
    name = a.dtype.name
    if name == "bfloat16":  # ml_dtypes.bfloat16
        return Encoded(tensor_pb2.BFLOAT16, a.shape,
                       _little_endian_contiguous(a, a.dtype).view(np.uint16),
                       Like(bf16_numpy_dtype=a.dtype))
    if name == "uint16":
        return Encoded(tensor_pb2.BFLOAT16, a.shape, _little_endian_contiguous(a, np.uint16),
                       Like.NUMPY)
    if name == "float16":
        return Encoded(tensor_pb2.FLOAT16, a.shape, _little_endian_contiguous(a, np.float16),
                       Like.NUMPY)
    if name == "float32":
        return Encoded(tensor_pb2.FLOAT32, a.shape, _little_endian_contiguous(a, np.float32),
                       Like.NUMPY)
    if a.dtype.kind in "fiub":
        return Encoded(tensor_pb2.FLOAT32, a.shape,
                       np.ascontiguousarray(a, dtype=np.dtype("<f4")), Like.NUMPY)
    raise InvalidArgument("%s: cannot send an array of dtype %s (float32, float16, uint16 as "
                          "bfloat16 bits, or a torch tensor)" % (what, a.dtype))


def to_proto(x, what="tensor"):
    """An attend.v1.Tensor holding `x`'s bytes (`data`). Protobuf copies them into the message;
    the big-tensor RPCs use serialize_with_tensors instead, which does not."""
    e = encode(x, what)
    return tensor_pb2.Tensor(dtype=e.dtype, shape=e.shape, data=e.array.tobytes())


_NUMPY_OF = {tensor_pb2.FLOAT32: np.dtype("<f4"), tensor_pb2.FLOAT16: np.dtype("<f2"),
             tensor_pb2.BFLOAT16: np.dtype("<u2")}


def from_proto(t, like=None):
    """The elements of attend.v1.Tensor `t` as an array shaped like it: a read-only NumPy view of
    the message's bytes, or a torch tensor when `like` says the input was torch. `values` come
    back as float32. Internal error (the server's fault) when the bytes do not fill the shape."""
    shape = tuple(t.shape)
    data = t.data  # each read of a bytes field copies it out of the message: read it once
    if len(t.values) or not data:
        a = np.asarray(t.values, dtype=np.float32)
        dtype = tensor_pb2.FLOAT32
    else:
        dtype = t.dtype or tensor_pb2.FLOAT32
        np_dtype = _NUMPY_OF.get(dtype)
        if np_dtype is None:
            raise Internal("the server sent a tensor of dtype %d, which is not a tensor dtype"
                           % dtype)
        if len(data) % np_dtype.itemsize:
            raise Internal("the server sent %d bytes of %s" % (len(data), DType.Name(dtype)))
        a = np.frombuffer(data, dtype=np_dtype)
    if a.size != int(np.prod(shape, dtype=np.int64)):
        raise Internal("the server sent %d elements for shape %s" % (a.size, list(shape)))
    a = a.reshape(shape)
    like = like or Like.NUMPY
    if like.torch_device is not None:
        torch = _torch()
        if dtype == tensor_pb2.BFLOAT16:
            out = torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
        else:
            # torch wants a writable buffer; the response's bytes are not.
            out = torch.from_numpy(a.astype(a.dtype.newbyteorder("="), copy=True))
        return out if like.torch_device.type == "cpu" else out.to(like.torch_device)
    if dtype == tensor_pb2.BFLOAT16 and like.bf16_numpy_dtype is not None:
        return a.view(like.bf16_numpy_dtype)
    return a


def float32_to_bfloat16(x):
    """bfloat16 bit patterns (uint16) of `x`, rounded to nearest even as attend rounds; NaN stays
    NaN. What a NumPy caller sends to get BFLOAT16 on the wire."""
    a = np.ascontiguousarray(x, dtype=np.float32)
    bits = a.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(a)
    if nan.any():
        rounded[nan] = ((bits[nan] >> 16) | 0x40).astype(np.uint16)
    return rounded


def bfloat16_to_float32(bits):
    """float32 values of bfloat16 bit patterns (uint16 arrays, or an ml_dtypes.bfloat16 array):
    exact, since bfloat16 is the upper half of a float32."""
    a = np.asarray(bits)
    if a.dtype.name == "bfloat16":
        a = a.view(np.uint16)
    return (a.astype(np.uint32) << 16).view(np.float32)


# --- protobuf wire encoding around big buffers --------------------------------------------------

_LEN = 2  # protobuf wire type of length-delimited fields


def _varint(n):
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def serialize_with_tensors(message, tensors):
    """The serialized bytes of `message` with the Tensor fields in `tensors` ({field number:
    Encoded}) set, written without copying the tensors into protobuf first.

    `message` must not set those fields itself. Protobuf parsers merge a message field that
    appears after the rest of the message into it, so the message's own bytes followed by each
    tensor field (its dtype and shape serialized by protobuf, then its `data` field written here
    around the array's buffer) parse as the message with the tensors set. The one copy is
    bytes.join, gathering everything into the buffer gRPC sends.
    """
    parts = [message.SerializeToString()]
    data_key = _varint((3 << 3) | _LEN)  # Tensor.data
    for number, e in sorted(tensors.items()):
        if e is None:
            continue
        header = tensor_pb2.Tensor(dtype=e.dtype, shape=e.shape).SerializeToString()
        nbytes = e.nbytes
        data_prefix = data_key + _varint(nbytes) if nbytes else b""
        parts += [_varint((number << 3) | _LEN),
                  _varint(len(header) + len(data_prefix) + nbytes), header, data_prefix,
                  e.buffer()]
    return b"".join(parts)


def tensor_field_bytes(e):
    """Upper bound of the bytes that serialize_with_tensors writes for tensor `e` beyond its data:
    the field's key and length, the dtype, the shape and the data field's key and length."""
    return 2 * 11 + 2 + 2 + 11 * (len(e.shape) + 1)
