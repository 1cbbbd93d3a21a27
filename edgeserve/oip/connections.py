"""Connection caps and timeouts for the HTTP listeners, on the socket front's model (docs/oip.md,
"Limits"): idle or half-sent connections can neither exhaust the process's descriptors nor hold
memory past their timeouts, and every answer the connection layer gives itself is the protocol's
JSON error.

One HttpGuard is shared by a server's HTTP listeners (the OIP front, "http", and the metrics
endpoint, "metrics"; NetServer makes it), so that together they stay under their cap and a flood on
one leaves room on the other; it keeps the counters the metrics endpoint exports as edgeserve_http_*.
It is loop-only, like the fronts' counters.

- Past the caps a connection is written a 503 and closed at once, before aiohttp reads from it.
- A request's line and headers must arrive within `http_header_timeout_s` of the connection
  opening, or of the first byte of the next request on a kept-alive connection (slowloris); else
  a 408 and the connection is closed.
- A kept-alive connection idle for `http_keepalive_timeout_s` is closed (aiohttp's keep-alive).
- The body timeout (a floor plus the size at a minimum rate) is the OIP front's, where it reads.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from edgeserve.config.http_limits import HttpLimits
from edgeserve.config.server import ListenConfig
from edgeserve.oip.decoding import DecodeBudget
from edgeserve.runtime import FrontendStats
from edgeserve.wire.http_errors import error_response, raw_error

_log = logging.getLogger(__name__)

TIMEOUT_KINDS = ("header", "body", "keepalive")


class HttpGuard:
    """The caps, the counters and the decode budget of one server's HTTP listeners (see the module
    docstring). The limits are derived on first use, when the first listener starts: by then the
    server has opened its models, so the descriptors counted as open include them."""

    def __init__(self, listen: ListenConfig) -> None:
        self.listen = listen
        self.budget = DecodeBudget(listen.decode_budget_bytes)
        self._limits: HttpLimits | None = None
        self.open = 0
        self.open_by_listener: dict[str, int] = {}
        self.refused_connections: dict[str, int] = {}
        self.timeouts: dict[tuple[str, str], int] = {}
        self.bad_requests: dict[str, int] = {}
        self._refusals: dict[str, bytes] = {}

    @property
    def limits(self) -> HttpLimits:
        if self._limits is None:
            self._limits = limits = HttpLimits.from_listen(self.listen)
            derived = self.listen.http_max_connections is None
            _log.info(
                "HTTP listeners: at most %d connections, %d on one listener (gRPC's too)%s",
                limits.max_connections,
                limits.max_connections_per_listener,
                " (derived from RLIMIT_NOFILE; listen.http_max_connections sets them)" if derived else "",
            )
        return self._limits

    @property
    def decode_bytes(self) -> int:
        return self.budget.in_use

    @property
    def decode_refused(self) -> int:
        return self.budget.refused

    def add_listener(self, listener: str) -> None:
        """Count `listener`'s events from zero (so its series exist before anything happens)."""
        self.open_by_listener.setdefault(listener, 0)
        self.refused_connections.setdefault(listener, 0)
        self.bad_requests.setdefault(listener, 0)
        for kind in TIMEOUT_KINDS:
            self.timeouts.setdefault((listener, kind), 0)

    def admit(self, listener: str) -> bytes | None:
        """None when a new connection on `listener` may stay (it is counted), else the 503 to
        write before closing it (counted as refused)."""
        limits, here = self.limits, self.open_by_listener.get(listener, 0)
        if self.open < limits.max_connections and here < limits.max_connections_per_listener:
            self.open += 1
            self.open_by_listener[listener] = here + 1
            return None
        self.refused_connections[listener] = self.refused_connections.get(listener, 0) + 1
        refusal = self._refusals.get(listener)
        if refusal is None:
            refusal = self._refusals[listener] = raw_error(
                503,
                f"too many HTTP connections (listen.http_max_connections {limits.max_connections}, "
                f"{limits.max_connections_per_listener} per listener); try again later",
                {"Retry-After": "1"},
            )
        return refusal

    def release(self, listener: str) -> None:
        """An admitted connection on `listener` closed."""
        self.open -= 1
        self.open_by_listener[listener] -= 1

    def timed_out(self, listener: str, kind: str) -> None:
        self.timeouts[(listener, kind)] = self.timeouts.get((listener, kind), 0) + 1

    def bad_request(self, listener: str) -> None:
        self.bad_requests[listener] = self.bad_requests.get(listener, 0) + 1

    def runner(
        self, app: web.Application, listener: str, stats: FrontendStats | None = None, **kwargs: Any
    ) -> web.AppRunner:
        """An AppRunner for `app` whose connections on `listener` are held to these limits (and
        counted in `stats`, a front's counters, when given)."""
        self.add_listener(listener)
        kwargs.setdefault("keepalive_timeout", self.limits.keepalive_timeout_s)
        return _GuardedRunner(app, self, listener, stats, **kwargs)


class _GuardedProtocol(RequestHandler):
    """aiohttp's per-connection protocol under an HttpGuard: refused past the caps before it reads
    anything, closed when a request's head is not in by the header timeout, and answering what it
    cannot parse with the protocol's JSON error, logged at debug (a client's input is no fault of
    the server's: no traceback)."""

    __slots__ = ("_admitted", "_guard", "_head_by", "_head_timer", "_listener", "_stats")

    def __init__(self, manager: _GuardedServer, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._guard, self._listener, self._stats = manager.guard, manager.listener, manager.stats
        self._admitted = False
        self._head_by: float | None = None  # loop time the awaited request head must be in by
        self._head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        refusal = self._guard.admit(self._listener)
        if refusal is not None:
            transport.write(refusal)  # type: ignore[attr-defined]
            transport.close()  # (flushes the 503 first)
            return
        self._admitted = True
        super().connection_made(transport)
        if self._keepalive_handle is not None:  # until its first request the header timeout rules
            self._keepalive_handle.cancel()
            self._keepalive_handle = None
        self._await_head()

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self._admitted:
            return  # refused: never counted, never started
        self._admitted = False
        self._guard.release(self._listener)
        self._head_by = None
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        waiter = self._waiter  # set while aiohttp waits for the next request's head
        if self._head_by is None and waiter is not None and not waiter.done():
            self._await_head()
        count = self._request_count
        super().data_received(data)
        if self._request_count != count:  # a head is in
            self._head_by = None

    def _await_head(self) -> None:
        """Start the header timeout; one timer per connection, moved on rather than re-created."""
        self._head_by = self._loop.time() + self._guard.limits.header_timeout_s
        if self._head_timer is None:
            self._head_timer = self._loop.call_at(self._head_by, self._head_due)

    def _head_due(self) -> None:
        self._head_timer = None
        due = self._head_by
        if due is None or self.transport is None:
            return
        if self._loop.time() < due:
            self._head_timer = self._loop.call_at(due, self._head_due)
            return
        self._guard.timed_out(self._listener, "header")
        limit = self._guard.limits.header_timeout_s
        self.transport.write(raw_error(408, f"request line and headers not received within {limit:g} s"))
        self.force_close()

    def _process_keepalive(self) -> None:
        closing = self._force_close
        super()._process_keepalive()
        if self._force_close and not closing:
            self._guard.timed_out(self._listener, "keepalive")

    def handle_error(
        self,
        request: Any,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if request.writer.output_size > 0:  # as aiohttp's: an answer is half sent, the connection is lost
            raise ConnectionError(
                "Response is sent already, cannot send another response with the error message"
            )
        if status >= 500:
            _log.error("HTTP %s: fault answering a request", self._listener, exc_info=exc)
            text = f"internal server error ({type(exc).__name__ if exc else status})"
        else:
            text = f"bad HTTP request: {_one_line(message or (exc and str(exc)) or str(status))}"
            self._guard.bad_request(self._listener)
            if self._stats is not None:
                self._stats.protocol_errors += 1
            _log.debug("HTTP %s: %s from %s", self._listener, text, request.remote)
        answer = error_response(status, text)
        answer.force_close()
        return answer


def _one_line(message: str, limit: int = 200) -> str:
    """aiohttp's parser message on one line, cut to `limit` (it quotes the offending header line,
    up to 8 KiB, and marks the column with a caret line)."""
    parts = [p.strip() for p in message.splitlines()]
    text = " ".join(p for p in parts if p and set(p) != {"^"})
    return text if len(text) <= limit else f"{text[:limit]}...[cut]"


class _GuardedServer(web.Server):
    """aiohttp's low-level server building _GuardedProtocol connections and counting them into a
    front's `stats`. AppRunner builds a plain web.Server; _GuardedRunner retypes it."""

    guard: HttpGuard
    listener: str
    stats: FrontendStats | None

    def __call__(self) -> RequestHandler:
        return _GuardedProtocol(self, loop=self._loop, **self._kwargs)

    def connection_made(self, handler: RequestHandler, transport: asyncio.Transport) -> None:
        super().connection_made(handler, transport)
        if self.stats is not None:
            self.stats.connections += 1
            self.stats.open_connections += 1

    def connection_lost(self, handler: RequestHandler, exc: BaseException | None = None) -> None:
        super().connection_lost(handler, exc)
        if self.stats is not None:
            self.stats.open_connections = max(0, self.stats.open_connections - 1)


class _GuardedRunner(web.AppRunner):
    def __init__(
        self,
        app: web.Application,
        guard: HttpGuard,
        listener: str,
        stats: FrontendStats | None,
        **kwargs: Any,
    ) -> None:
        super().__init__(app, **kwargs)
        self._guard, self._listener, self._stats = guard, listener, stats

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        if type(server) is not web.Server:  # only aiohttp's own class, whose layout we extend
            raise TypeError(f"cannot guard {type(server).__name__}: expected aiohttp's web.Server")
        server.__class__ = _GuardedServer
        server.guard, server.listener, server.stats = self._guard, self._listener, self._stats  # type: ignore[attr-defined]
        return server
