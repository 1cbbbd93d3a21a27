"""Several camera streams in one process: one event loop, a summary every period, a clean stop.

Each stream has its own connection, window and counters. SIGINT and SIGTERM stop every stream
(frames in flight get a moment to be answered), then a final summary is logged; a set-up error of
one stream (wrong model, frames that do not fit) stops them all with that one sentence.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Sequence

from edgeserve.camera.stream import CameraStream

log = logging.getLogger("edgeserve.camera")


def log_summary(streams: Sequence[CameraStream], seconds: float, *, final: bool = False) -> None:
    for stream in streams:
        fields = stream.stats.summary(seconds, final=final)
        log.info("final summary" if final else "summary", extra=fields)
        stream.stats.reset_period()


async def run_streams(streams: Sequence[CameraStream], *, stats_every_s: float = 5.0) -> None:
    """Run until every stream ends (files) or a signal; re-raises the first stream's fatal error."""
    loop = asyncio.get_running_loop()
    installed = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, _stop_all, streams)
            installed.append(sig)
    tasks = [asyncio.ensure_future(stream.run()) for stream in streams]
    ticker = asyncio.ensure_future(_summaries(streams, stats_every_s))
    started = time.monotonic()
    error: BaseException | None = None
    try:
        pending = set(tasks)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if error is None and not task.cancelled() and task.exception() is not None:
                    error = task.exception()
                    _stop_all(streams)
    finally:
        ticker.cancel()
        await asyncio.gather(ticker, return_exceptions=True)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for sig in installed:
            loop.remove_signal_handler(sig)
        # A set-up error before any frame came in: its sentence alone, not an all-zero summary first.
        if error is None or any(s.stats.frames_in or s.stats.sent for s in streams):
            log_summary(streams, time.monotonic() - started, final=True)
    if error is not None:
        raise error


def _stop_all(streams: Sequence[CameraStream]) -> None:
    for stream in streams:
        stream.stop()


async def _summaries(streams: Sequence[CameraStream], every_s: float) -> None:
    if every_s <= 0:
        return
    last = time.monotonic()
    while True:
        await asyncio.sleep(every_s)
        now = time.monotonic()
        log_summary(streams, now - last)
        last = now
