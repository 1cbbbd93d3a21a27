"""Python clients for `edgeserve serve`: AsyncClient (pipelined) and BlockingClient.

    async with await AsyncClient.connect("unix:///run/edgeserve.sock") as client:
        replies = await asyncio.gather(*(client.infer("digits-m", x) for x in xs))

    with BlockingClient("tcp://127.0.0.1:7070", token="...") as client:
        reply = client.infer("digits-m", x, deadline_ms=20)

Requests are written as soon as they are made, up to the window the server advertises in its
hello (`max_in_flight`, docs/protocol.md): beyond it a request waits in the client until an answer
frees a slot, so a burst is queued here instead of answered `rejected` by the server. A server that
lets a connection alone fill more (`max_in_flight_total` in its hello, `[listen] share_total`) gets
more: while requests wait here, the window grows by one every window's worth of answers, up to that
total; a request past `max_in_flight` that the server refuses for its window ("too many requests in
flight": refused from its id alone, nothing else of it read) waits here again and the window shrinks
to what the server let through, for a second. The caller never sees those refusals. The
connection's protocol resolves each request's future by id as its answer's bytes arrive, in the
same callback (a StreamReader and a reader task cost one more loop turn per answer), so answers
may arrive in any order. If the connection drops, every waiting call raises ConnectionError.

The client never sends abandoned work: a request whose caller was cancelled or timed out (its
`infer` cancelled, `asyncio.wait_for` expired, the future from `send` cancelled, BlockingClient's
`infer(timeout=...)` passed) while it waited here for the window is withdrawn before it is written;
one already written is answered by the server and that answer is discarded. The requests waiting
here are bounded (`max_backlog`, 4096 by default): past it `send` answers at once, locally,
`rejected` with a sentence saying so, instead of growing a backlog that every fresh request would
wait behind under open-loop overload (benchmarks/client_backlog.py).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import threading
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlparse

import numpy as np

from edgeserve.errors import EdgeServeError
from edgeserve.loop import new_event_loop
from edgeserve.wire.frames import (
    HEADER,
    PROTOCOL_VERSION,
    TOO_MANY_IN_FLIGHT,
    ProtocolError,
    decode_body,
    encode_frame,
)
from edgeserve.wire.tensors import decode_tensor, encode_tensor

T = TypeVar("T")
# One request's input: an array, or a map from input name to array (a model with several inputs).
Sample = np.ndarray | Mapping[str, np.ndarray]
CLIENT_MAX_FRAME = 256 * 1024 * 1024
# After the server refused a request past max_in_flight, the window grows again only this much later:
# clients that share the total then probe it about once a second each, too seldom for the server
# to take one for a flood (net/settings.py flood_frames) and shrink its window below max_in_flight.
REGROW_AFTER_S = 1.0
# The most requests that wait in the client for the server's window (AsyncClient.connect max_backlog):
# a caller sending faster than it is answered then hears `rejected` at once instead of waiting
# behind work that will be late. Above any window a server derives (a deadline of answers: tens on
# a CPU, ~2,000 for the H200 profile at 50 ms), so it binds only a caller that outruns the server
# by more than a deadline's worth; the memory held is that many requests' tensors.
MAX_BACKLOG = 4096


class ServerRefused(EdgeServeError, ConnectionError):
    """The server sent an error message (bad hello, wrong token, broken frame) and closed."""


@dataclass(frozen=True)
class Reply:
    """One request's answer as the server sent it (docs/protocol.md, "result")."""

    id: int
    status: str
    model: str
    output: np.ndarray | None = None
    exit_index: int | None = None
    exit_name: str | None = None
    expected_accuracy: float | None = None
    late: bool = False
    timings: dict[str, Any] = field(default_factory=dict)
    priority: int | None = None
    error: str | None = None
    served_by: str = "local"  # or the name of the upstream that computed the output (docs/offload.md)
    outputs: dict[str, np.ndarray] = field(default_factory=dict)  # every output by name

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @classmethod
    def from_message(cls, message: dict[str, Any]) -> Reply:
        exit_info = message.get("exit") or {}
        raw = message.get("outputs") or {}
        outputs = {str(k): decode_tensor(v) for k, v in raw.items()}
        output = message.get("output")
        if output is not None:  # the server sends the first of `outputs` again: decode it once
            first = next(iter(raw), None)
            same = first is not None and raw[first] == output
            output = outputs[str(first)] if same else decode_tensor(output)
        return cls(
            id=message["id"],
            status=message["status"],
            model=message.get("model", ""),
            output=output,
            exit_index=exit_info.get("index"),
            exit_name=exit_info.get("name"),
            expected_accuracy=exit_info.get("accuracy"),
            late=bool(message.get("late")),
            timings=message.get("timings") or {},
            priority=message.get("priority"),
            error=message.get("error"),
            served_by=str(message.get("served_by") or "local"),
            outputs=outputs,
        )


class ConnectFailed(EdgeServeError, ConnectionError):
    """No server could be reached at the target; the message names it and says what to check."""


def connect_failure(target: str, kind: str, address: str, exc: BaseException) -> str:
    """One sentence for a failed connect: the target, what happened, and what to do."""
    start = "start the server (`edgeserve serve --config FILE`) or fix --target"
    if isinstance(exc, asyncio.TimeoutError | TimeoutError):
        return f"cannot connect to {target}: no answer; check that the server runs there, or {start}"
    if isinstance(exc, FileNotFoundError):
        return f"cannot connect to {target}: no socket file {address}: {start} (its [listen] unix path)"
    if isinstance(exc, ConnectionRefusedError):
        where = "a stale socket file, nobody listens" if kind == "unix" else "nothing listens on that port"
        return f"cannot connect to {target}: connection refused ({where}): {start}"
    if isinstance(exc, PermissionError):
        return (
            f"cannot connect to {target}: permission denied: add this user to the socket's group "
            "(listen.unix_group) or run as the service user"
        )
    reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return f"cannot connect to {target}: {reason}: {start}"


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def unknown_served_model(model: str, served: list[str], target: str) -> str:
    """`--model 'x': not served at <target>; did you mean 'y'?` with the served names."""
    import difflib

    close = difflib.get_close_matches(model, served, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"--model {model!r} is not served at {target}: {hint}it serves {', '.join(served) or 'nothing'}"


def parse_target(target: str) -> tuple[str, str | int]:
    """("unix", path) or ("tcp", "host:port" split later); EdgeServeError on anything else."""
    url = urlparse(target)
    if url.scheme == "unix" and (url.netloc + url.path):
        return "unix", url.netloc + url.path
    if url.scheme == "tcp" and url.hostname and url.port is not None:
        return "tcp", f"{url.hostname}:{url.port}"
    hint = " (a UNIX socket path needs three slashes: unix:///run/x.sock)" if url.scheme == "unix" else ""
    raise EdgeServeError(f"--target {target!r}: use unix:///path/to.sock or tcp://host:port{hint}")


class _Connection(asyncio.Protocol):
    """The client's end of one connection: whole frames decoded as bytes arrive, each message
    handed to `on_message` in the same callback; flow control for writes (`drain`)."""

    def __init__(
        self, on_message: Callable[[dict[str, Any]], None], on_lost: Callable[[BaseException], None]
    ) -> None:
        self._on_message = on_message
        self._on_lost = on_lost
        self._buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self._paused = False
        self._drained: asyncio.Future[None] | None = None
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's are not asyncio.Transport

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        size, pos = len(buffer), 0
        try:
            while size - pos >= HEADER.size:
                (length,) = HEADER.unpack_from(buffer, pos)
                if length > CLIENT_MAX_FRAME:
                    raise ProtocolError(f"an answer of {length} bytes exceeds {CLIENT_MAX_FRAME}")
                end = pos + HEADER.size + length
                if size < end:
                    break
                with memoryview(buffer) as view:  # one copy of the body (a slice would make two)
                    body = bytes(view[pos + HEADER.size : end])
                pos = end
                self._on_message(decode_body(body, CLIENT_MAX_FRAME))
        # AttributeError: a field of the wrong type (`exit` or `outputs` not a map)
        except (ProtocolError, KeyError, ValueError, TypeError, AttributeError) as exc:
            self._fail(ConnectionError(f"unreadable answer from the server: {exc}"))
            return
        finally:
            del buffer[:pos]

    def _fail(self, error: BaseException) -> None:
        self._buffer.clear()
        self._on_lost(error)
        if self.transport is not None:
            self.transport.abort()

    def eof_received(self) -> None:
        """The server closed its end (after an error message, or at shutdown): nothing more will
        be answered; the transport then closes."""
        self._on_lost(ConnectionError("the server closed the connection"))

    def write(self, frame: bytes) -> None:
        """Write unless the connection is closing (the waiting calls already have their error)."""
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(frame)

    def connection_lost(self, exc: Exception | None) -> None:
        self._on_lost(ConnectionError("the server closed the connection"))
        if not self.lost.done():
            self.lost.set_result(None)
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    async def drain(self) -> None:
        """Wait while the transport's write buffer is over its high-water mark."""
        if self._paused and not self.lost.done():
            if self._drained is None or self._drained.done():
                self._drained = asyncio.get_running_loop().create_future()
            await self._drained


class AsyncClient:
    """One connection; make it with `await AsyncClient.connect(target, token=...)`."""

    def __init__(self) -> None:
        self._connection: _Connection | None = None
        self._ids = itertools.count()
        self._pending: dict[int, asyncio.Future[Reply]] = {}
        self._hello: asyncio.Future[dict[str, Any] | None] = asyncio.get_running_loop().create_future()
        self._closed_error: BaseException | None = None
        self._refusal: ServerRefused | None = None  # the server's error message, before it closes
        self._on_wire = 0  # requests written and not yet answered
        # id -> frame waiting for a slot in the window, oldest first; a cancelled caller's is withdrawn
        self._held: OrderedDict[int, bytes] = OrderedDict()
        self.max_backlog: int | None = MAX_BACKLOG  # the most in _held (None: unbounded)
        self.withdrawn = 0  # requests never sent: their callers gave up while they waited here
        self.discarded = 0  # answers that came after their callers gave up
        self.backlog_full = 0  # requests answered `rejected` here: the backlog was full
        self._limit = 0  # the window now: from the hello's max_in_flight up to its max_in_flight_total
        self._grown = 0  # answers since the window last grew
        self._grow_from = 0.0  # the loop's time before which the window does not grow (after a refusal)
        self._beyond: dict[int, bytes] = {}  # frames written past max_in_flight, by id: sent again if refused
        self.respect_window = True
        self.hello: dict[str, Any] = {}

    @classmethod
    async def connect(
        cls,
        target: str,
        *,
        token: str | None = None,
        timeout: float = 10.0,
        respect_window: bool = True,
        max_backlog: int | None = MAX_BACKLOG,
    ) -> AsyncClient:
        """Connect and say hello. `respect_window=False` writes every request at once, beyond the
        server's max_in_flight (tests of the server's own limit); clients keep the default.
        `max_backlog`: the most requests that wait here for the window (None: no bound)."""
        kind, address = parse_target(target)
        loop = asyncio.get_running_loop()
        client = cls()
        client.respect_window = respect_window
        client.max_backlog = max_backlog

        def protocol() -> _Connection:
            return _Connection(client._on_message, client._on_lost)

        try:
            if kind == "unix":
                opening = loop.create_unix_connection(protocol, str(address))
            else:
                host, port = str(address).rsplit(":", 1)
                opening = loop.create_connection(protocol, host, int(port))
            _, client._connection = await asyncio.wait_for(opening, timeout)
        except (OSError, asyncio.TimeoutError) as exc:
            raise ConnectFailed(connect_failure(target, kind, str(address), exc)) from None
        try:
            await asyncio.wait_for(client._handshake(token), timeout)
        except BaseException:
            client._transport.abort()
            raise
        return client

    @property
    def _transport(self) -> asyncio.Transport:
        assert self._connection is not None and self._connection.transport is not None
        return self._connection.transport

    def _connection_write(self, frame: bytes) -> None:
        assert self._connection is not None
        self._connection.write(frame)

    async def _handshake(self, token: str | None) -> None:
        hello: dict[str, Any] = {
            "type": "hello",
            "version": PROTOCOL_VERSION,
            "client": "edgeserve.wire.client",
        }
        if token is not None:
            hello["token"] = token
        self._connection_write(encode_frame(hello))
        message = await self._hello
        if message is None:
            raise ServerRefused("the server closed the connection during the hello")
        if message.get("type") == "error":
            raise ServerRefused(f"server refused the connection: {message.get('error')}")
        if message.get("type") != "hello":
            raise ServerRefused(f"expected a hello reply, got {message.get('type')!r}")
        self.hello = message
        self._limit = self.window or 0

    def _on_message(self, message: dict[str, Any]) -> None:
        """An answer (or the hello's reply): resolve its future now, in the protocol's callback."""
        if not self._hello.done():
            self._hello.set_result(message)
            return
        if message.get("type") == "error":  # the server closes next: say why
            self._refusal = ServerRefused(f"server closed the connection: {message.get('error')}")
            return
        key = message.get("id", -1)
        future = self._pending.get(key)
        if future is not None:
            reply = Reply.from_message(message)  # a malformed answer raises while its call still
            frame = self._beyond.pop(key, None)  # waits, so that data_received's _fail answers it
            if frame is not None and reply.status == "rejected" and reply.error == TOO_MANY_IN_FLIGHT:
                self._refused_beyond(key, frame)
                return
            del self._pending[key]
            self._answered()
            if not future.done():
                future.set_result(reply)
            else:  # its caller gave up after it was written: the answer goes nowhere
                self.discarded += 1

    def _on_lost(self, error: BaseException) -> None:
        if self._closed_error is not None:
            return
        self._closed_error = error = self._refusal or error
        if not self._hello.done():
            self._hello.set_result(None)
        self._held.clear()
        self._beyond.clear()
        for future in self._pending.values():
            if not future.done():
                future.set_exception(error)
        self._pending.clear()

    @property
    def window(self) -> int | None:
        """The most requests the server accepts in flight on this connection whatever the other
        clients do (None: it did not say)."""
        value = self.hello.get("max_in_flight")
        if not self.respect_window:
            return None
        return value if _positive_int(value) else None

    @property
    def window_total(self) -> int | None:
        """The most this connection may have in flight while the server has room: the hello's
        max_in_flight_total, else its max_in_flight (None: it did not say)."""
        window = self.window
        total = self.hello.get("max_in_flight_total")
        if window is None or not _positive_int(total):
            return window
        return max(window, total)

    def _write_within_window(self, request_id: int, frame: bytes) -> None:
        if self._held or (self.window is not None and self._on_wire >= self._limit):
            self._held[request_id] = frame
            return
        self._write(request_id, frame)

    def _withdraw(self, request_id: int) -> None:
        """Its caller gave up (cancelled, timed out): if it still waits here, it is never written;
        a written one stays pending until its answer comes, and is discarded then."""
        if self._held.pop(request_id, None) is not None:
            self._pending.pop(request_id, None)
            self.withdrawn += 1

    def _purge_held(self) -> None:
        """Withdraw every waiting request whose future is done (a `send` future cancelled)."""
        for request_id in [k for k in self._held if self._pending[k].done()]:
            self._withdraw(request_id)

    @property
    def backlog(self) -> int:
        """Requests waiting in this client for a slot in the server's window (not written yet)."""
        return len(self._held)

    def _write(self, request_id: int, frame: bytes) -> None:
        window = self.window
        if window is not None and self._on_wire >= window:
            self._beyond[request_id] = frame
        self._on_wire += 1
        self._connection_write(frame)

    def _answered(self) -> None:
        self._on_wire = max(0, self._on_wire - 1)
        total = self.window_total
        if total is not None and self._held and self._limit < total:  # more waits: one more a window
            self._grown += 1
            if self._grown >= self._limit and asyncio.get_running_loop().time() >= self._grow_from:
                self._limit, self._grown = self._limit + 1, 0
        self._flush(total is None)

    def _flush(self, unlimited: bool = False) -> None:
        """Write the held requests the window has room for (all of them with the window off)."""
        while self._held and (unlimited or self._on_wire < self._limit):
            request_id, frame = self._held.popitem(last=False)
            if self._pending[request_id].done():  # cancelled while it waited: never written
                del self._pending[request_id]
                self.withdrawn += 1
                continue
            self._write(request_id, frame)

    def _refused_beyond(self, request_id: int, frame: bytes) -> None:
        """The server refused a request written past max_in_flight for its window (other clients
        share the total now): it waits here again, first, and the window shrinks to what the
        server let through."""
        self._on_wire = max(0, self._on_wire - 1)
        self._limit = max(self.window or 1, self._on_wire)
        self._grown = 0
        self._grow_from = asyncio.get_running_loop().time() + REGROW_AFTER_S
        future = self._pending.get(request_id)
        if future is None or future.done():  # its caller gave up meanwhile: not sent again
            self._pending.pop(request_id, None)
            self.withdrawn += 1
        else:
            self._held[request_id] = frame
            self._held.move_to_end(request_id, last=False)
        self._flush()

    @property
    def models(self) -> dict[str, Any]:
        """The server's model table from the hello: input dtype/shape, SLO, exits."""
        return dict(self.hello.get("models", {}))

    def send(
        self,
        model: str,
        x: Sample,
        *,
        deadline_ms: float | None = None,
        capture_ts: float | None = None,
        priority: int | None = None,
    ) -> asyncio.Future[Reply]:
        """Write one request now (or, with the window full, as soon as an answer frees a slot) and
        return the future of its Reply (pipelining without awaiting). `x` is one sample: an array,
        or a map from input name to array for a model with several inputs. Cancelling the future
        while the request waits for the window withdraws it: it is never written."""
        return self._send(model, x, deadline_ms, capture_ts, priority)[1]

    def _send(
        self,
        model: str,
        x: Sample,
        deadline_ms: float | None,
        capture_ts: float | None,
        priority: int | None,
    ) -> tuple[int, asyncio.Future[Reply]]:
        if self._closed_error is not None:
            raise self._closed_error
        request_id = next(self._ids)
        message: dict[str, Any] = {"type": "infer", "id": request_id, "model": model}
        if isinstance(x, Mapping):
            message["inputs"] = {str(k): encode_tensor(np.asarray(v)) for k, v in x.items()}
        else:
            message["tensor"] = encode_tensor(x)
        if deadline_ms is not None:
            message["deadline_ms"] = float(deadline_ms)
        if capture_ts is not None:
            message["capture_ts"] = float(capture_ts)
        if priority is not None:
            message["priority"] = int(priority)
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        if self.max_backlog is not None and len(self._held) >= self.max_backlog:
            self._purge_held()
        if self.max_backlog is not None and len(self._held) >= self.max_backlog:
            self.backlog_full += 1
            future.set_result(
                Reply(
                    id=request_id,
                    status="rejected",
                    model=model,
                    error=(
                        f"not sent: {len(self._held)} requests already wait in this client for the "
                        f"server's window (max_backlog {self.max_backlog}); send slower, or raise "
                        "max_backlog in AsyncClient.connect"
                    ),
                )
            )
            return request_id, future
        self._pending[request_id] = future
        self._write_within_window(request_id, encode_frame(message))
        return request_id, future

    async def infer(
        self,
        model: str,
        x: Sample,
        *,
        deadline_ms: float | None = None,
        capture_ts: float | None = None,
        priority: int | None = None,
    ) -> Reply:
        """Send one request and await its Reply (other calls may be in flight meanwhile).
        Cancelled (or timed out) while the request waits for the window: it is never sent."""
        request_id, future = self._send(model, x, deadline_ms, capture_ts, priority)
        assert self._connection is not None
        try:
            await self._connection.drain()
            return await future
        except asyncio.CancelledError:
            future.cancel()
            self._withdraw(request_id)
            raise

    @property
    def in_flight(self) -> int:
        """Requests not answered yet, those held back by the window included."""
        return len(self._pending)

    async def close(self) -> None:
        """Close the connection; calls still waiting raise ConnectionError."""
        if self._connection is None:
            return
        self._transport.close()
        await self._connection.lost

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def connect(target: str, *, token: str | None = None, timeout: float = 10.0) -> AsyncClient:
    """AsyncClient.connect."""
    return await AsyncClient.connect(target, token=token, timeout=timeout)


class BlockingClient:
    """AsyncClient on a background event loop thread, for programs that are not async.

    `submit` returns a concurrent.futures.Future at once (pipelining); `infer` waits for it.
    Safe to call from several threads.
    """

    def __init__(self, target: str, *, token: str | None = None, timeout: float = 10.0) -> None:
        self._loop = new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="edgeserve-client", daemon=True)
        self._thread.start()
        try:
            self._client: AsyncClient = self._call(AsyncClient.connect(target, token=token, timeout=timeout))
        except BaseException:
            self._stop()
            raise

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    @property
    def models(self) -> dict[str, Any]:
        return self._client.models

    @property
    def window_total(self) -> int | None:
        """AsyncClient.window_total: the most this connection may have in flight."""
        return self._client.window_total

    def submit(self, model: str, x: Sample, **options: Any) -> concurrent.futures.Future[Reply]:
        """Send now; the Future resolves to the Reply."""
        return asyncio.run_coroutine_threadsafe(self._client.infer(model, x, **options), self._loop)

    def infer(self, model: str, x: Sample, *, timeout: float | None = None, **options: Any) -> Reply:
        """Send one request and wait for its Reply (TimeoutError after `timeout` seconds; the
        request is then withdrawn if it still waits in the client, its answer discarded if not)."""
        future = self.submit(model, x, **options)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise

    def close(self) -> None:
        if self._loop.is_closed():
            return
        try:
            self._call(self._client.close(), timeout=10.0)
        finally:
            self._stop()

    def _stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __enter__(self) -> BlockingClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
