"""Tensors on the wire: {dtype, shape, data} with raw little-endian bytes, checked before use.

The dtype is taken from an allow-list and the byte count must equal prod(shape) * itemsize, so a
peer can neither make the server allocate more than it sent nor reinterpret memory.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

DTYPES = ("uint8", "int8", "uint16", "int16", "int32", "int64", "float16", "float32", "float64")
MAX_NDIM = 8


class TensorError(ValueError):
    """A tensor field is malformed; the message says which part."""


def encode_tensor(array: np.ndarray) -> dict[str, Any]:
    """The wire form of `array` (copied to C order, little-endian)."""
    if array.dtype.name not in DTYPES:
        raise TensorError(f"dtype {array.dtype} is not sendable; use one of {', '.join(DTYPES)}")
    data = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
    return {"dtype": array.dtype.name, "shape": [int(n) for n in array.shape], "data": data}


def decode_tensor(value: object) -> np.ndarray:
    """A read-only array viewing the received bytes; TensorError says what is wrong."""
    if not isinstance(value, dict):
        raise TensorError(f"tensor must be a map with dtype, shape and data, got {type(value).__name__}")
    unknown = set(value) - {"dtype", "shape", "data"}
    if unknown:
        raise TensorError(f"tensor has unknown keys {sorted(map(str, unknown))}")
    dtype, shape, data = value.get("dtype"), value.get("shape"), value.get("data")
    if dtype not in DTYPES:
        raise TensorError(f"tensor.dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if not isinstance(shape, list) or len(shape) > MAX_NDIM:
        raise TensorError(f"tensor.shape must be a list of at most {MAX_NDIM} sizes, got {shape!r}")
    if not all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 2**31 for n in shape):
        raise TensorError(f"tensor.shape must hold non-negative integers, got {shape!r}")
    if not isinstance(data, bytes):
        raise TensorError(f"tensor.data must be bytes (msgpack bin), got {type(data).__name__}")
    kind = np.dtype(dtype).newbyteorder("<")
    expected = math.prod(shape) * kind.itemsize
    if len(data) != expected:
        raise TensorError(f"tensor.data has {len(data)} bytes; {dtype} {shape} needs {expected}")
    return np.frombuffer(data, dtype=kind).reshape(shape).astype(dtype, copy=False)
