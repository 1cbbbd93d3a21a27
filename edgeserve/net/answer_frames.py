"""The wire form of an answer (`result_message`), and the frame of an `ok` answer written from
cached pieces: the same bytes as `encode_frame(result_message(...))`, in about two thirds of the time.

Every served request costs the event loop one answer, and building the result map (four dicts, a
tensor map per output, three rounded timings) and packing it was the largest single part of the
loop's time per served request (docs/runtime.md, "Answers from cached pieces"). msgpack writes
a map's fields in order and each value independently, so the parts that repeat from one answer to
the next (the keys, the model, the exit, a tensor's dtype and shape) are packed once and kept, and
only the id, the outputs' bytes, the timings and the priority are packed per answer.

Where it is built (setup.py), a compiled writer (net/_answer.c) writes the frame from the same
caches, the same bytes in about a sixth of the time; what the caches do not hold yet is written
here, which fills them.

Anything unusual (not `ok`, no outputs, an output that is not a C-ordered array of a wire-ready
dtype, 16 outputs or more) returns None and takes the general encoder. The caches are bounded:
their keys come from the config (models, exits, upstreams) except the outputs' shapes, which a
model with dynamic output shapes could vary.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from typing import Any, TypeVar

import msgpack
import numpy as np

from edgeserve.runtime import Result, Status
from edgeserve.wire.bounds import ERROR_TEXT_LIMIT, cut
from edgeserve.wire.frames import HEADER
from edgeserve.wire.tensors import WIRE_READY, encode_tensor  # WIRE_READY: bytes already the wire's

try:  # the same frame written from the caches, compiled (setup.py; optional)
    from edgeserve.net._answer import frame as _compiled_frame
except ImportError:  # pragma: no cover - a machine without a C compiler
    _compiled_frame = None

K = TypeVar("K")
V = TypeVar("V")
CACHE_LIMIT = 256  # entries per cache; past it a cache starts again
MAX_OUTPUTS = 15  # a fixmap: more outputs take the general encoder
_FLOAT = struct.Struct(">Bd").pack  # a msgpack float 64: what msgpack writes for a Python float
_NIL = b"\xc0"
# The result map's 12 fields in result_message's order; "type" and the key "id" come first.
_HEAD = b"\x8c\xa4type\xa6result\xa2id"
_ERROR_NIL = b"\xa5error\xc0"
ROUNDED_BELOW = 1e15  # ms; larger timings are kept as they are (no float has 4 places there)


def timing_ms(seconds: float) -> float | None:
    """An answer's timing in ms, rounded to 4 places; None when unknown (nan).

    Rounded as round(ms * 1e4) / 1e4, not round(ms, 4): the compiled writer (net/_answer.c) gives
    the same float to the bit with C's rint, which round(ms, 4)'s decimal rounding would not."""
    ms = seconds * 1000.0
    if ms != ms:
        return None
    return round(ms * 1e4) / 1e4 if abs(ms) < ROUNDED_BELOW else ms


def output_field(output: object) -> dict[str, Any] | None:
    """The wire form of an output (None stays None)."""
    return None if output is None else encode_tensor(np.asarray(output))


def result_message(request_id: int, result: Result, priority: int | None) -> dict[str, Any]:
    """The wire form of a Result (docs/protocol.md, "result")."""
    exit_info = None
    if result.exit_index is not None:
        exit_info = {
            "index": result.exit_index,
            "name": result.exit_name,
            "accuracy": result.expected_accuracy,
        }
    queued, start, end = result.queued, result.start, result.end
    status = result.status
    outputs = None if result.outputs is None else {k: output_field(v) for k, v in result.outputs.items()}
    output = output_field(result.output) if not outputs else next(iter(outputs.values()))  # encoded once
    return {
        "type": "result",
        "id": request_id,
        "status": status.value,
        "model": result.model,
        "output": output,
        "outputs": outputs,
        "exit": exit_info,
        "late": status is Status.OK and end > result.deadline,
        "served_by": result.served_by,
        "timings": {
            "queue_ms": timing_ms(start - queued),
            "service_ms": timing_ms(end - start),
            "total_ms": timing_ms(end - queued),
            "batch_size": result.batch_size,
        },
        "priority": priority,
        "error": None if result.error is None else cut(result.error, ERROR_TEXT_LIMIT),
    }


def _ms(seconds: float) -> bytes:
    ms = timing_ms(seconds)
    return _NIL if ms is None else _FLOAT(0xCB, ms)


def _bin_header(size: int) -> bytes:
    if size <= 0xFF:
        return b"\xc4" + size.to_bytes(1, "big")
    if size <= 0xFFFF:
        return b"\xc5" + size.to_bytes(2, "big")
    return b"\xc6" + size.to_bytes(4, "big")


class AnswerFrames:
    """Frames of `ok` answers; one per front (its caches are its own, not global)."""

    def __init__(self) -> None:
        self._pack: Callable[[Any], bytes] = msgpack.Packer(use_bin_type=True).pack
        self._models: dict[str, bytes] = {}
        self._layouts: dict[tuple[str, np.dtype[Any], tuple[int, ...]], tuple[bytes, bytes]] = {}
        self._exits: dict[tuple[int, str | None, float | None], bytes] = {}
        self._served: dict[str, bytes] = {}
        self._tables = (Result, Status.OK, np.ndarray, self._models, self._layouts, self._exits, self._served)

    def frame(self, request_id: int, result: Result, priority: int | None) -> bytes | None:
        """The frame of `result`'s answer to `request_id`, or None where the general encoder must
        write it (see the module docstring)."""
        if _compiled_frame is not None:
            written = _compiled_frame(request_id, result, priority, self._tables)
            if written is not None:
                return written
        return self.written_here(request_id, result, priority)

    def written_here(self, request_id: int, result: Result, priority: int | None) -> bytes | None:
        """`frame` without the compiled writer: the way that fills the caches."""
        outputs = result.outputs
        if (
            result.status is not Status.OK
            or not outputs
            or len(outputs) > MAX_OUTPUTS
            or result.exit_index is None
            or result.error is not None
        ):
            return None
        pieces: list[bytes] = []
        first = b""
        for name, value in outputs.items():
            if type(value) is not np.ndarray or not value.flags.c_contiguous:
                return None
            layout = self._layouts.get((name, value.dtype, value.shape))
            if layout is None:
                if value.dtype not in WIRE_READY:
                    return None
                layout = self._layout(name, value.dtype, value.shape)
            data = value.tobytes()
            if not pieces:
                first = layout[1]
            pieces += (layout[0], data)
        pack = self._pack
        model, exit, served = self._shared(result)
        queued, start, end = result.queued, result.start, result.end
        body = b"".join(
            (
                _HEAD,
                pack(request_id),
                model,
                first,  # "output": the first output's tensor
                pieces[1],
                b"\xa7outputs",
                (0x80 | len(outputs)).to_bytes(1, "big"),
                *pieces,
                exit,
                b"\xc3" if result.late else b"\xc2",
                served,
                _ms(start - queued),
                b"\xaaservice_ms",
                _ms(end - start),
                b"\xa8total_ms",
                _ms(end - queued),
                b"\xaabatch_size",
                pack(result.batch_size),
                b"\xa8priority",
                pack(priority),
                _ERROR_NIL,
            )
        )
        return HEADER.pack(len(body)) + body

    def _shared(self, result: Result) -> tuple[bytes, bytes, bytes]:
        """The packed fields an answer shares with the others of its model, exit and upstream."""
        pack = self._pack
        model = self._models.get(result.model)
        if model is None:
            fields = b"\xa6status\xa2ok\xa5model" + pack(result.model) + b"\xa6output"
            model = _put(self._models, result.model, fields)
        key = (result.exit_index, result.exit_name, result.expected_accuracy)
        exit = self._exits.get(key)
        if exit is None:
            info = {"index": key[0], "name": key[1], "accuracy": key[2]}
            exit = _put(self._exits, key, b"\xa4exit" + pack(info) + b"\xa4late")
        served = self._served.get(result.served_by)
        if served is None:
            tail = b"\xa9served_by" + pack(result.served_by) + b"\xa7timings\x84\xa8queue_ms"
            served = _put(self._served, result.served_by, tail)
        return model, exit, served

    def _layout(self, name: str, dtype: np.dtype[Any], shape: tuple[int, ...]) -> tuple[bytes, bytes]:
        """An output's name and its tensor map up to its data (dtype, shape, the key "data" and
        the bin header), packed; and the same without the name (the field "output")."""
        size = dtype.itemsize * math.prod(shape)
        tensor = self._pack({"dtype": WIRE_READY[dtype], "shape": list(shape), "data": b""})
        bare = tensor[:-2] + _bin_header(size)  # the empty bin (c4 00) replaced by the data's header
        return _put(self._layouts, (name, dtype, shape), (self._pack(name) + bare, bare))


def _put(cache: dict[K, V], key: K, value: V) -> V:
    if len(cache) >= CACHE_LIMIT:
        cache.clear()
    cache[key] = value
    return value
