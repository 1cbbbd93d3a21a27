"""The pipeline (runtime/pipeline.py) without a server, a socket or a thread: a fake clock, a
scripted policy and a real task book; what runs next, when the executor is free, and the batch
decided ahead."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from edgeserve.runtime.budget import BatchOverhead
from edgeserve.runtime.counters import Counters
from edgeserve.runtime.executor import BatchRun
from edgeserve.runtime.pipeline import Pipeline
from edgeserve.runtime.settings import RuntimeSettings
from edgeserve.runtime.tasks import Task, TaskBook
from edgeserve.scheduler import Dispatch, Drop, LatencyModel, ModelLatency, Wait

MS = 1e-3
# One model, two exits, batches of 1..4: the shallow exit takes 1-2 ms, the deep one 3-6 ms.
SECONDS = np.array([[1.0, 1.3, 1.6, 2.0], [3.0, 4.0, 5.0, 6.0]]) * MS


@dataclass
class Clock:
    t: float = 100.0

    def __call__(self) -> float:
        return self.t


@dataclass
class Script:
    """A policy that answers from a list (a callable: called with the queues), recording `at`."""

    answers: list[Any]
    name: str = "script"
    guards_the_tail: bool = False
    asked: list[float] = field(default_factory=list)

    def decide(self, queues: Any, at: float) -> Any:
        self.asked.append(at)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer(queues) if callable(answer) else answer


@dataclass
class Rig:
    pipeline: Pipeline
    book: TaskBook
    clock: Clock
    policy: Script
    fallback: Script
    done: list[tuple[Any, ...]]
    failed: list[tuple[Exception, float]]

    def queue(self, n: int, budget: float = 1.0) -> list[Task]:
        now = self.clock()
        return [self.book.add(0, np.zeros(1), lambda r: None, now, budget) for _ in range(n)]

    def finish(self, job: Any) -> None:
        """The loop runs the finished batch's callback."""
        job[3](BatchRun(None, None, math.nan, self.clock()))


def _rig(*answers: Any, fallback: tuple[Any, ...] = (), settings: RuntimeSettings | None = None) -> Rig:
    book = TaskBook(1)
    clock = Clock()
    done: list[tuple[Any, ...]] = []
    failed: list[tuple[Exception, float]] = []

    def on_done(*args: Any) -> None:
        done.append(args)

    def on_failed(exc: Exception, now: float) -> None:
        failed.append((exc, now))

    pipeline = Pipeline(book, ("m",), Counters(), BatchOverhead(1.0), on_done, on_failed, settings, clock)
    policy, fallback_policy = Script(list(answers)), Script(list(fallback), name="fallback")
    latency = LatencyModel((ModelLatency("m", ("e0", "e1"), (0, 1), 4, SECONDS.copy()),))
    pipeline.use(latency, policy, fallback_policy)  # type: ignore[arg-type]
    return Rig(pipeline, book, clock, policy, fallback_policy, done, failed)


def _dispatch(batch: int, exit: int = 0, drops: tuple[Drop, ...] = ()) -> Dispatch:
    return Dispatch(0, exit, batch, predicted_s=float(SECONDS[exit, batch - 1]), drops=drops)


def _start(rig: Rig, batch: int, exit: int = 0, inline: bool = False) -> Any:
    """The loop takes a batch, as Server._decide does with the loop's decision."""
    with rig.pipeline.lock:
        return rig.pipeline.take(_dispatch(batch, exit), rig.clock(), inline=inline)


def test_a_batch_taken_pops_its_tasks_and_marks_the_executor_busy_until_its_predicted_end() -> None:
    rig = _rig()
    tasks = rig.queue(5)
    name, exit, samples, done = _start(rig, 4, exit=1)
    p = rig.pipeline
    assert (name, exit, len(samples)) == ("m", 1, 4)
    assert len(rig.book.queues[0]) == 1 and all(t.dispatch == rig.clock.t for t in tasks[:4])
    assert p.busy and p.threaded and p.started == rig.clock.t
    assert p.ends == pytest.approx(rig.clock.t + 6 * MS)
    assert p.free_at(rig.clock.t) == p.ends
    rig.finish((name, exit, samples, done))  # the callback names the batch: model, exit, tasks
    assert rig.done[0][:5] == (0, 1, tasks[:4], False, False)


def test_the_executor_is_free_at_the_predicted_end_and_an_overran_batch_runs_as_long_again() -> None:
    rig = _rig()
    p, t0 = rig.pipeline, rig.clock.t
    assert p.free_for_admission(t0) == t0 and p.free_at(t0) == t0  # idle: now
    rig.queue(2)
    _start(rig, 2)  # predicted 1.3 ms
    assert p.free_for_admission(t0 + 0.5 * MS) == pytest.approx(t0 + 1.3 * MS)
    now = t0 + 3 * MS  # overran its prediction: it may run as long again as it has so far
    assert p.free_for_admission(now) == pytest.approx(2 * now - t0)
    assert p.free_at(now) == pytest.approx(t0 + 1.3 * MS)  # (the offload planner's: the prediction)


def test_the_executor_thread_decides_the_next_batch_itself_as_one_ends() -> None:
    rig = _rig(_dispatch(3, exit=1))
    rig.queue(4)
    _start(rig, 1)
    rig.clock.t += 1 * MS
    job = rig.pipeline.follow()
    assert job is not None and len(job[2]) == 3 and job[1] == 1
    assert rig.policy.asked == [rig.clock.t]
    p = rig.pipeline
    assert p.busy and p.threaded and p.started == rig.clock.t
    assert p.ends == pytest.approx(rig.clock.t + 5 * MS)
    assert len(rig.book.queues[0]) == 0


@pytest.mark.parametrize(
    "answer",
    [
        Wait(until=math.inf),
        _dispatch(1, drops=(Drop(0, (0,)),)),
        ZeroDivisionError("bug in the policy"),
    ],
    ids=["wait", "drops", "raises"],
)
def test_the_executor_thread_leaves_to_the_loop_what_only_the_loop_can_act_on(answer: Any) -> None:
    rig = _rig(answer)
    rig.queue(3)
    _start(rig, 1)
    assert rig.pipeline.follow() is None
    p = rig.pipeline
    assert not p.busy and not p.threaded and len(rig.book.queues[0]) == 2
    assert p.counters.policy_failures == 0  # the loop asks again, and counts a failure then
    assert rig.failed == []


def test_nothing_is_decided_on_the_thread_when_nothing_is_queued_or_only_the_loop_may_decide() -> None:
    rig = _rig()
    rig.queue(1)
    _start(rig, 1)
    assert rig.pipeline.follow() is None  # the queue is empty
    rig.queue(2)
    rig.pipeline.loop_only = True  # expire mode, or upstreams
    _start(rig, 1)
    assert rig.pipeline.follow() is None
    assert rig.policy.asked == []


def test_a_short_batch_that_takes_every_queued_task_is_left_to_the_loop_to_run_inline() -> None:
    rig = _rig(_dispatch(2), _dispatch(2))
    p = rig.pipeline
    p.inline_ok, p.inline_max_s = True, 5 * MS
    rig.queue(3)
    _start(rig, 1)
    assert p.follow() is None  # two short tasks, all there is: the loop runs them itself
    assert p.runs_inline(_dispatch(2))
    p.loop_delay = 1.0  # a loop busy reading runs nothing inline: the thread runs it
    assert not p.runs_inline(_dispatch(2))
    job = p.follow()
    assert job is not None and len(job[2]) == 2 and p.threaded


def test_the_loop_decides_ahead_only_as_the_running_batch_is_due_to_end() -> None:
    settings = RuntimeSettings()
    rig = _rig(_dispatch(2), settings=settings)
    p, t0 = rig.pipeline, rig.clock.t
    rig.queue(4)
    _start(rig, 2, exit=1)  # predicted 4 ms on the executor thread
    assert p.due == pytest.approx(t0 + 4 * MS)  # due_share 1 so far
    assert p.decide_from == pytest.approx(p.due - settings.decide_ahead_s)
    rig.clock.t = p.decide_from - 1e-6
    p.decide_ahead()
    assert p.ahead is None and rig.policy.asked == []
    rig.clock.t = p.decide_from
    p.decide_ahead()
    assert rig.policy.asked == [p.due]  # as of the running batch's end
    assert p.ahead is not None and len(p.ahead[0][2]) == 2 and len(rig.book.queues[0]) == 0
    # the executor is free after the running batch and the one decided after it
    assert p.free_for_admission(rig.clock.t) == pytest.approx(t0 + 4 * MS + 1.3 * MS)
    p.decide_ahead()  # one batch ahead at most
    assert rig.policy.asked == [p.due]


def test_the_batch_decided_ahead_is_started_by_the_executor_thread_without_deciding() -> None:
    rig = _rig(_dispatch(2))
    p = rig.pipeline
    rig.queue(4)
    ahead_of = _start(rig, 2, exit=1)
    rig.clock.t = p.decide_from
    p.decide_ahead()
    assert p.ahead is not None
    ahead_job, due = p.ahead[0], p.due
    rig.clock.t += 1 * MS
    assert p.follow() is ahead_job
    assert rig.policy.asked == [due]  # asked once: ahead, as of the running batch's end
    assert p.ahead is None and p.busy and p.threaded
    assert p.started == rig.clock.t and p.ends == pytest.approx(rig.clock.t + 1.3 * MS)
    assert p.counters.batches_ahead == 1
    assert ahead_job is not ahead_of


def test_a_batch_decided_ahead_is_dropped_when_the_server_closes() -> None:
    """Its tasks stay open in the book (the server answers every open task `shutdown`); the
    executor thread starts nothing more."""
    rig = _rig(_dispatch(2))
    p = rig.pipeline
    tasks = rig.queue(4)
    _start(rig, 2, exit=1)
    rig.clock.t = p.decide_from
    p.decide_ahead()
    assert p.ahead is not None
    p.closed = True
    assert p.follow() is None
    assert p.ahead is None and not p.busy
    assert all(t.id in rig.book.open for t in tasks)


@pytest.mark.parametrize("why", ["inline", "loop_only", "closed", "empty"])
def test_nothing_is_decided_ahead_where_the_thread_would_not_start_it(why: str) -> None:
    rig = _rig(_dispatch(1))
    p = rig.pipeline
    rig.queue(1 if why == "empty" else 3)
    _start(rig, 1, exit=1, inline=why == "inline")
    p.loop_only = why == "loop_only"
    p.closed = why == "closed"
    rig.clock.t = p.due
    p.decide_ahead()
    assert p.ahead is None and rig.policy.asked == []


def test_due_share_learns_what_share_of_their_prediction_batches_on_the_thread_take() -> None:
    weight = 0.5
    rig = _rig(settings=RuntimeSettings(due_weight=weight))
    p = rig.pipeline
    rig.queue(2)
    _start(rig, 1, exit=1)  # predicted 3 ms
    rig.clock.t += 1.5 * MS  # took half of it
    p.follow()
    assert p.due_share == pytest.approx(1.0 + weight * (0.5 - 1.0))
    _start(rig, 1, exit=1)
    assert p.due == pytest.approx(rig.clock.t + p.due_share * 3 * MS)
    rig.clock.t += 60 * MS  # 20x its prediction: counted as 2x at most
    share = p.due_share
    p.follow()
    assert p.due_share == pytest.approx(share + weight * (2.0 - share))
    rig.queue(1)
    _start(rig, 1, exit=1, inline=True)  # inline batches end on the loop: not counted
    share = p.due_share
    p.idle()
    assert p.due_share == share and not p.busy


def test_on_the_loop_a_failing_policy_is_the_fallbacks_turn_then_the_queued_are_answered() -> None:
    bug = ZeroDivisionError("bug")
    rig = _rig(bug, bug, fallback=(_dispatch(1), ValueError("broken queues")))
    rig.queue(2)
    p, now = rig.pipeline, rig.clock.t
    with p.lock:
        assert p.decide_next(now, now, loop=True) == _dispatch(1)
        assert p.counters.policy_failures == 1
        assert p.decide_next(now, now, loop=True) is None
    assert p.counters.policy_failures == 2
    assert [(type(e), t) for e, t in rig.failed] == [(ValueError, now)]
    assert p.counters.decision.count == 2


def test_on_the_loop_waits_and_drops_come_back_as_the_policy_made_them() -> None:
    wait = Wait(until=123.0, drops=(Drop(0, (0,)),))
    rig = _rig(wait)
    rig.queue(2)
    now = rig.clock.t
    with rig.pipeline.lock:
        assert rig.pipeline.decide_next(now + 1.0, now, loop=True) is wait
    assert rig.policy.asked == [now + 1.0]


@pytest.mark.parametrize("budget, kept_exit", [(4.5 * MS, 0), (10 * MS, 1)])
def test_a_policy_that_guards_the_tail_is_kept_to_an_exit_that_leaves_the_queued_in_time(
    budget: float, kept_exit: int
) -> None:
    """Six tasks due together; after a batch of four at the deep exit (6 ms) the other two (1.3 ms
    at the shallow exit) would end past a 4.5 ms deadline: served at the shallow exit (2 ms)."""
    rig = _rig(_dispatch(4, exit=1))
    p = rig.pipeline
    p.keeps_tail = True
    rig.policy.guards_the_tail = True
    rig.queue(7, budget=budget)
    _start(rig, 1)  # six left, all due at once
    job = p.follow()
    assert job is not None and job[1] == kept_exit
    assert p.ends - p.started == pytest.approx(SECONDS[kept_exit, 3])
    assert p.counters.exits_kept_shallower == (1 if kept_exit == 0 else 0)


def test_without_deadline_admission_the_policys_exit_stands() -> None:
    rig = _rig(_dispatch(4, exit=1))
    rig.policy.guards_the_tail = True
    rig.queue(7, budget=4.5 * MS)
    _start(rig, 1)
    job = rig.pipeline.follow()
    assert job is not None and job[1] == 1 and rig.pipeline.counters.exits_kept_shallower == 0


def test_calibration_moves_the_costs_admission_and_kept_read() -> None:
    rig = _rig()
    p = rig.pipeline
    assert p.costs == [pytest.approx((0.0, *SECONDS[0]))]
    assert p.latency is not None
    p.latency.set_seconds(0, SECONDS * 2)
    p.cost_work()
    assert p.costs == [pytest.approx((0.0, *(SECONDS[0] * 2)))]
