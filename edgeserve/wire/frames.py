"""The frame codec and message validation of docs/protocol.md.

A frame is a 4-byte big-endian length followed by that many bytes of one msgpack map. Decoding
never trusts the peer: msgpack's length limits cap every container at the frame size, maps need
string keys, and each message is checked field by field into a dataclass, with an error string
that names the field. Error strings quote at most a few hundred characters of what was sent
(`brief`), whatever its size or nesting, and are never longer than about bounds.ERROR_TEXT_LIMIT.
`deadline_ms` and `capture_ts` have bounds (bounds.timing_problem), shared with runtime/budget.request_budget.
"""

from __future__ import annotations

import math
import struct
import time
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

from edgeserve.wire.bounds import (
    MAX_CLOCK_SKEW_S,
    MAX_DEADLINE_MS,
    MIN_DEADLINE_MS,
    brief,
    cut,
    real,
    timing_problem,
)
from edgeserve.wire.tensors import TensorError, decode_tensor

try:  # fast_infer's common case read from the frame's bytes, compiled (setup.py; optional)
    from edgeserve.wire._infer import parse as _compiled_parse
except ImportError:  # pragma: no cover - a machine without a C compiler
    _compiled_parse = None

PROTOCOL_VERSION = 1
# The error text of a request refused because its connection's window was full: refused from its id
# alone, before anything else was read of it, so a client may send it again (wire/client.py does).
TOO_MANY_IN_FLIGHT = "too many requests in flight"
HEADER = struct.Struct(">I")
MAX_ID = 2**63 - 1
MAX_MODEL_NAME = 256
UNIFORM_RUN = 32  # in a mixed stream, frames from which newest_frames_start checks a run with numpy


class ProtocolError(ValueError):
    """A frame or message is malformed. `request_id` is set when the message's id was readable."""

    def __init__(self, message: str, request_id: int | None = None) -> None:
        super().__init__(cut(message))
        self.request_id = request_id


def encode_frame(message: dict[str, Any]) -> bytes:
    """Length prefix + msgpack body (bin type for bytes)."""
    body = msgpack.packb(message, use_bin_type=True)
    return HEADER.pack(len(body)) + body


def newest_frames_start(buffer: bytearray, size: int, count: int) -> int:
    """Where the last `count` complete frames of buffer[:size] begin (0 if it holds no more than
    `count`): a front that has room for `count` requests serves those and refuses the older ones.
    Only the length headers are read, and a flood's frames are alike: whether all the frames left
    have the length of the next one is one strided comparison per header byte, so a read of
    hundreds of frames costs a few us; a mixed stream is walked frame by frame, with numpy over
    runs of UNIFORM_RUN frames or more."""
    runs: list[tuple[int, int, int]] = []  # (start, frame size, frames): the complete frames, in order
    pos, mixed, unpack_from, header = 0, False, HEADER.unpack_from, HEADER.size
    while size - pos >= header:
        step = header + unpack_from(buffer, pos)[0]
        if size - pos < step:
            break
        fit = (size - pos) // step
        if fit > 1 and not mixed and _all_of_size(buffer, pos, step, fit):
            same = fit
        else:
            mixed = mixed or fit > 1
            same = _same_size_run(buffer, pos, step, fit) if fit >= UNIFORM_RUN else 1
        runs.append((pos, step, same))
        pos += same * step
    left = count
    for start, step, frames in reversed(runs):
        if frames >= left:
            return start + (frames - left) * step
        left -= frames
    return 0


def _all_of_size(buffer: bytearray, pos: int, step: int, fit: int) -> bool:
    """Whether the `fit` frames of `step` bytes that may follow from `pos` all have that size: each
    header byte, taken from every frame by one strided slice, is that size's."""
    head, stop = HEADER.pack(step - HEADER.size), pos + fit * step
    return (
        buffer[pos + 3 : stop : step] == head[3:4] * fit  # the low byte first: it differs most often
        and buffer[pos + 2 : stop : step] == head[2:3] * fit
        and buffer[pos + 1 : stop : step] == head[1:2] * fit
        and buffer[pos:stop:step] == head[0:1] * fit
    )


def _same_size_run(buffer: bytearray, pos: int, step: int, fit: int) -> int:
    """How many of the `fit` frames of `step` bytes that may follow from `pos` have that size, in a
    row from the first."""
    with memoryview(buffer) as view:  # no copy of the frames; the arrays go before the view does
        frames = np.frombuffer(view[pos : pos + fit * step], dtype=np.uint8).reshape(fit, step)
        lengths = np.ascontiguousarray(frames[:, : HEADER.size]).view(">u4").ravel()
        del frames
    other = np.flatnonzero(lengths != step - HEADER.size)
    return fit if other.size == 0 else int(other[0])


def decode_body(body: bytes, max_frame_bytes: int) -> dict[str, Any]:
    """One frame's msgpack map; ProtocolError for anything else (no exception of msgpack escapes)."""
    try:
        message = msgpack.unpackb(
            body,
            raw=False,
            strict_map_key=True,
            max_bin_len=max_frame_bytes,
            max_str_len=max_frame_bytes,
            max_array_len=max_frame_bytes,
            max_map_len=max_frame_bytes // 2,
            max_ext_len=0,
        )
    except RecursionError:
        raise ProtocolError("frame is not one msgpack value: nested too deeply") from None
    except Exception as exc:  # msgpack raises several types (ExtraData, ValueError, UnicodeError, ...)
        # the exception's text can quote the data (ExtraData holds the whole rest of the frame)
        raise ProtocolError(f"frame is not one msgpack value: {type(exc).__name__}: {_text(exc)}") from None
    if not isinstance(message, dict):
        raise ProtocolError(f"frame must hold a msgpack map, got {type(message).__name__}")
    return message


@dataclass(frozen=True)
class Hello:
    version: int
    token: str | None
    client: str | None


@dataclass(frozen=True)
class InferRequest:
    """`tensor` (a single-input model's one input) or `inputs` (by name): exactly one is set."""

    id: int
    model: str
    tensor: np.ndarray | None
    deadline_ms: float | None = None
    capture_ts: float | None = None
    priority: int | None = None
    inputs: dict[str, np.ndarray] | None = None

    @property
    def sample(self) -> np.ndarray | dict[str, np.ndarray]:
        """What the Server takes for this request."""
        if self.inputs is not None:
            return self.inputs
        assert self.tensor is not None
        return self.tensor


def message_type(message: dict[str, Any]) -> str:
    kind = message.get("type")
    if kind not in ("hello", "infer"):
        raise ProtocolError(f'type must be "hello" or "infer", got {brief(kind)}', id_of(message))
    return kind


def parse_hello(message: dict[str, Any]) -> Hello:
    _only(message, ("type", "version", "token", "client"), None)
    version = message.get("version")
    if type(version) is not int or version != PROTOCOL_VERSION:  # 1.0 and True compare equal to 1
        raise ProtocolError(f"hello.version must be {PROTOCOL_VERSION}, got {brief(version)}")
    token, client = message.get("token"), message.get("client")
    if token is not None and not isinstance(token, str):
        raise ProtocolError(f"hello.token must be a string, got {type(token).__name__}")
    if client is not None and not isinstance(client, str):
        raise ProtocolError(f"hello.client must be a string, got {type(client).__name__}")
    return Hello(version, token, client)


def id_of(message: dict[str, Any]) -> int | None:
    """The message's id if it is a valid one, else None."""
    value = message.get("id")
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_ID:
        return value
    return None


def _only(message: dict[str, Any], allowed: tuple[str, ...], request_id: int | None) -> None:
    unknown = [k for k in message if k not in allowed]
    if unknown:
        raise ProtocolError(f"unknown fields {brief(unknown)} (allowed: {', '.join(allowed)})", request_id)


def _text(exc: BaseException) -> str:
    """An exception's message, bounded (it may quote client data)."""
    try:
        return brief(str(exc))
    except Exception:  # str() of the exception itself failed (RecursionError, a broken __str__)
        return "(unprintable)"


def parse_infer(message: dict[str, Any]) -> InferRequest:
    """The request, or ProtocolError naming the bad field (with the id once the id is valid)."""
    request_id = id_of(message)
    if request_id is None:
        raise ProtocolError(f"infer.id must be an integer in 0..2**63-1, got {brief(message.get('id'))}")
    allowed = ("type", "id", "model", "tensor", "inputs", "deadline_ms", "capture_ts", "priority")
    _only(message, allowed, request_id)
    model = message.get("model")
    if not isinstance(model, str) or not 0 < len(model) <= MAX_MODEL_NAME:
        raise ProtocolError(f"infer.model must be a model name, got {brief(model, 80)}", request_id)
    tensor: np.ndarray | None = None
    inputs: dict[str, np.ndarray] | None = None
    if ("tensor" in message) == ("inputs" in message):
        raise ProtocolError(
            "infer needs exactly one of tensor (a single-input model's input) and inputs (a map "
            "from input name to tensor)",
            request_id,
        )
    if "inputs" in message:
        inputs = _inputs(message["inputs"], request_id)
    else:
        try:
            tensor = decode_tensor(message.get("tensor"))
        except TensorError as exc:
            raise ProtocolError(f"infer.{exc}", request_id) from None
    deadline_ms, capture_ts = message.get("deadline_ms"), message.get("capture_ts")
    problem = timing_problem(deadline_ms, capture_ts, time.time())
    if problem is not None:
        separator = ": " if problem.startswith("give ") else "."
        raise ProtocolError(f"infer{separator}{problem}", request_id)
    priority = message.get("priority")
    if priority is not None and type(priority) is not int:
        raise ProtocolError(f"infer.priority must be an integer, got {brief(priority)}", request_id)
    if priority is not None and not -(2**31) <= priority < 2**31:
        raise ProtocolError(f"infer.priority must fit in 32 bits, got {brief(priority)}", request_id)
    return InferRequest(request_id, model, tensor, real(deadline_ms), real(capture_ts), priority, inputs)


MAX_INPUTS = 64


def _inputs(value: object, request_id: int) -> dict[str, np.ndarray]:
    """infer.inputs: a map of 1..MAX_INPUTS input names to tensors, each decoded like `tensor`."""
    if not isinstance(value, dict) or not 0 < len(value) <= MAX_INPUTS:
        raise ProtocolError(
            f"infer.inputs must be a map of 1 to {MAX_INPUTS} input names to tensors, got {brief(value)}",
            request_id,
        )
    inputs = {}
    for name, tensor in value.items():
        if not 0 < len(name) <= MAX_MODEL_NAME:
            raise ProtocolError(f"infer.inputs names must be 1 to {MAX_MODEL_NAME} characters", request_id)
        try:
            inputs[name] = decode_tensor(tensor)
        except TensorError as exc:
            raise ProtocolError(f"infer.inputs[{brief(name, 80)}].{exc}", request_id) from None
    return inputs


INFER_FIELDS = frozenset(("type", "id", "model", "tensor", "deadline_ms", "capture_ts", "priority"))
_TENSOR_FIELDS = frozenset(("dtype", "shape", "data"))
_NUMBERS = (float, int)  # exact types: a bool is not a number here
_LATEST_CAPTURE = 2.0**40  # seconds; any capture_ts past it is left to the full checks


@dataclass(frozen=True)
class SampleSpec:
    """What one model takes, precomputed for `fast_infer`: the wire dtype name and shape, the byte
    count, and the numpy dtype to view the bytes with."""

    dtype_name: str
    shape: tuple[int, ...]
    nbytes: int
    dtype: np.dtype[Any]

    @classmethod
    def of(cls, dtype_name: str, shape: tuple[int, ...]) -> SampleSpec | None:
        """None where the fast path cannot view the bytes as they are (a big-endian machine)."""
        dtype = np.dtype(dtype_name)
        if dtype.newbyteorder("<") != dtype:
            return None
        return cls(dtype_name, tuple(shape), math.prod(shape) * dtype.itemsize, dtype)


FastInfer = tuple[int, str, np.ndarray, "float | None", "float | None", "int | None"]
# What the compiled reader takes: per model served as it is, its name in UTF-8, the name, its
# SampleSpec, the wire dtype name, the shape and the data's size (wire/_infer.c).
InferTable = tuple[tuple[bytes, str, SampleSpec, bytes, tuple[int, ...], int], ...]
RequestHead = tuple[int, str, "int | None"]  # a request's id, model and priority


def infer_table(specs: dict[str, SampleSpec]) -> InferTable:
    """`specs` as the compiled reader (`compiled_infer`) takes them."""
    return tuple(
        (name.encode(), name, spec, spec.dtype_name.encode(), spec.shape, spec.nbytes)
        for name, spec in specs.items()
    )


def compiled_infer(buffer: bytearray, start: int, end: int, table: InferTable) -> FastInfer | None:
    """What `fast_infer(decode_body(buffer[start:end]))` gives, read straight from the bytes where
    the compiled reader is built (setup.py), for a request without capture_ts; None otherwise, and
    the caller reads the frame the general way. Its tensor is a copy: the buffer moves on."""
    if _compiled_parse is None:
        return None
    found = _compiled_parse(buffer, start, end, table)
    if found is None:
        return None
    request_id, model, spec, at, deadline_ms, priority = found
    sample = np.frombuffer(buffer[at : at + spec.nbytes], dtype=spec.dtype).reshape(spec.shape)
    return request_id, model, sample, deadline_ms, None, priority


def compiled_head(buffer: bytearray, start: int, end: int, table: InferTable) -> RequestHead | None:
    """The id, model and priority of a request `compiled_infer` would take, without its tensor:
    what a refusal needs; None where it would not (the caller then decodes the frame)."""
    if _compiled_parse is None:
        return None
    found = _compiled_parse(buffer, start, end, table)
    return None if found is None else (found[0], found[1], found[5])


def refusal_head(message: dict[str, Any]) -> RequestHead | None:
    """The id, model and priority a window refusal of `message` answers with (a model name or
    priority it cannot echo becomes "" or None); None if it is not an infer with a valid id."""
    request_id = message.get("id")
    if message.get("type") != "infer" or type(request_id) is not int or not 0 <= request_id <= MAX_ID:
        return None
    model, priority = message.get("model"), message.get("priority")
    model = model if type(model) is str and len(model) <= MAX_MODEL_NAME else ""
    priority = priority if type(priority) is int and -(2**31) <= priority < 2**31 else None
    return request_id, model, priority


def fast_infer(message: dict[str, Any], specs: dict[str, SampleSpec]) -> FastInfer | None:
    """The common request in a few comparisons: (id, model, sample, deadline_ms, capture_ts,
    priority) for a message that `parse_infer` would accept as it is and whose tensor is exactly
    what its model takes (a model in `specs`); None for anything else, which then takes the full
    checks (and gets their error message). Several times cheaper than parse_infer: under overload
    the loop's time per frame decides how much gets served."""
    if message.get("type") != "infer" or not message.keys() <= INFER_FIELDS:
        return None
    request_id, model, tensor = message.get("id"), message.get("model"), message.get("tensor")
    if type(request_id) is not int or not 0 <= request_id <= MAX_ID or type(tensor) is not dict:
        return None
    spec = specs.get(model) if type(model) is str else None
    if spec is None or len(tensor) != 3 or not tensor.keys() <= _TENSOR_FIELDS:
        return None
    data, shape = tensor["data"], tensor["shape"]
    if type(data) is not bytes or len(data) != spec.nbytes or tensor["dtype"] != spec.dtype_name:
        return None
    if type(shape) is not list or len(shape) != len(spec.shape):
        return None
    for got, want in zip(shape, spec.shape, strict=True):
        if type(got) is not int or got != want:
            return None
    deadline_ms, capture_ts = message.get("deadline_ms"), message.get("capture_ts")
    if deadline_ms is not None:  # bounds compared before float(): a huge int must not overflow
        if capture_ts is not None or type(deadline_ms) not in _NUMBERS:
            return None
        if not MIN_DEADLINE_MS <= deadline_ms <= MAX_DEADLINE_MS:
            return None
        deadline_ms = float(deadline_ms)
    elif capture_ts is not None:
        if type(capture_ts) not in _NUMBERS or not 0 < capture_ts < _LATEST_CAPTURE:
            return None
        capture_ts = float(capture_ts)
        if not abs(time.time() - capture_ts) <= MAX_CLOCK_SKEW_S:
            return None
    priority = message.get("priority")
    if priority is not None and (type(priority) is not int or not -(2**31) <= priority < 2**31):
        return None
    sample = np.frombuffer(data, dtype=spec.dtype).reshape(spec.shape)
    return request_id, model, sample, deadline_ms, capture_ts, priority
