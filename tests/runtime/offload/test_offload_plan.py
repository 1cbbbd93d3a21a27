"""The offload planner on synthetic queues: only the excess over local capacity goes, as whole batches."""

from __future__ import annotations

import numpy as np
import pytest

from edgeserve.runtime.offload.plan import Route, plan
from edgeserve.scheduler import LatencyModel, TaskQueue
from edgeserve.scheduler.latency import ModelLatency

B = 4


def latency(*per_batch_s: float) -> LatencyModel:
    """One or more models; shallowest exit takes `s` per batch whatever its size, final 3x that."""
    models = []
    for i, s in enumerate(per_batch_s):
        seconds = np.array([[s] * B, [3 * s] * B])
        models.append(ModelLatency(f"m{i}", ("early", "final"), (0, 1), B, seconds))
    return LatencyModel(tuple(models))


def queue(n: int, budget: float, start: float = 0.0, gap: float = 0.0, first_id: int = 0) -> TaskQueue:
    q = TaskQueue()
    for i in range(n):
        q.push(first_id + i, start + i * gap, budget)
    return q


def route(remote_s: float, slots: int = 8, max_batch: int = B) -> Route:
    return Route(upstream=0, max_batch=max_batch, slots=slots, predict=lambda batch, size, ahead: remote_s)


def test_nothing_goes_when_the_box_can_serve_everything_in_time() -> None:
    q = queue(8, budget=0.05)  # two batches of 10 ms: done at 20 ms
    assert plan([q], latency(0.010), 0.0, 0.0, {0: [route(0.001)]}, [256]) == []


def test_only_the_tasks_beyond_local_capacity_go_and_they_go_as_one_batch() -> None:
    q = queue(12, budget=0.025)  # batches end at 10, 20, 30 ms: the last batch of 4 misses
    (offload,) = plan([q], latency(0.010), 0.0, 0.0, {0: [route(0.015)]}, [256])
    assert offload.ids == (8, 9, 10, 11) and offload.model == 0 and offload.upstream == 0


def test_the_running_batch_and_other_models_work_count_against_local_time() -> None:
    q = queue(4, budget=0.025)
    assert plan([q], latency(0.010), 0.0, 0.0, {0: [route(0.015)]}, [256]) == []
    busy = plan([q], latency(0.010), 0.0, 0.020, {0: [route(0.015)]}, [256])  # executor busy until 20 ms
    assert [o.ids for o in busy] == [(0, 1, 2, 3)]
    other = queue(4, budget=0.012, first_id=100)  # an earlier-deadline queue of another model, served first
    both = plan([q, other], latency(0.010, 0.018), 0.0, 0.0, {0: [route(0.015)]}, [256, 256])
    assert [o.ids for o in both] == [(0, 1, 2, 3)]


def test_tasks_the_upstream_cannot_save_either_stay_local() -> None:
    q = queue(12, budget=0.025)
    assert plan([q], latency(0.010), 0.0, 0.0, {0: [route(0.030)]}, [256]) == []


def test_in_flight_slots_and_the_upstream_batch_cap_limit_what_goes() -> None:
    q = queue(20, budget=0.025)  # 8 make it locally, 12 miss
    offloads = plan([q], latency(0.010), 0.0, 0.0, {0: [route(0.015, slots=2, max_batch=5)]}, [256])
    assert [len(o.ids) for o in offloads] == [5, 5]  # two batches of at most 5; the rest stays queued
    assert not set(offloads[0].ids) & set(offloads[1].ids)


def test_a_batch_predicted_too_slow_at_its_real_size_keeps_the_tasks_it_cannot_save() -> None:
    q = TaskQueue()
    for i in range(8):
        q.push(i, 0.0, 0.010 if i < 4 else 0.100)
    # the upstream takes 5 ms + 10 ms per task in the batch; locally one 4-batch takes 20 ms
    slow = Route(0, B, 4, lambda batch, size, ahead: 0.005 + 0.010 * batch)
    offloads = plan([q], latency(0.020), 0.0, 0.0, {0: [slow]}, [256])
    sent = [i for o in offloads for i in o.ids]
    assert 0 not in sent  # a 10 ms budget cannot be met remotely at batch 4 (45 ms)
    assert all(q.deadlines[q.ids.tolist().index(i)] >= 0.045 for i in sent)


def test_requeued_tasks_take_their_place_by_arrival() -> None:
    q = queue(5, budget=0.05, gap=0.001)
    q.remove([1, 3])
    q.insert(3, 0.003, 0.05)
    q.insert(1, 0.001, 0.05)
    q.insert(9, 0.0035, 0.02)  # a different budget keeps its own deadline
    assert q.ids.tolist() == [0, 1, 2, 3, 9, 4]
    assert q.deadlines.tolist() == pytest.approx([0.05, 0.051, 0.052, 0.053, 0.0235, 0.054])
    assert q.uniform_budget is None
    q.pop(6)
    q.insert(7, 0.5, 0.05)  # into an empty queue
    assert q.ids.tolist() == [7] and q.uniform_budget == 0.05
