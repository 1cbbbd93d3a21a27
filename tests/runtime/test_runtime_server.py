"""The serving core on real ONNX Runtime sessions of tiny models and a real event loop."""

from __future__ import annotations

import asyncio
import itertools
import math
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from runtime_support import MAX_BATCH, HookedFactory, config_dict, profiled_tiny_repository
from tiny_onnx import TinyModel

from edgeserve.errors import ProfileError, RepositoryError
from edgeserve.loop import run
from edgeserve.runtime.results import RequestFailed, Result, Status
from edgeserve.runtime.server import Server
from edgeserve.scheduler import Drop, Wait
from edgeserve.wire.bounds import ERROR_TEXT_LIMIT, MIN_DEADLINE_MS


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, TinyModel]]:
    root = tmp_path_factory.mktemp("runtime") / "engines"
    return root, profiled_tiny_repository(root)


def _config(served: tuple[Path, dict[str, TinyModel]], **scheduler: Any) -> dict[str, Any]:
    return config_dict(served[0], **scheduler)


def _assert_reference(result: Result, tiny: TinyModel, x: np.ndarray) -> None:
    assert result.status is Status.OK, result.error
    assert result.exit_index is not None and result.output is not None
    assert result.exit_name == tiny.manifest.exits[result.exit_index].name
    expected = tiny.forward(x[None], result.exit_index)[0]
    np.testing.assert_allclose(result.output, expected, rtol=1e-4, atol=1e-4)


def test_concurrent_callers_across_models_get_their_own_reference_logits(served) -> None:
    _, models = served
    xa = models["tiny_a"].random_input(40, seed=3)
    xb = models["tiny_b"].random_input(30, seed=4)

    async def main() -> tuple[list[Result], list[Result], dict[str, Any]]:
        async with Server(_config(served)) as server:
            calls_a = [server.infer("tiny_a", x) for x in xa]
            calls_b = [server.infer("tiny_b", x) for x in xb]
            results = await asyncio.gather(*calls_a, *calls_b)
            return results[:40], results[40:], server.snapshot()

    ra, rb, snap = run(main())
    for x, r in zip(xa, ra, strict=True):
        _assert_reference(r, models["tiny_a"], x)
    for x, r in zip(xb, rb, strict=True):
        _assert_reference(r, models["tiny_b"], x)
    assert snap["requests"] == {"tiny_a": {"ok": 40}, "tiny_b": {"ok": 30}}
    assert snap["decision"]["count"] >= sum(snap["batches"].values()) >= 70 / MAX_BATCH
    assert 0 < snap["executor_busy_s"] <= snap["wall_s"]
    assert snap["queue_depth"] == {"tiny_a": 0, "tiny_b": 0} and snap["violations"] == {}
    assert sum(snap["exit_mix"]["tiny_a"].values()) == 40
    assert all(1 <= r.batch_size <= MAX_BATCH for r in ra + rb)
    for r in ra + rb:
        assert r.queued <= r.dispatch <= r.start <= r.end
        assert math.isclose(r.total_ms, r.queue_ms + r.service_ms, abs_tol=1e-6)
        assert not r.late and r.raise_for_status() is r


def test_executor_never_runs_two_batches_at_once(served) -> None:
    _, models = served
    factory = HookedFactory(delay_s=0.002)

    async def main() -> list[Result]:
        async with Server(_config(served), backend_factory=factory) as server:
            calls = [server.infer("tiny_a", x) for x in models["tiny_a"].random_input(60)]
            calls += [server.infer("tiny_b", x) for x in models["tiny_b"].random_input(60)]
            return await asyncio.gather(*calls)

    results = run(main())
    assert all(r.ok for r in results)
    backend = factory.backend
    assert backend is not None and backend.max_active == 1
    spans = sorted(backend.spans)
    assert len(spans) > 1
    for (_, leave, _), (enter, _, _) in itertools.pairwise(spans):
        assert leave <= enter
    # The results' own timings show the same: distinct batches never overlap.
    batches = sorted({(r.start, r.end) for r in results})
    for (_, end), (start, _) in itertools.pairwise(batches):
        assert end <= start
    assert sum(size for _, _, size in backend.spans) == len(results)


def test_backend_load_run_and_close_all_happen_on_the_executor_thread(served) -> None:
    _, models = served
    factory = HookedFactory()

    async def main() -> None:
        async with Server(_config(served), backend_factory=factory) as server:
            await server.infer_batch("tiny_b", models["tiny_b"].random_input(5))

    run(main())
    backend = factory.backend
    assert backend is not None and backend.closed
    threads = backend.threads["load"] | backend.threads["run"] | backend.threads["close"]
    assert len(threads) == 1


def test_full_queue_rejects_at_once_and_every_request_is_answered_once(served) -> None:
    _, models = served
    factory = HookedFactory(delay_s=0.01)
    config = _config(served)
    config["models"]["tiny_a"]["max_queue"] = 5

    async def main() -> tuple[list[Result], dict[str, Any]]:
        async with Server(config, backend_factory=factory) as server:
            results = await asyncio.gather(
                *(server.infer("tiny_a", x) for x in models["tiny_a"].random_input(50))
            )
            return results, server.snapshot()

    results, snap = run(main())
    statuses = [r.status for r in results]
    assert len(results) == 50
    assert statuses.count(Status.REJECTED) >= 50 - 5 - MAX_BATCH
    assert statuses.count(Status.OK) >= 5
    assert set(statuses) == {Status.OK, Status.REJECTED}
    rejected = [r for r in results if r.status is Status.REJECTED]
    assert all(r.output is None and "full" in (r.error or "") and r.total_ms == 0.0 for r in rejected)
    assert sum(snap["requests"]["tiny_a"].values()) == 50
    assert snap["queue_depth"] == {"tiny_a": 0, "tiny_b": 0}


def test_backend_error_answers_that_batch_with_error_and_the_server_keeps_serving(served) -> None:
    _, models = served
    factory = HookedFactory(fail_model="tiny_b")

    async def main() -> tuple[list[Result], list[Result], list[Result], dict[str, Any]]:
        async with Server(_config(served), backend_factory=factory) as server:
            failing = server.infer_batch("tiny_b", models["tiny_b"].random_input(6))
            fine = server.infer_batch("tiny_a", models["tiny_a"].random_input(6))
            bad, good = await asyncio.gather(failing, fine)
            after = await server.infer_batch("tiny_a", models["tiny_a"].random_input(3, seed=9))
            return bad, good, after, server.snapshot()

    bad, good, after, snap = run(main())
    assert all(r.status is Status.ERROR for r in bad)
    assert all("injected failure on tiny_b" in (r.error or "") and r.output is None for r in bad)
    with pytest.raises(RequestFailed, match="error: RuntimeError: injected failure"):
        bad[0].raise_for_status()
    assert all(r.ok for r in good + after)
    assert snap["requests"] == {"tiny_a": {"ok": 9}, "tiny_b": {"error": 6}}


def test_cancelled_caller_while_queued_is_removed_and_the_others_are_served(served) -> None:
    _, models = served
    factory = HookedFactory(delay_s=0.05)
    config = _config(served, max_batch=1)

    async def main() -> tuple[list[Any], dict[str, Any]]:
        async with Server(config, backend_factory=factory) as server:
            xs = models["tiny_a"].random_input(4)
            tasks = [asyncio.ensure_future(server.infer("tiny_a", x)) for x in xs]
            while factory.backend is None or not factory.backend.entered.is_set():
                await asyncio.sleep(0.001)
            tasks[2].cancel()  # batch size 1: task 0 runs, tasks 1-3 are queued
            answers = await asyncio.gather(*tasks, return_exceptions=True)
            return answers, server.snapshot()

    answers, snap = run(main())
    assert isinstance(answers[2], asyncio.CancelledError)
    assert all(isinstance(a, Result) and a.ok for i, a in enumerate(answers) if i != 2)
    assert snap["cancelled"] == {"tiny_a": 1}
    assert snap["requests"] == {"tiny_a": {"ok": 3}}
    assert factory.backend is not None and len(factory.backend.spans) == 3  # never ran the cancelled one


def test_cancelled_caller_whose_batch_is_running_does_not_break_that_batch(served) -> None:
    _, models = served
    factory = HookedFactory(delay_s=0.1)

    async def main() -> list[Any]:
        async with Server(_config(served), backend_factory=factory) as server:
            xs = models["tiny_b"].random_input(3)
            tasks = [asyncio.ensure_future(server.infer("tiny_b", x)) for x in xs]
            while factory.backend is None or not factory.backend.entered.is_set():
                await asyncio.sleep(0.001)
            tasks[0].cancel()  # the first task is in the running batch
            answers = await asyncio.gather(*tasks, return_exceptions=True)
            later = await server.infer("tiny_b", xs[0])
            return [*answers, later]

    answers = run(main())
    assert isinstance(answers[0], asyncio.CancelledError)
    for x, r in zip(models["tiny_b"].random_input(3)[1:], answers[1:3], strict=True):
        _assert_reference(r, models["tiny_b"], x)
    assert answers[3].ok


@pytest.mark.parametrize("late_tasks", ["serve", "expire"])
def test_tasks_that_cannot_make_their_deadline_are_served_late_or_expired(served, late_tasks: str) -> None:
    _, models = served
    factory = HookedFactory(delay_s=0.15)

    async def main() -> tuple[Result, list[Result], dict[str, Any]]:
        async with Server(_config(served, late_tasks=late_tasks), backend_factory=factory) as server:
            x = models["tiny_a"].random_input(4)
            first = asyncio.ensure_future(server.infer("tiny_a", x[0]))
            while factory.backend is None or not factory.backend.entered.is_set():
                await asyncio.sleep(0.001)
            # Queued behind a 150 ms batch with a 5 ms budget: hopeless before they can start.
            tight = await asyncio.gather(*(server.infer("tiny_a", xi, deadline_ms=5) for xi in x[1:]))
            return await first, tight, server.snapshot()

    first, tight, snap = run(main())
    assert first.ok and not first.late
    if late_tasks == "serve":
        assert all(r.ok and r.late and r.output is not None for r in tight)
        assert snap["requests"]["tiny_a"] == {"ok": 4}
    else:
        assert all(r.status is Status.EXPIRED and r.output is None for r in tight)
        # Answered as soon as they were hopeless, while the first batch was still running.
        assert all(r.end < first.end for r in tight)
        assert snap["requests"]["tiny_a"] == {"ok": 1, "expired": 3}
        assert factory.backend is not None and len(factory.backend.spans) == 1
    assert snap["violations"] == {"tiny_a": 3}


def test_deadline_admission_sheds_what_the_queue_would_make_late_and_admits_once_it_drains(served) -> None:
    _, models = served
    factory = HookedFactory(delay_s=0.3)
    config = _config(served, admission="deadline")
    x = models["tiny_a"].random_input(1)[0]

    async def main() -> tuple[list[Result], Result]:
        async with Server(config, backend_factory=factory) as server:
            running = asyncio.ensure_future(server.infer("tiny_a", x))
            await asyncio.to_thread(factory.backend.entered.wait, 5)  # the executor is busy 0.3 s
            head = asyncio.ensure_future(server.infer("tiny_a", x))
            await asyncio.sleep(0.15)  # the running batch has now overrun its profile by ~150 ms
            # It may run as long again (budget.py counts what is ahead from then): no exit can
            # answer a 100 ms deadline, even at the head of an empty queue.
            shed = await server.infer("tiny_a", x, deadline_ms=100)
            kept = asyncio.ensure_future(server.infer("tiny_a", x, deadline_ms=5000))
            # ~150 ms more fits in 200 ms with room for the way back: admitted (the server's
            # part is judged against the planned deadline, not a share of the budget).
            fits = asyncio.ensure_future(server.infer("tiny_a", x, deadline_ms=200))
            done = await asyncio.gather(running, head, kept, fits)
            after = await server.infer("tiny_a", x, deadline_ms=100)  # idle again: admitted
            return [shed, *done], after

    (shed, *served_ok), after = run(main())
    assert shed.status is Status.REJECTED and shed.refused and "overloaded" in (shed.error or "")
    assert [r.status for r in served_ok] == [Status.OK] * 4
    assert after.status is Status.OK


def test_deadline_admission_counts_the_work_ahead_at_the_shallowest_exit(served) -> None:
    """Deep queues are admitted while the shallowest exit can still answer in time: with a 1 s
    deadline and ms batches, a burst of far more than a full batch is all admitted, and a request
    whose deadline is shorter than the work ahead of it is refused, saying by how much."""
    _, models = served
    factory = HookedFactory(delay_s=0.0)
    config = _config(served, admission="deadline")
    x = models["tiny_a"].random_input(1)[0]

    async def main() -> tuple[list[Result], Result, int]:
        async with Server(config, backend_factory=factory) as server:
            bound = server.queue_bound("tiny_a")
            burst = [server.submit("tiny_a", x, deadline_ms=1000) for _ in range(4 * MAX_BATCH)]
            costs = server._pipeline.costs[0]
            ahead_s = (4 * MAX_BATCH // MAX_BATCH) * costs[MAX_BATCH]
            tight = await server.infer("tiny_a", x, deadline_ms=ahead_s * 1000 / 4)
            return list(await asyncio.gather(*burst)), tight, bound

    burst, tight, bound = run(main())
    assert [r.status for r in burst] == [Status.OK] * (4 * MAX_BATCH)
    assert tight.status is Status.REJECTED and "ms more than it leaves" in (tight.error or "")
    assert bound == 64  # the test config's explicit max_queue is kept


def test_a_reply_margin_makes_the_scheduler_plan_early_and_late_still_means_the_requests_deadline(
    served,
) -> None:
    """`reply_margin_s` (a front's way back) moves the deadline the scheduler plans to, never below
    half the budget; the Result keeps the request's own deadline. In expire mode a queued task is
    answered `expired` when its planned deadline becomes hopeless, which makes the plan visible."""
    _, models = served
    factory = HookedFactory(delay_s=0.6)  # the executor is busy long after every deadline below
    x = models["tiny_a"].random_input(1)[0]

    async def main() -> list[Result]:
        async with Server(_config(served, late_tasks="expire"), backend_factory=factory) as server:
            running = asyncio.ensure_future(server.infer("tiny_a", x))
            await asyncio.to_thread(factory.backend.entered.wait, 5)
            answers = await asyncio.gather(
                server.infer("tiny_a", x, deadline_ms=400),  # planned to 400 ms
                server.infer("tiny_a", x, deadline_ms=400, reply_margin_s=0.2),  # to 200 ms
                server.infer("tiny_a", x, deadline_ms=400, reply_margin_s=5.0),  # to half: 200 ms
            )
            await running
            return answers

    plain, margin, floored = run(main())
    assert [r.status for r in (plain, margin, floored)] == [Status.EXPIRED] * 3
    assert [r.deadline - r.queued for r in (plain, margin, floored)] == [pytest.approx(0.4)] * 3
    waited = [r.end - r.queued for r in (plain, margin, floored)]
    assert waited[0] >= 0.39
    assert 0.19 <= waited[1] < waited[0] - 0.1 and 0.19 <= waited[2] < waited[0] - 0.1


def test_a_request_the_front_read_earlier_has_that_much_less_budget(served) -> None:
    """`received` (when a front read the frame): the deadline runs from then; one that waited in
    the front's buffer past its deadline is answered `expired` at once."""
    _, models = served
    x = models["tiny_a"].random_input(1)[0]

    async def main() -> tuple[Result, Result]:
        async with Server(_config(served)) as server:
            got: list[Result] = []
            now = time.monotonic()
            server.enqueue("tiny_a", x, got.append, deadline_ms=500, received=now - 1.0)
            stale = got.pop()
            done: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
            server.enqueue("tiny_a", x, done.set_result, deadline_ms=500, received=now - 0.2)
            return stale, await done

    stale, fresh = run(main())
    assert stale.status is Status.EXPIRED and stale.refused and "to be read" in (stale.error or "")
    assert fresh.ok and fresh.deadline - fresh.queued == pytest.approx(0.3, abs=0.05)


@pytest.mark.parametrize(
    ("margin_s", "agos"),
    [
        (5e-4, (0.004, 0.001, 0.009, 0.0, 0.002)),
        # a margin past half the deadline: the plan's floor binds, and it is held to steps too
        (0.6, (8e-5, 2e-5, 1e-4, 0.0, 5e-5)),
    ],
)
def test_requests_alike_read_at_different_times_share_one_planned_budget(
    served, margin_s: float, agos: tuple[float, ...]
) -> None:
    """The plan runs from the read (`received`) and its measured margin is held steady, so a
    queue of requests alike has one budget: the policy then scores it the fast way."""
    _, models = served
    x = models["tiny_a"].random_input(1)[0]
    factory = HookedFactory(delay_s=0.3)

    async def main() -> tuple[float | None, list[float], list[Result]]:
        async with Server(_config(served), backend_factory=factory) as server:
            running = asyncio.ensure_future(server.infer("tiny_a", x))
            await asyncio.to_thread(factory.backend.entered.wait, 5)
            futures = []
            for ago in agos:  # reads of several connections, out of order
                future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
                server.enqueue(
                    "tiny_a",
                    x,
                    future.set_result,
                    deadline_ms=800,
                    reply_margin_s=margin_s,
                    received=time.monotonic() - ago,
                )
                futures.append(future)
            queue = server._queues[0]
            budget, arrivals = queue.uniform_budget, queue.arrivals.tolist()
            results = list(await asyncio.gather(*futures))
            await running
            return budget, arrivals, results

    budget, arrivals, results = run(main())
    assert budget is not None and budget < 0.8
    assert arrivals == sorted(arrivals)
    assert all(r.ok for r in results)


def test_per_request_deadline_overrides_the_model_slo(served) -> None:
    _, models = served
    x = models["tiny_a"].random_input(1)[0]

    async def main() -> tuple[Result, Result]:
        async with Server(_config(served)) as server:
            return await server.infer("tiny_a", x), await server.infer("tiny_a", x, deadline_ms=250)

    default, custom = run(main())
    assert default.deadline - default.queued == pytest.approx(1.0)
    assert custom.deadline - custom.queued == pytest.approx(0.25)


def test_a_capture_time_runs_the_slo_from_capture_and_a_stale_frame_expires_at_once(served) -> None:
    _, models = served
    x = models["tiny_a"].random_input(1)[0]

    async def main() -> list[Result]:
        async with Server(_config(served)) as server:
            return [
                await server.infer("tiny_a", x, capture_ts=time.time() - 0.4),
                await server.infer("tiny_a", x, capture_ts=time.time() - 5.0),
                await server.infer("tiny_a", x, capture_ts=time.time(), deadline_ms=50),
                await server.infer("tiny_a", x, capture_ts=-1.0),
            ]

    aged, stale, both, bad = run(main())
    assert aged.status is Status.OK
    assert 0.5 < aged.deadline - aged.queued < 0.61  # 1 s SLO, 0.4 s of it spent before arrival
    assert stale.status is Status.EXPIRED and stale.refused and "past the 1000 ms SLO" in (stale.error or "")
    assert both.status is Status.INVALID and "not both" in (both.error or "")
    assert bad.status is Status.INVALID and "capture_ts" in (bad.error or "")
    assert not aged.refused


def test_bad_requests_are_answered_invalid_before_queueing(served) -> None:
    _, models = served
    good = models["tiny_a"].random_input(1)[0]

    async def main() -> tuple[list[Result], dict[str, Any]]:
        async with Server(_config(served)) as server:
            results = [
                await server.infer("no-such-model", good),
                await server.infer("tiny_a", good.astype(np.float64)),
                await server.infer("tiny_a", good[None]),
                await server.infer("tiny_a", good.tolist()),  # type: ignore[arg-type]
                await server.infer("tiny_a", good, deadline_ms=-1),
                await server.infer("tiny_a", good, deadline_ms=math.nan),
            ]
            return results, server.snapshot()

    results, snap = run(main())
    assert [r.status for r in results] == [Status.INVALID] * 6
    errors = [r.error or "" for r in results]
    assert "unknown model 'no-such-model'" in errors[0]
    assert "float32" in errors[1] and "float64" in errors[1]
    assert "(1, 8, 8)" in errors[2]
    assert "numpy array" in errors[3]
    assert "deadline_ms" in errors[4] and "deadline_ms" in errors[5]
    assert snap["batches"] == {}


def test_shutdown_serves_what_it_can_within_the_timeout_and_answers_the_rest(served) -> None:
    _, models = served
    factory = HookedFactory(delay_s=0.05)
    config = _config(served, max_batch=1)

    async def main() -> tuple[list[Result], Result, dict[str, Any]]:
        server = await Server(config, backend_factory=factory).start()
        tasks = [asyncio.ensure_future(server.infer("tiny_a", x)) for x in models["tiny_a"].random_input(20)]
        await asyncio.sleep(0)
        await server.close(timeout_s=0.3)
        results = await asyncio.gather(*tasks)
        after = await server.infer("tiny_a", models["tiny_a"].random_input(1)[0])
        return results, after, server.snapshot()

    results, after, snap = run(main())
    statuses = [r.status for r in results]
    assert set(statuses) == {Status.OK, Status.SHUTDOWN}
    assert statuses.count(Status.OK) >= 1 and statuses.count(Status.SHUTDOWN) >= 10
    assert statuses == sorted(statuses, key=lambda s: s is Status.SHUTDOWN)  # FIFO: served ones first
    assert after.status is Status.SHUTDOWN
    assert sum(snap["requests"]["tiny_a"].values()) == 21
    assert factory.backend is not None and factory.backend.closed


def test_shutdown_drains_the_queue_when_time_allows(served) -> None:
    _, models = served

    async def main() -> list[Result]:
        server = await Server(_config(served)).start()
        tasks = [asyncio.ensure_future(server.infer("tiny_b", x)) for x in models["tiny_b"].random_input(12)]
        await asyncio.sleep(0)
        await server.close()
        return await asyncio.gather(*tasks)

    assert all(r.ok for r in run(main()))


def test_runs_on_the_standard_asyncio_loop_too(served) -> None:
    _, models = served

    async def main() -> list[Result]:
        async with Server(_config(served)) as server:
            return await server.infer_batch("tiny_a", models["tiny_a"].random_input(5))

    assert all(r.ok for r in asyncio.run(main()))


def test_expected_accuracy_comes_from_the_manifest(tmp_path: Path) -> None:
    root = tmp_path / "engines"
    models = profiled_tiny_repository(root)
    from edgeserve.repository import ModelRepository

    repository = ModelRepository(root)
    manifest = repository.load_manifest("tiny_a").with_accuracies([0.5, 0.7, 0.9], "tiny-eval")
    repository.save_manifest(manifest)

    async def main() -> tuple[Result, Result]:
        async with Server(config_dict(root)) as server:
            x = models["tiny_a"].random_input(1)[0]
            return await server.infer("tiny_a", x), await server.infer(
                "tiny_b", models["tiny_b"].random_input(1)[0]
            )

    a, b = run(main())
    assert a.expected_accuracy == [0.5, 0.7, 0.9][a.exit_index or 0]
    assert b.expected_accuracy is None


def test_start_without_a_profile_for_this_device_fails_naming_the_command(tmp_path: Path) -> None:
    from tiny_onnx import write_tiny_repository

    root = tmp_path / "engines"
    write_tiny_repository(root)
    with pytest.raises(ProfileError, match="edgeserve-profile --model tiny_a"):
        run(Server(config_dict(root)).start())


def test_start_with_a_model_missing_from_the_repository_fails_naming_it(served) -> None:
    config = _config(served)
    config["models"]["ghost"] = {"slo_ms": 10}
    with pytest.raises(RepositoryError, match=r"'ghost'.*edgeserve export"):
        run(Server(config).start())


def test_unknown_model_names_share_one_counter_key_so_memory_stays_bounded(served) -> None:
    _, models = served
    x = models["tiny_a"].random_input(1)[0]

    async def main() -> tuple[list[Result], dict[str, Any]]:
        async with Server(_config(served)) as server:
            results = [await server.infer(f"model-{i}", x) for i in range(20)]
            return results, server.snapshot()

    results, snap = run(main())
    assert [r.model for r in results] == [f"model-{i}" for i in range(20)]
    assert snap["requests"] == {"(unknown)": {"invalid": 20}}


def test_numpy_scalar_deadlines_are_accepted(served) -> None:
    _, models = served
    x = models["tiny_a"].random_input(1)[0]

    async def main() -> Result:
        async with Server(_config(served)) as server:
            return await server.infer("tiny_a", x, deadline_ms=np.float32(250))

    result = run(main())
    assert result.ok and result.deadline - result.queued == pytest.approx(0.25)


class _Failing:
    """The real policy, except that its first `fail` decisions raise (a scheduler bug)."""

    def __init__(self, policy: Any, fail: float = 1) -> None:
        self.inner, self.name, self.calls, self.fail = policy, policy.name, 0, fail

    def decide(self, queues: Any, now: float) -> Any:
        self.calls += 1
        if self.calls <= self.fail:
            raise ZeroDivisionError("bug in the policy")
        return self.inner.decide(queues, now)


def test_a_policy_exception_is_decided_by_the_fallback_and_counted(served) -> None:
    _, models = served
    xs = models["tiny_a"].random_input(4)

    async def main() -> tuple[list[Result], list[Result], dict[str, Any]]:
        async with Server(_config(served)) as server:
            server._pipeline.policy = _Failing(server._pipeline.policy)  # white-box: inject a scheduler bug
            first = await server.infer_batch("tiny_a", xs)
            return first, await server.infer_batch("tiny_a", xs), server.snapshot()

    first, later, snapshot = run(main())
    assert all(r.ok for r in first + later)
    assert snapshot["policy_failures"] == 1


def test_when_the_fallback_fails_too_the_queued_requests_are_answered_error(served) -> None:
    _, models = served
    xs = models["tiny_a"].random_input(4)

    async def main() -> tuple[list[Result], list[Result]]:
        async with Server(_config(served)) as server:
            server._pipeline.policy = _Failing(server._pipeline.policy)
            server._pipeline.fallback = _Failing(server._pipeline.fallback)
            failed = await server.infer_batch("tiny_a", xs)
            return failed, await server.infer_batch("tiny_a", xs)

    failed, later = run(main())
    assert all(r.status is Status.ERROR and "bug in the policy" in (r.error or "") for r in failed)
    assert all(r.ok for r in later)


def test_close_may_be_called_concurrently_and_again(served) -> None:
    _, models = served
    factory = HookedFactory(delay_s=0.01)

    async def main() -> list[Result]:
        server = await Server(_config(served), backend_factory=factory).start()
        tasks = [asyncio.ensure_future(server.infer("tiny_b", x)) for x in models["tiny_b"].random_input(6)]
        await asyncio.sleep(0)
        await asyncio.gather(server.close(), server.close())
        await server.close()
        return await asyncio.gather(*tasks)

    assert all(r.ok for r in run(main()))
    assert factory.backend is not None and factory.backend.closed


class _DropsOldestFirst:
    """The real policy, except that its first decision also drops the oldest queued task."""

    def __init__(self, policy: Any) -> None:
        self.inner, self.name, self.dropped = policy, policy.name, False

    def decide(self, queues: Any, now: float) -> Any:
        decision = self.inner.decide(queues, now)
        if self.dropped or decision is None:
            return decision
        self.dropped = True
        oldest = int(queues[0].ids[0])
        return Wait(until=now, drops=(Drop(0, (oldest,)),))


def test_tasks_the_policy_drops_are_answered_expired_and_the_rest_served(served) -> None:
    _, models = served

    async def main() -> tuple[list[Result], dict[str, Any]]:
        async with Server(_config(served)) as server:
            # white-box: a policy that drops
            server._pipeline.policy = _DropsOldestFirst(server._pipeline.policy)
            return await server.infer_batch("tiny_a", models["tiny_a"].random_input(4)), server.snapshot()

    results, snap = run(main())
    assert results[0].status is Status.EXPIRED and results[0].error == "dropped by the policy"
    assert all(r.ok for r in results[1:])
    assert snap["violations"] == {"tiny_a": 1}


def test_symphony_deferred_batching_answers_every_request_once(served) -> None:
    _, models = served
    factory = HookedFactory(delay_s=0.003)
    config = _config(served, policy="symphony")
    for model in config["models"].values():
        model["slo_ms"] = 30

    async def main() -> tuple[list[Result], dict[str, Any]]:
        async with Server(config, backend_factory=factory) as server:
            calls = [server.infer("tiny_a", x) for x in models["tiny_a"].random_input(30)]
            calls += [server.infer("tiny_b", x) for x in models["tiny_b"].random_input(30)]
            return await asyncio.gather(*calls), server.snapshot()

    results, snap = run(main())
    assert {r.status for r in results} <= {Status.OK, Status.EXPIRED}
    assert all(r.error == "dropped by the policy" for r in results if r.status is Status.EXPIRED)
    assert all(r.exit_name == "final" for r in results if r.ok)  # Symphony serves the final exit only
    assert sum(n for by_status in snap["requests"].values() for n in by_status.values()) == 60
    violations = sum(1 for r in results if r.status is Status.EXPIRED or r.late)
    assert sum(snap["violations"].values()) == violations


def test_a_server_starts_once(served) -> None:
    async def main() -> None:
        server = Server(_config(served))
        async with server:
            with pytest.raises(RuntimeError, match="starts once"):
                await server.start()
        with pytest.raises(RuntimeError, match="starts once"):
            await server.start()

    run(main())


@pytest.mark.parametrize("late_tasks", ["serve", "expire"])
def test_a_vanishing_deadline_affects_only_its_own_request(served, late_tasks: str) -> None:
    """Found by the socket fuzzer: deadline_ms=1e-283, alone in its model's queue, made the scorer
    overflow, and the policy's failure answered every queued request `error`. Now such a deadline
    is `invalid` (below MIN_DEADLINE_MS), and the smallest accepted one (1 us) makes only its own
    request miss its deadline."""
    root, models = served
    xs = models["tiny_a"].random_input(12, seed=8)
    x_b = models["tiny_b"].random_input(1, seed=9)[0]
    slow = HookedFactory(delay_s=0.01)  # keep tiny_a's queue standing while the tiny_b task waits

    async def main() -> tuple[list[Result], Result, int]:
        async with Server(config_dict(root, late_tasks=late_tasks), backend_factory=slow) as server:
            first = asyncio.ensure_future(server.infer_batch("tiny_a", xs[:6]))
            await asyncio.sleep(0)
            tiny = asyncio.ensure_future(server.infer("tiny_b", x_b, deadline_ms=MIN_DEADLINE_MS))
            vanishing = await server.infer("tiny_b", x_b, deadline_ms=1e-283)
            assert vanishing.status is Status.INVALID and "deadline_ms" in (vanishing.error or "")
            rest = await server.infer_batch("tiny_a", xs[6:])
            return [*(await first), *rest], await tiny, server.snapshot()["policy_failures"]

    others, tiny, policy_failures = run(main())
    assert policy_failures == 0  # the scorer itself copes; the fallback policy was not needed
    assert [r.status for r in others] == [Status.OK] * 12
    assert not any(r.late for r in others)
    # No exit answers in 1 us: deadline admission refuses it at once, in either late-task mode.
    assert tiny.status is Status.REJECTED and tiny.refused


EXTREME_DEADLINES = [5e-324, 1e-283, 0.0, -1, -0.0, math.inf, -math.inf, math.nan, 2**64, 10**400, 1e308]
EXTREME_DEADLINES += [np.float64(math.nan), np.float32(1e-40), True, "5", [1], {"ms": 5}]


def test_deadlines_and_capture_times_at_every_extreme_are_invalid_not_errors(served) -> None:
    """budget.request_budget (the embedding API and the HTTP front): any value outside 1 us .. 1 day, or
    a capture_ts more than a day from the clock, is `invalid` with a short text, never `error`."""
    _, models = served
    x = models["tiny_a"].random_input(1)[0]
    now = time.time()
    captures = [5e-324, 1.0, -1, math.inf, math.nan, 1e308, 2**64, now + 2 * 86400, now - 2 * 86400, "now"]

    async def main() -> tuple[list[Result], list[Result], list[Result]]:
        async with Server(_config(served)) as server:
            deadlines = [await server.infer("tiny_a", x, deadline_ms=d) for d in EXTREME_DEADLINES]  # type: ignore[arg-type]
            captured = [await server.infer("tiny_a", x, capture_ts=c) for c in captures]  # type: ignore[arg-type]
            edges = [
                await server.infer("tiny_a", x, deadline_ms=86_400_000),
                await server.infer("tiny_a", x, capture_ts=time.time() - 3600),
                await server.infer("tiny_a", x, capture_ts=time.time() + 60),
            ]
            return deadlines, captured, edges

    deadlines, captured, (longest, hour_old, early) = run(main())
    for value, result in zip(EXTREME_DEADLINES + captures, deadlines + captured, strict=True):
        assert result.status is Status.INVALID, (value, result)
        assert len((result.error or "").encode()) <= ERROR_TEXT_LIMIT, value
    assert "clock" in (captured[-2].error or "") and "in the past" in (captured[-2].error or "")
    assert longest.status is Status.OK
    assert hour_old.status is Status.EXPIRED  # within a day of the clock: late, not a bad clock
    assert early.status is Status.OK  # a minute of clock skew ahead: served


def test_deadline_admission_reads_the_queue_under_the_lock_the_executor_thread_pops_with(served) -> None:
    """The executor thread pops the next batch itself (`Pipeline.follow`, holding the server's lock)
    while the loop admits requests. Admission read the queue's head without that lock, and once in
    ~100k requests of an HTTP flood the queue emptied between its check and its read: an
    IndexError, answered HTTP 500. Here a probe on the queue tries the lock from another thread at
    the moment admission reads the head: it must be held."""
    _, models = served
    factory = HookedFactory(delay_s=0.3)
    x = models["tiny_a"].random_input(1)[0]
    tried: list[bool] = []

    async def main() -> list[Result]:
        async with Server(_config(served, admission="deadline"), backend_factory=factory) as server:
            running = asyncio.ensure_future(server.infer("tiny_a", x))
            await asyncio.to_thread(factory.backend.entered.wait, 5)  # the executor is busy 0.3 s
            queued = [asyncio.ensure_future(server.infer("tiny_a", x)) for _ in range(MAX_BATCH)]
            await asyncio.sleep(0)
            queue = server._queues[server.models.index("tiny_a")]
            lock = server._lock

            def try_lock() -> None:  # what the executor thread does as its batch ends
                took = lock.acquire(timeout=0.05)
                tried.append(took)
                if took:
                    lock.release()

            class Probe(type(queue)):  # type: ignore[misc]
                __slots__ = ()

                def last_deadline(self) -> float:
                    thread = threading.Thread(target=try_lock)
                    thread.start()
                    thread.join()
                    return super().last_deadline()

            queue.__class__ = Probe
            # tiny_a's queued tasks: admission reads when the last of them is due
            x_b = models["tiny_b"].random_input(1)[0]
            last = await server.infer("tiny_b", x_b, deadline_ms=5000)
            return [await running, *await asyncio.gather(*queued), last]

    results = run(main())
    assert [r.status for r in results] == [Status.OK] * (MAX_BATCH + 2)
    assert tried == [False]
