"""Short batches on the loop's own thread: a lone short batch runs inline, a backlog and long
batches on the executor thread, and either way one batch at a time with the right answers."""

from __future__ import annotations

import asyncio
import itertools
import math
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from runtime_support import HookedBackend, HookedFactory, config_dict, profiled_tiny_repository
from tiny_onnx import TinyModel

from edgeserve.loop import run
from edgeserve.repository import ModelRepository
from edgeserve.runtime.backends.onnxruntime import OnnxRuntimeBackend
from edgeserve.runtime.executor import BatchRun, Executor, inline_safe
from edgeserve.runtime.results import Result, Status
from edgeserve.runtime.server import Server
from edgeserve.runtime.settings import RuntimeSettings


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, TinyModel]]:
    root = tmp_path_factory.mktemp("inline") / "engines"
    return root, profiled_tiny_repository(root)


def _check(results: list[Result], tiny: TinyModel, xs: np.ndarray) -> None:
    for x, r in zip(xs, results, strict=True):
        assert r.status is Status.OK, r.error
        assert r.exit_index is not None
        np.testing.assert_allclose(r.output, tiny.forward(x[None], r.exit_index)[0], rtol=1e-4, atol=1e-4)


def _one_at_a_time(
    served, factory: HookedFactory, inline_max_ms: float | None, settings: RuntimeSettings | None = None
) -> tuple[list[Result], int]:
    root, models = served
    config = config_dict(root)
    if inline_max_ms is not None:
        config["backend"]["inline_max_ms"] = inline_max_ms
    xs = models["tiny_a"].random_input(12, seed=5)

    async def main() -> tuple[list[Result], int]:
        async with Server(config, backend_factory=factory, settings=settings) as server:
            return [await server.infer("tiny_a", x) for x in xs], threading.get_ident()

    results, loop_thread = run(main())
    _check(results, models["tiny_a"], xs)
    return results, loop_thread


def test_a_lone_short_batch_runs_on_the_loop_thread_and_the_backend_lives_on_the_executor_thread(
    served,
) -> None:
    factory = HookedFactory(inline_safe=True)
    _, loop_thread = _one_at_a_time(served, factory, None)
    backend = factory.backend
    assert backend is not None and backend.closed
    assert backend.threads["run"] == {loop_thread}
    owner = backend.threads["load"] | backend.threads["close"]
    assert len(owner) == 1 and loop_thread not in owner


@pytest.mark.parametrize(
    "inline_safe, inline_max_ms, settings",
    [(True, 0.0, None), (False, None, None), (True, None, RuntimeSettings(inline_loop_delay_s=-1.0))],
    ids=["inline_max_ms_0", "not_inline_safe", "no_loop_fast_enough"],
)
def test_without_inline_every_batch_runs_on_the_executor_thread(
    served, inline_safe, inline_max_ms, settings
) -> None:
    """`inline_max_ms = 0` turns it off; a backend that does not say `inline_safe` never gets it;
    nor does a loop slower than the settings' `inline_loop_delay_s` (here: any loop)."""
    factory = HookedFactory(inline_safe=inline_safe)
    _, loop_thread = _one_at_a_time(served, factory, inline_max_ms, settings)
    backend = factory.backend
    assert backend is not None
    assert backend.threads["run"] == backend.threads["load"] and loop_thread not in backend.threads["run"]


def test_a_backlog_goes_to_the_executor_thread_and_batches_never_overlap(served) -> None:
    _, models = served
    factory = HookedFactory(delay_s=0.002, inline_safe=True)
    xa, xb = models["tiny_a"].random_input(60, seed=6), models["tiny_b"].random_input(60, seed=7)

    async def main() -> tuple[list[Result], int]:
        async with Server(config_dict(served[0]), backend_factory=factory) as server:
            calls = [server.infer("tiny_a", x) for x in xa] + [server.infer("tiny_b", x) for x in xb]
            return await asyncio.gather(*calls), threading.get_ident()

    results, loop_thread = run(main())
    _check(results[:60], models["tiny_a"], xa)
    _check(results[60:], models["tiny_b"], xb)
    backend = factory.backend
    assert backend is not None and backend.max_active == 1
    assert backend.threads["run"] - {loop_thread}, "a backlog of 120 requests ran entirely on the loop"
    spans = sorted(backend.spans)
    for (_, leave, _), (enter, _, _) in itertools.pairwise(spans):
        assert leave <= enter
    assert sum(size for _, _, size in spans) == len(results)


def test_an_inline_batch_submitted_before_close_comes_back_as_an_error(served) -> None:
    root, models = served
    x = models["tiny_a"].random_input(2, seed=8)

    async def main() -> BatchRun:
        executor = Executor(lambda: OnnxRuntimeBackend(ModelRepository(root), threads=1, warmup=0))
        backend = await executor.open()
        assert inline_safe(backend)
        done: asyncio.Future[BatchRun] = asyncio.get_running_loop().create_future()
        executor.submit("tiny_a", 0, list(x), done.set_result, inline=True)
        await executor.close()  # before the loop gets to the inline batch
        return await done

    batch = run(main())
    assert batch.outputs is None and isinstance(batch.error, RuntimeError) and "closed" in str(batch.error)


def test_finished_batches_are_answered_by_run_completed_without_a_loop_turn(served) -> None:
    """The front door calls run_completed before it reads: batches that ended while the loop was
    busy are answered there and then, in the order they ended, each exactly once."""
    root, models = served
    xs = models["tiny_a"].random_input(6, seed=9)

    async def main() -> tuple[list[tuple[str, bool]], list[tuple[str, bool]]]:
        repository = ModelRepository(root)
        executor = Executor(lambda: OnnxRuntimeBackend(repository, threads=1, warmup=0))
        await executor.open()
        await executor.load(repository.load_manifest("tiny_a"))
        answered: list[tuple[str, bool]] = []
        ended = threading.Event()
        follows = iter(
            [
                ("tiny_a", 1, list(xs[2:4]), lambda r: answered.append(("second", r.error is None))),
                ("tiny_a", 0, list(xs[4:]), lambda r: answered.append(("third", r.error is None))),
            ]
        )

        def follow():
            job = next(follows, None)
            if job is None:
                ended.set()
            return job

        executor.submit(
            "tiny_a", 2, list(xs[:2]), lambda r: answered.append(("first", r.error is None)), follow
        )
        assert ended.wait(30)  # the loop is blocked here: no callback of its own can run
        deadline = time.monotonic() + 10  # the last callback is queued just after follow() returns
        while len(answered) < 3 and time.monotonic() < deadline:
            executor.run_completed()  # on the loop's thread, which never yields here
            time.sleep(0.001)
        in_place = list(answered)
        await asyncio.sleep(0.05)  # the wake-ups find nothing left to answer
        await executor.close()
        return in_place, answered

    in_place, answered = run(main())
    assert in_place == [("first", True), ("second", True), ("third", True)]  # each ran without error
    assert answered == in_place


@pytest.mark.parametrize("wait", ["nap", "lock"])
def test_the_loop_steps_aside_once_per_batch_until_the_executor_starts_the_next(
    served, monkeypatch, wait: str
) -> None:
    """step_aside (the front door's, before each read) blocks the loop only when the running batch
    is due to end, once per batch, and only until the executor thread has started the next one:
    napping on the compiled counter (_nap.c), or blocked on a lock where that is not built."""
    import edgeserve.runtime.executor as executor_module

    if wait == "nap" and executor_module.nap is None:
        pytest.skip("edgeserve.runtime._nap is not built (no C compiler at install)")
    if wait == "lock":
        monkeypatch.setattr(executor_module, "nap", None)
    root, models = served
    xs = models["tiny_a"].random_input(3, seed=10)

    async def main() -> dict[str, float]:
        repository = ModelRepository(root)
        backend = HookedBackend(OnnxRuntimeBackend(repository, threads=1, warmup=0), delay_s=0.2)
        executor = Executor(lambda: backend)
        await executor.open()
        await executor.load(repository.load_manifest("tiny_a"))
        seen: dict[str, float] = {}

        def timed(key: str, ends_at_from_now: float) -> None:
            t = time.monotonic()
            executor.step_aside(t + ends_at_from_now)
            seen[key] = time.monotonic() - t
            seen[key + "_ended"] = len(backend.spans)

        timed("idle", 0.0)  # nothing running: nothing to step aside for
        follows = iter([("tiny_a", 0, [xs[1]], lambda r: None)])
        executor.submit("tiny_a", 0, [xs[0]], lambda r: None, lambda: next(follows, None))
        assert backend.entered.wait(10)
        timed("not_due", 10.0)  # the first batch is not due: returns at once, still due later
        timed("no_prediction", math.nan)  # a policy that predicts nothing: never stepped aside for
        monkeypatch.setattr(executor_module, "STEP_ASIDE_LATE_S", 10.0)
        timed("due", 0.0)  # waits out the first batch, until the second starts
        timed("second", 0.0)  # the second batch, its own step: until the executor goes idle

        backend.entered.clear()
        done = asyncio.get_running_loop().create_future()
        executor.submit("tiny_a", 0, [xs[2]], done.set_result)
        assert backend.entered.wait(10)
        monkeypatch.setattr(executor_module, "STEP_ASIDE_LATE_S", 0.001)
        timed("short", 0.0)  # bounded: gives up 1 ms past the predicted end
        monkeypatch.setattr(executor_module, "STEP_ASIDE_LATE_S", 10.0)
        timed("again", 0.0)  # the same batch: once per batch, so at once
        await done
        await executor.close()
        return seen

    seen = run(main())
    assert seen["idle"] < 0.1 and seen["not_due"] < 0.1 and seen["not_due_ended"] == 0
    assert seen["no_prediction"] < 0.1 and seen["no_prediction_ended"] == 0
    assert seen["due_ended"] == 1 and seen["due"] < 5  # returned after the first batch ended
    assert seen["second_ended"] == 2 and seen["second"] < 5
    assert seen["short"] < 0.15 and seen["short_ended"] == 2  # the third batch (0.2 s) still runs
    assert seen["again"] < 0.1 and seen["again_ended"] == 2


def test_requests_of_one_loop_turn_run_as_one_inline_batch(served) -> None:
    """The decision waits for the loop turn's arrivals (one callback per turn) and the inline
    batch it picks runs in that callback: requests sent together are still answered together,
    from one batch on the loop's thread."""
    root, models = served
    factory = HookedFactory(inline_safe=True)
    xs = models["tiny_a"].random_input(4, seed=10)

    async def main() -> tuple[list[Result], int]:
        async with Server(config_dict(root), backend_factory=factory) as server:
            await server.infer("tiny_a", xs[0])
            results = await asyncio.gather(*(server.infer("tiny_a", x) for x in xs))
            return list(results), threading.get_ident()

    results, loop_thread = run(main())
    _check(results, models["tiny_a"], xs)
    assert {r.batch_size for r in results} == {len(xs)}
    assert len({(r.start, r.end) for r in results}) == 1
    backend = factory.backend
    assert backend is not None and backend.threads["run"] == {loop_thread}
