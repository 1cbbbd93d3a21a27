"""The loop polls for a while after a batch leaves the server idle (idle_poll.py): only while idle
periods are that short, never when it is turned off, and without holding up anything else the
loop has to do."""

from __future__ import annotations

import asyncio
import math
import time
from pathlib import Path
from typing import Any

import pytest
from runtime_support import config_dict, profiled_tiny_repository
from tiny_onnx import TinyModel

from edgeserve.loop import run
from edgeserve.runtime.idle_poll import MIN_HIT_RATE, IdlePoll
from edgeserve.runtime.results import Status
from edgeserve.runtime.server import Server

WINDOW_S = 200e-6


def test_polling_lasts_the_window_or_until_work_comes_and_is_counted() -> None:
    poll = IdlePoll(WINDOW_S)
    assert poll.idle(1.0)
    assert poll.polling(1.0 + 100e-6)
    poll.busy(1.0 + 150e-6)  # a request within the window ends the period and the polling
    assert not poll.polling(1.0 + 160e-6)
    assert poll.polled_s == pytest.approx(150e-6)
    assert poll.idle(2.0)
    assert not poll.polling(2.0 + 300e-6)  # the window is over: the loop sleeps
    assert poll.polled_s == pytest.approx(350e-6)
    poll.busy(2.5)  # came long after: counted as a miss, no more polling time
    assert poll.polled_s == pytest.approx(350e-6)
    assert poll.hit_rate < 1.0


def test_a_sparse_stream_stops_the_polling_and_back_to_back_requests_bring_it_back() -> None:
    poll, now, polled = IdlePoll(WINDOW_S), 0.0, []
    for _ in range(40):  # a 100 fps camera: every idle period is 10 ms
        polled.append(poll.idle(now))
        now += 0.010
        poll.busy(now)
    assert polled[0] and not any(polled[20:])
    assert poll.polled_s <= polled.count(True) * WINDOW_S + 1e-12
    assert poll.hit_rate < MIN_HIT_RATE
    for _ in range(40):  # then a client sending each request 50 us after its answer
        polled.append(poll.idle(now))
        now += 50e-6
        poll.busy(now)
    assert all(polled[-10:])


def test_a_zero_window_never_polls() -> None:
    poll = IdlePoll(0.0)
    for k in range(5):
        assert not poll.idle(float(k))
        poll.busy(k + 1e-6)
    assert poll.polled_s == 0.0


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, TinyModel]]:
    root = tmp_path_factory.mktemp("idle-poll") / "engines"
    return root, profiled_tiny_repository(root)


def _config(served: tuple[Path, dict[str, TinyModel]], idle_poll_us: float) -> dict[str, Any]:
    config = config_dict(served[0])
    config["backend"]["idle_poll_us"] = idle_poll_us
    return config


def test_back_to_back_requests_are_polled_for_and_a_sparse_stream_is_not(served) -> None:
    xs = served[1]["tiny_a"].random_input(60, seed=3)

    async def main() -> tuple[float, float, float]:
        async with Server(_config(served, 200)) as server:
            for x in xs[:20]:  # one after another, as a request-response client sends them
                assert (await server.infer("tiny_a", x)).status is Status.OK
            back_to_back = server.snapshot()["idle_poll_s"]
            for x in xs[20:40]:  # 3 ms apart: every idle period outlasts the window
                await asyncio.sleep(0.003)
                assert (await server.infer("tiny_a", x)).status is Status.OK
            after_twenty_sparse = server.snapshot()["idle_poll_s"]
            for x in xs[40:]:
                await asyncio.sleep(0.003)
                assert (await server.infer("tiny_a", x)).status is Status.OK
            return back_to_back, after_twenty_sparse, server.snapshot()["idle_poll_s"]

    back_to_back, after_twenty_sparse, last = run(main())
    assert 0.0 < back_to_back <= 20 * WINDOW_S
    assert after_twenty_sparse - back_to_back <= 20 * WINDOW_S
    assert last == after_twenty_sparse  # by then the hit rate is under MIN_HIT_RATE: no polling


def test_turned_off_the_loop_never_polls(served) -> None:
    xs = served[1]["tiny_a"].random_input(10, seed=4)

    async def main() -> float:
        async with Server(_config(served, 0)) as server:
            for x in xs:
                assert (await server.infer("tiny_a", x)).status is Status.OK
            return server.snapshot()["idle_poll_s"]

    assert run(main()) == 0.0


def test_while_the_loop_polls_coroutines_and_timers_run_and_a_request_ends_it(served) -> None:
    """A poll of 0.5 s (white-box: its state is read from the Server): the loop still runs other
    callbacks many times and fires a 5 ms timer long before the window ends; a request ends it."""
    xs = served[1]["tiny_a"].random_input(2, seed=6)

    async def main() -> tuple[int, float, float, float]:
        async with Server(_config(served, 500_000)) as server:
            assert (await server.infer("tiny_a", xs[0])).status is Status.OK
            polling = server._idle_poll
            assert polling.until > -math.inf  # the batch left the server idle: it polls
            turns = 0
            for _ in range(50):
                await asyncio.sleep(0)
                turns += polling.until > -math.inf
            t0 = time.monotonic()
            await asyncio.sleep(0.005)
            slept = time.monotonic() - t0
            still = polling.until - time.monotonic()
            assert (await server.infer("tiny_a", xs[1])).status is Status.OK
            return turns, slept, still, polling.polled_s

    turns, slept, still, polled = run(main())
    assert turns == 50  # each of those loop turns ran with the poll going on
    assert slept < 0.25 and still > 0.0  # the timer fired while the window was still open
    assert 0.0 < polled < 0.5  # the request ended the poll before its window did
