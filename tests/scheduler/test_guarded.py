"""The default policy (stability-safe with the look-ahead guard) and the workload generators."""

from __future__ import annotations

import numpy as np
import pytest

from edgeserve.scheduler import DEFAULT_POLICY, Dispatch, LatencyModel, PolicyOptions, TaskQueue, make_policy
from edgeserve.scheduler.guarded import doomed, none_doomed, queue_chunks, unavoidable
from edgeserve.scheduler.synthetic import paper_gpu_profiles
from edgeserve.scheduler.workloads import diurnal, mmpp, spike

SLO = 0.050


@pytest.fixture(scope="module")
def latency() -> LatencyModel:
    return LatencyModel.from_profiles(paper_gpu_profiles(samples=20))


def _state(ages: dict[int, list[float]], now: float = 1.0) -> list[TaskQueue]:
    queues = [TaskQueue() for _ in range(3)]
    task = 0
    for m, model_ages in ages.items():
        for age in sorted(model_ages, reverse=True):
            queues[m].push(task, now - age, SLO)
            task += 1
    return queues


def test_the_guard_serves_first_the_task_that_the_stability_pick_would_doom(latency: LatencyModel) -> None:
    # ResNet152 holds a full batch with 20 ms of slack; ResNet50's one task has 3 ms: only serving it
    # first saves it. The paper's score and the one-step safe rule serve ResNet152 (fewer tasks left).
    queues = _state({0: [0.047], 2: [0.030] * 10})
    assert make_policy("stability", latency).decide(queues, 1.0).model == 2
    assert make_policy("stability-safe-exit", latency).decide(queues, 1.0).model == 2
    decision = make_policy("stability-safe", latency).decide(queues, 1.0)
    assert isinstance(decision, Dispatch) and (decision.model, decision.batch) == (0, 1)
    assert decision.exit >= 1 and decision.predicted_s <= 0.003  # the deepest exit that still fits
    chunks = queue_chunks(queues, latency, None)
    assert doomed(chunks, 2, latency.models[2].latency(3, 10), 1.0) == 1
    assert doomed(chunks, 0, decision.predicted_s, 1.0) == 0
    assert unavoidable(chunks, 1.0) == 0


def test_below_saturation_the_default_decides_as_stability_safe_exit(latency: LatencyModel) -> None:
    rng = np.random.default_rng(3)
    guarded, plain = make_policy(DEFAULT_POLICY, latency), make_policy("stability-safe-exit", latency)
    for _ in range(200):
        ages = {m: list(rng.uniform(0.0, 0.02, rng.integers(0, 12))) for m in range(3)}
        queues = _state(ages)
        a, b = guarded.decide(queues, 1.0), plain.decide(queues, 1.0)
        assert (a is None and b is None) or (a.model, a.exit, a.batch) == (b.model, b.exit, b.batch)


def test_the_quick_test_that_nothing_is_doomed_never_says_so_wrongly(latency: LatencyModel) -> None:
    rng = np.random.default_rng(11)
    said = 0
    for _ in range(500):
        queues = [TaskQueue() for _ in range(3)]
        for m, queue in enumerate(queues):
            mixed = rng.random() < 0.3  # requests carrying their own deadlines
            for k, age in enumerate(sorted(rng.uniform(0.0, 0.03, rng.integers(0, 20)), reverse=True)):
                queue.push(100 * m + k, 1.0 - age, SLO * (rng.choice([0.5, 1.0, 2.0]) if mixed else 1.0))
        chunks = queue_chunks(queues, latency, None)
        for m in range(3):
            first = latency.models[m].latency(int(rng.integers(0, 4)), int(rng.integers(1, 11)))
            if none_doomed(queues, latency, None, first, 1.0):
                said += 1
                assert doomed(chunks, m, first, 1.0) == 0
    assert 100 < said < 1500  # both answers are exercised


def test_fast_and_loop_scorers_give_the_default_the_same_decisions(latency: LatencyModel) -> None:
    rng = np.random.default_rng(5)
    fast = make_policy(DEFAULT_POLICY, latency, PolicyOptions(scorer="fast"))
    loop = make_policy(DEFAULT_POLICY, latency, PolicyOptions(scorer="loop"))
    for _ in range(200):
        queues = _state({m: list(rng.uniform(0.0, 0.075, rng.integers(0, 15))) for m in range(3)})
        a, b = fast.decide(queues, 1.0), loop.decide(queues, 1.0)
        assert (a is None and b is None) or (a.model, a.exit, a.batch) == (b.model, b.exit, b.batch)


def test_the_paper_policy_is_unchanged_and_every_name_is_still_accepted() -> None:
    from edgeserve.scheduler import POLICIES
    from edgeserve.scheduler.stability import StabilityPolicy

    lat = LatencyModel.from_profiles(paper_gpu_profiles(samples=20))
    paper = make_policy("stability", lat)
    assert isinstance(paper, StabilityPolicy) and paper.exit_rule == "adaptive" and paper.batch_cap is None
    assert DEFAULT_POLICY == "stability-safe" and {"stability-safe", "stability-protective"} <= set(POLICIES)


@pytest.mark.parametrize(
    "make",
    [
        lambda r: mmpp(r, 200.0, 1, shared=True),
        lambda r: mmpp(r, 200.0, 1, shared=False),
        lambda r: diurnal(r, 200.0, 1),
    ],
)
def test_generators_keep_the_mean_rate_of_every_model(make) -> None:
    rates = [30.0, 10.0]
    trace = make(rates)
    assert np.all(np.diff(trace.times) >= 0) and trace.times.max() < 200.0
    for m, rate in enumerate(rates):
        observed = (trace.models == m).sum() / 200.0
        assert observed == pytest.approx(rate, rel=0.15)


def test_shared_bursts_hit_every_model_at_once_and_independent_ones_do_not() -> None:
    def correlation(trace) -> float:
        counts = [np.histogram(trace.times[trace.models == m], bins=400, range=(0, 100))[0] for m in range(2)]
        return float(np.corrcoef(counts)[0, 1])

    assert correlation(mmpp([50.0, 50.0], 100.0, 2, shared=True)) > 0.5
    assert abs(correlation(mmpp([50.0, 50.0], 100.0, 2, shared=False))) < 0.2


def test_spike_triples_the_rate_inside_its_window_only() -> None:
    trace = spike([100.0], 100.0, 4, factor=3.0, start_frac=0.4, length_frac=0.2)
    inside = ((trace.times >= 40) & (trace.times < 60)).sum() / 20.0
    outside = ((trace.times < 40) | (trace.times >= 60)).sum() / 80.0
    assert inside / outside == pytest.approx(3.0, rel=0.1)
