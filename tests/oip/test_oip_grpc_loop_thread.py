"""The gRPC front's loop thread and its crossings (oipgrpc/loop_thread.py), with real threads and
loops: every call crosses exactly once and in order, and a burst wakes the loop once."""

from __future__ import annotations

import asyncio
import threading

from edgeserve.loop import run
from edgeserve.oipgrpc.loop_thread import Crossing, LoopThread


def test_calls_from_several_threads_all_run_once_in_each_threads_order() -> None:
    async def main() -> dict[int, list[int]]:
        crossing = Crossing(asyncio.get_running_loop())
        seen: dict[int, list[int]] = {k: [] for k in range(4)}
        done = asyncio.Event()
        total = 4 * 2000

        def record(sender: int, i: int) -> None:
            seen[sender].append(i)
            if sum(map(len, seen.values())) == total:
                done.set()

        def send(sender: int) -> None:
            for i in range(2000):
                crossing.call(record, sender, i)

        threads = [threading.Thread(target=send, args=(k,)) for k in range(4)]
        for thread in threads:
            thread.start()
        await asyncio.wait_for(done.wait(), 10)
        for thread in threads:
            thread.join()
        await asyncio.sleep(0.05)  # nothing more arrives
        return seen

    seen = run(main())
    assert all(calls == list(range(2000)) for calls in seen.values())


def test_a_burst_made_while_the_loop_is_busy_wakes_it_once() -> None:
    beside = LoopThread("test-crossing")
    beside.start()
    try:
        runs: list[int] = []
        crossing = Crossing(beside.loop)
        blocked, release = threading.Event(), threading.Event()

        def block() -> None:
            blocked.set()
            release.wait(10)

        beside.loop.call_soon_threadsafe(block)
        assert blocked.wait(10)
        wakes = []
        original = crossing._run

        def counted() -> None:
            wakes.append(len(crossing._calls))
            original()

        crossing._run = counted  # type: ignore[method-assign]
        for i in range(500):
            crossing.call(runs.append, i)
        release.set()
        assert run(beside.run(asyncio.sleep(0))) is None
        assert runs == list(range(500)) and wakes == [500]
    finally:
        run(beside.stop())
