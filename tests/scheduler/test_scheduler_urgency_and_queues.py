"""Urgency forms match their definitions; the task queue is a FIFO that tracks its budgets."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edgeserve.scheduler.queues import TaskQueue
from edgeserve.scheduler.urgency import Urgency


def test_paper_form_is_zero_at_zero_and_one_at_the_deadline() -> None:
    u = Urgency("paper", clip=10.0)
    assert u(0.0) == 0.0
    assert u(1.0) == pytest.approx(1.0, rel=1e-15)
    # (e^0.5 - 1) / (e - 1) = 0.648721 / 1.718282 = 0.377541
    assert u(0.5) == pytest.approx(0.3775406688, rel=1e-9)


def test_code_form_is_one_over_e_at_zero_and_one_at_the_deadline() -> None:
    u = Urgency("code", clip=10.0)
    assert u(0.0) == pytest.approx(1 / math.e, rel=1e-15)
    assert u(1.0) == 1.0
    assert u(1.5) == pytest.approx(math.exp(0.5), rel=1e-15)


@pytest.mark.parametrize("form", ["code", "paper"])
def test_urgency_is_clipped_at_and_beyond_its_threshold(form: str) -> None:
    u = Urgency(form, clip=10.0)
    # code: e^(x-1) = 10 at x = 1 + ln 10 = 3.302585; paper: x = ln(1 + 10 (e - 1)) = 2.901589
    expected = 1 + math.log(10) if form == "code" else math.log1p(10 * (math.e - 1))
    assert u.threshold == pytest.approx(expected, rel=1e-15)
    assert u(u.threshold - 1e-6) < 10.0
    assert u(u.threshold) == 10.0
    assert u(50.0) == 10.0
    assert u(1e6) == 10.0  # no overflow for hopeless tasks


@pytest.mark.parametrize("form", ["code", "paper"])
def test_vectorised_urgency_equals_the_scalar_one(form: str) -> None:
    u = Urgency(form, clip=4.0)
    x = np.linspace(0.0, 5.0, 101)
    assert np.allclose(u.of(x), [u(v) for v in x], rtol=1e-14, atol=0)


def test_urgency_without_clip_saturates_at_infinity_instead_of_raising() -> None:
    u = Urgency("code", clip=math.inf)
    assert u(1000.0) == math.inf
    assert u.of(np.array([1000.0]))[0] == math.inf


def test_the_default_urgency_is_the_paper_form_clipped_at_ten() -> None:
    assert Urgency() == Urgency("paper", 10.0)


def test_unknown_urgency_form_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match="code"):
        Urgency("cubic")


def test_queue_is_fifo_and_grows_past_its_initial_capacity() -> None:
    q = TaskQueue(capacity=4)
    for k in range(10):
        q.push(k, arrival=k * 0.01, budget=0.05)
    assert len(q) == 10
    assert q.pop(3).tolist() == [0, 1, 2]
    for k in range(10, 20):  # compaction and growth while the head has moved
        q.push(k, arrival=k * 0.01, budget=0.05)
    assert q.ids.tolist() == list(range(3, 20))
    assert np.allclose(q.deadlines, q.arrivals + 0.05)
    assert q.pop(17).size == 17 and not q


def test_queue_remove_takes_tasks_from_anywhere_and_keeps_order() -> None:
    q = TaskQueue()
    for k in range(6):
        q.push(k, arrival=float(k), budget=1.0)
    assert sorted(q.remove([4, 1, 99]).tolist()) == [1, 4]
    assert q.ids.tolist() == [0, 2, 3, 5]
    assert q.arrivals.tolist() == [0.0, 2.0, 3.0, 5.0]


def test_queue_tracks_whether_all_tasks_share_one_budget() -> None:
    q = TaskQueue()
    assert q.uniform_budget is None
    q.push(0, 0.0, 0.05)
    q.push(1, 0.1, 0.05)
    assert q.uniform_budget == 0.05
    q.push(2, 0.2, 0.2)  # a request that carries its own deadline
    assert q.uniform_budget is None
    q.remove([2])
    assert q.uniform_budget == 0.05
    q.push(3, 0.3, 0.2)
    q.pop(2)
    assert q.uniform_budget == 0.2


def test_queue_refuses_out_of_order_arrivals_and_nonpositive_budgets() -> None:
    q = TaskQueue()
    q.push(0, 1.0, 0.05)
    with pytest.raises(ValueError, match="arrival order"):
        q.push(1, 0.5, 0.05)
    with pytest.raises(ValueError, match="positive"):
        q.push(2, 2.0, 0.0)
