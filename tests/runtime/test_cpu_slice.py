"""The event loop's thread runs on a short CPU slice (cpu_slice.py): set on a real thread through
the kernel, read back from it, only for the loop's thread, and given back when the server closes.
Skipped where the kernel reports no slice (before Linux 6.12, or not Linux)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from runtime_support import config_dict, profiled_tiny_repository
from tiny_onnx import TinyModel

from edgeserve.loop import run
from edgeserve.runtime.cpu_slice import MAX_S, MIN_S, set_thread_slice, thread_slice_s
from edgeserve.runtime.results import Status
from edgeserve.runtime.server import Server

T = TypeVar("T")

pytestmark = pytest.mark.skipif(
    thread_slice_s() is None, reason="the kernel reports no CPU slice (Linux < 6.12)"
)


def on_new_thread(fn: Callable[[], T]) -> T:
    """`fn` on a thread of its own (nothing it sets stays on pytest's), from the kernel's default slice."""
    out: list[Any] = []

    def target() -> None:
        try:
            set_thread_slice(0)  # the kernel's default, whatever the thread that started it had
            out.append(fn())
        except BaseException as exc:  # raised again on the caller's thread
            out.append(exc)

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if isinstance(out[0], BaseException):
        raise out[0]
    return out[0]


def test_a_thread_takes_a_short_slice_clamped_to_the_kernels_range_and_back() -> None:
    def body() -> list[float | None]:
        nice = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        default = thread_slice_s()
        assert set_thread_slice(200e-6)
        seen = [thread_slice_s()]
        assert set_thread_slice(1e-6)  # below the kernel's least: its least
        seen.append(thread_slice_s())
        assert set_thread_slice(10.0)
        seen.append(thread_slice_s())
        assert set_thread_slice(0)  # the kernel's default again
        seen += [thread_slice_s(), default]
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == nice
        return seen

    short, least, most, again, default = on_new_thread(body)
    assert short == pytest.approx(200e-6)
    assert least == pytest.approx(MIN_S)
    assert most == pytest.approx(MAX_S)
    assert again == pytest.approx(default)


def test_a_thread_its_operator_made_sched_batch_is_left_alone() -> None:
    def body() -> tuple[bool, int, float | None]:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))  # this thread only (Linux)
        return set_thread_slice(100e-6), os.sched_getscheduler(0), thread_slice_s()

    took, policy, seen = on_new_thread(body)
    assert not took and policy == os.SCHED_BATCH and seen is None


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, TinyModel]]:
    root = tmp_path_factory.mktemp("cpu-slice") / "engines"
    return root, profiled_tiny_repository(root)


@pytest.mark.parametrize("slice_us", [100.0, 0.0])
def test_the_server_shortens_its_loop_threads_slice_alone_and_gives_it_back(served, slice_us: float) -> None:
    x = served[1]["tiny_a"].random_input(1, seed=1)[0]
    config = config_dict(served[0])
    config["backend"]["loop_slice_us"] = slice_us

    async def main() -> dict[str, Any]:
        before = thread_slice_s()
        async with Server(config) as server:
            result = await server.infer("tiny_a", x, deadline_ms=1000)
            executor = server._executor
            assert executor is not None and executor.thread_id is not None
            seen = {"loop": thread_slice_s(), "executor": thread_slice_s(executor.thread_id)}
        return {**seen, "before": before, "after": thread_slice_s(), "status": result.status}

    seen = on_new_thread(lambda: run(main()))
    assert seen["status"] is Status.OK
    assert seen["loop"] == pytest.approx(slice_us * 1e-6 if slice_us else seen["before"])
    assert seen["executor"] == pytest.approx(seen["before"])  # its batches are not cut up
    assert seen["after"] == pytest.approx(seen["before"])


def test_two_servers_on_one_thread_leave_it_as_it_was(served) -> None:
    config = config_dict(served[0])

    async def main() -> list[float | None]:
        seen = [thread_slice_s()]
        async with Server(config):
            async with Server(config):
                seen.append(thread_slice_s())
            seen.append(thread_slice_s())  # the inner one did not shorten it, so gives nothing back
        return [*seen, thread_slice_s()]

    before, both, outer, after = on_new_thread(lambda: run(main()))
    assert both == pytest.approx(100e-6) and outer == pytest.approx(100e-6)
    assert after == pytest.approx(before)
