"""One asyncio.Protocol per connection, in front of a running Server.

Flow control (net/flow.py, after uvicorn's flow_control.py): a connection's socket is read while
none of its reasons to pause holds. Reading pauses while the transport's write buffer is above its
high-water mark (a client that does not read its answers stops being read, so the server never
buffers without bound) and resumes when it drains; frames left for the next loop turn, a flood
held (net/admission.py) and shutdown pause it too. Requests beyond a connection's window are
answered `rejected` at once ("too many requests in flight"), so a pipelining client learns the
limit instead of stalling.

Overload (docs/runtime.md, "The path under overload"): a refusal must cost far less than a served
request, or the more a client over-sends the less is served. So a request over the window is
refused from its id alone (net/refusals.py: its tensor is never decoded or checked; frames that
match a shape learned from the connection's earlier frames, hundreds at a time), the common
request is parsed by wire.frames.compiled_infer or fast_infer, at most `frames_per_turn` frames
are handled before the loop gets to run its other callbacks (a finished batch's hand-off among
them), and the answers of one loop turn leave in one write (net/outbox.py). An accepted request
costs no task and no future: the Server calls the connection back with its Result
(Server.enqueue), and a fixed refusal is written from a cached frame. The numbers are
FrontSettings (net/settings.py), handed to the Frontend.

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
from typing import Any, Protocol, cast

import numpy as np

from edgeserve import __version__
from edgeserve.config.server import ListenConfig, ServerConfig
from edgeserve.manifest import Manifest, TensorSpec
from edgeserve.net.admission import Admission
from edgeserve.net.answer_frames import AnswerFrames, result_message
from edgeserve.net.flow import BACKLOG, HOLD, STOP, WRITE, ReadGate
from edgeserve.net.outbox import Outbox
from edgeserve.net.preprocess import PreprocessError, preprocess_frame
from edgeserve.net.read_lag import PLANNED_MAX_S, ReadLag
from edgeserve.net.refusals import CACHED_REFUSALS, RefusalFrames, Refusals
from edgeserve.net.settings import FrontSettings
from edgeserve.runtime import FrontendStats, Result, Status
from edgeserve.wire.bounds import ERROR_TEXT_LIMIT, cut
from edgeserve.wire.frames import (
    HEADER,
    PROTOCOL_VERSION,
    InferRequest,
    InferTable,
    ProtocolError,
    SampleSpec,
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
)

_log = logging.getLogger(__name__)


def _describe(exc: BaseException) -> str:
    """ "Type: message", bounded: an exception's message may quote client data."""
    try:
        text = str(exc)
    except Exception:  # a broken __str__, or one that recursed too deeply
        text = "(unprintable)"
    return cut(f"{type(exc).__name__}: {text}")


def _tensor_entry(spec: TensorSpec) -> dict[str, Any]:
    """A tensor of one sample as the hello reply describes it (-1: a size that varies)."""
    return {"dtype": spec.dtype, "shape": list(spec.shape)}


def _answered_now(status: Status, error: str) -> Result:
    """An answer the front gives itself, at once (no model: the request was not checked)."""
    now = time.monotonic()
    return Result(status, "", queued=now, end=now, error=error)


def complete_frame(buffer: bytearray) -> bool:
    """The buffer begins with a whole frame."""
    return len(buffer) >= HEADER.size and len(buffer) >= HEADER.size + HEADER.unpack_from(buffer)[0]


def behind(fd: int, buffer: bytearray, frames: int) -> bool:
    """The kernel holds at least `frames` more frames of the socket `fd` than `buffer` (their size
    as the buffer's first): a read of this client's socket is behind its sends."""
    if fd < 0 or len(buffer) < HEADER.size:
        return False
    try:
        waiting = struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]
    except OSError:
        return False
    return waiting >= frames * (HEADER.size + HEADER.unpack_from(buffer)[0])


def take_received(transport: asyncio.Transport | None, buffer: bytearray, most: int) -> None:
    """Before a close: add to `buffer` what the kernel already holds for this connection (reading
    paused), up to `most` bytes, so that a frame which reached the server before it stopped gets
    its answer, and a TCP close leaves no unread bytes behind (the kernel would answer them with a
    reset, which can destroy the answers still on their way to the client)."""
    sock = None if transport is None else transport.get_extra_info("socket")
    if sock is None:
        return
    with contextlib.suppress(OSError), socket.socket(fileno=os.dup(sock.fileno())) as raw:
        taken = 0
        while taken < most and (chunk := raw.recv(1 << 16, socket.MSG_DONTWAIT)):
            buffer += chunk
            taken += len(chunk)


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
    """Shared by all connections of one server process: the Server, the limits, the admission of
    requests (net/admission.py) and the counters."""

    def __init__(
        self,
        server: ServerPort,
        listen: ListenConfig,
        peers: Sequence[FrontendStats] = (),
        *,
        settings: FrontSettings | None = None,
    ) -> None:
        self.server = server
        self.settings = settings = FrontSettings() if settings is None else settings
        # The windows of the connections; `peers`, the other fronts on this server (the HTTP
        # front's stats): their clients count beside the connections when a flood is held.
        self.admission = Admission(settings.admission, peers)
        self.listen = listen  # its derived windows are filled in as the first connection comes (`resolve`)
        # The in-flight total in force (Admission.total): the configured one, or below it what the
        # server should hold now (Server.in_flight_limit), taken before each read (`refresh_total`).
        self._total_at = math.nan
        self._limit = getattr(server, "in_flight_limit", None)  # (a stand-in server: none)
        # Server.enqueue's reply_margin_s: the configured margin for the answer's way to the client,
        # plus the measured wait of a request in its socket before the loop read it (read_lag.py)
        self.reply_margin_s = listen.reply_margin_ms / 1000.0
        self.margin_s = self.reply_margin_s
        self.read_lag = ReadLag(self._read_lag_moved)
        self.stats = FrontendStats()
        self.connections: set[Connection] = set()
        self.per_listener: dict[str, int] = {}  # admitted open connections by listener ("unix", "tcp")
        self.write_high_water = (
            settings.write_high_water
        )  # bytes buffered for one client before reading pauses
        self._all_closed: asyncio.Event | None = None  # set when the last connection is lost
        self._specs: tuple[object, dict[str, SampleSpec], InferTable] = (None, {}, ())
        self.refusal_frames = RefusalFrames()  # refusals from cached frames
        self.answer_frames = AnswerFrames()  # `ok` answers from cached pieces
        # While the server hands out a batch's answers (holding > 0), connections keep theirs and
        # write them all at the release, one write each (Server.answers_together).
        self.holding = 0
        self._held: set[Connection] = set()
        server.answers_together(self.hold_answers, self.release_answers)

    @property
    def listen(self) -> ListenConfig:
        return self._listen

    @listen.setter
    def listen(self, listen: ListenConfig) -> None:
        """The config (and the windows it gives the admission)."""
        self._listen = listen
        self.admission.max_in_flight = listen.max_in_flight or 0  # (None until `resolve`)
        self.admission.share_total = listen.share_total

    @property
    def in_flight(self) -> int:
        """Accepted requests not answered yet, all connections."""
        return self.admission.in_flight

    @property
    def refusing(self) -> int:
        """Connections whose refusals wait for the next loop turn."""
        return self.admission.refusing

    def _read_lag_moved(self, wait_s: float) -> None:
        self.margin_s = self.reply_margin_s + min(wait_s, PLANNED_MAX_S)
        self.stats.read_wait_seconds = wait_s

    def hold_answers(self) -> None:
        self.holding += 1

    def release_answers(self) -> None:
        self.holding = max(self.holding - 1, 0)  # a release without its hold must not hold forever
        if self.holding == 0 and self._held:
            held, self._held = self._held, set()
            for connection in held:
                connection.write_held()

    def write_at_release(self, connection: Connection) -> None:
        """`connection` keeps its answers until the batch's last is handed out (`release_answers`)."""
        self._held.add(connection)

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

    def resolve(self) -> None:
        """Fill in the windows the config leaves to the server: its in-flight bound, known once it
        has started (the profiles and deadlines give it)."""
        if self._listen.max_in_flight is None:
            bounds = getattr(self.server, "window_bounds", None)  # (a stand-in server: no bounds)
            self.listen = self._listen.resolved(*((1 << 30, 1 << 30) if bounds is None else bounds()))
        if not self.admission.total:
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
        admission, total = self.admission, self._listen.in_flight_total
        admission.total = (
            total if self._limit is None else min(total, self._limit(admission.in_flight, self.margin_s))
        )

    def protocol_factory(self, listener: str = "socket") -> Connection:
        return Connection(self, listener)

    def over_cap(self, listener: str) -> str | None:
        """Why a new connection on `listener` must be refused, or None when it may stay."""
        listen = self._listen
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
        admission = self.admission
        if admission.in_flight > 0:
            admission.drained = asyncio.Event()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(admission.drained.wait(), timeout)
            admission.drained = None

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
        self.admission.join(connection.share)
        if len(self.connections) == 1:
            self.read_lag.resume()

    def lost(self, connection: Connection) -> None:
        self.connections.discard(connection)
        self.admission.leave(connection.share)
        if not self.connections:
            self.read_lag.pause()
            if self._all_closed is not None:
                self._all_closed.set()


class Connection(asyncio.Protocol):
    """One client: hello first, then pipelined infer requests answered in completion order.

    It applies what its collaborators decide: the admission (`share`: whether a frame fits the
    window, whether a flood is held), the refusals past the window (`_refusals`), the read gate
    (`_gate`: whether its socket is read) and the outbox (`_outbox`: when its frames are written)."""

    def __init__(self, frontend: Frontend, listener: str = "socket") -> None:
        frontend.resolve()  # the first connection: the server has started, its bound is known
        self.frontend = frontend
        self.listener = listener
        self.transport: asyncio.Transport | None = None
        # The loop, looked up once: asyncio.get_running_loop() makes a getpid() system call (its
        # fork check), and the hot paths below would make it for every read and loop turn.
        self._loop = asyncio.get_running_loop()
        self.peer = "?"
        settings = frontend.settings
        self._turn = settings.frames_per_turn
        self._admission = frontend.admission
        self.share = frontend.admission.share()  # in flight, greeted, last data, its flood record
        self._gate = ReadGate()  # reading pauses while any of its reasons holds
        self._outbox = Outbox(self._loop)
        self._out = self._outbox.frames  # frames to write at the end of this loop turn
        self._refusals = Refusals(settings.refusals, frontend.refusal_frames, frontend.stats, self._outbox)
        self._admitted = False  # counted in frontend.connections (not refused over the cap)
        self._hello_timer: asyncio.TimerHandle | None = None
        self._idle_timer: asyncio.TimerHandle | None = None
        self._flood_timer: asyncio.TimerHandle | None = None  # the end of a hold (flow.HOLD)
        self._read_at = 0.0  # time.monotonic() of the read that brought the buffer's first frame
        self._buffer = bytearray()
        self._closing = False
        self._failing: str | None = None  # the error to send once the answers in flight are out
        self._stale = 0  # the buffer's first bytes are older than frames served: refuse them
        self._eof = False
        self._reading = False  # inside _read_frames (an answer given there must not close under it)
        self._jobs: set[asyncio.Future[None]] = set()  # camera frames being preprocessed

    # -- transport callbacks -----------------------------------------------------------------------

    def stop_reading(self) -> None:
        """No more frames from this client (shutdown); the ones already read are answered."""
        self._gate.pause(STOP)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not subclasses
        transport = self.transport
        transport.set_write_buffer_limits(high=self.frontend.write_high_water)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        plain = sock is not None and transport.get_extra_info("sslcontext") is None
        self._outbox.attach(transport, sock.fileno() if plain else -1)  # plain bytes: Outbox.transmit
        self._gate.attach(transport)
        self.peer = str(transport.get_extra_info("peername") or "unix")
        frontend = self.frontend
        refusal = frontend.over_cap(self.listener)
        if refusal is not None:
            frontend.stats.refused_connections += 1  # logged at info by _fail: a flood floods no log
            self._fail(refusal, protocol_error=False)
            return
        self._admitted = True
        stats = frontend.stats
        stats.connections += 1
        stats.open_connections += 1
        frontend.joined(self)
        frontend.per_listener[self.listener] = frontend.per_listener.get(self.listener, 0) + 1
        loop = self._loop
        self.share.last_data = loop.time()
        self._hello_timer = loop.call_later(frontend.listen.hello_timeout_s, self._on_hello_timeout)
        _log.info("client connected: %s", self.peer)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        self._gate.detach()
        self._outbox.fd = -1  # the transport closes the socket: its number may be reused
        self._cancel_timers()
        if not self._admitted:
            return  # refused over the cap: never counted
        self._admitted = False
        frontend = self.frontend
        frontend.lost(self)
        frontend.per_listener[self.listener] -= 1
        frontend.stats.open_connections -= 1
        _log.info("client disconnected: %s (%d requests still in flight)", self.peer, self.share.in_flight)

    @property
    def reading_paused(self) -> bool:
        """Paused because the client does not read its answers."""
        return bool(self._gate.reasons & WRITE)

    def pause_writing(self) -> None:
        """The client is not reading its answers: stop reading its requests until it does."""
        self._gate.pause(WRITE)

    def resume_writing(self) -> None:
        self._gate.resume(WRITE)

    def data_received(self, data: bytes) -> None:
        if self._closing or self._failing is not None:
            return  # after an error: discard until the peer closes
        self.share.last_data = self._loop.time()
        backlog = self._gate.reasons & BACKLOG  # the frames still buffered came with an earlier read
        if not backlog:
            self._read_at = time.monotonic()
        self._buffer += data
        if not backlog:
            self._read_frames()

    def eof_received(self) -> bool | None:
        """The client half-closed: answer what is in flight, then close (keep the transport open)."""
        if self._closing:
            return False
        self._eof = True
        if self.share.in_flight == 0 and not self._gate.reasons & BACKLOG:
            self._read_frames(whole=True)  # the frames left, then the close (nothing in flight)
        return True

    # -- reading -----------------------------------------------------------------------------------

    def _read_frames(self, whole: bool = False) -> None:
        """Handle up to a turn's frames (`whole`: all that are buffered); if more are complete, stop
        reading the socket and come back on the next loop turn, after the callbacks already due."""
        frontend = self.frontend
        frontend.server.run_completed()  # first: the answers free window for these frames
        frontend.refresh_total(self.share.last_data)
        self._reading = True
        try:
            self._read_some(None if whole else self._turn)
        finally:
            self._reading = False
        if self._eof and self.share.in_flight == 0 and not self._gate.reasons & BACKLOG:
            self.close()

    def _read_some(self, limit: int | None) -> None:
        frontend, share, buffer = self.frontend, self.share, self._buffer
        if self._stale:  # older than frames already served: refused, never served
            until, handled, self._stale = self._stale, 0, 0
        else:
            until, handled = self._serve_newest(limit) if share.greeted else (0, 0)
            if share.greeted and self._defer_refusals(limit, until):
                return
        listen, table = frontend.listen, frontend.infer_table
        room, refuse = self._admission.room, self._refusals.run
        max_frame = listen.max_frame_bytes
        hello_limit = min(listen.max_hello_bytes, max_frame)  # an unauthenticated peer buffers a hello
        size, pos, header, refused = len(buffer), 0, HEADER.size, 0
        while not self._closing and self._failing is None and size - pos >= header:
            (length,) = HEADER.unpack_from(buffer, pos)
            greeted = share.greeted
            if not greeted and length > hello_limit:
                self._fail(f"frame of {length} bytes before the hello exceeds max_hello_bytes {hello_limit}")
                return
            if length > max_frame:
                self._fail(f"frame of {length} bytes exceeds max_frame_bytes {max_frame}")
                return
            end = pos + header + length
            if size < end or handled == limit:
                break
            if greeted:
                full = room(share) <= 0
                if full or pos < until:  # (before `until`: older than the frames _serve_newest served)
                    budget = None if limit is None else limit - handled
                    pos, cost, count = refuse(buffer, pos, size if full else until, budget, max_frame, table)
                    refused += count
                    if cost:
                        handled += cost
                        continue
                fast = compiled_infer(buffer, pos + header, end, table)  # the common request: no map
                if fast is not None:
                    self._on_fast(*fast)
                    pos, handled = end, handled + 1
                    continue
            body = buffer[pos + header : end]  # one copy; the buffer is trimmed once, below
            pos = end
            self._on_frame(body)
            handled += 1
        if self._failing is not None or self._closing:
            return  # _fail cleared the buffer
        del buffer[:pos]
        self._after_read(refused, handled == limit)

    def _after_read(self, refused: int, turn_done: bool) -> None:
        """The admission counts the read's refusals (and may hold a flood); if the turn's limit
        left complete frames, the rest waits for the next loop turn."""
        gate = self._gate
        if refused:
            hold_s = self._admission.after_read(
                self.share, refused, bool(gate.reasons & HOLD), self._loop.time
            )
            if hold_s:  # the kernel holds its frames, the frames of this read wait in its buffer
                self.frontend.stats.flood_pauses += 1
                gate.pause(HOLD)
                self._flood_timer = self._loop.call_later(hold_s, self._release_flood)
        if turn_done and complete_frame(self._buffer):
            gate.pause(BACKLOG)
            if not gate.reasons & HOLD:  # a held flood's frames wait for the hold to end
                self._loop.call_soon(self._read_frames)
            return
        gate.resume(BACKLOG)

    def _defer_refusals(self, limit: int | None, until: int) -> bool:
        """With the window full after a read's newest frames were served (those before `until`:
        older, to be refused): leave the rest of the read for the next loop turn, so that the
        other connections' reads of this turn serve their newest frames first. Under a flood a
        read's refusals cost ~100 us; with four connections the executor, its queues refilled
        only after all of them, found them empty at 3 % of its batches, for ~0.9 ms each. Only
        with at most `defer_refusals` connections open: with 16, the turn of deferred refusals
        itself held every read back."""
        frontend, gate = self.frontend, self._gate
        most = frontend.settings.defer_refusals
        if limit is None or gate.reasons & BACKLOG or len(frontend.connections) > most:
            return False
        if not until and not (self._admission.room(self.share) <= 0 and complete_frame(self._buffer)):
            return False
        self._stale = until
        self._admission.defer(True)
        gate.pause(BACKLOG)  # the socket waits (the kernel holds what comes meanwhile)
        self._loop.call_soon(self._refuse_deferred)
        return True

    def _refuse_deferred(self) -> None:
        self._admission.defer(False)
        if self._closing or self._failing is not None:
            return
        if not self._gate.reasons & HOLD:  # a held flood's frames wait for the hold to end
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
        space = self._admission.room(self.share)
        buffer = self._buffer
        if limit is not None and space > limit:
            # The turn's limit binds, not the window: the older frames are read in order (the rest
            # of them next turn) while the window has room, unless the kernel holds more than a
            # turn of frames behind them: then the loop reads slower than this client sends, the
            # oldest would be answered late however deep the window, and the backlog would grow
            # (the server cannot see how long they waited there). Then the turn's newest go first.
            if not behind(self._outbox.fd, buffer, limit):
                return 0, 0
            space = limit
        until = newest_frames_start(buffer, len(buffer), space) if space > 0 else 0
        if until == 0:
            return 0, 0
        max_frame, table = self.frontend.listen.max_frame_bytes, self.frontend.infer_table
        pos, served = until, 0
        while len(buffer) - pos >= HEADER.size and not self._closing:
            length = HEADER.unpack_from(buffer, pos)[0]
            if length > max_frame:
                break
            end = pos + HEADER.size + length
            if end > len(buffer):  # the incomplete frame after the ones newest_frames_start counted
                break
            fast = compiled_infer(buffer, pos + HEADER.size, end, table)
            if fast is not None:
                self._on_fast(*fast)
            else:
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

    # -- lifecycle limits --------------------------------------------------------------------------

    def _on_hello_timeout(self) -> None:
        self._hello_timer = None
        if self.share.greeted or self._closing:
            return
        self.frontend.stats.timed_out_connections += 1
        timeout = self.frontend.listen.hello_timeout_s
        self._fail(
            f"no hello within {timeout:g} s (the server's listen.hello_timeout_s)", protocol_error=False
        )

    def _on_idle_timer(self) -> None:
        """Close a greeted connection that has had nothing in flight and sent nothing for
        idle_timeout_s; a busy one (answers in flight or unsent) is looked at again a full period later."""
        self._idle_timer = None
        transport, share = self.transport, self.share
        if self._closing or transport is None:
            return
        timeout = self.frontend.listen.idle_timeout_s
        now = self._loop.time()
        busy = (
            share.in_flight or self._out or self._gate.reasons & BACKLOG or transport.get_write_buffer_size()
        )
        if busy:
            share.last_data = now  # busy: the idle period starts again
        idle = now - share.last_data
        if idle < timeout:
            self._idle_timer = self._loop.call_later(timeout - idle, self._on_idle_timer)
            return
        self.frontend.stats.timed_out_connections += 1
        self._fail(
            f"idle for {timeout:g} s with nothing in flight (the server's listen.idle_timeout_s)",
            protocol_error=False,
        )

    def _cancel_timers(self) -> None:
        for timer in (self._hello_timer, self._idle_timer, self._flood_timer):
            if timer is not None:
                timer.cancel()
        self._hello_timer = self._idle_timer = self._flood_timer = None
        self._gate.resume(HOLD)  # (a hold cut short: the connection fails or is gone)

    def _release_flood(self) -> None:
        """A hold ends: reading resumes, after the frames read before it (a backlog)."""
        self._flood_timer = None
        gate = self._gate
        gate.resume(HOLD)
        if gate.reasons & BACKLOG and not self._closing:
            self._read_frames()

    # -- messages ----------------------------------------------------------------------------------

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
        """A decoded frame (`_on_frame`): the hello first, then infer requests (a request over the
        window never gets here: `_read_some` refused it). One with a valid id and type infer is
        always answered here, never with a close (`_serve_newest` relies on it)."""
        share = self.share
        if share.greeted:
            fast = fast_infer(message, self.frontend.specs)
            if fast is not None:
                self._on_fast(*fast)
                return
        try:
            kind = message_type(message)
            if not share.greeted:
                if kind != "hello":
                    raise ProtocolError("the first message must be a hello (docs/protocol.md)")
                self._on_hello(message)
                return
            if kind == "hello":
                raise ProtocolError("hello was already sent on this connection", id_of(message))
            request = parse_infer(message)
        except ProtocolError as exc:
            if exc.request_id is not None and share.greeted:
                self.frontend.stats.protocol_errors += 1
                self._answer(exc.request_id, _answered_now(Status.INVALID, str(exc)), None)
            else:
                self._fail(str(exc))
            return
        except Exception as exc:  # a fault in the checks (RecursionError, a bug) must not drop the
            why = _describe(exc)  # connection with the answers of its requests in flight
            _log.error("a frame from %s could not be checked: %s", self.peer, why)
            request_id = id_of(message)
            if request_id is not None and share.greeted:
                error = f"the server could not check this request: {why}"
                self._answer(request_id, _answered_now(Status.ERROR, error), None)
            else:
                self._fail(f"the server could not check this frame: {why}")
            return
        self._on_request(request)

    def _on_hello(self, message: dict[str, Any]) -> None:
        hello = parse_hello(message)
        listen = self.frontend.listen
        token = listen.token
        if token is not None and not hmac.compare_digest((hello.token or "").encode(), token.encode()):
            self.frontend.stats.refused_auth += 1
            self._fail("authentication failed: wrong or missing token", protocol_error=False)
            return
        self.share.greeted = True
        if self._hello_timer is not None:
            self._hello_timer.cancel()
            self._hello_timer = None
        if listen.idle_timeout_s > 0:
            self._idle_timer = self._loop.call_later(listen.idle_timeout_s, self._on_idle_timer)
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
        self._outbox.write(encode_frame(reply))

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
        frontend.stats.requests += 1
        self._admission.accept(self.share)  # it now holds a place in the window
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
        frontend.stats.requests += 1
        self._admission.accept(self.share)  # it now holds a place in the window
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

    # -- answers -----------------------------------------------------------------------------------

    def _on_answer(self, request_id: int, priority: int | None, result: Result) -> None:
        """Write a request's answer (exactly one per accepted request; the Server calls it once)."""
        share = self.share
        self._admission.answered(share)
        if result.status is Status.EXPIRED and result.refused:
            self.frontend.stats.expired_on_arrival += 1
        self._answer(request_id, result, priority)
        if self._failing is not None and share.in_flight == 0:
            self._close_with_error()
        elif self._eof and share.in_flight == 0 and not self._reading:
            self.close()

    def _answer(self, request_id: int, result: Result, priority: int | None) -> None:
        frontend = self.frontend
        stats = frontend.stats
        status = result.status
        stats.by_status[status.value] = stats.by_status.get(status.value, 0) + 1
        if self._closing:
            stats.discarded += 1
            return
        if status in CACHED_REFUSALS and result.end == result.queued:
            self._outbox.write(frontend.refusal_frames.refusal(result, priority).frame(request_id))
            return
        frame = frontend.answer_frames.frame(request_id, result, priority)
        if frame is None:
            frame = encode_frame(result_message(request_id, result, priority))
        if self._reading:
            self._outbox.write(frame)
        elif frontend.holding:  # more answers of the batch follow: one write at the release
            frontend.write_at_release(self)
            self._out.append(frame)
        else:  # a finished batch's answer leaves at once, with what is queued before it: at the end
            # of the loop turn it would wait behind the turn's reads (up to a turn's frames per
            # connection), time its client counts against the deadline
            self._outbox.send(frame)

    def write_held(self) -> None:
        """The held answers leave, with what was queued before them (Frontend.release_answers)."""
        self._outbox.flush()

    # -- closing -----------------------------------------------------------------------------------

    def _fail(self, error: str, protocol_error: bool = True) -> None:
        """An error message, then close: used when the stream or the peer cannot be trusted, and
        (protocol_error=False: not counted as one) for a refused token, a connection limit or a
        timeout (logged at info: a flood of them floods no log).

        Input stops at once (later bytes are discarded); the requests already accepted on this
        connection are still answered, then the error message goes and our side is half-closed,
        so the message is not lost to a reset caused by closing with the peer's unread bytes; the
        transport closes when the peer does, or after `fail_linger_s`.
        """
        if self._closing or self._failing is not None:
            return
        if protocol_error:
            self.frontend.stats.protocol_errors += 1
        self._failing = cut(error, ERROR_TEXT_LIMIT)  # it may quote the client's data
        _log.info("closing %s: %s", self.peer, self._failing)
        self._cancel_timers()
        self._buffer, self._stale = bytearray(), 0
        if self.share.in_flight == 0:
            self._close_with_error()

    def _close_with_error(self) -> None:
        transport = self.transport
        if transport is None or self._closing:
            return
        self._outbox.write(encode_frame({"type": "error", "error": self._failing}))
        self._outbox.flush()
        self._closing = True
        self._gate.detach()
        if transport.can_write_eof():
            transport.write_eof()
            self._loop.call_later(self.frontend.settings.fail_linger_s, transport.close)
        else:
            transport.close()

    def close(self) -> None:
        """Answer the frames already read (a shutdown's close too: their answers say `shutdown`),
        write what is queued, then close."""
        reading = not self._closing and not self._reading and self._failing is None and self.share.greeted
        if reading:
            take_received(self.transport, self._buffer, self.frontend.settings.close_read_bytes)
        if reading and complete_frame(self._buffer):
            self._gate.pause(STOP)
            self._read_frames(whole=True)
            if self._closing:
                return  # reading the last frames closed the connection (its peer half-closed)
        self._outbox.flush()
        self._closing = True
        self._gate.detach()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()  # flushes what is buffered, then closes
