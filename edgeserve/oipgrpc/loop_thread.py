"""An event loop on a thread of its own: the gRPC server's, beside the serving loop.

grpc.aio accepts RPCs one turn of its loop at a time: its server re-arms a single request_call
after each call arrives, and each completion (the call, its message) reaches the handler through
one more turn. On the serving loop, whose turns grow long under a flood on another front, a
polite gRPC client beside a 10x socket flood waited up to 66 ms before its handler ran, while the
handler itself took 2 ms (docs/oip.md, "gRPC": 73 % in deadline). On this loop, whose turns only
move gRPC messages, an RPC is taken as soon as it arrives; a request crosses to the serving loop
once, for Server.infer, and its Results cross back once; `Crossing` wakes each loop once per
burst of such crossings rather than once per request (a wake is a write to the loop's self-pipe,
and the writer then waits for the GIL: 17 % of the serving thread's time with one wake per
answer, py-spy, a gRPC client at 32 in flight).
"""

from __future__ import annotations

import asyncio
import collections
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from edgeserve.loop import new_event_loop

T = TypeVar("T")


class LoopThread:
    """`start()`, then `await run(coro)` from another loop; `await stop()` once nothing runs on it
    any more."""

    def __init__(self, name: str) -> None:
        self.loop = new_event_loop()  # uvloop where installed: 1.08x asyncio's gRPC throughput here
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """`coro` run on this thread's loop, awaited from the caller's (cancelling cancels it)."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    async def stop(self) -> None:
        """Stop the loop and join its thread (without blocking the caller's loop)."""
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            await asyncio.to_thread(self._thread.join)
        self.loop.close()


class Crossing:
    """Calls made from other threads into one loop, in order; the loop is woken once for all the
    calls made before it runs them (call_soon_threadsafe wakes it once per call)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._calls: collections.deque[tuple[Callable[..., object], tuple[Any, ...]]] = collections.deque()
        self._armed = False

    def call(self, fn: Callable[..., object], *args: Any) -> None:
        """Run fn(*args) on the loop soon (from any thread)."""
        self._calls.append((fn, args))
        if not self._armed:  # (a run that cleared it takes this call, or a new one is armed)
            self._armed = True
            self._loop.call_soon_threadsafe(self._run)

    def _run(self) -> None:
        self._armed = False  # first: a call appended from here on arms a new run or is taken below
        calls = self._calls
        while calls:
            fn, args = calls.popleft()
            fn(*args)
