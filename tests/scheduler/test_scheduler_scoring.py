"""The fast stability scorer (every method) agrees with the per-task reference loop."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgeserve.scheduler.candidates import pick_min
from edgeserve.scheduler.fast_scoring import fast_candidates
from edgeserve.scheduler.latency import LatencyModel, ModelLatency
from edgeserve.scheduler.queues import RUN_CACHED, RUN_FIELDS, TaskQueue
from edgeserve.scheduler.reference import reference_candidates
from edgeserve.scheduler.stability import StabilityPolicy
from edgeserve.scheduler.urgency import Urgency


def _random_latency(rng: np.random.Generator, n_models: int) -> LatencyModel:
    models = []
    for m in range(n_models):
        n_exits = int(rng.integers(1, 5))  # models may have different exit counts
        max_batch = int(rng.integers(1, 11))
        per_exit = np.sort(rng.uniform(0.5e-3, 20e-3, n_exits))
        growth = 1.0 + np.cumsum(rng.uniform(0.0, 0.2, max_batch)) - rng.uniform(0.0, 0.2)
        seconds = per_exit[:, None] * growth[None, :]
        models.append(
            ModelLatency(
                f"m{m}", tuple(f"e{j}" for j in range(n_exits)), tuple(range(n_exits)), max_batch, seconds
            )
        )
    return LatencyModel(tuple(models))


def _random_queues(
    rng: np.random.Generator, n_models: int, n_tasks: int, mixed_budgets: bool, now: float
) -> list[TaskQueue]:
    slo = rng.uniform(0.01, 0.2, n_models)
    queues = [TaskQueue() for _ in range(n_models)]
    ages = np.sort(rng.uniform(0.0, 4.0 * slo.max(), n_tasks))[::-1]  # oldest first: FIFO pushes
    owners = rng.integers(0, n_models, n_tasks)
    for k, (age, m) in enumerate(zip(ages, owners, strict=True)):
        budget = slo[m] * (rng.choice([0.5, 1.0, 3.0]) if mixed_budgets else 1.0)
        queues[m].push(k, now - float(age), float(budget))
    return queues


def _assert_same(reference: list, fast: list) -> None:
    assert [(c.model, c.exit_pos, c.batch) for c in fast] == [
        (c.model, c.exit_pos, c.batch) for c in reference
    ]
    for r, f in zip(reference, fast, strict=True):
        assert f.delta_s == r.delta_s
        assert f.score == pytest.approx(r.score, rel=1e-9, abs=0)
    if reference:
        assert pick_min([c.score for c in fast]) == pick_min([c.score for c in reference])


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n_models=st.integers(1, 6),
    n_tasks=st.integers(0, 120),
    form=st.sampled_from(["code", "paper"]),
    clip=st.sampled_from([2.0, 10.0, 1e3]),
    exit_rule=st.sampled_from(["adaptive", "final", "shallowest", "protective", "safe"]),
    batch_cap=st.sampled_from([None, 1, 3]),
)
def test_fast_methods_match_the_loop_on_random_uniform_budget_states(
    seed: int, n_models: int, n_tasks: int, form: str, clip: float, exit_rule: str, batch_cap: int | None
) -> None:
    rng = np.random.default_rng(seed)
    now = float(rng.uniform(0.0, 1e5))  # monotonic clocks can be large
    latency = _random_latency(rng, n_models)
    queues = _random_queues(rng, n_models, n_tasks, mixed_budgets=False, now=now)
    urgency = Urgency(form, clip)
    reference = reference_candidates(queues, now, latency, urgency, exit_rule, batch_cap)
    for method in ("auto", "python", "deep", "numpy-factorised", "numpy-direct"):
        _assert_same(reference, fast_candidates(queues, now, latency, urgency, exit_rule, batch_cap, method))


@settings(max_examples=80, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n_models=st.integers(1, 5),
    n_tasks=st.integers(1, 100),
    form=st.sampled_from(["code", "paper"]),
)
def test_fast_scorer_falls_back_correctly_when_requests_carry_their_own_deadlines(
    seed: int, n_models: int, n_tasks: int, form: str
) -> None:
    rng = np.random.default_rng(seed)
    now = 50.0
    latency = _random_latency(rng, n_models)
    queues = _random_queues(rng, n_models, n_tasks, mixed_budgets=True, now=now)
    urgency = Urgency(form, 10.0)
    reference = reference_candidates(queues, now, latency, urgency)
    _assert_same(reference, fast_candidates(queues, now, latency, urgency, method="auto"))
    _assert_same(reference, fast_candidates(queues, now, latency, urgency, method="numpy-direct"))


def test_factorised_methods_refuse_mixed_budgets_instead_of_answering_wrong() -> None:
    rng = np.random.default_rng(3)
    latency = _random_latency(rng, 2)
    queues = [TaskQueue(), TaskQueue()]
    queues[0].push(0, 0.0, 0.05)
    queues[0].push(1, 0.01, 0.5)
    with pytest.raises(ValueError, match="mixes deadline budgets"):
        fast_candidates(queues, 0.02, latency, Urgency(), method="python")


def test_large_state_uses_the_deep_scorer_and_still_matches_the_loop() -> None:
    rng = np.random.default_rng(11)
    latency = _random_latency(rng, 16)
    queues = _random_queues(rng, 16, 1000, mixed_budgets=False, now=100.0)
    reference = reference_candidates(queues, 100.0, latency, Urgency())
    cached = [q._runs[q._run_head * RUN_FIELDS + RUN_CACHED] for q in queues if q]
    assert all(c != c for c in cached)  # nothing cached yet
    _assert_same(reference, fast_candidates(queues, 100.0, latency, Urgency()))
    cached = [q._runs[q._run_head * RUN_FIELDS + RUN_CACHED] for q in queues if q]
    assert cached == [q.uniform_budget for q in queues if q]  # auto took scoring_deep
    _assert_same(reference, fast_candidates(queues, 100.0, latency, Urgency(), method="numpy-factorised"))


def test_without_clip_all_scorers_agree_even_when_scores_overflow() -> None:
    rng = np.random.default_rng(5)
    latency = _random_latency(rng, 3)
    queues = [TaskQueue() for _ in range(3)]
    queues[0].push(0, 0.0, 0.01)  # 100 s old against a 10 ms budget: e^(10^4) overflows
    queues[1].push(1, 99.9, 0.05)
    urgency = Urgency("code", clip=math.inf)
    reference = reference_candidates(queues, 100.0, latency, urgency)
    fast = fast_candidates(queues, 100.0, latency, urgency)
    assert [c.score for c in fast] == [c.score for c in reference]
    assert pick_min([c.score for c in fast]) == pick_min([c.score for c in reference])


def test_stability_policy_with_loop_scorer_decides_like_the_fast_one() -> None:
    rng = np.random.default_rng(9)
    latency = _random_latency(rng, 4)
    for trial in range(60):
        queues = _random_queues(rng, 4, int(rng.integers(1, 60)), mixed_budgets=trial % 2 == 1, now=10.0)
        rule = ("adaptive", "safe", "protective")[trial % 3]
        fast = StabilityPolicy(latency, exit_rule=rule, scorer="fast").decide(queues, 10.0)
        loop = StabilityPolicy(latency, exit_rule=rule, scorer="loop").decide(queues, 10.0)
        assert fast is not None and loop is not None
        assert (fast.model, fast.exit, fast.batch) == (loop.model, loop.exit, loop.batch)


def test_near_ties_go_to_the_lower_model_index() -> None:
    assert pick_min([1.0, 1.0 - 1e-13, 2.0]) == 0
    assert pick_min([1.0, 0.5, 0.5]) == 1
    assert pick_min([math.inf, math.inf]) == 0


@pytest.mark.parametrize("form", ["code", "paper"])
@pytest.mark.parametrize("budget", [1e-280, 1e-300, 5e-324])
def test_a_vanishing_budget_is_scored_clipped_by_every_method_without_overflow(
    form: str, budget: float
) -> None:
    """A request may carry any positive deadline (a fuzzer sent 1e-283 ms): delta / budget is then
    astronomically large, and e^shift must never be evaluated where its term is zero."""
    rng = np.random.default_rng(4)
    latency = _random_latency(rng, 3)
    now = 100.0
    queues = [TaskQueue(), TaskQueue(), TaskQueue()]
    queues[0].push(0, now - 1e-3, budget)
    for i in range(5):
        queues[1].push(10 + i, now - 0.01 * (5 - i), 0.05)
    urgency = Urgency(form, 10.0)
    reference = reference_candidates(queues, now, latency, urgency)
    for method in ("auto", "python", "deep", "numpy-factorised", "numpy-direct"):
        fast = fast_candidates(queues, now, latency, urgency, method=method)
        assert all(math.isfinite(c.score) for c in fast), method
        _assert_same(reference, fast)
