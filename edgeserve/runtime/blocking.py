"""A blocking wrapper for programs that are not async: the server's loop runs in its own thread.

    with edgeserve.BlockingServer("serve.toml") as server:
        result = server.infer("digits-m", x, deadline_ms=30)

`infer` and `infer_batch` may be called from several threads at once: each call is handed to
the loop thread with run_coroutine_threadsafe, where all queue and scheduler state lives.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from edgeserve.config.server import ServerConfig
from edgeserve.loop import new_event_loop
from edgeserve.runtime.results import Result
from edgeserve.runtime.server import BackendFactory, Server

T = TypeVar("T")


class BlockingServer:
    """Server behind blocking calls; a context manager that starts it and shuts it down."""

    def __init__(
        self,
        config: ServerConfig | Mapping[str, Any] | str | Path,
        *,
        backend_factory: BackendFactory | None = None,
    ) -> None:
        self.server = Server(config, backend_factory=backend_factory)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def _submit(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        if self._loop is None:
            coro.close()
            raise RuntimeError("BlockingServer is not started; use `with BlockingServer(config) as server:`")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()  # a queued request is removed, as for a cancelled async caller
            raise

    def start(self) -> BlockingServer:
        """Start the loop thread and the server; errors (bad profile, missing model) raise here."""
        if self._loop is not None:
            raise RuntimeError("BlockingServer already started")
        loop = new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="edgeserve-loop", daemon=True)
        thread.start()
        self._loop, self._thread = loop, thread
        try:
            self._submit(self.server.start())
        except BaseException:
            self._stop_loop()
            raise
        return self

    def infer(
        self, model: str, x: np.ndarray, *, deadline_ms: float | None = None, timeout: float | None = None
    ) -> Result:
        """Block until this sample's Result is back; after `timeout` seconds the request is
        cancelled and TimeoutError raised."""
        return self._submit(self.server.infer(model, x, deadline_ms=deadline_ms), timeout)

    def infer_batch(
        self,
        model: str,
        xs: np.ndarray | Sequence[np.ndarray],
        *,
        deadline_ms: float | None = None,
        timeout: float | None = None,
    ) -> list[Result]:
        """One request per sample, answered together; Results in input order."""
        return self._submit(self.server.infer_batch(model, xs, deadline_ms=deadline_ms), timeout)

    def snapshot(self) -> dict[str, Any]:
        """The server's counters, read on its loop thread."""

        async def _snapshot() -> dict[str, Any]:
            return self.server.snapshot()

        return self._submit(_snapshot())

    def close(self, timeout_s: float | None = None) -> None:
        """Shut the server down (see Server.close) and stop the loop thread."""
        if self._loop is None:
            return
        try:
            self._submit(self.server.close(timeout_s))
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        loop, thread = self._loop, self._thread
        self._loop = self._thread = None
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()

    def __enter__(self) -> BlockingServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
