"""One asyncio.Protocol per connection, in front of a running Server.

Flow control (after uvicorn's flow_control.py): reading pauses while the transport's write
buffer is above its high-water mark (a client that does not read its answers stops being read,
so the server never buffers without bound) and resumes when it drains. Requests beyond
`max_in_flight` on one connection are answered `rejected` at once ("too many requests in
flight"), so a pipelining client learns the limit instead of stalling.

Overload (docs/runtime.md, "The path under overload"): a refusal must cost far less than a served
request, or the more a client over-sends the less is served. So a request over the window is
refused from its id alone (its tensor is never decoded or checked; frames that match a shape
learned from the connection's earlier frames, hundreds at a time: wire.frame_shape), the common
request is parsed by wire.frames.fast_infer, at most FRAMES_PER_TURN frames are handled before
the loop gets to run its other callbacks (a finished batch's hand-off among them), and the
answers of one loop turn leave in one write. An accepted request costs no task and no future: the
Server calls the connection back with its Result (Server.enqueue), and a fixed refusal is written
from a cached frame.

Every accepted request gets exactly one answer; if the client has gone, the answer is dropped
and counted in FrontendStats.discarded. A frame over max_frame_bytes or an unreadable frame
gets an error message and the connection is closed (a peer that breaks framing cannot be
trusted to resynchronise); a readable request with a bad field gets an `invalid` answer and the
connection stays open.

Connection limits (docs/protocol.md, "Limits and back-pressure"): past `max_connections` (all
listeners) or `max_connections_per_listener`, a new connection gets one `error` message and is
closed. Before its hello a connection may announce a frame of at most `max_hello_bytes`, so an
unauthenticated connection buffers a few KiB, not a whole `max_frame_bytes` frame; it must finish
its hello within `hello_timeout_s`. A greeted connection with nothing in flight that sends nothing
for `idle_timeout_s` is closed. The timers are loop.call_later handles, cancelled on close.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import hmac
import logging
import math
import os
import socket
import struct
import termios
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

import msgpack
import numpy as np

from edgeserve import __version__
from edgeserve.config.server import ListenConfig, ServerConfig
from edgeserve.manifest import Manifest, TensorSpec
from edgeserve.net.answer_frames import AnswerFrames, timing_ms
from edgeserve.net.flood_tally import FloodTally, PeerFront
from edgeserve.net.preprocess import PreprocessError, preprocess_frame
from edgeserve.net.read_lag import PLANNED_MAX_S, ReadLag
from edgeserve.runtime import FrontendStats, Result, Status
from edgeserve.wire.bounds import ERROR_TEXT_LIMIT, cut
from edgeserve.wire.frame_shape import FrameShape, FrameShapes
from edgeserve.wire.frames import (
    HEADER,
    PROTOCOL_VERSION,
    TOO_MANY_IN_FLIGHT,
    InferRequest,
    InferTable,
    ProtocolError,
    SampleSpec,
    compiled_head,
    compiled_infer,
    decode_body,
    encode_frame,
    fast_infer,
    id_of,
    infer_table,
    message_type,
    newest_frames_start,
    parse_hello,
    parse_infer,
    refusal_head,
)
from edgeserve.wire.tensors import encode_tensor

_log = logging.getLogger(__name__)

FRAMES_PER_TURN = 32  # frames handled per loop turn before other callbacks run (~0.3 ms of work)
REFUSALS_PER_FRAME = 8  # refusals past the window count as one frame of that budget (~8x cheaper)
# Refusals of frames that match one of their connection's learned FrameShapes, checked BLOCK_MIN
# to BLOCK_MAX at a time (below that, without the compiled check, numpy's per-call cost is more
# than decoding them), count 64 to a frame of the turn's budget.
BLOCK_REFUSALS_PER_FRAME = 64
BLOCK_MIN = 16
BLOCK_MAX = 512
LEARN_AFTER = 16  # frames refused one by one between two learnings of a shape
# A client that interleaves a few kinds of frames (models, priorities) gets a shape for each within
# about a hundred frames. Past FrameShapes.MAX_PER_LENGTH learnings with no block of BLOCK_MIN
# frames since, the frames' structure itself varies (an int that changes, fields in another
# order): then each further learning doubles the frames refused one by one before the next block
# and the next learning (backoff, up to 2^MAX_BACKOFF), so such a client costs about what it did
# without shapes.
MAX_BACKOFF = 6
WRITE_HIGH_WATER = 1024 * 1024
# A connection that sends this many frames past its window in one read floods; while the other
# clients sending do not (no flooding read for POLITE_S, data in the last second), the flood's
# socket is left unread for FLOOD_PAUSE_S (the kernel holds its frames, and the frames of its last
# read wait in its buffer) so the loop's time goes to the polite clients, and for POLITE_S after
# each hold its window is FLOOD_WINDOW, so that its requests do not fill the queues the polite
# clients' wait in (docs/runtime.md). Beside another flood none is held (Frontend.polite_others):
# each keeps being read (its frames stay fresh), with a window of SHARED_FLOOD_WINDOW for POLITE_S
# while a polite client is around. Nor is a client held whose refusals number less than
# FLOOD_RATIO times what its full window let through (flood_tally): a hold would idle the executor
# it can use.
FLOOD_FRAMES = 16
# With [listen] share_total, a connection's window below the total is its even share among the
# clients that sent in the last SENDING_S, counted every SENDING_EVERY_S (Frontend.sending).
SENDING_S = 0.25
SENDING_EVERY_S = 0.01
# With at most this many connections open, a full window's refusals wait a loop turn (_defer_refusals).
DEFER_REFUSALS = 4
FLOOD_PAUSE_S = 0.05
FLOOD_RATIO = 8
POLITE_S = 0.25
FLOOD_WINDOW = 1
SHARED_FLOOD_WINDOW = 2
FAIL_LINGER_S = 2.0  # after an error message, wait this long for the peer to close
CLOSE_READ_BYTES = 4 * 1024 * 1024  # what a close still reads from the kernel (_take_received)


def _describe(exc: BaseException) -> str:
    """ "Type: message", bounded: an exception's message may quote client data."""
    try:
        text = str(exc)
    except Exception:  # a broken __str__, or one that recursed too deeply
        text = "(unprintable)"
    return cut(f"{type(exc).__name__}: {text}")


def output_field(output: object) -> dict[str, Any] | None:
    """The wire form of an output (None stays None)."""
    return None if output is None else encode_tensor(np.asarray(output))


def _tensor_entry(spec: TensorSpec) -> dict[str, Any]:
    """A tensor of one sample as the hello reply describes it (-1: a size that varies)."""
    return {"dtype": spec.dtype, "shape": list(spec.shape)}


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


def _backoff(fruitless: int) -> int:
    """How many times the wait before the next block and learning doubles (see MAX_BACKOFF)."""
    return min(max(fruitless - FrameShapes.MAX_PER_LENGTH, 0), MAX_BACKOFF)


def window(
    max_in_flight: int, total: int, in_flight: int, busy: int, mine: int, share_total: bool, sending: int = 0
) -> int:
    """A connection's window, with `mine` of its requests in flight. While all connections
    together have fewer than `total` in flight (`in_flight`): `max_in_flight`, or with
    `share_total` its even share of `total` where that is more, shared among the `busy`
    connections (those with requests in flight, itself counted) or the `sending` ones, whichever
    are more: a client alone keeps the executor's queue as full as several would. At the total: an
    even share of it among the busy connections, at most `max_in_flight` and at least 1."""
    if in_flight < total:
        if not share_total:
            return max_in_flight
        return max(max_in_flight, total // max(busy + (mine == 0), sending, 1))
    return max(1, min(max_in_flight, total // max(busy, 1)))


def room(
    max_in_flight: int, total: int, mine: int, in_flight: int, busy: int, share_total: bool, sending: int = 0
) -> int:
    """How many requests a connection with `mine` in flight may accept one after the other, its
    `window` moving with each (the total grows, and its first makes it busy): up to the window
    while under the total, then up to its share."""
    busy_then = max(busy + (mine == 0), 1)
    cap = max(max_in_flight, total // max(busy_then, sending)) if share_total else max_in_flight
    under = min(cap - mine, total - in_flight)
    share = max(1, min(max_in_flight, total // busy_then))
    return max(under, share - mine, 0)


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


CACHED_REFUSALS = (Status.REJECTED, Status.SHUTDOWN)  # their error texts do not vary per request


class ServerPort(Protocol):
    """What a front needs of a Server: the Server itself, or the front process's RemoteServer."""

    config: ServerConfig
    models: tuple[str, ...]

    def manifest(self, model: str) -> Manifest: ...

    def window_bounds(self) -> tuple[int, int]: ...

    def in_flight_limit(self, in_flight: int, margin_s: float = 0.0) -> int: ...

    def run_completed(self) -> None: ...

    def answers_together(self, hold: Callable[[], None], release: Callable[[], None]) -> None: ...

    def enqueue(
        self,
        model: str,
        x: Any,
        reply: Callable[[Result], object],
        *,
        deadline_ms: float | None = None,
        capture_ts: float | None = None,
        reply_margin_s: float = 0.0,
        received: float | None = None,
    ) -> object: ...


class Frontend:
    """Shared by all connections of one server process: the Server, the limits and the counters."""

    def __init__(self, server: ServerPort, listen: ListenConfig, peers: Sequence[FrontendStats] = ()) -> None:
        self.server = server
        self.listen = listen  # its derived windows are filled in as the first connection comes (`resolve`)
        # The in-flight total in force: the configured one, or below it what the server should
        # hold now (Server.in_flight_limit), taken before each read (`refresh_total`).
        self.total = 0
        self._total_at = math.nan
        self._limit = getattr(server, "in_flight_limit", None)  # (a stand-in server: none)
        # The other fronts on this server (the HTTP front's stats): their clients count beside the
        # connections when a flood is to be held for the polite ones (polite_others).
        self.peers = [PeerFront(stats, FloodTally(POLITE_S)) for stats in peers]
        # Server.enqueue's reply_margin_s: the configured margin for the answer's way to the client,
        # plus the measured wait of a request in its socket before the loop read it (read_lag.py)
        self.reply_margin_s = listen.reply_margin_ms / 1000.0
        self.margin_s = self.reply_margin_s
        self.read_lag = ReadLag(self._read_lag_moved)
        self.stats = FrontendStats()
        self.connections: set[Connection] = set()
        self.per_listener: dict[str, int] = {}  # admitted open connections by listener ("unix", "tcp")
        self.write_high_water = WRITE_HIGH_WATER  # bytes buffered for one client before reading pauses
        self.in_flight = 0  # accepted requests not answered yet, all connections
        self.busy = 0  # connections with requests in flight: they share max_in_flight_total
        self._sending = (-math.inf, 0)  # (loop.time() counted at, greeted connections sending lately)
        self.refusing = 0  # connections whose refusals wait for the next loop turn
        self._drained: asyncio.Event | None = None  # set when in_flight reaches 0 (drain waits on it)
        self._all_closed: asyncio.Event | None = None  # set when the last connection is lost
        self._specs: tuple[object, dict[str, SampleSpec], InferTable] = (None, {}, ())
        self._refusals: dict[tuple[object, ...], RefusalFrame] = {}
        self.window_refusals: dict[tuple[str, int | None], RefusalFrame] = {}  # by model, priority
        self.answer_frames = AnswerFrames()  # `ok` answers from cached pieces
        # While the server hands out a batch's answers (holding > 0), connections keep theirs and
        # write them all at the release, one write each (Server.answers_together).
        self.holding = 0
        self.held: set[Connection] = set()
        server.answers_together(self.hold_answers, self.release_answers)

    def _read_lag_moved(self, wait_s: float) -> None:
        self.margin_s = self.reply_margin_s + min(wait_s, PLANNED_MAX_S)
        self.stats.read_wait_seconds = wait_s

    def window_refusal(self, model: str, priority: int | None) -> RefusalFrame:
        """The cached frame of a `rejected` past a connection's window (bounded like `refusal`)."""
        frame = self.window_refusals.get((model, priority))
        if frame is None:
            if len(self.window_refusals) >= 1024:
                self.window_refusals.clear()
            result = Result(Status.REJECTED, model, queued=0.0, end=0.0, error=TOO_MANY_IN_FLIGHT)
            frame = self.window_refusals[(model, priority)] = self.refusal(result, priority)
        return frame

    def refusal(self, result: Result, priority: int | None) -> RefusalFrame:
        """The cached frame for a refusal like `result` (answered at once: queued == end); the
        cache is bounded (priorities and models named by clients vary)."""
        key = (result.status, result.model, result.error, priority, result.served_by)
        frame = self._refusals.get(key)
        if frame is None:
            if len(self._refusals) >= 1024:
                self._refusals.clear()
            frame = self._refusals[key] = RefusalFrame.of(result, priority)
        return frame

    def hold_answers(self) -> None:
        self.holding += 1

    def release_answers(self) -> None:
        self.holding = max(self.holding - 1, 0)  # a release without its hold must not hold forever
        if self.holding == 0 and self.held:
            held, self.held = self.held, set()
            for connection in held:
                connection.write_held()

    @property
    def specs(self) -> dict[str, SampleSpec]:
        """Per model served as it is (no camera preprocess): what fast_infer accepts."""
        return self._spec_tables()[1]

    @property
    def infer_table(self) -> InferTable:
        """`specs` as the compiled reader takes them (wire.frames.compiled_infer)."""
        return self._spec_tables()[2]

    def _spec_tables(self) -> tuple[object, dict[str, SampleSpec], InferTable]:
        """Recomputed when a reload installs a new config (preprocess tables may change)."""
        config = self.server.config
        if self._specs[0] is not config:
            specs = {}
            for name in self.server.models:
                inputs = self.server.manifest(name).inputs
                if config.models[name].preprocess is None and len(inputs) == 1:
                    sample = SampleSpec.of(inputs[0].dtype, tuple(inputs[0].shape))
                    if sample is not None:
                        specs[name] = sample
            self._specs = (config, specs, infer_table(specs))
        return self._specs

    def polite_others(self, connection: Connection) -> tuple[int, int]:
        """How many other greeted clients sent lately, and how many of them are polite. A hold
        serves the polite ones only beside a lone flood: beside another, holds left the executor
        idle (every held client's frames go stale behind its hold), so the floods keep being read
        with a small window instead (docs/runtime.md)."""
        now = asyncio.get_running_loop().time()
        others = [
            c for c in self.connections if c is not connection and c.greeted and now - c.last_data < 1.0
        ]
        senders, polite = len(others), sum(c.polite(now) for c in others)
        for peer in self.peers:  # an HTTP front's clients: one more client, polite or not
            sending, light = peer.lately(now)
            senders, polite = senders + sending, polite + light
        return senders, polite

    def sending(self, now: float) -> int:
        """How many greeted clients sent in the last SENDING_S (counted again every SENDING_EVERY_S):
        with `share_total`, a busy connection's window below the total is at most its even share
        among these too, so that a client sending now and then (between its requests it has none
        in flight) does not find the queues filled by one that sends more."""
        counted_at, count = self._sending
        if now - counted_at > SENDING_EVERY_S:
            count = sum(c.greeted and now - c.last_data < SENDING_S for c in self.connections)
            self._sending = (now, count)
        return count

    def answered(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0 and self._drained is not None:
            self._drained.set()

    def resolve(self) -> None:
        """Fill in the windows the config leaves to the server: its in-flight bound, known once it
        has started (the profiles and deadlines give it)."""
        if self.listen.max_in_flight is None:
            bounds = getattr(self.server, "window_bounds", None)  # (a stand-in server: no bounds)
            self.listen = self.listen.resolved(*((1 << 30, 1 << 30) if bounds is None else bounds()))
        if not self.total:
            self.refresh_total()

    def refresh_total(self, now: float = math.nan) -> None:
        """Before a read: the total is what the server should hold now (Server.in_flight_limit:
        within what deadline admission would still take and what the host can answer in time),
        at most the configured or derived total; at it each busy connection keeps an even share,
        and the frames past a share are refused without decoding. A front in a process of its
        own has only the configured total. Once per `now` (the loop's time, which uvloop
        keeps per iteration to the millisecond): the connections read in one turn share it."""
        if now == self._total_at:
            return
        self._total_at = now
        total = self.listen.in_flight_total
        self.total = total if self._limit is None else min(total, self._limit(self.in_flight, self.margin_s))

    def protocol_factory(self, listener: str = "socket") -> Connection:
        return Connection(self, listener)

    def over_cap(self, listener: str) -> str | None:
        """Why a new connection on `listener` must be refused, or None when it may stay."""
        listen = self.listen
        if len(self.connections) >= listen.max_connections:
            return (
                f"too many connections ({listen.max_connections}); try again later "
                "(the server's listen.max_connections)"
            )
        if self.per_listener.get(listener, 0) >= listen.max_connections_per_listener:
            return (
                f"too many connections on this listener ({listen.max_connections_per_listener}); "
                "try again later (the server's listen.max_connections_per_listener)"
            )
        return None

    def model_table(self) -> dict[str, Any]:
        """What the hello reply tells a client about each served model."""
        table: dict[str, Any] = {}
        for name in self.server.models:
            manifest = self.server.manifest(name)
            config = self.server.config.models[name]
            pre = config.preprocess
            inputs = manifest.inputs
            table[name] = {
                "input": _tensor_entry(inputs[0]) if len(inputs) == 1 else None,
                "inputs": {t.name: _tensor_entry(t) for t in inputs},
                "outputs": {t.name: _tensor_entry(t) for t in manifest.exit_outputs(len(manifest.exits) - 1)},
                "camera_input": None
                if pre is None
                else {"dtype": "uint8", "layout": "hwc", "channels": pre.channels},
                "slo_ms": config.slo_ms,
                "exits": [
                    {
                        "name": e.name,
                        "accuracy": e.accuracy,
                        "outputs": [t.name for t in manifest.exit_outputs(i)],
                    }
                    for i, e in enumerate(manifest.exits)
                ],
            }
        return table

    def stop_reading(self) -> None:
        """Shutdown: read no new frames on any connection; what is read is still answered."""
        for connection in self.connections:
            connection.stop_reading()

    async def drain(self, timeout: float) -> None:
        """Wait (bounded) until every connection's requests have been answered."""
        if self.in_flight > 0:
            self._drained = asyncio.Event()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._drained.wait(), timeout)
            self._drained = None

    def close_all(self) -> None:
        for connection in list(self.connections):
            connection.close()

    async def wait_closed(self, timeout: float) -> None:
        """Wait (bounded) until every connection is gone. A transport's close() writes what is
        buffered first, in the background: a process that exits before then loses the answers
        still in its buffers (under a flood, thousands of refusals)."""
        if self.connections:
            self._all_closed = asyncio.Event()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._all_closed.wait(), timeout)
            self._all_closed = None
        unsent = sum(c.transport.get_write_buffer_size() for c in self.connections if c.transport is not None)
        if unsent:
            _log.warning(
                "%d connection(s) had not taken their answers %.1f s after the close: %d bytes of "
                "answers unsent (their peers stopped reading)",
                len(self.connections),
                timeout,
                unsent,
            )

    def joined(self, connection: Connection) -> None:
        self.connections.add(connection)
        if len(self.connections) == 1:
            self.read_lag.resume()

    def lost(self, connection: Connection) -> None:
        self.connections.discard(connection)
        if not self.connections:
            self.read_lag.pause()
            if self._all_closed is not None:
                self._all_closed.set()


class Connection(asyncio.Protocol):
    """One client: hello first, then pipelined infer requests answered in completion order."""

    def __init__(self, frontend: Frontend, listener: str = "socket") -> None:
        frontend.resolve()  # the first connection: the server has started, its bound is known
        self.frontend = frontend
        self.listener = listener
        self.transport: asyncio.Transport | None = None
        # The loop, looked up once: asyncio.get_running_loop() makes a getpid() system call (its
        # fork check), and the hot paths below would make it for every read and loop turn.
        self._loop = asyncio.get_running_loop()
        self.peer = "?"
        self._admitted = False  # counted in frontend.connections (not refused over the cap)
        self._fd = -1  # the socket's descriptor while the transport is open (_transmit), else -1
        self._hello_timer: asyncio.TimerHandle | None = None
        self._idle_timer: asyncio.TimerHandle | None = None
        self._last_data = 0.0  # loop.time() of the last bytes received
        self._read_at = 0.0  # time.monotonic() of the read that brought the buffer's first frame
        self._buffer = bytearray()
        self._greeted = False
        self._closing = False
        self._failing: str | None = None  # the error to send once the answers in flight are out
        self._in_flight = 0
        self._paused = False  # by the write side: the client does not read its answers
        self._backlog = False  # by the read side: frames left in the buffer for the next turn
        self._stale = 0  # the buffer's first bytes are older than frames served: refuse them
        self._eof = False
        self._out: list[bytes] = []  # frames to write at the end of this loop turn
        self._stopped = False  # shutdown: no more reading
        self._reading = False  # inside _read_frames (an answer given there must not close under it)
        self._over_window = 0  # frames refused past the window in the current read
        # The layouts of this client's frames (wire.frame_shape), learned from refused frames that
        # no known shape matched.
        self._shapes = FrameShapes()
        self._unmatched = False  # a block stopped at the next frame: no shape matched it
        self._shape_wait = 0  # frames to refuse one by one before the shapes are tried again
        self._fruitless = 0  # shapes learned since the last block of BLOCK_MIN or more frames
        self._since_learn = LEARN_AFTER  # frames refused one by one since the last learning
        self.last_flood = -math.inf  # loop.time() of the last read with FLOOD_FRAMES past the window
        # What it sent past its window lately: a client over its window in every read by a few
        # frames floods as much as one that sends a burst.
        self._tally = FloodTally(POLITE_S)
        self._flood_timer: asyncio.TimerHandle | None = None  # not reading: this client floods
        self._small_window_until = -math.inf  # loop.time(): its window is _small_window until then
        self._small_window = FLOOD_WINDOW
        self._jobs: set[asyncio.Future[None]] = set()  # camera frames being preprocessed

    # -- transport callbacks -----------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        """Accepted requests still to be answered."""
        return self._in_flight

    @property
    def greeted(self) -> bool:
        return self._greeted

    @property
    def last_data(self) -> float:
        """loop.time() of the last bytes received."""
        return self._last_data

    def stop_reading(self) -> None:
        """No more frames from this client (shutdown); the ones already read are answered."""
        self._stopped = True
        if self.transport is not None and not self._closing:
            self.transport.pause_reading()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not subclasses
        transport = self.transport
        transport.set_write_buffer_limits(high=self.frontend.write_high_water)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if sock is not None and transport.get_extra_info("sslcontext") is None:
            self._fd = sock.fileno()  # plain bytes on a stream socket: see _transmit
        self.peer = str(transport.get_extra_info("peername") or "unix")
        frontend = self.frontend
        refusal = frontend.over_cap(self.listener)
        if refusal is not None:
            frontend.stats.refused_connections += 1  # logged at info by _shed: a flood floods no log
            self._shed(refusal)
            return
        self._admitted = True
        stats = frontend.stats
        stats.connections += 1
        stats.open_connections += 1
        frontend.joined(self)
        frontend.per_listener[self.listener] = frontend.per_listener.get(self.listener, 0) + 1
        loop = self._loop
        self._last_data = loop.time()
        self._hello_timer = loop.call_later(frontend.listen.hello_timeout_s, self._on_hello_timeout)
        _log.info("client connected: %s", self.peer)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        self._fd = -1  # the transport closes the socket: its number may be reused
        self._cancel_timers()
        if not self._admitted:
            return  # refused over the cap: never counted
        self._admitted = False
        frontend = self.frontend
        frontend.lost(self)
        frontend.per_listener[self.listener] -= 1
        frontend.stats.open_connections -= 1
        _log.info("client disconnected: %s (%d requests still in flight)", self.peer, self._in_flight)

    @property
    def reading_paused(self) -> bool:
        return self._paused

    def pause_writing(self) -> None:
        """The client is not reading its answers: stop reading its requests until it does."""
        if self.transport is not None and not self._paused:
            self._paused = True
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.transport is not None and self._paused and not self._closing:
            self._paused = False
            if not self._backlog and not self._stopped and self._flood_timer is None:
                self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        if self._closing or self._failing is not None:
            return  # after an error: discard until the peer closes
        self._last_data = self._loop.time()
        if not self._backlog:  # else the frames still buffered came with an earlier read
            self._read_at = time.monotonic()
        self._buffer += data
        if not self._backlog:
            self._read_frames()

    def _read_frames(self, limit: int | None = FRAMES_PER_TURN) -> None:
        """Handle up to `limit` buffered frames (None: all); if more are complete, stop reading the
        socket and come back on the next loop turn, after the callbacks that are already due."""
        self.frontend.server.run_completed()  # first: the answers free window for these frames
        self.frontend.refresh_total(self._last_data)
        self._reading = True
        try:
            self._read_some(limit)
        finally:
            self._reading = False
        if self._eof and self._in_flight == 0 and not self._backlog:
            self.close()

    def _read_some(self, limit: int | None) -> None:
        listen = self.frontend.listen
        buffer = self._buffer
        if self._stale:  # older than frames already served: refused, never served
            until, handled, self._stale = self._stale, 0, 0
        else:
            until, handled = self._serve_newest(limit) if self._greeted else (0, 0)
            if self._greeted and self._defer_refusals(limit, until):
                return
        size, pos = len(buffer), 0
        while not self._closing and self._failing is None and size - pos >= HEADER.size:
            (length,) = HEADER.unpack_from(buffer, pos)
            if not self._greeted:  # an unauthenticated peer buffers a hello's worth, not a frame's
                hello_limit = min(listen.max_hello_bytes, listen.max_frame_bytes)
                if length > hello_limit:
                    self._fail(
                        f"frame of {length} bytes before the hello exceeds max_hello_bytes {hello_limit}"
                    )
                    return
            elif length > listen.max_frame_bytes:
                self._fail(f"frame of {length} bytes exceeds max_frame_bytes {listen.max_frame_bytes}")
                return
            end = pos + HEADER.size + length
            if size < end:
                break
            if handled == limit:
                break
            if self._greeted:
                full = self._in_flight >= self._window()
                if full or pos < until:  # (before `until`: older than the frames _serve_newest served)
                    budget = None if limit is None else limit - handled
                    pos, cost = self._refuse_run(buffer, pos, size if full else until, budget)
                    if cost:
                        handled += cost
                        continue
            if self._greeted and self._on_compiled(buffer, pos + HEADER.size, end):
                pos = end
                handled += 1
                continue
            body = buffer[pos + HEADER.size : end]  # one copy; the buffer is trimmed once, below
            pos = end
            self._on_frame(body)
            handled += 1
        if self._failing is not None or self._closing:
            return  # _fail cleared the buffer
        del buffer[:pos]
        if self._over_window:
            self._count(refused=self._over_window)
        if self._over_window >= FLOOD_FRAMES:
            self.last_flood = self._last_data
            if self._tally.floods_heavily(self._last_data, FLOOD_RATIO):
                self._hold_flood()
        self._over_window = 0
        more = handled == limit and len(buffer) >= HEADER.size
        if more and len(buffer) >= HEADER.size + HEADER.unpack_from(buffer)[0]:
            self._set_backlog(True)
            if self._flood_timer is None:  # a held flood's frames wait for the hold to end
                self._loop.call_soon(self._read_frames)
            return
        self._set_backlog(False)

    def _defer_refusals(self, limit: int | None, until: int) -> bool:
        """With the window full after a read's newest frames were served (those before `until`:
        older, to be refused): leave the rest of the read for the next loop turn, so that the
        other connections' reads of this turn serve their newest frames first. Under a flood a
        read's refusals cost ~100 us; with four connections the executor, its queues refilled
        only after all of them, found them empty at 3 % of its batches, for ~0.9 ms each. Only
        with at most DEFER_REFUSALS connections open: with 16, the turn of deferred refusals
        itself held every read back."""
        frontend = self.frontend
        if limit is None or self._backlog or len(frontend.connections) > DEFER_REFUSALS:
            return False
        if not until and not (self._in_flight >= self._window() and self._complete_frame()):
            return False
        self._stale = until
        frontend.refusing += 1
        self._set_backlog(True)  # the socket waits (the kernel holds what comes meanwhile)
        self._loop.call_soon(self._refuse_deferred)
        return True

    def _refuse_deferred(self) -> None:
        self.frontend.refusing -= 1
        if self._closing or self._failing is not None:
            return
        if self._flood_timer is None:  # a held flood's frames wait for the hold to end
            self._read_frames()

    def _serve_newest(self, limit: int | None) -> tuple[int, int]:
        """The newest frames first: when the buffer holds more complete frames than this connection
        has room for, serve the newest that fit, before anything else (so they reach the queues
        before the executor's next decision), and take them out of the buffer. Under overload a
        backlog waits in the kernel and its oldest frames would be answered late; camera streams
        want the latest frame anyway. Returns where the older frames end, for `_read_some` to
        refuse them next, and how many frames were served (0 and 0: read in order). Stops at a
        frame that might close the connection (unreadable, no infer with a valid id): the frames
        before it are answered first, in `_read_some`, which then reads that one."""
        space = self._room()
        if limit is not None and space > limit:
            # The turn's limit binds, not the window: the older frames are read in order (the rest
            # of them next turn) while the window has room, unless the kernel holds more than a
            # turn of frames behind them: then the loop reads slower than this client sends, the
            # oldest would be answered late however deep the window, and the backlog would grow
            # (the server cannot see how long they waited there). Then the turn's newest go first.
            if not self._behind(limit):
                return 0, 0
            space = limit
        buffer = self._buffer
        until = newest_frames_start(buffer, len(buffer), space) if space > 0 else 0
        if until == 0:
            return 0, 0
        max_frame = self.frontend.listen.max_frame_bytes
        pos, served = until, 0
        while len(buffer) - pos >= HEADER.size and not self._closing:
            length = HEADER.unpack_from(buffer, pos)[0]
            if length > max_frame:
                break
            end = pos + HEADER.size + length
            if end > len(buffer):  # the incomplete frame after the ones newest_frames_start counted
                break
            if self._on_compiled(buffer, pos + HEADER.size, end):
                served += 1
                pos = end
                continue
            try:
                message = decode_body(buffer[pos + HEADER.size : end], max_frame)
            except ProtocolError:
                break
            if message.get("type") != "infer" or id_of(message) is None:
                break
            self._on_message(message)
            served += 1
            pos = end
        if not served:  # the newest frame needs the general path: read in order then
            return 0, 0
        if not self._closing:
            del buffer[until:pos]
        return until, served

    def _behind(self, frames: int) -> bool:
        """The kernel holds at least `frames` more frames of this connection than its buffer (their
        size as the buffer's first): a read of this client's socket is behind its sends."""
        if self._fd < 0 or len(self._buffer) < HEADER.size:
            return False
        try:
            waiting = struct.unpack("i", fcntl.ioctl(self._fd, termios.FIONREAD, b"\0\0\0\0"))[0]
        except OSError:
            return False
        return waiting >= frames * (HEADER.size + HEADER.unpack_from(self._buffer)[0])

    def _count(self, accepted: int = 0, refused: int = 0) -> None:
        now = self._last_data
        self._tally.count(now, accepted, refused, full=now >= self._small_window_until)

    def polite(self, now: float) -> bool:
        """Within its window lately: no read FLOOD_FRAMES past it for POLITE_S, and fewer than
        FLOOD_FRAMES refused over the last periods."""
        return now - self.last_flood > POLITE_S and self._tally.lately(now).refused < FLOOD_FRAMES

    def _set_backlog(self, backlog: bool) -> None:
        if backlog == self._backlog or self.transport is None or self._closing:
            self._backlog = backlog
            return
        self._backlog = backlog
        if backlog and not self._paused:
            self.transport.pause_reading()
        elif not backlog and not self._paused and not self._stopped and self._flood_timer is None:
            self.transport.resume_reading()

    def eof_received(self) -> bool | None:
        """The client half-closed: answer what is in flight, then close (keep the transport open)."""
        if self._closing:
            return False
        self._eof = True
        if self._in_flight == 0 and not self._backlog:
            self._read_frames(limit=None)  # the frames left, then the close (nothing in flight)
        return True

    def _complete_frame(self) -> bool:
        buffer = self._buffer
        return len(buffer) >= HEADER.size and len(buffer) >= HEADER.size + HEADER.unpack_from(buffer)[0]

    # -- lifecycle limits --------------------------------------------------------------------------

    def _on_hello_timeout(self) -> None:
        self._hello_timer = None
        if self._greeted or self._closing:
            return
        self.frontend.stats.timed_out_connections += 1
        timeout = self.frontend.listen.hello_timeout_s
        self._shed(f"no hello within {timeout:g} s (the server's listen.hello_timeout_s)")

    def _arm_idle_timer(self, delay: float) -> None:
        self._idle_timer = self._loop.call_later(delay, self._on_idle_timer)

    def _on_idle_timer(self) -> None:
        """Close a greeted connection that has had nothing in flight and sent nothing for
        idle_timeout_s; a busy one (answers in flight or unsent) is looked at again a full period later."""
        self._idle_timer = None
        transport = self.transport
        if self._closing or transport is None:
            return
        timeout = self.frontend.listen.idle_timeout_s
        now = self._loop.time()
        if self._in_flight or self._out or self._backlog or transport.get_write_buffer_size():
            self._last_data = now  # busy: the idle period starts again
            self._arm_idle_timer(timeout)
            return
        idle = now - self._last_data
        if idle < timeout:
            self._arm_idle_timer(timeout - idle)
            return
        self.frontend.stats.timed_out_connections += 1
        self._shed(f"idle for {timeout:g} s with nothing in flight (the server's listen.idle_timeout_s)")

    def _cancel_timers(self) -> None:
        for timer in (self._hello_timer, self._idle_timer, self._flood_timer):
            if timer is not None:
                timer.cancel()
        self._hello_timer = self._idle_timer = self._flood_timer = None

    def _hold_flood(self) -> None:
        """Leave this flooding socket unread for FLOOD_PAUSE_S while the other clients are polite;
        beside other floods and a polite client, give it SHARED_FLOOD_WINDOW instead."""
        if self.transport is None or self._closing or self._flood_timer is not None:
            return
        frontend = self.frontend
        others, polite = frontend.polite_others(self)
        if not polite:
            return
        if polite < others:  # several floods: each keeps being read, two in flight
            self._small_window, self._small_window_until = SHARED_FLOOD_WINDOW, self._loop.time() + POLITE_S
            return
        frontend.stats.flood_pauses += 1
        if not self._paused and not self._backlog:
            self.transport.pause_reading()
        loop = self._loop
        self._flood_timer = loop.call_later(FLOOD_PAUSE_S, self._release_flood)
        self._small_window, self._small_window_until = FLOOD_WINDOW, loop.time() + FLOOD_PAUSE_S + POLITE_S

    def _release_flood(self) -> None:
        self._flood_timer = None
        if self._backlog:  # frames read before the hold: on with them (reading resumes after)
            if not self._closing:
                self._read_frames()
            return
        if self.transport is not None and not (
            self._closing or self._paused or self._backlog or self._stopped
        ):
            self.transport.resume_reading()

    def _shed(self, error: str) -> None:
        """Close for a connection limit, not a protocol fault (not counted in protocol_errors)."""
        self._fail(error, protocol_error=False)

    # -- messages ----------------------------------------------------------------------------------

    def _on_compiled(self, buffer: bytearray, start: int, end: int) -> bool:
        """A greeted connection's common request, read by the compiled reader straight from the
        buffer (no msgpack map: ~2 us less of the loop's time per request) and accepted; False
        for any other frame, which the caller then reads the general way."""
        fast = compiled_infer(buffer, start, end, self.frontend.infer_table)
        if fast is None:
            return False
        self._on_fast(*fast)
        return True

    def _on_frame(self, body: bytes) -> None:
        """One frame. A readable id (after the hello) gets exactly one answer: `invalid` for a bad
        field, `error` if checking it failed unexpectedly, and the connection stays open; a frame
        that cannot be read, or has no readable id, gets an `error` message and a close."""
        try:
            message = decode_body(body, self.frontend.listen.max_frame_bytes)
        except ProtocolError as exc:
            self._fail(str(exc))
            return
        self._on_message(message)

    def _on_message(self, message: dict[str, Any]) -> None:
        """A decoded frame (`_on_frame`); one with a valid id and type infer is always answered
        here, never with a close (`_serve_newest` relies on it)."""
        frontend = self.frontend
        if self._greeted:  # (past the window, _read_some refused it: _refuse_run)
            fast = fast_infer(message, frontend.specs)
            if fast is not None:
                self._on_fast(*fast)
                return
        try:
            request = self._check(message)
        except ProtocolError as exc:
            if exc.request_id is not None and self._greeted:
                self.frontend.stats.protocol_errors += 1
                self._reply_now(exc.request_id, Status.INVALID, str(exc), None)
            else:
                self._fail(str(exc))
            return
        except Exception as exc:  # a fault in the checks (RecursionError, a bug) must not drop the
            why = _describe(exc)  # connection with the answers of its requests in flight
            _log.error("a frame from %s could not be checked: %s", self.peer, why)
            request_id = id_of(message)
            if request_id is not None and self._greeted:
                self._reply_now(
                    request_id, Status.ERROR, f"the server could not check this request: {why}", None
                )
            else:
                self._fail(f"the server could not check this frame: {why}")
            return
        if request is not None:
            self._on_request(request)

    def _check(self, message: dict[str, Any]) -> InferRequest | None:
        """The infer request to serve, or None when the message was handled here (a hello);
        ProtocolError for a bad message. (A request over the window never gets here: _on_frame.)"""
        kind = message_type(message)
        if not self._greeted:
            if kind != "hello":
                raise ProtocolError("the first message must be a hello (docs/protocol.md)")
            self._on_hello(message)
            return None
        if kind == "hello":
            raise ProtocolError("hello was already sent on this connection", id_of(message))
        return parse_infer(message)

    def _on_hello(self, message: dict[str, Any]) -> None:
        hello = parse_hello(message)
        token = self.frontend.listen.token
        if token is not None and not hmac.compare_digest((hello.token or "").encode(), token.encode()):
            self.frontend.stats.refused_auth += 1
            self._fail("authentication failed: wrong or missing token", protocol_error=False)
            return
        self._greeted = True
        if self._hello_timer is not None:
            self._hello_timer.cancel()
            self._hello_timer = None
        if self.frontend.listen.idle_timeout_s > 0:
            self._arm_idle_timer(self.frontend.listen.idle_timeout_s)
        listen = self.frontend.listen
        reply: dict[str, Any] = {
            "type": "hello",
            "version": PROTOCOL_VERSION,
            "server": f"edgeserve {__version__}",
            "max_frame_bytes": listen.max_frame_bytes,
            "max_in_flight": listen.max_in_flight,
        }
        if listen.share_total and listen.in_flight_total >= listen.max_in_flight:
            reply["max_in_flight_total"] = listen.in_flight_total  # what a client alone may fill
        reply["models"] = self.frontend.model_table()
        self._send(reply)

    def _window(self) -> int:
        """How many requests this connection may have in flight now (`window`); FLOOD_WINDOW after
        a hold, its whole max_in_flight while it is light (FloodTally.light)."""
        if self._last_data < self._small_window_until:
            return self._small_window
        frontend, listen = self.frontend, self.frontend.listen
        assert listen.max_in_flight is not None  # resolved as the connection was made
        mine = window(
            listen.max_in_flight,
            frontend.total,
            frontend.in_flight,
            frontend.busy,
            self._in_flight,
            listen.share_total,
            frontend.sending(self._last_data),
        )
        if self._tally.light(self._last_data):  # a light client's bursts pass: the even share binds the busy
            return max(mine, listen.max_in_flight)
        return mine

    def _room(self) -> int:
        """How many requests this connection may accept now, one after the other (`room`)."""
        if self._last_data < self._small_window_until:
            return self._small_window - self._in_flight
        frontend, listen = self.frontend, self.frontend.listen
        assert listen.max_in_flight is not None  # resolved as the connection was made
        mine = room(
            listen.max_in_flight,
            frontend.total,
            self._in_flight,
            frontend.in_flight,
            frontend.busy,
            listen.share_total,
            frontend.sending(self._last_data),
        )
        if self._tally.light(self._last_data):
            return max(mine, listen.max_in_flight - self._in_flight)
        return mine

    def _refuse_run(self, buffer: bytearray, pos: int, size: int, budget: int | None) -> tuple[int, int]:
        """Refuse the complete frames from `pos` on, the window being full, within `budget` frames
        of the turn (None: all): `rejected` from the id, model and priority alone (the tensor is
        never checked), written from a cached frame. Under overload most frames come this way, so
        this cost per frame decides how much CPU is left to serve: frames that match one of the
        connection's FrameShapes are refused BLOCK_MIN or more at a time (compiled, or numpy), the
        others one by one with no call per frame but the decoder's and the frame's. The window
        cannot open in between (nothing is answered here). Stops before the first frame it cannot
        refuse from its id (not an infer, no valid id, unreadable, over max_frame_bytes,
        incomplete): the general path reads that one. Returns the position after the refused
        frames and their cost in frames of the budget."""
        frontend = self.frontend
        max_frame = frontend.listen.max_frame_bytes
        cached = frontend.window_refusals
        table = frontend.infer_table
        out = self._out
        unpack_from, header = HEADER.unpack_from, HEADER.size
        flush = not out  # nothing was queued before: flush at the end of this turn
        lengths = self._shapes.lengths
        wait, since, unmatched = self._shape_wait, self._since_learn, self._unmatched
        fruitless = self._fruitless
        backoff = _backoff(fruitless)
        blocks = single = block_cost = 0
        while budget is None or single < (budget - block_cost) * REFUSALS_PER_FRAME:
            if size - pos < header:
                break
            (length,) = unpack_from(buffer, pos)
            end = pos + header + length
            if length > max_frame or size < end:
                break
            if not wait and end - pos in lengths:
                most = min((size - pos) // (end - pos), BLOCK_MAX)
                if budget is not None:
                    spent = block_cost + -(-single // REFUSALS_PER_FRAME)
                    most = min(most, (budget - spent) * BLOCK_REFUSALS_PER_FRAME)
                if most >= BLOCK_MIN:
                    count = self._refuse_block(buffer, pos, end - pos, most)
                    pos += count * (end - pos)
                    blocks += count
                    block_cost += -(-count // BLOCK_REFUSALS_PER_FRAME)
                    if count >= BLOCK_MIN:
                        fruitless = backoff = 0
                    if count < most:  # the next frame has a layout not seen yet
                        wait, unmatched = BLOCK_MIN << backoff, True
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
            refusal = cached.get((model, priority)) or frontend.window_refusal(model, priority)
            out.append(refusal.frame(request_id))
            single += 1
            since += 1
            if wait:
                wait -= 1
            # Learn from the frame a block stopped at (no shape matched it), or from a frame of a
            # length with no shape yet; with no backoff, try the blocks again at once.
            if unmatched or (end - pos not in lengths and since >= LEARN_AFTER << backoff):
                if message is None:  # (decodes: the compiled reader took it)
                    message = decode_body(buffer[pos + header : end], max_frame)
                shape = FrameShape.learn(buffer[pos:end], message)
                if shape is not None:
                    self._shapes.add(shape)
                since, unmatched = 0, False
                wait = wait if backoff else 0
                fruitless += 1
                backoff = _backoff(fruitless)
            pos = end
        self._shape_wait, self._since_learn, self._unmatched = wait, since, unmatched
        self._fruitless = fruitless
        refused = blocks + single
        if refused:
            if flush:
                self._loop.call_soon(self._flush)
            stats = frontend.stats
            stats.requests += refused
            stats.by_status["rejected"] = stats.by_status.get("rejected", 0) + refused
            self._over_window += refused
        return pos, block_cost + -(-single // REFUSALS_PER_FRAME)

    def _refuse_block(self, buffer: bytearray, pos: int, length: int, most: int) -> int:
        """Refuse the frames of `length` bytes from `pos` on (at most `most`) that match one of the
        connection's FrameShapes, as one block; returns how many there were."""
        with memoryview(buffer) as view, view[pos : pos + most * length] as block:  # no copy
            count, answers = self._shapes.refuse(block, length, self._window_refusal)
        if count:
            self._out.append(answers)
        return count

    def _window_refusal(self, shape: FrameShape) -> tuple[bytes, bytes]:
        return self.frontend.window_refusal(shape.model, shape.priority).around(shape.id_size)

    def _accept(self) -> None:
        """Count a request that will be answered (it now holds a place in the window)."""
        frontend = self.frontend
        frontend.stats.requests += 1
        self._count(accepted=1)
        self._in_flight += 1
        frontend.in_flight += 1
        if self._in_flight == 1:
            frontend.busy += 1

    def _on_fast(
        self,
        request_id: int,
        model: str,
        x: np.ndarray,
        deadline_ms: float | None,
        capture_ts: float | None,
        priority: int | None,
    ) -> None:
        """A request that passed fast_infer: straight to the Server, its answer to `_on_answer`."""
        frontend = self.frontend
        self._accept()
        reply = functools.partial(self._on_answer, request_id, priority)
        try:
            frontend.server.enqueue(
                model,
                x,
                reply,
                deadline_ms=deadline_ms,
                capture_ts=capture_ts,
                reply_margin_s=frontend.margin_s,
                received=self._read_at,
            )
        except Exception as exc:  # never lose an answer, whatever went wrong
            self._on_error(request_id, model, priority, exc)

    def _on_request(self, request: InferRequest) -> None:
        frontend = self.frontend
        self._accept()
        reply = functools.partial(self._on_answer, request.id, request.priority)
        config = frontend.server.config.models.get(request.model)
        try:
            tensor = request.tensor
            if (
                config is not None
                and config.preprocess is not None
                and tensor is not None
                and tensor.dtype == np.uint8
            ):
                job = asyncio.ensure_future(self._preprocess_and_enqueue(request, reply, self._read_at))
                self._jobs.add(job)  # a reference, so the job is not collected half-way
                job.add_done_callback(self._jobs.discard)
            else:
                frontend.server.enqueue(
                    request.model,
                    request.sample,
                    reply,
                    deadline_ms=request.deadline_ms,
                    capture_ts=request.capture_ts,
                    reply_margin_s=frontend.margin_s,
                    received=self._read_at,
                )
        except Exception as exc:  # never lose an answer, whatever went wrong
            self._on_error(request.id, request.model, request.priority, exc)

    def _on_error(self, request_id: int, model: str, priority: int | None, exc: Exception) -> None:
        why = _describe(exc)  # the traceback's frames, not its (unbounded) message
        trace = "".join(traceback.format_tb(exc.__traceback__))
        _log.error("request %d from %s failed: %s\n%s", request_id, self.peer, why, trace)
        self._on_answer(request_id, priority, Result(Status.ERROR, model, error=why))

    async def _preprocess_and_enqueue(
        self, request: InferRequest, reply: functools.partial[None], received: float
    ) -> None:
        """A camera frame (uint8 HWC): resize and convert off the loop, then queue (its budget
        running from when it was read); one answer."""
        server = self.frontend.server
        try:
            pre = server.config.models[request.model].preprocess
            assert pre is not None
            spec = server.manifest(request.model).input
            try:
                x = await asyncio.to_thread(preprocess_frame, request.sample, pre, spec.shape, spec.dtype)
            except PreprocessError as exc:
                reply(Result(Status.INVALID, request.model, error=str(exc)))
                return
            server.enqueue(
                request.model,
                x,
                reply,
                deadline_ms=request.deadline_ms,
                capture_ts=request.capture_ts,
                reply_margin_s=self.frontend.margin_s,
                received=received,
            )
        except Exception as exc:  # never lose an answer
            self._on_error(request.id, request.model, request.priority, exc)

    def _on_answer(self, request_id: int, priority: int | None, result: Result) -> None:
        """Write a request's answer (exactly one per accepted request; the Server calls it once)."""
        self._in_flight -= 1
        self.frontend.answered()
        if self._in_flight == 0:
            self.frontend.busy -= 1
        if result.status is Status.EXPIRED and result.refused:
            self.frontend.stats.expired_on_arrival += 1
        self._answer(request_id, result, priority)
        if self._failing is not None and self._in_flight == 0:
            self._close_with_error()
        elif self._eof and self._in_flight == 0 and not self._reading:
            self.close()

    def _reply_now(
        self, request_id: int, status: Status, error: str, priority: int | None, model: str = ""
    ) -> None:
        now = time.monotonic()
        self._answer(request_id, Result(status, model, queued=now, end=now, error=error), priority)

    def _answer(self, request_id: int, result: Result, priority: int | None) -> None:
        stats = self.frontend.stats
        status = result.status
        stats.by_status[status.value] = stats.by_status.get(status.value, 0) + 1
        if self._closing:
            stats.discarded += 1
            return
        if status in CACHED_REFUSALS and result.end == result.queued:
            self._write(self.frontend.refusal(result, priority).frame(request_id))
            return
        frame = self.frontend.answer_frames.frame(request_id, result, priority)
        if frame is None:
            frame = encode_frame(result_message(request_id, result, priority))
        if self._reading:
            self._write(frame)
        else:
            self._write_now(frame)

    def _write_now(self, frame: bytes) -> None:
        """A finished batch's answer leaves at once, with what is queued before it: at the end of
        the loop turn it would wait behind the turn's reads (up to FRAMES_PER_TURN frames per
        connection), time its client counts against the deadline."""
        if self.transport is None or self._closing:
            return
        if self.frontend.holding:  # more answers of the batch follow: one write at the release
            self.frontend.held.add(self)
            self._out.append(frame)
        elif self._out:
            self._out.append(frame)
            self._flush()
        else:
            self._transmit(frame)

    def _transmit(self, data: bytes) -> None:
        """Write `data` to the socket with the GIL released, then leave the rest to the transport.

        uvloop's `transport.write` makes its write() syscall holding the GIL. Sending an answer
        wakes the client, and on a busy box the woken client often takes the loop thread's core
        in the middle of that call: the loop is then off its CPU for ~20 us per write, GIL in hand,
        while the executor thread, its batch done, waits for the GIL to return from ONNX Runtime
        and to decide the next batch. os.write releases the GIL for the syscall. It is used only
        while the transport has nothing buffered (so the bytes keep their order); what the socket
        does not take now, or an error, goes to transport.write, which buffers, applies the write
        flow control, or reports the error and closes as before."""
        transport = self.transport
        assert transport is not None
        if self._fd >= 0 and not transport.get_write_buffer_size() and not transport.is_closing():
            try:
                sent = os.write(self._fd, data)
            except OSError:  # EAGAIN, or an error the transport's own write will meet and report
                sent = 0
            if sent == len(data):
                return
            data = data[sent:]
        transport.write(data)

    def write_held(self) -> None:
        """The held answers leave, with what was queued before them (Frontend.release_answers)."""
        self._flush()

    def _send(self, message: dict[str, Any]) -> None:
        self._write(encode_frame(message))

    def _write(self, frame: bytes) -> None:
        """Queue a frame; the frames of one loop turn (refusals, the hello) leave in one write."""
        if self.transport is None or self._closing:
            return
        if not self._out:
            self._loop.call_soon(self._flush)
        self._out.append(frame)

    def _flush(self) -> None:
        if self._out and self.transport is not None and not self.transport.is_closing():
            self._transmit(b"".join(self._out))
        self._out.clear()

    def _fail(self, error: str, protocol_error: bool = True) -> None:
        """An error message, then close: used when the stream or the peer cannot be trusted, and
        (protocol_error=False: not counted as one) for a refused token or a connection limit.

        Input stops at once (later bytes are discarded); the requests already accepted on this
        connection are still answered, then the error message goes and our side is half-closed,
        so the message is not lost to a reset caused by closing with the peer's unread bytes; the
        transport closes when the peer does, or after FAIL_LINGER_S.
        """
        if self._closing or self._failing is not None:
            return
        if protocol_error:
            self.frontend.stats.protocol_errors += 1
        self._failing = cut(error, ERROR_TEXT_LIMIT)  # it may quote the client's data
        _log.info("closing %s: %s", self.peer, self._failing)
        self._cancel_timers()
        self._buffer, self._stale = bytearray(), 0
        if self._in_flight == 0:
            self._close_with_error()

    def _close_with_error(self) -> None:
        self._send({"type": "error", "error": self._failing})
        self._flush()
        transport = self.transport
        if transport is None or self._closing:
            return
        self._closing = True
        if transport.can_write_eof():
            transport.write_eof()
            self._loop.call_later(FAIL_LINGER_S, transport.close)
        else:
            transport.close()

    def _take_received(self) -> None:
        """Before a close: what the kernel already holds for this connection (reading paused),
        up to CLOSE_READ_BYTES, so that a frame which reached the server before it stopped gets
        its answer, and a TCP close leaves no unread bytes behind (the kernel would answer them
        with a reset, which can destroy the answers still on their way to the client)."""
        sock = None if self.transport is None else self.transport.get_extra_info("socket")
        if sock is None:
            return
        with contextlib.suppress(OSError), socket.socket(fileno=os.dup(sock.fileno())) as raw:
            taken = 0
            while taken < CLOSE_READ_BYTES and (chunk := raw.recv(1 << 16, socket.MSG_DONTWAIT)):
                self._buffer += chunk
                taken += len(chunk)

    def close(self) -> None:
        """Answer the frames already read (a shutdown's close too: their answers say `shutdown`),
        write what is queued, then close."""
        reading = not self._closing and not self._reading and self._failing is None and self._greeted
        if reading:
            self._take_received()
        if reading and self._complete_frame():
            self._stopped = True
            self._read_frames(limit=None)
            if self._closing:
                return  # reading the last frames closed the connection (its peer half-closed)
        self._flush()
        self._closing = True
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()  # flushes what is buffered, then closes
