"""Refusing the frames past a connection's window, and the cached frames those refusals are.

Overload (docs/runtime.md, "The path under overload"): a refusal must cost far less than a served
request, or the more a client over-sends the less is served. So a request over the window is
refused from its id alone (its tensor is never decoded or checked), written from a cached frame
(RefusalFrame: msgpack's bytes around the id), and a turn's refusals count a fraction of a frame
of its budget each. A flooding client's frames are nearly always alike: the layouts learned from
its refused frames (FrameShape, net/frame_shape.py) let hundreds of them be checked and refused at
once (net/_shapes.c, or numpy), the others are refused one by one with no call per frame but the
decoder's and the frame's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

from edgeserve.net.answer_frames import result_message
from edgeserve.net.frame_shape import FrameShape, FrameShapes
from edgeserve.net.outbox import Outbox
from edgeserve.net.settings import RefusalSettings
from edgeserve.runtime import FrontendStats, Result, Status
from edgeserve.wire.frames import (
    HEADER,
    TOO_MANY_IN_FLIGHT,
    InferTable,
    ProtocolError,
    compiled_head,
    decode_body,
    refusal_head,
)

CACHED_REFUSALS = (Status.REJECTED, Status.SHUTDOWN)  # their error texts do not vary per request
CACHE_LIMIT = 1024  # refusal frames per cache; past it a cache starts again


def pack_id(request_id: int) -> bytes:
    """msgpack's encoding of an id (0 .. 2^63-1), as msgpack.packb writes it, without a Packer."""
    if request_id < 0x80:
        return bytes((request_id,))
    if request_id < 0x100:
        return b"\xcc" + bytes((request_id,))
    if request_id < 0x10000:
        return b"\xcd" + request_id.to_bytes(2, "big")
    if request_id < 0x100000000:
        return b"\xce" + request_id.to_bytes(4, "big")
    return b"\xcf" + request_id.to_bytes(8, "big")


@dataclass(frozen=True)
class RefusalFrame:
    """A refusal's answer as bytes around its id: msgpack writes the map's fields in order and
    "id" is the second, so two refusals of one kind (status, model, error, priority) differ only
    there. Under overload most answers are refusals; this spares each the encoder."""

    head: bytes  # map header, "type": "result", "id"
    tail: bytes  # the fields after the id
    size: int  # len(head) + len(tail): the frame's length is this plus the packed id's

    @classmethod
    def of(cls, result: Result, priority: int | None) -> RefusalFrame:
        message = result_message(0, result, priority)
        assert list(message)[:2] == ["type", "id"]
        body = msgpack.packb(message, use_bin_type=True)
        head = msgpack.packb({"type": "result", "id": 0})[:-1]  # without the id (0 is one byte)
        head = body[:1] + head[1:]  # the whole map's header
        tail = body[len(head) + 1 :]
        return cls(head, tail, len(head) + len(tail))

    def frame(self, request_id: int) -> bytes:
        rid = pack_id(request_id)
        return HEADER.pack(self.size + len(rid)) + self.head + rid + self.tail

    def around(self, id_size: int) -> tuple[bytes, bytes]:
        """The bytes before and after an id encoded in `id_size` bytes (FrameShapes.refuse)."""
        return HEADER.pack(self.size + id_size) + self.head, self.tail


class RefusalFrames:
    """One front's cached refusal frames, shared by its connections; bounded (the models and
    priorities named by clients vary)."""

    def __init__(self) -> None:
        self._refusals: dict[tuple[object, ...], RefusalFrame] = {}
        self.window_refusals: dict[tuple[str, int | None], RefusalFrame] = {}  # by model, priority

    def window_refusal(self, model: str, priority: int | None) -> RefusalFrame:
        """The frame of a `rejected` past a connection's window."""
        frame = self.window_refusals.get((model, priority))
        if frame is None:
            if len(self.window_refusals) >= CACHE_LIMIT:
                self.window_refusals.clear()
            result = Result(Status.REJECTED, model, queued=0.0, end=0.0, error=TOO_MANY_IN_FLIGHT)
            frame = self.window_refusals[(model, priority)] = self.refusal(result, priority)
        return frame

    def refusal(self, result: Result, priority: int | None) -> RefusalFrame:
        """The frame for a refusal like `result` (answered at once: queued == end)."""
        key = (result.status, result.model, result.error, priority, result.served_by)
        frame = self._refusals.get(key)
        if frame is None:
            if len(self._refusals) >= CACHE_LIMIT:
                self._refusals.clear()
            frame = self._refusals[key] = RefusalFrame.of(result, priority)
        return frame


class Refusals:
    """One connection's refusals past its window, and the shapes learned from them.

    Frames that match one of the connection's FrameShapes are refused block_min to block_max at a
    time (compiled, or numpy), the others one by one. A shape is learned from a frame a block
    stopped at (no shape matched it), or every learn_after frames refused one by one of a length
    with no shape yet; past FrameShapes.MAX_PER_LENGTH learnings with no block of block_min since
    (the frames' structure varies), each learning doubles the wait before the next (backoff)."""

    __slots__ = (
        "_frames",
        "_fruitless",
        "_out",
        "_outbox",
        "_settings",
        "_shapes",
        "_since",
        "_stats",
        "_unmatched",
        "_wait",
    )

    def __init__(
        self, settings: RefusalSettings, frames: RefusalFrames, stats: FrontendStats, outbox: Outbox
    ) -> None:
        self._settings = settings
        self._frames = frames
        self._stats = stats
        self._outbox = outbox
        self._out = outbox.frames
        self._shapes = FrameShapes()  # the layouts of this client's frames (net/frame_shape.py)
        self._unmatched = False  # a block stopped at the next frame: no shape matched it
        self._wait = 0  # frames to refuse one by one before the shapes are tried again
        self._fruitless = 0  # shapes learned since the last block of block_min or more frames
        self._since = settings.learn_after  # frames refused one by one since the last learning

    def run(
        self, buffer: bytearray, pos: int, size: int, budget: int | None, max_frame: int, table: InferTable
    ) -> tuple[int, int, int]:
        """Refuse the complete frames of buffer[pos:size], the window being full (nothing is answered
        here: it cannot open), within `budget` frames of the turn (None: all). Stops before the first
        frame it cannot refuse from its id (not an infer, no valid id, unreadable, over `max_frame`,
        incomplete): the general path reads that one. Returns the position after the refused
        frames, their cost in frames of the budget, and how many were refused."""
        settings = self._settings
        per_frame, per_block = settings.refusals_per_frame, settings.block_refusals_per_frame
        block_min, block_max, learn_after = settings.block_min, settings.block_max, settings.learn_after
        cached, window_refusal, out = self._frames.window_refusals, self._frames.window_refusal, self._out
        unpack_from, header = HEADER.unpack_from, HEADER.size
        flush = not out  # nothing was queued before: flush at the end of this turn
        lengths = self._shapes.lengths
        wait, since, unmatched, backoff = self._wait, self._since, self._unmatched, self._backoff()
        blocks = single = block_cost = 0
        while (budget is None or single < (budget - block_cost) * per_frame) and size - pos >= header:
            (length,) = unpack_from(buffer, pos)
            end = pos + header + length
            if length > max_frame or size < end:
                break
            step = end - pos
            if not wait and step in lengths:
                most = min((size - pos) // step, block_max)
                if budget is not None:
                    most = min(most, (budget - block_cost - -(-single // per_frame)) * per_block)
                if most >= block_min:
                    count = self._block(buffer, pos, step, most)
                    pos += count * step
                    blocks += count
                    block_cost += -(-count // per_block)
                    if count >= block_min:
                        backoff = 0
                    if count < most:  # the next frame has a layout not seen yet
                        wait, unmatched = block_min << backoff, True
                    continue
            message: dict[str, Any] | None = None
            head = compiled_head(buffer, pos + header, end, table)  # a common request: no decode
            if head is None:
                try:
                    message = decode_body(buffer[pos + header : end], max_frame)
                except ProtocolError:
                    break
                head = refusal_head(message)
                if head is None:
                    break
            request_id, model, priority = head
            out.append((cached.get((model, priority)) or window_refusal(model, priority)).frame(request_id))
            single, since, wait = single + 1, since + 1, wait - 1 if wait else 0
            # Learn from the frame a block stopped at (no shape matched it), or from a frame of a
            # length with no shape yet; with no backoff, try the blocks again at once.
            if unmatched or (step not in lengths and since >= learn_after << backoff):
                self._learn(buffer, pos, end, message, max_frame)
                since, unmatched, wait, backoff = 0, False, wait if backoff else 0, self._backoff()
            pos = end
        self._wait, self._since, self._unmatched = wait, since, unmatched
        if blocks + single:
            self._count(blocks + single, flush)
        return pos, block_cost + -(-single // per_frame), blocks + single

    def _count(self, refused: int, flush: bool) -> None:
        """Count a run's refusals; `flush`: its frames are the first of this turn, write them at its end."""
        if flush:
            self._outbox.flush_soon()
        stats = self._stats
        stats.requests += refused
        stats.by_status["rejected"] = stats.by_status.get("rejected", 0) + refused

    def _block(self, buffer: bytearray, pos: int, length: int, most: int) -> int:
        """Refuse the frames of `length` bytes from `pos` on (at most `most`) that match one of the
        connection's FrameShapes, as one block; returns how many there were."""
        with memoryview(buffer) as view, view[pos : pos + most * length] as block:  # no copy
            count, answers = self._shapes.refuse(block, length, self._answer)
        if count:
            self._out.append(answers)
        if count >= self._settings.block_min:
            self._fruitless = 0
        return count

    def _answer(self, shape: FrameShape) -> tuple[bytes, bytes]:
        return self._frames.window_refusal(shape.model, shape.priority).around(shape.id_size)

    def _learn(
        self, buffer: bytearray, pos: int, end: int, message: dict[str, Any] | None, max_frame: int
    ) -> None:
        """Learn the shape of the frame buffer[pos:end] (its body `message`, or decoded here: the
        compiled reader took it)."""
        if message is None:
            message = decode_body(buffer[pos + HEADER.size : end], max_frame)
        shape = FrameShape.learn(buffer[pos:end], message)
        if shape is not None:
            self._shapes.add(shape)
        self._fruitless += 1

    def _backoff(self) -> int:
        """How many times the wait before the next block and learning doubles (max_backoff)."""
        return min(max(self._fruitless - FrameShapes.MAX_PER_LENGTH, 0), self._settings.max_backoff)
