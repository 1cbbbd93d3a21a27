"""The default's batch look-ahead (latency.split_batch) against the paper's batch min(|Q|, B_max)."""

from __future__ import annotations

import numpy as np
import pytest

from edgeserve.scheduler import DEFAULT_POLICY, Dispatch, LatencyModel, ModelLatency, TaskQueue, make_policy
from edgeserve.scheduler.latency import split_batch
from edgeserve.scheduler.synthetic import paper_gpu_profiles

SLO = 0.080
# A final exit measured on a CPU (tests/scheduler/data/cpu/t1, digits-l, p95 ms): cheap up to a
# batch of 6, then the batch falls out of cache and a batch of 10 costs more than two of 5.
CPU_FINAL_MS = [5.1, 6.5, 7.0, 5.8, 6.4, 6.5, 15.2, 24.2, 28.1, 27.9]
# The paper's GPU (ResNet152 final, p95 ms): a batch of 10 costs 2x a batch of 1.
GPU_FINAL_MS = [9.8, 10.9, 12.1, 13.1, 14.1, 15.2, 16.5, 17.5, 18.6, 19.6]


def _model(final_ms: list[float]) -> ModelLatency:
    shallow = np.linspace(0.2, 1.0, 10)  # a cheap early exit
    return ModelLatency("m", ("early", "final"), (0, 1), 10, np.array([shallow, final_ms]) / 1000.0)


def _queue(n: int, age: float = 0.005, now: float = 1.0) -> TaskQueue:
    queue = TaskQueue()
    for k in range(n):
        queue.push(k, now - age, SLO)
    return queue


def _time(model: ModelLatency, exit_pos: int, n: int, b: int) -> float:
    full, rest = divmod(n, b)
    t = full * model.latency(exit_pos, b)
    return t + (model.latency(exit_pos, rest) if rest else 0.0)


def test_the_look_ahead_splits_where_batching_does_not_pay_and_keeps_the_max_batch_where_it_does() -> None:
    for final_ms, expect_split in ((CPU_FINAL_MS, True), (GPU_FINAL_MS, False)):
        latency = LatencyModel((_model(final_ms),))
        queues = [_queue(12)]  # min(|Q|, B_max) = 10, all young: the final exit fits either way
        old = make_policy("stability-safe-maxbatch", latency).decide(queues, 1.0)
        new = make_policy(DEFAULT_POLICY, latency).decide(queues, 1.0)
        assert isinstance(old, Dispatch) and isinstance(new, Dispatch)
        assert (old.exit, old.batch) == (1, 10) and new.exit == 1
        if expect_split:
            # 6 + 4 take 12.3 ms, one batch of 10 27.9 ms: every one of the ten finishes sooner
            assert new.batch == 6
            assert _time(latency.models[0], 1, 10, 6) < 0.5 * _time(latency.models[0], 1, 10, 10)
        else:
            assert new.batch == 10
        assert new.predicted_s == pytest.approx(latency.models[0].latency(1, new.batch))


def test_split_batch_never_takes_longer_than_the_paper_batch_and_is_the_max_on_the_paper_gpu() -> None:
    rng = np.random.default_rng(7)
    for _ in range(300):
        table = np.sort(rng.uniform(0.1, 10.0, (3, 10)), axis=0) / 1000.0  # deeper exits slower
        model = ModelLatency("r", ("a", "b", "c"), (0, 1, 2), 10, table)
        for n in range(1, 11):
            for e in range(3):
                b = split_batch(model.by_batch, model.mean_by_batch, e, n, overhead_s=0.0)
                assert 1 <= b <= n
                assert _time(model, e, n, b) <= _time(model, e, n, n) + 1e-12
                # every task of the n finishes no later than in one batch of n
                assert model.latency(e, b) * (n // b) <= _time(model, e, n, n) + 1e-12
    gpu = LatencyModel.from_profiles(paper_gpu_profiles(samples=20))
    for model in gpu.models:
        for e in range(len(model.exit_ids)):
            assert [model.batch_for(e, n) for n in range(1, 11)] == list(range(1, 11))


def test_on_the_paper_gpu_the_default_decides_as_the_max_batch_rule() -> None:
    latency = LatencyModel.from_profiles(paper_gpu_profiles(samples=20))
    rng = np.random.default_rng(11)
    new, old = make_policy(DEFAULT_POLICY, latency), make_policy("stability-safe-maxbatch", latency)
    for _ in range(200):
        queues = [TaskQueue() for _ in range(3)]
        task = 0
        for q in queues:
            for age in sorted(rng.uniform(0.0, 0.06, rng.integers(0, 15)), reverse=True):
                q.push(task, 1.0 - age, 0.050)
                task += 1
        a, b = new.decide(queues, 1.0), old.decide(queues, 1.0)
        assert (a is None and b is None) or (a.model, a.exit, a.batch) == (b.model, b.exit, b.batch)


def test_an_unknown_batch_rule_is_refused() -> None:
    from edgeserve.scheduler.guarded import GuardedStabilityPolicy

    with pytest.raises(ValueError, match="batch rule"):
        GuardedStabilityPolicy(LatencyModel((_model(GPU_FINAL_MS),)), batch_rule="min")


def test_a_heavy_tailed_p95_does_not_split_a_batch_that_pays_on_average() -> None:
    # p95s of a noisy CPU cell (tests/scheduler/data/cpu/t2, digits-m final): ten batches of 1 look
    # cheaper than one of 10 (8.2 vs 10.1 ms), but on average a batch of 1 takes 0.76 ms and one of
    # 10 4.33 ms: splitting would cost throughput. The look-ahead judges cost by the mean.
    p95 = np.array([[0.2] * 10, [0.82, 8.48, 4.61, 8.72, 5.14, 9.05, 9.82, 9.62, 9.57, 10.10]]) / 1000.0
    mean = np.array([[0.1] * 10, [0.76, 1.07, 1.07, 1.39, 1.69, 2.27, 2.92, 3.52, 3.46, 4.33]]) / 1000.0
    with_mean = ModelLatency("m", ("early", "final"), (0, 1), 10, p95, mean=mean)
    p95_only = ModelLatency("m", ("early", "final"), (0, 1), 10, p95)
    assert with_mean.batch_for(1, 10) == 10
    assert p95_only.batch_for(1, 10) == 1  # what a p95-only look-ahead would do


def test_calibration_moves_the_look_ahead_with_the_table() -> None:
    latency = LatencyModel((_model(GPU_FINAL_MS),))
    assert latency.models[0].batch_for(1, 10) == 10
    cpu = np.array([np.linspace(0.2, 1.0, 10), CPU_FINAL_MS]) / 1000.0
    latency.set_seconds(0, cpu)
    assert latency.models[0].batch_for(1, 10) == 6
    assert make_policy(DEFAULT_POLICY, latency).decide([_queue(12)], 1.0).batch == 6


# digits-l's final exit on t2 (tests/scheduler/data/cpu/t2, ms, batches 1..10): p95 and mean.
T2_FINAL_P95 = [4.63, 8.79, 12.97, 9.85, 10.19, 11.08, 13.52, 14.0, 14.5, 15.0]
T2_FINAL_MEAN = [0.90, 1.81, 3.60, 3.72, 4.54, 5.14, 6.31, 7.0, 7.5, 8.0]


def _t2_model(name: str) -> ModelLatency:
    p95 = np.array([[0.2] * 10, T2_FINAL_P95]) / 1000.0
    mean = np.array([[0.1] * 10, T2_FINAL_MEAN]) / 1000.0
    return ModelLatency(name, ("early", "final"), (0, 1), 10, p95, mean=mean)


def test_tasks_that_are_all_that_waits_are_split_by_one_tail_not_the_sum_of_tails() -> None:
    # Batches of 2 + 1 planned as two p95s (13.4 ms) exceed one batch of 3 (13.0 ms), and so do
    # three of 1 (13.9 ms): with other tasks waiting the 3 stay together. Alone, 2 + 1 are planned
    # as their means (2.7 ms) plus the larger tail (7.0 ms) and cost 2.9 ms of executor time on
    # average against 3.7 ms for the 3 together.
    model = _t2_model("m")
    assert model.batch_for(1, 3) == 3
    assert model.batch_for(1, 3, alone=True) == 2
    latency = LatencyModel((model, _t2_model("other")))
    policy = make_policy(DEFAULT_POLICY, latency)
    alone = policy.decide([_queue(3, age=0.010), TaskQueue()], 1.0)
    assert isinstance(alone, Dispatch) and (alone.model, alone.exit, alone.batch) == (0, 1, 2)
    other = TaskQueue()
    other.push(99, 1.0 - 0.001, SLO)
    crowded = policy.decide([_queue(3, age=0.010), other], 1.0)
    assert isinstance(crowded, Dispatch) and (crowded.model, crowded.exit, crowded.batch) == (0, 1, 3)


def test_alone_splits_still_keep_the_max_batch_where_batching_pays() -> None:
    gpu = LatencyModel.from_profiles(paper_gpu_profiles(samples=20))
    for model in gpu.models:
        for e in range(len(model.exit_ids)):
            assert [model.batch_for(e, n, alone=True) for n in range(1, 11)] == list(range(1, 11))
