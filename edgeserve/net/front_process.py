"""The server process's side of a socket front run in a process of its own (`[listen]
front_process`, docs/runtime.md "The front in a process of its own").

Under overload most of the front's work is reading frames and refusing the ones past a
connection's window. In one process that work holds the GIL the executor thread needs each time
ONNX Runtime returns, and the batches slow down by a third. The front process (net.front_child)
does it on its own interpreter; this side feeds the requests it admits to the Server and sends
each Result back. It has the Frontend's lifecycle methods (stop_reading, drain, close_all,
wait_closed), its counters (`stats`, from the front's reports) and `in_flight` (the requests it
got that the Server has still to answer), so NetServer
stops it the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import socket
import subprocess
import sys
from collections.abc import Callable

import numpy as np

from edgeserve.config.server import ServerConfig
from edgeserve.errors import ListenError
from edgeserve.net.front_link import Link, Record, result_record, setup_record, update_stats
from edgeserve.runtime import FrontendStats, Result, Server, Status

START_TIMEOUT_S = 60.0  # the front imports numpy and msgpack and opens the listeners
EXIT_TIMEOUT_S = 2.0

_log = logging.getLogger("edgeserve.front")


class FrontProcess:
    """Starts the front process, serves its requests, and stops it when told."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.stats = FrontendStats()  # the front's counters (and its CPU time) as of its last report
        self.in_flight = 0  # requests from the front the Server has not answered yet
        self.failure: str | None = None  # why the front process stopped on its own
        self._on_failure: list[Callable[[], object]] = []
        self._process: subprocess.Popen[bytes] | None = None
        self._link: Link | None = None
        self._waiters: dict[str, asyncio.Future[Record]] = {}
        self._failed: asyncio.Future[str] | None = None  # set with why, if the front fails or goes
        self._ready = False
        self._stopping = False
        self._watcher: asyncio.Future[None] | None = None

    def on_failure(self, callback: Callable[[], object]) -> None:
        """Call `callback` if the front process exits before it is told to (serve stops then)."""
        self._on_failure.append(callback)

    async def start(self, config: ServerConfig) -> list[str]:
        ours, theirs = socket.socketpair()
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "edgeserve.net.front_child", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
            )
        finally:
            theirs.close()
        self._failed = asyncio.get_running_loop().create_future()
        self._link = Link(ours, self._on_record, before_read=self.server.run_completed)
        self.configure(config)
        self._watcher = asyncio.ensure_future(self._watch())
        ready = await self._expect("ready", START_TIMEOUT_S)
        self._ready = True
        return list(ready[1])

    def configure(self, config: ServerConfig) -> None:
        """Tell the front what it serves (at start, and after a reload)."""
        assert self._link is not None
        manifests = {name: self.server.manifest(name) for name in config.models}
        level = logging.getLevelName(logging.getLogger().getEffectiveLevel()).lower()
        self._link.send(setup_record(config, manifests, level))

    # -- the hot path -------------------------------------------------------------------------------

    def _on_record(self, record: Record) -> None:
        token = record[0]
        if type(token) is not int:
            self._on_control(record)
            return
        reply = functools.partial(self._reply, token)
        self.in_flight += 1
        try:
            x = np.frombuffer(record[4], dtype=record[2]).reshape(record[3])
            self.server.enqueue(
                record[1],
                x,
                reply,
                deadline_ms=record[5],
                capture_ts=record[6],
                reply_margin_s=record[7],
                received=record[8],
            )
        except Exception as exc:  # never lose an answer
            _log.exception("a request from the socket front failed")
            reply(Result(Status.ERROR, str(record[1]), error=f"{type(exc).__name__}: {exc}"))

    def _reply(self, token: int, result: Result) -> None:
        assert self._link is not None
        self.in_flight -= 1
        self._link.send(result_record(token, result))

    # -- control ------------------------------------------------------------------------------------

    def _on_control(self, record: Record) -> None:
        kind = record[0]
        if kind in ("stats", "closed"):
            update_stats(self.stats, record[1])
        if kind == "failed":
            self._fail(str(record[1]))
        waiter = self._waiters.pop(kind, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(record)

    async def _expect(self, kind: str, timeout: float) -> Record:
        """The next control record of this kind; ListenError if the front says it failed or
        goes away first."""
        assert self._failed is not None
        future: asyncio.Future[Record] = asyncio.get_running_loop().create_future()
        self._waiters[kind] = future
        await asyncio.wait([future, self._failed], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if future.done():
            return future.result()
        if self._failed.done():
            raise ListenError(f"socket front: {self._failed.result()}")
        raise ListenError(f"socket front: no {kind!r} within {timeout:g} s")

    async def _watch(self) -> None:
        """The link closing before we stopped the front means the front process died."""
        assert self._link is not None and self._process is not None
        await self._link.closed.wait()
        code = await asyncio.to_thread(self._wait_exit)
        if not self._stopping:
            self._fail(f"the socket front process exited unexpectedly (exit code {code})")

    def _fail(self, why: str) -> None:
        """Wake whatever waits on the front; once it served, stop the server (`on_failure`)."""
        if self._failed is not None and not self._failed.done():
            self._failed.set_result(why)
        if self._ready and self.failure is None and not self._stopping:
            self.failure = why
            _log.error(why)
            for callback in self._on_failure:
                callback()

    def _wait_exit(self) -> int | None:
        assert self._process is not None
        try:
            return self._process.wait(EXIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._process.kill()
            return self._process.wait()

    # -- the Frontend's lifecycle, forwarded ---------------------------------------------------------

    def stop_reading(self) -> None:
        """Close the listeners and stop reading; requests read later are answered `shutdown`."""
        self._stopping = True
        self._send(["stop"])

    async def drain(self, timeout: float) -> None:
        self._send(["drain", timeout])
        with contextlib.suppress(ListenError):
            await self._expect("drained", timeout + 1.0)

    def close_all(self) -> None:
        self._send(["close_all"])

    async def wait_closed(self, timeout: float) -> None:
        """Until the front has written its answers and closed, then its process exits."""
        self._stopping = True
        self._send(["wait_closed", timeout])
        with contextlib.suppress(ListenError):
            await self._expect("closed", 2 * timeout + 1.0)
        await self.abort()

    async def abort(self) -> None:
        """Close the link (the front exits on it) and reap the process."""
        self._stopping = True
        if self._link is not None:
            self._link.close()
        if self._watcher is not None:
            await self._watcher  # it reaps the process once the link is closed
        elif self._process is not None and self._process.returncode is None:
            await asyncio.to_thread(self._wait_exit)

    def _send(self, record: Record) -> None:
        if self._link is not None:
            self._link.send(record)
            self._link.flush()
