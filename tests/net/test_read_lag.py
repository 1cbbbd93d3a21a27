"""The probe of a request's wait in its socket before the loop reads it: a real timerfd read by a
real event loop, alone and behind a real socket front."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from net_support import hello_frame, net_config, raw_connect, read_frame, server_thread
from runtime_support import config_dict, profiled_tiny_repository

from edgeserve.loop import run
from edgeserve.net.read_lag import HOLD_S, PLANNED_MAX_S, ReadLag, timer_fd

pytestmark = pytest.mark.skipif(timer_fd() is None, reason="no timerfd on this system")


def _spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


async def _probe(busy_s: float, duration_s: float = 0.6) -> tuple[ReadLag, list[float]]:
    """A ReadLag probing fast on this loop, which spins `busy_s` at a time (0: it mostly sleeps)."""
    moves: list[float] = []
    lag = ReadLag(moves.append, rate_hz=1000.0)
    lag.resume()
    end = time.monotonic() + duration_s
    while time.monotonic() < end:
        if busy_s:
            _spin(busy_s)
            await asyncio.sleep(0)  # one loop turn: the probe is read only here
        else:
            await asyncio.sleep(0.005)
    lag.pause()
    return lag, moves


def test_a_loop_busy_in_long_callbacks_is_measured_waiting_and_an_idle_one_is_not() -> None:
    busy, moves = run(_probe(busy_s=0.004))
    idle, _ = run(_probe(busy_s=0.0))
    # A probe due during a 4 ms callback waits for its end: uniform over 0-4 ms, median ~2 ms.
    assert busy.probes > 50 and idle.probes > 50
    assert 1.0e-3 < busy.estimate.value < 4.5e-3
    assert busy.value == moves[-1] and abs(busy.value - busy.estimate.value) <= HOLD_S
    assert idle.estimate.value < min(1.0e-3, busy.estimate.value / 2)


def test_paused_it_holds_no_descriptor_and_probes_no_more() -> None:
    async def main() -> tuple[bool, bool, int, int]:
        lag = ReadLag(lambda _: None, rate_hz=1000.0)
        before = len(os.listdir("/proc/self/fd"))
        lag.resume()
        armed = lag.measuring
        await asyncio.sleep(0.05)
        lag.pause()
        probes = lag.probes
        await asyncio.sleep(0.05)
        return armed, lag.measuring, probes - lag.probes, len(os.listdir("/proc/self/fd")) - before

    armed, measuring, more, descriptors = run(main())
    assert armed and not measuring
    assert more == 0 and descriptors == 0


def test_the_front_plans_socket_requests_with_the_measured_wait_while_clients_are_connected(
    tmp_path: Path,
) -> None:
    root = tmp_path / "engines"
    profiled_tiny_repository(root)
    with server_thread(net_config(config_dict(root), tmp_path, reply_margin_ms=0.5)) as srv:
        frontend = srv.net.frontend

        def on_loop(call: Callable[[], Any]) -> Any:
            async def read() -> Any:
                return call()

            return asyncio.run_coroutine_threadsafe(read(), srv.loop).result(10)

        assert not on_loop(lambda: frontend.read_lag.measuring)  # no client: nothing wakes the loop
        frontend.read_lag.rate_hz = 1000.0  # (200 by default) for a short test
        sock = raw_connect(srv.unix_url)
        sock.sendall(hello_frame())
        assert read_frame(sock)["type"] == "hello"
        assert on_loop(lambda: frontend.read_lag.measuring)
        # The server's loop in 4 ms callbacks for half a second: what a busy box does to a read.
        stop = threading.Event()

        def hog() -> None:
            _spin(0.004)
            if not stop.is_set():
                srv.loop.call_later(0.0005, hog)

        srv.loop.call_soon_threadsafe(hog)
        time.sleep(0.6)
        stop.set()
        margin, wait = on_loop(lambda: (frontend.margin_s, frontend.stats.read_wait_seconds))
        assert wait > 0.5e-3  # probes due during a 4 ms callback waited up to 4 ms
        assert margin == pytest.approx(0.5e-3 + min(wait, PLANNED_MAX_S))
        sock.close()
        deadline = time.monotonic() + 5
        while on_loop(lambda: frontend.read_lag.measuring) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not on_loop(lambda: frontend.read_lag.measuring)
