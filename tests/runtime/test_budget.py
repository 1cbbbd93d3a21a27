"""Deadline admission and the bounds derived from it, as pure functions: no server, no socket, no thread."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edgeserve.runtime.budget import (
    BatchOverhead,
    Throughput,
    admission_excess,
    headroom,
    late_on_arrival,
    overloaded,
    planned_budget,
    queue_bound,
    request_budget,
    shallow_costs,
    work_s,
)
from edgeserve.scheduler.queues import TaskQueue

# A model whose shallowest exit takes 1 ms for one task and 2 ms for a full batch of 4.
COSTS = shallow_costs([1e-3, 1.3e-3, 1.6e-3, 2e-3])


def _queue(arrivals: list[float], budget: float) -> TaskQueue:
    queue = TaskQueue()
    for i, arrival in enumerate(arrivals):
        queue.push(i, arrival, budget)
    return queue


def test_work_is_full_batches_at_the_shallowest_exit_plus_a_partial_one() -> None:
    assert work_s(0, COSTS) == 0.0
    assert work_s(4, COSTS) == pytest.approx(2e-3)
    assert work_s(9, COSTS) == pytest.approx(2 * 2e-3 + 1e-3)
    assert work_s(9, COSTS, overhead_s=0.5e-3) == pytest.approx(2 * 2.5e-3 + 1.5e-3)


def test_a_queue_bound_is_a_deadline_of_full_batches_and_one_more() -> None:
    assert queue_bound(0.050, COSTS) == 25 * 4 + 4  # 50 ms / 2 ms per batch of 4
    assert queue_bound(0.001, COSTS) == 4 + 4  # shorter than a batch: one batch, and one more


def test_admission_refuses_only_what_no_exit_can_answer_in_time() -> None:
    # 40 tasks queued for model 0, all due at t=1.0 (arrived at 0.95 with a 50 ms budget).
    queues = [_queue([0.95] * 40, 0.050), TaskQueue()]
    costs = [COSTS, COSTS]
    # At t=0.96 with the executor free, 41 tasks of model 0 take 10 full batches + 1 = 21 ms.
    excess = admission_excess(queues, 0, deadline=0.96 + 0.030, free_at=0.96, costs=costs)
    assert excess == pytest.approx(0.021 - 0.030)  # admitted, 9 ms to spare
    tight = admission_excess(queues, 0, deadline=0.96 + 0.015, free_at=0.96, costs=costs)
    assert tight == pytest.approx(0.006)  # refused: 6 ms short
    # Model 1's request due at 0.98 only waits for the tasks due before it (all of model 0's
    # are due at 1.0, later): it rides alone at its shallowest exit.
    assert admission_excess(queues, 1, deadline=0.98, free_at=0.96, costs=costs) == pytest.approx(1e-3 - 0.02)
    # Due after model 0's tasks: all 40 run first.
    later = admission_excess(queues, 1, deadline=1.5, free_at=0.96, costs=costs)
    assert later == pytest.approx(0.96 + 0.020 + 1e-3 - 1.5)


def test_mixed_budgets_count_only_the_tasks_due_first() -> None:
    queue = TaskQueue()
    queue.push(0, 0.0, 1.0)  # due at 1.0
    queue.push(1, 0.1, 0.1)  # due at 0.2
    queue.push(2, 0.2, 5.0)  # due at 5.2
    assert queue.uniform_budget is None
    excess = admission_excess([queue, TaskQueue()], 1, deadline=0.5, free_at=0.0, costs=[COSTS, COSTS])
    assert excess == pytest.approx(1e-3 + 1e-3 - 0.5)  # one task of model 0 (due 0.2), then itself


def test_a_batch_overhead_adds_to_every_batch_ahead() -> None:
    queues = [_queue([0.0] * 8, 0.05)]
    plain = admission_excess(queues, 0, deadline=1.0, free_at=0.0, costs=[COSTS])
    slower = admission_excess(queues, 0, deadline=1.0, free_at=0.0, costs=[COSTS], overhead_s=1e-3)
    assert slower - plain == pytest.approx(3e-3)  # 9 tasks: three batches


def test_headroom_is_what_is_left_of_the_most_generous_deadline_in_tasks() -> None:
    queues = [_queue([0.0] * 8, 0.05), TaskQueue()]
    # 8 queued: 4 ms of work; 1 ms still running; 50 ms budgets: 45 ms left at 0.5 ms a task.
    assert headroom(queues, 1e-3, [0.050, 0.010], [COSTS, COSTS]) == 90
    assert headroom(queues, 1e-3, [0.004, 0.004], [COSTS, COSTS]) == 0


def test_the_planned_budget_leaves_the_way_back_but_never_less_than_the_floor() -> None:
    assert planned_budget(0.050, 0.0, 0.5e-3, 1e-3, 0.5, 0.2e-3) == pytest.approx(0.0485)
    # A way back longer than half the budget: the floor (half of what is left after the wait).
    assert planned_budget(0.004, 0.0, 3e-3, 0.0, 0.5, 0.2e-3) == pytest.approx(0.002)
    # The wait to be read is held in 0.2 ms steps, so requests alike share one budget.
    assert planned_budget(0.004, 0.31e-3, 3e-3, 0.0, 0.5, 0.2e-3) == pytest.approx(0.4e-3 + 0.5 * 3.6e-3)


def test_the_batch_overhead_is_the_time_from_when_a_batch_could_start_beyond_its_profile() -> None:
    overhead = BatchOverhead(horizon_s=0.010)
    overhead.observe(ready=0.999, end=1.000, predicted_s=1e-3)  # as predicted: nothing to add
    assert overhead.value == pytest.approx(0.0, abs=1e-12)
    overhead.observe(ready=0.9995, end=1.003, predicted_s=1e-3)  # waited for the one before: 3 ms
    assert overhead.value == pytest.approx(0.1 * 2e-3)  # moved by its 1 ms share of 10 ms
    overhead.observe(ready=1.5, end=1.5012, predicted_s=1e-3)  # an idle executor: from its arrival
    assert overhead.value == pytest.approx(0.2e-3 + 0.1 * (0.2e-3 - 0.2e-3))
    stalled = BatchOverhead(horizon_s=0.010)
    stalled.observe(ready=0.0, end=0.001, predicted_s=1e-3)
    stalled.observe(ready=0.0005, end=0.201, predicted_s=1e-3)  # a 200 ms stall: its batch's share
    assert stalled.value == pytest.approx(0.1 * 0.199)
    for k in range(100):  # a steady 1.5 ms cycle for a 1 ms batch
        overhead.observe(ready=1.5 + k * 1.5e-3, end=1.5015 + k * 1.5e-3, predicted_s=1e-3)
    assert overhead.value == pytest.approx(0.5e-3, rel=1e-3)
    for k in range(100):  # faster than its profile: never below zero
        overhead.observe(ready=2.0 + k * 0.5e-3, end=2.0005 + k * 0.5e-3, predicted_s=1e-3)
    assert overhead.value == 0.0


def test_the_hosts_in_flight_total_is_the_shortest_deadline_of_what_it_answers_per_cpu_second() -> None:
    rates = Throughput(deadline_s=0.010, tick_s=0.050)  # models of 50 and 10 ms deadlines
    assert rates.target(0.0, host_cpu=lambda: 0.0) == math.inf  # nothing measured: no bound
    # 400 answers of model 0 and 100 of model 1 over the tick, the host busy half of it: it could
    # answer 20,000/s at full load, and any request may be of the model with the 10 ms deadline.
    rates.observe(400)
    rates.observe(100)
    assert rates.target(0.05, host_cpu=lambda: 0.025) == pytest.approx(20000 * 0.010)
    assert rates.target(0.06, host_cpu=lambda: 0.03) == pytest.approx(200)  # within the tick: it stands
    # The requests' way in and back comes off the deadline.
    assert rates.target(0.07, host_cpu=lambda: 0.03, way_s=0.002) == pytest.approx(20000 * 0.008)
    assert rates.target(1.0, host_cpu=lambda: 0.1) == math.inf  # idle for many ticks: stale, no bound


WALL = 1.7e9  # time.time() of the tests below


@pytest.mark.parametrize(
    "deadline_ms, capture_ts, budget",
    [
        (None, None, 0.050),  # the model's SLO from now
        (250, None, 0.250),  # the request's own budget from now
        (np.float32(250), None, 0.250),  # numpy scalars are numbers too
        (None, WALL - 0.010, 0.040),  # the SLO from the capture
        (None, WALL - 0.080, -0.030),  # captured past the SLO: <= 0, answered `expired`
    ],
)
def test_a_requests_budget_runs_from_now_or_from_its_capture(deadline_ms, capture_ts, budget) -> None:
    total, problem = request_budget(0.050, deadline_ms, capture_ts, WALL)
    assert problem is None and total == pytest.approx(budget, abs=1e-6)  # (wall-clock seconds)


@pytest.mark.parametrize(
    "deadline_ms, capture_ts",
    [("250", None), (-1, None), (math.nan, None), (True, None), (1e12, None), (10, WALL), (None, 0.0)],
)
def test_a_bad_deadline_is_a_problem_never_an_exception(deadline_ms, capture_ts) -> None:
    total, problem = request_budget(0.050, deadline_ms, capture_ts, WALL)
    assert math.isnan(total) and problem


def test_a_request_late_on_arrival_is_told_why() -> None:
    captured = late_on_arrival(-0.030, 0.0, 0.050, captured=True, busy=False)
    assert captured == "captured 80.0 ms ago, past the 50 ms SLO"
    busy = late_on_arrival(0.002, 0.003, 0.050, captured=False, busy=True)
    assert busy == "waited 3.0 ms to be read, past its 2 ms deadline (the server is overloaded)"
    idle = late_on_arrival(0.002, 0.003, 0.050, captured=False, busy=False)
    assert idle.startswith("waited 3.0 ms to be read") and "give a longer deadline_ms or slo_ms" in idle


def test_an_overloaded_refusal_says_by_how_much() -> None:
    assert overloaded("m", 0.0061) == (
        "overloaded: 'm' cannot answer within this request's deadline now "
        "(the work ahead needs 6.1 ms more than it leaves)"
    )
