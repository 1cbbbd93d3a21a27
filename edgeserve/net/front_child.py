"""The socket front in a process of its own: `python -m edgeserve.net.front_child FD`.

Started by the server process (net.front_process) with one end of a socket pair as FD. It runs
the same Frontend and listeners as the in-process front, in front of a RemoteServer that forwards
each admitted request over the link and hands each Result that comes back to its connection.
Everything a refusal needs (the window, the cached refusal frames, the flood holds) stays here,
so under overload the reads and refusals no longer share the inference process's GIL with the
executor (docs/runtime.md, "The front in a process of its own").

It ignores SIGINT, SIGTERM and SIGHUP: the server process orders its shutdown over the link (a
Ctrl-C or systemd's stop reaches both processes; the front must keep answering until told). It
exits when the server process closes the link or goes away.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from edgeserve import logs
from edgeserve.config.server import ServerConfig
from edgeserve.errors import ListenError
from edgeserve.loop import run
from edgeserve.manifest import Manifest
from edgeserve.net.front_link import (
    Link,
    Record,
    config_of,
    request_record,
    result_of,
    stats_record,
)
from edgeserve.net.frontend import Frontend
from edgeserve.net.listeners import Listeners, open_listeners
from edgeserve.runtime import AnswerHolders, Result, Status

STATS_EVERY_S = 0.25  # how often the server process learns the front's counters (its /metrics)
STOPPING = "server is stopped or shutting down"
# The answer's way from the server process to this one (the link, this loop's turn) is part of
# the way back a request's plan must leave room for (listen.reply_margin_ms covers the client's
# side): an EWMA, held in steps so that requests alike keep one planned budget (docs/runtime.md).
WAY_BACK_ALPHA = 0.02
WAY_BACK_STEP_S = 0.0002

_log = logging.getLogger("edgeserve.front")


def refusal(model: str, status: Status, error: str) -> Result:
    """An answer given here at once (`shutdown` once the server stops or goes away)."""
    now = time.monotonic()
    return Result(status, model, queued=now, end=now, error=error)


class RemoteServer:
    """What a Frontend needs of a Server, the requests served by the server process.

    Each request gets a token; its reply waits here until the Result with that token comes back
    (exactly one per request: the server process answers every request it gets). Once the server
    stops, requests are answered `shutdown` here at once, as Server.enqueue would."""

    def __init__(self, link: Link, config: ServerConfig, manifests: dict[str, Manifest]) -> None:
        self.link = link
        self.stopping = False
        self._replies: dict[int, Callable[[Result], object]] = {}
        # The fronts' (hold, release) (Server.answers_together): the answers of one read of the
        # link are held from the first and written at its end (release_answers, by the Link).
        self._holders = AnswerHolders()
        self._holding = False
        self._token = 0
        self._way_back = 0.0  # EWMA, seconds
        self.way_back_s = 0.0  # as held, added to each request's reply margin
        self.configure(config, manifests)

    def configure(self, config: ServerConfig, manifests: dict[str, Manifest]) -> None:
        self.config = config
        self.models = tuple(config.models)
        self._manifests = manifests

    def manifest(self, model: str) -> Manifest:
        return self._manifests[model]

    def window_bounds(self) -> tuple[int, int]:
        """The server process derived the windows and sent them resolved (NetServer.start)."""
        listen = self.config.listen
        assert listen.max_in_flight is not None
        return listen.max_in_flight, listen.in_flight_total

    def run_completed(self) -> None:
        """Before a connection reads: take the answers that have arrived (they free its window)."""
        self.link.pump()

    def answers_together(self, hold: Callable[[], None], release: Callable[[], None]) -> None:
        self._holders.add(hold, release)

    def release_answers(self) -> None:
        if self._holding:
            self._holding = False
            self._holders.release()

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
    ) -> None:
        if self.stopping or self.link.closed.is_set():
            reply(refusal(model, Status.SHUTDOWN, STOPPING))
            return
        token = self._token
        self._token += 1
        x = np.asarray(x)
        margin = reply_margin_s + self.way_back_s
        self.link.send(request_record(token, model, x, deadline_ms, capture_ts, margin, received))
        self._replies[token] = reply

    def answer(self, record: Record) -> None:
        delay = time.monotonic() - record[16]
        if 0.0 <= delay < 1.0:
            self._way_back += WAY_BACK_ALPHA * (delay - self._way_back)
            if abs(self._way_back - self.way_back_s) >= WAY_BACK_STEP_S:
                self.way_back_s = round(self._way_back / WAY_BACK_STEP_S) * WAY_BACK_STEP_S
        reply = self._replies.pop(record[0], None)
        if reply is None:
            _log.error("an answer for no request came from the server process (token %s)", record[0])
            return
        if not self._holding:
            self._holding = True
            self._holders.hold()
        reply(result_of(record))

    def abandon(self) -> None:
        """The server process is gone: every request still waiting is answered `shutdown`."""
        replies, self._replies = self._replies, {}
        for reply in replies.values():
            reply(refusal("", Status.SHUTDOWN, "the server process stopped"))


class FrontChild:
    """The front process's state: the link, the Frontend, its listeners, the shutdown steps."""

    def __init__(self, sock: socket.socket) -> None:
        self.link = Link(sock, self._on_record, after_records=self._after_records)
        self.setup: asyncio.Future[Record] = asyncio.get_running_loop().create_future()
        self.controls: asyncio.Queue[Record] = asyncio.Queue()
        self.remote: RemoteServer | None = None
        self.frontend: Frontend | None = None
        self.listeners: Listeners | None = None

    def _after_records(self) -> None:
        if self.remote is not None:
            self.remote.release_answers()

    def _on_record(self, record: Record) -> None:
        if type(record[0]) is int:
            if self.remote is not None:
                self.remote.answer(record)
        elif record[0] == "setup" and not self.setup.done():
            self.setup.set_result(record)
        else:
            self.controls.put_nowait(record)

    async def run(self) -> int:
        done = asyncio.ensure_future(self.link.closed.wait())
        try:
            return await self._serve(done)
        finally:
            done.cancel()

    async def _serve(self, done: asyncio.Future[bool]) -> int:
        await asyncio.wait([self.setup, done], return_when=asyncio.FIRST_COMPLETED)
        if not self.setup.done():
            return 1
        setup = self.setup.result()[1]
        logs.configure(setup["log"]["level"], setup["log"]["format"], sys.stderr)
        config, manifests = config_of(setup)
        self.remote = RemoteServer(self.link, config, manifests)
        self.frontend = frontend = Frontend(self.remote, config.listen)
        try:
            self.listeners = await open_listeners(frontend, config.listen)
        except (ListenError, OSError) as exc:
            self.link.send(["failed", str(exc)])
            self.link.flush()
            return 1
        self.link.send(["ready", list(self.listeners.urls)])
        stats = asyncio.ensure_future(self._report_stats())
        steps = asyncio.ensure_future(self._follow_controls())
        try:
            await asyncio.wait([steps, done], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stats.cancel()
        if not steps.done():  # the server process went away: nothing can be served any more
            steps.cancel()
            _log.error("the server process closed the link; the socket front stops")
            self.remote.abandon()
            await self.listeners.close()
            frontend.close_all()
            await frontend.wait_closed(0.5)
            return 1
        return 0

    async def _report_stats(self) -> None:
        assert self.frontend is not None
        while True:
            await asyncio.sleep(STATS_EVERY_S)
            self._send_stats("stats")

    def _send_stats(self, kind: str) -> None:
        assert self.frontend is not None
        self.frontend.stats.process_cpu_seconds = time.process_time()  # this process's, all threads
        self.link.send(stats_record(kind, self.frontend.stats))

    async def _follow_controls(self) -> None:
        """The server process's orders, in turn (NetServer.close, a reload)."""
        frontend, remote, listeners = self.frontend, self.remote, self.listeners
        assert frontend is not None and remote is not None and listeners is not None
        while True:
            record = await self.controls.get()
            kind = record[0]
            if kind == "setup":
                remote.configure(*config_of(record[1]))
            elif kind == "stop":
                await listeners.close()
                remote.stopping = True
                frontend.stop_reading()
            elif kind == "drain":
                await frontend.drain(record[1])
                self.link.send(["drained"])
            elif kind == "close_all":
                frontend.close_all()
            elif kind == "wait_closed":
                await frontend.wait_closed(record[1])
                await listeners.wait_closed(record[1])
                self._send_stats("closed")
                self.link.flush()
                return
            else:
                _log.error("unknown order from the server process: %r", kind)


async def _main(fd: int) -> int:
    child = FrontChild(socket.socket(fileno=fd))
    try:
        return await child.run()
    finally:
        child.link.close()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    return run(_main(int(args[0])))


if __name__ == "__main__":
    sys.exit(main())
