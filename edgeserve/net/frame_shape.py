"""The byte layout of one request frame, learned once and matched against many frames at once.

Under overload most frames are refused from their id alone (net/refusals.py), and decoding each
one costs about a microsecond of the event loop's time, which at 10x capacity is over a tenth of
a core. A flooding client's frames are nearly always alike: the same fields in the same order,
the same model, a tensor of the same size; what changes is the id, the tensor's bytes and floats
such as a deadline. A FrameShape records which bytes of one frame are *structure* (the length
header, map and array headers, keys, strings, integers, the type and length bytes of bins and
floats) and which are *payload* (a bin's bytes, a float's bytes, the id's bytes). A frame of the
same length whose structure bytes are all equal decodes to the same map but for those payloads:
the same type, model and priority, an id in the same place. So it is refused exactly as the
learned one was, and a block of hundreds of frames is checked and answered in one call (_shapes.c,
the GIL released; numpy where it was not built). Frames that differ anywhere in the structure
simply do not match and take the general path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgeserve.wire.frames import HEADER, refusal_head

try:  # the same check and answers compiled (setup.py; optional: without a C compiler numpy does it)
    from edgeserve.net._shapes import refuse as compiled_refuse
except ImportError:  # pragma: no cover - a machine without a C compiler
    compiled_refuse = None

_FIXED = {0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8, 0xD0: 1, 0xD1: 2, 0xD2: 4, 0xD3: 8}  # ints
_FLOATS = {0xCA: 4, 0xCB: 8}
_SIZED = {0xC4: 1, 0xC5: 2, 0xC6: 4, 0xD9: 1, 0xDA: 2, 0xDB: 4}  # bin and str: bytes of length
_BINS = (0xC4, 0xC5, 0xC6)
_CONTAINERS = {0xDC: (2, 1), 0xDD: (4, 1), 0xDE: (2, 2), 0xDF: (4, 2)}  # (length bytes, items each)
_UNSIGNED = (0xCC, 0xCD, 0xCE)  # ids whose every payload is in 0 .. MAX_ID
# A request's structure is a few dozen values and bytes; a frame with more is not learned (the walk
# is Python, and each shape keeps its structure's offsets).
MAX_VALUES = 256
MAX_STRUCTURE = 4096


# The bytes before and after the id of the answer to a frame of a shape (FrameShapes.refuse).
Answer = Callable[["FrameShape"], tuple[bytes, bytes]]
# A shape as compiled_refuse takes it: mask, wanted bytes, id_at, id_size, sign_at (-1: none), and
# the answer's bytes before and after the id.
Compiled = tuple[bytes, bytes, int, int, int, bytes, bytes]


class _Unsupported(Exception):
    """A frame whose layout a FrameShape does not describe (ext types, odd keys, odd ids)."""


@dataclass(frozen=True, eq=False)
class FrameShape:
    """Which bytes of a frame of `length` bytes (header included) must equal `values`."""

    length: int
    columns: np.ndarray  # offsets of the structure bytes (intp)
    values: np.ndarray  # their bytes in the learned frame (uint8)
    id_at: int  # offset of the id's whole msgpack encoding (type byte included)
    id_size: int
    id_sign_at: int | None  # a byte that must be < 0x80 (fixint ids, 64-bit and signed ids)
    model: str  # as the refusal names it ("" for a model field that is no usable name)
    priority: int | None

    @classmethod
    def learn(cls, frame: bytes | bytearray, message: dict[str, Any]) -> FrameShape | None:
        """The shape of `frame` (header included), whose body decoded to `message`; None for a
        frame that is not an infer with a usable id, or whose layout this does not describe."""
        head = refusal_head(message)  # the id, and the model and priority the refusals echo
        if head is None:
            return None
        _, model, priority = head
        data = bytes(frame)
        payload: list[tuple[int, int]] = []
        try:
            id_at, id_size = _top_map(data, HEADER.size, payload)
        except (_Unsupported, IndexError):
            return None
        kind = data[id_at]
        if kind <= 0x7F:  # a positive fixint: type and value in one byte
            payload.append((id_at, id_at + 1))
            sign_at: int | None = id_at
        elif kind in _FIXED:
            payload.append((id_at + 1, id_at + id_size))
            sign_at = None if kind in _UNSIGNED else id_at + 1
        else:
            return None
        structure = np.ones(len(data), dtype=bool)
        for start, end in payload:
            structure[start:end] = False
        columns = np.flatnonzero(structure)
        if len(columns) > MAX_STRUCTURE:
            return None
        return cls(
            length=len(data),
            columns=columns,
            values=np.frombuffer(data, dtype=np.uint8)[columns].copy(),
            id_at=id_at,
            id_size=id_size,
            id_sign_at=sign_at,
            model=model,
            priority=priority,
        )

    def same(self, frames: np.ndarray) -> np.ndarray:
        """Which rows of `frames` (one frame of this length each) have this shape."""
        same = (frames[:, self.columns] == self.values).all(axis=1)
        if self.id_sign_at is not None:
            same &= frames[:, self.id_sign_at] < 0x80
        return same

    def ids(self, frames: np.ndarray) -> np.ndarray:
        """The ids' encodings of rows of this shape (one row of `id_size` bytes each)."""
        return frames[:, self.id_at : self.id_at + self.id_size]


class FrameShapes:
    """The shapes learned from one client's frames: a client that sends several models (or
    priorities) over one connection sends several shapes, interleaved. Bounded: at most
    MAX_PER_LENGTH shapes of one frame length and MAX_LENGTHS lengths, the oldest dropped."""

    MAX_PER_LENGTH = 4
    MAX_LENGTHS = 4

    def __init__(self) -> None:
        self.lengths: dict[int, list[FrameShape]] = {}  # the shapes by frame length (read only)
        # Per length whose shapes share one layout (the same structure columns and id, as one
        # client's models do): their structure bytes stacked, to check a block against all at once.
        self._stacked: dict[int, np.ndarray] = {}
        # Per length, its shapes with their answers as compiled_refuse takes them (built on use).
        self._compiled: dict[int, tuple[Compiled, ...]] = {}

    def add(self, shape: FrameShape) -> None:
        self._compiled.pop(shape.length, None)
        shapes = self.lengths.get(shape.length)
        if shapes is None:
            if len(self.lengths) >= self.MAX_LENGTHS:
                oldest = next(iter(self.lengths))
                del self.lengths[oldest]
                self._stacked.pop(oldest, None)
                self._compiled.pop(oldest, None)
            shapes = self.lengths[shape.length] = []
        if any(_same_layout(known, shape) and np.array_equal(known.values, shape.values) for known in shapes):
            return
        if len(shapes) >= self.MAX_PER_LENGTH:
            del shapes[0]
        shapes.append(shape)
        if all(_same_layout(shapes[0], other) for other in shapes[1:]):
            self._stacked[shape.length] = np.stack([known.values for known in shapes])[None]
        else:
            self._stacked.pop(shape.length, None)

    def match(self, block: bytes | bytearray, length: int) -> tuple[int, list[tuple[FrameShape, np.ndarray]]]:
        """How many leading frames of `block` (a whole number of frames of `length` bytes) have one
        of the shapes, and those frames' ids' encodings grouped by shape (in order within each)."""
        shapes = self.lengths.get(length)
        if not shapes:
            return 0, []
        frames = np.frombuffer(block, dtype=np.uint8).reshape(-1, length)
        stacked = self._stacked.get(length)
        if stacked is None:  # layouts differ: shape by shape
            each = np.stack([shape.same(frames) for shape in shapes], axis=1)
        else:
            first = shapes[0]
            each = (frames[:, first.columns][:, None, :] == stacked).all(axis=2)
            if first.id_sign_at is not None:
                each &= (frames[:, first.id_sign_at] < 0x80)[:, None]
        known = each.any(axis=1)
        count = len(known) if known.all() else int(known.argmin())
        if count == 0:
            return 0, []
        if len(shapes) == 1:
            return count, [(shapes[0], shapes[0].ids(frames[:count]).copy())]
        which = each[:count].argmax(axis=1)  # the first shape each frame has
        return count, [
            (shapes[s], shapes[s].ids(frames[:count][which == s])) for s in np.unique(which).tolist()
        ]

    def refuse(self, block: bytes | bytearray | memoryview, length: int, answer: Answer) -> tuple[int, bytes]:
        """How many leading frames of `block` (whole frames of `length` bytes) have one of the
        shapes, and the answers to them: each `before + id + after`, where `answer(shape)` gives
        (before, after) for the frames of that shape (the same for a shape on every call; the id
        echoed as the client wrote it). Compiled where it was built (in the frames' order), else
        numpy's `match` (grouped by shape): either way in completion order, as the protocol allows."""
        shapes = self.lengths.get(length)
        if not shapes:
            return 0, b""
        if compiled_refuse is not None:
            compiled = self._compiled.get(length)
            if compiled is None:
                compiled = tuple(_compiled(shape, *answer(shape)) for shape in shapes)
                self._compiled[length] = compiled
            return compiled_refuse(block, length, compiled)
        count, groups = self.match(block, length)
        return count, b"".join(_answers(ids, *answer(shape)) for shape, ids in groups)


def _compiled(shape: FrameShape, before: bytes, after: bytes) -> Compiled:
    mask = np.zeros(shape.length, dtype=np.uint8)
    mask[shape.columns] = 0xFF
    want = np.zeros(shape.length, dtype=np.uint8)
    want[shape.columns] = shape.values
    sign_at = -1 if shape.id_sign_at is None else shape.id_sign_at
    return (mask.tobytes(), want.tobytes(), shape.id_at, shape.id_size, sign_at, before, after)


def _answers(ids: np.ndarray, before: bytes, after: bytes) -> bytes:
    """`before + id + after` for each row of `ids` (an id's encoding per row), as one array."""
    count, width = ids.shape
    out = np.empty((count, len(before) + width + len(after)), dtype=np.uint8)
    out[:, : len(before)] = np.frombuffer(before, dtype=np.uint8)
    out[:, len(before) : len(before) + width] = ids
    out[:, len(before) + width :] = np.frombuffer(after, dtype=np.uint8)
    return out.tobytes()


def _same_layout(one: FrameShape, other: FrameShape) -> bool:
    return (
        one.id_at == other.id_at
        and one.id_size == other.id_size
        and one.id_sign_at == other.id_sign_at
        and np.array_equal(one.columns, other.columns)
    )


def _top_map(data: bytes, pos: int, payload: list[tuple[int, int]]) -> tuple[int, int]:
    """Walk the frame's top-level map from `pos`: the payload spans of its values go to
    `payload`; returns where the id's encoding starts and its size."""
    kind = data[pos]
    if 0x80 <= kind <= 0x8F:
        pairs, pos = kind & 0x0F, pos + 1
    elif kind in (0xDE, 0xDF):
        size = 2 if kind == 0xDE else 4
        pairs, pos = int.from_bytes(data[pos + 1 : pos + 1 + size], "big"), pos + 1 + size
    else:
        raise _Unsupported
    if pairs > MAX_VALUES // 4:
        raise _Unsupported
    keys: set[bytes] = set()
    id_at = id_size = -1
    for _ in range(pairs):
        kind = data[pos]
        if 0xA0 <= kind <= 0xBF:
            start = pos + 1
        elif kind in (0xD9, 0xDA, 0xDB):
            start = pos + 1 + _SIZED[kind]
        else:
            raise _Unsupported  # not a str key
        key_end = _skip(data, pos, None)
        key = data[start:key_end]
        if key in keys:
            raise _Unsupported  # a repeated key: the decoder keeps the last one
        keys.add(key)
        end = _skip(data, key_end, payload)
        if key == b"id":
            id_at, id_size = key_end, end - key_end
        pos = end
    if id_at < 0 or pos != len(data):
        raise _Unsupported
    return id_at, id_size


def _skip(data: bytes, pos: int, payload: list[tuple[int, int]] | None) -> int:
    """The end of the msgpack value at `pos` (iterative: nesting costs no recursion); bin and
    float payloads inside it are appended to `payload` (None: not recorded)."""
    pending, walked = 1, 0
    while pending:
        pending -= 1
        walked += 1
        if walked > MAX_VALUES:
            raise _Unsupported
        kind = data[pos]
        if kind <= 0x7F or kind >= 0xE0 or kind in (0xC0, 0xC2, 0xC3):
            pos += 1
        elif kind <= 0x8F:
            pending, pos = pending + 2 * (kind & 0x0F), pos + 1
        elif kind <= 0x9F:
            pending, pos = pending + (kind & 0x0F), pos + 1
        elif kind <= 0xBF:
            pos += 1 + (kind & 0x1F)
        elif kind in _FIXED:
            pos += 1 + _FIXED[kind]
        elif kind in _FLOATS:
            if payload is not None:
                payload.append((pos + 1, pos + 1 + _FLOATS[kind]))
            pos += 1 + _FLOATS[kind]
        elif kind in _SIZED:
            size = _SIZED[kind]
            start = pos + 1 + size
            end = start + int.from_bytes(data[pos + 1 : start], "big")
            if payload is not None and kind in _BINS:
                payload.append((start, end))
            pos = end
        elif kind in _CONTAINERS:
            size, each = _CONTAINERS[kind]
            count = int.from_bytes(data[pos + 1 : pos + 1 + size], "big")
            pending, pos = pending + each * count, pos + 1 + size
        else:
            raise _Unsupported  # ext types (the decoder refuses them) and 0xc1
    if pos > len(data):
        raise _Unsupported
    return pos
