"""Tensors on the wire: {dtype, shape, data} with raw little-endian bytes, checked before use.

The dtype is taken from an allow-list and the byte count must equal prod(shape) * itemsize, so a
peer can neither make the server allocate more than it sent nor reinterpret memory. The shape's
arithmetic is done in Python ints before numpy sees it, and error messages quote at most a few
hundred characters of what was sent (bounds.brief).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from edgeserve.wire.bounds import brief

DTYPES = ("uint8", "int8", "uint16", "int16", "int32", "int64", "float16", "float32", "float64", "bool")
MAX_NDIM = 8
MAX_DIM = 2**31 - 1  # one size of a shape
MAX_ELEMENTS = 2**31 - 1  # prod(shape), a 0 counted as 1: numpy's sizes never overflow


class TensorError(ValueError):
    """A tensor field is malformed; the message says which part."""


# The sendable dtypes whose bytes are already the wire's (little-endian, or one byte wide).
WIRE_READY = {np.dtype(n): n for n in DTYPES if np.dtype(n).newbyteorder("<") == np.dtype(n)}


def encode_tensor(array: np.ndarray) -> dict[str, Any]:
    """The wire form of `array` (copied to C order, little-endian). A C-ordered array whose bytes
    are the wire's (the usual case: a camera frame, a model's output row) skips the conversion."""
    name = WIRE_READY.get(array.dtype)
    if name is not None and array.flags.c_contiguous:
        return {"dtype": name, "shape": list(array.shape), "data": array.tobytes()}
    if array.dtype.name not in DTYPES:
        raise TensorError(f"dtype {array.dtype} is not sendable; use one of {', '.join(DTYPES)}")
    data = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
    return {"dtype": array.dtype.name, "shape": [int(n) for n in array.shape], "data": data}


def decode_tensor(value: object) -> np.ndarray:
    """A read-only array viewing the received bytes; TensorError says what is wrong.

    The shape is checked in Python ints before numpy sees it: every size in 0..MAX_DIM, and the
    element count, counting a 0 as 1 (numpy refuses a shape such as [0, 2**31-1, 2**31-1] whose
    other sizes overflow, empty or not), at most MAX_ELEMENTS.
    """
    if not isinstance(value, dict):
        raise TensorError(f"tensor must be a map with dtype, shape and data, got {type(value).__name__}")
    unknown = [k for k in value if k not in ("dtype", "shape", "data")]
    if unknown:
        raise TensorError(f"tensor has unknown keys {brief(unknown)} (allowed: dtype, shape, data)")
    dtype, shape, data = value.get("dtype"), value.get("shape"), value.get("data")
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise TensorError(f"tensor.dtype must be one of {', '.join(DTYPES)}, got {brief(dtype)}")
    if not isinstance(shape, list) or len(shape) > MAX_NDIM:
        raise TensorError(f"tensor.shape must be a list of at most {MAX_NDIM} sizes, got {brief(shape)}")
    if not all(type(n) is int and 0 <= n <= MAX_DIM for n in shape):
        raise TensorError(f"tensor.shape must hold non-negative integers up to {MAX_DIM}, got {brief(shape)}")
    if not isinstance(data, bytes):
        raise TensorError(f"tensor.data must be bytes (msgpack bin), got {type(data).__name__}")
    if math.prod(max(n, 1) for n in shape) > MAX_ELEMENTS:
        raise TensorError(
            f"tensor.shape {brief(shape)} is too large: more than {MAX_ELEMENTS} elements "
            "(a size of 0 counted as 1)"
        )
    kind = np.dtype(dtype).newbyteorder("<")
    expected = math.prod(shape) * kind.itemsize
    if len(data) != expected:
        raise TensorError(f"tensor.data has {len(data)} bytes; {dtype} {brief(shape)} needs {expected}")
    if dtype == "bool" and data.translate(None, b"\x00\x01"):
        raise TensorError("tensor.data of a bool tensor must hold only bytes 0 and 1")
    return np.frombuffer(data, dtype=kind).reshape(shape).astype(dtype, copy=False)
