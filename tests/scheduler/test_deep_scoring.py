"""Deep queues (scoring_deep, and its copy in _quick.c): the default policy's decision at 1000+
queued tasks equals the per-task reference loop's, and the compiled decision equals the Python
one to the bit, over long runs of pushes, pops, drops and returns that extend, carry and rebase
the sums the queues keep."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import numpy as np
import pytest
from scheduler_support import agrees_with_loop

from edgeserve.profile import ProfileTable
from edgeserve.scheduler import LatencyModel, TaskQueue, Urgency
from edgeserve.scheduler.fast_scoring import SMALL_STATE, fast_candidates
from edgeserve.scheduler.guarded import GuardedStabilityPolicy, compiled_decide
from edgeserve.scheduler.queues import RUN_ANCHOR, RUN_FIELDS, RUN_PIVOT
from edgeserve.scheduler.reference import reference_candidates
from edgeserve.scheduler.scoring_deep import MAX_RUNS, deep_candidates
from edgeserve.scheduler.synthetic import paper_gpu_profiles

CPU = Path(__file__).parent / "data" / "cpu" / "t1"
SLO = 0.050


def _latency(n_models: int, cpu: bool = False) -> LatencyModel:
    tables = (
        [ProfileTable.load(CPU / f"digits-{s}.profile.json") for s in "sml"]
        if cpu
        else paper_gpu_profiles(20)
    )
    picked = [tables[i % 3] for i in range(n_models)]
    return LatencyModel.from_profiles(picked, names=[f"m{i}" for i in range(n_models)])


def _fill(rng: np.random.Generator, n_models: int, depth: int, now: float, max_age: float) -> list[TaskQueue]:
    """`depth` tasks over the models (some queues empty), ages up to max_age SLOs: FIFO by age."""
    queues = [TaskQueue(capacity=4) for _ in range(n_models)]
    share = rng.dirichlet(np.full(n_models, 0.7))
    share[rng.random(n_models) < 0.2] = 0.0  # empty queues
    share = share / share.sum() if share.sum() else np.full(n_models, 1.0 / n_models)
    for m, count in enumerate(rng.multinomial(depth, share).tolist()):
        for k, age in enumerate(np.sort(rng.uniform(0.0, max_age * SLO, count))[::-1].tolist()):
            queues[m].push(100_000 * m + k, now - age, SLO)
    return queues


def _cache(queue: TaskQueue, field: int, run: int = 0) -> float:
    """A field of the deep scorer's cache of one of `queue`'s runs (the oldest by default)."""
    return float(queue._runs[(queue._run_head + run) * RUN_FIELDS + field])


def _same(policy: GuardedStabilityPolicy, loop: GuardedStabilityPolicy, queues: list[TaskQueue], now: float):
    return agrees_with_loop(policy.decide(queues, now), loop, queues, now)


@pytest.mark.parametrize("n_models", [1, 3, 16])
@pytest.mark.parametrize("urgency", [Urgency(), Urgency("code")], ids=str)
def test_deep_decisions_equal_the_reference_on_random_states(n_models: int, urgency: Urgency) -> None:
    rng = np.random.default_rng(n_models)
    latency = _latency(n_models)
    policy = GuardedStabilityPolicy(latency, urgency)
    python = GuardedStabilityPolicy(latency, urgency, compiled=False)
    loop = GuardedStabilityPolicy(latency, urgency, scorer="loop")
    clipped = 0
    for _ in range(12):
        now = 1e4 + float(rng.uniform(0.0, 1e3))
        max_age = float(rng.choice([0.3, 1.0, 4.0, 40.0]))  # 4 and 40 SLOs: clipped tasks, many
        queues = _fill(rng, n_models, int(rng.choice([1000, 1500, 3000])), now, max_age)
        clipped += max_age > urgency.threshold
        _same(policy, loop, queues, now)
        assert policy.decide(queues, now) == python.decide(queues, now)  # to the bit
        candidates = fast_candidates(queues, now, latency, urgency, "safe")
        assert [(c.model, c.exit_pos, c.batch) for c in candidates] == [
            (c.model, c.exit_pos, c.batch)
            for c in reference_candidates(queues, now, latency, urgency, "safe")
        ]
    assert clipped


@pytest.mark.parametrize(
    ("n_models", "depth", "cpu"), [(1, 1200, False), (3, 1000, False), (3, 2000, True), (16, 1000, False)]
)
def test_a_long_run_of_pushes_and_pops_keeps_the_deep_decision_exact(
    n_models: int, depth: int, cpu: bool
) -> None:
    """A server's life in fast-forward: each round the decision (compiled, Python and the loop on the
    same queues), its batch popped, time moving on by it, arrivals pushed, now and then a lazy drop
    of the heads, a drop in the middle, a task put back, a queue emptied; some stretches so slow that
    tasks pass the clip. Over a few hundred deadlines of time the sums are extended, carried by
    compactions, rebased (their prefix dominates) and rebuilt (their pivot grows old)."""
    rng = np.random.default_rng(depth + n_models)
    latency = _latency(n_models, cpu)
    urgency = Urgency()
    policy = GuardedStabilityPolicy(latency, urgency)
    python = GuardedStabilityPolicy(latency, urgency, compiled=False)
    loop = GuardedStabilityPolicy(latency, urgency, scorer="loop")
    now = 5e4
    queues = _fill(rng, n_models, depth, now, 1.0)
    twin = copy.deepcopy(queues)  # the same life, decided in Python only: its sums built by Python
    next_id = 10**7
    anchors = pivots = 0
    for round_ in range(1500):
        before = [(_cache(q, RUN_PIVOT), _cache(q, RUN_ANCHOR)) for q in queues]
        # the loop is slow at depth: it checks every few rounds
        decision = _same(policy, loop, queues, now) if round_ % 8 == 0 else policy.decide(queues, now)
        assert python.decide(twin, now) == decision  # to the bit
        for queue, (pivot, anchor) in zip(queues, before, strict=True):
            pivots += _cache(queue, RUN_PIVOT) != pivot  # rebuilt
            anchors += (
                _cache(queue, RUN_PIVOT) == pivot and _cache(queue, RUN_ANCHOR) != anchor
            )  # rebased, or carried
        if decision is None:
            queues = _fill(rng, n_models, depth, now, 1.0)
            twin = copy.deepcopy(queues)
            continue
        slow = 40.0 if round_ % 50 == 49 else 1.0  # now and then a stall: heads pass the clip
        elapsed = decision.predicted_s * slow + SLO / 50  # and time between batches
        now += elapsed
        missing = depth - sum(map(len, queues)) + decision.batch
        arrivals = [
            (int(rng.integers(0, n_models)), at) for at in np.linspace(now - elapsed, now, missing + 1)[1:]
        ]
        event = rng.random() if round_ < 500 else 1.0  # then a quiet stretch: the sums only rebase
        m = int(rng.integers(0, n_models))
        for life in (queues, twin):
            life[decision.model].pop(decision.batch)
            for k, (owner, at) in enumerate(arrivals):
                life[owner].push(next_id + k, float(at), SLO)
            queue = life[m]
            if event < 0.1 and len(queue) > 20:  # lazy drop: the heads past their deadline
                late = int(np.searchsorted(queue.deadlines, now))
                queue.remove(queue.ids[: max(late, 1)].copy())
            elif event < 0.11 and len(queue) > 20:  # a drop in the middle
                queue.remove(queue.ids[len(queue) // 2 : len(queue) // 2 + 3].copy())
            elif event < 0.12 and len(queue) > 20:  # an offload failed: a task back in its place
                gone = queue.ids[5].copy()
                arrival = float(queue.arrivals[5])
                queue.remove([gone])
                queue.insert(int(gone), arrival, SLO)
            elif event < 0.125:  # a queue served empty
                queue.pop(len(queue))
        next_id += len(arrivals)
    assert anchors + pivots > 3, (anchors, pivots)  # carried, rebased, rebuilt


def test_the_sums_stay_exact_when_the_popped_prefix_dominates() -> None:
    """One queue, a task a millisecond for a long time, served as it comes: the popped tasks'
    weights grow e-fold per budget against the live ones'; the rebase keeps the live sum's digits."""
    latency = _latency(2)
    urgency = Urgency()
    queues = [TaskQueue(capacity=10**5), TaskQueue(capacity=10**5)]  # no compaction carries the sums
    now = 100.0
    for k in range(600):
        queues[0].push(k, now - 0.6 + k * 1e-3, SLO)
        queues[1].push(10_000 + k, now - 0.6 + k * 1e-3, SLO)
    anchors = set()
    for step in range(3000):
        deep = deep_candidates(queues, now, latency, urgency, "safe")
        if step % 25 == 0:
            reference = reference_candidates(queues, now, latency, urgency, "safe")
            for d, r in zip(deep, reference, strict=True):
                assert d.score == pytest.approx(r.score, rel=1e-11)
        anchors.add(_cache(queues[0], RUN_ANCHOR))
        for queue in queues:
            queue.pop(1)
            queue.push(20_000 + step, now, SLO)
        now += 1e-3
    assert len(anchors) > 2  # rebased (shift_down) as the popped prefix came to dominate


def test_time_moving_back_and_a_budget_change_rebuild_the_sums() -> None:
    latency = _latency(1)
    urgency = Urgency("code")
    queue = TaskQueue()
    for k in range(SMALL_STATE + 50):
        queue.push(k, 10.0 + k * 1e-4, SLO)
    for now in (10.2, 10.1, 10.25, 10.05):  # a state looked at out of order (tests, the simulator)
        reference = reference_candidates([queue], now, latency, urgency)
        assert deep_candidates([queue], now, latency, urgency)[0].score == pytest.approx(
            reference[0].score, rel=1e-11
        )
    while queue:
        queue.pop(min(len(queue), 7))
    for k in range(SMALL_STATE + 50):  # emptied, then filled with another budget
        queue.push(k, 20.0 + k * 1e-4, 2 * SLO)
    reference = reference_candidates([queue], 20.05, latency, urgency)
    assert deep_candidates([queue], 20.05, latency, urgency)[0].score == pytest.approx(
        reference[0].score, rel=1e-11
    )


@pytest.mark.skipif(compiled_decide is None, reason="edgeserve.scheduler._quick is not built")
def test_the_compiled_path_takes_every_deep_state_of_a_few_runs_per_queue() -> None:
    latency = _latency(16)
    policy = GuardedStabilityPolicy(latency)
    python = GuardedStabilityPolicy(latency, compiled=False)
    rng = np.random.default_rng(2)
    for depth in (10, 300, 3000):  # 16 models: past the plain scorer's size even with 10 tasks
        queues = _fill(rng, 16, depth, 100.0, 1.0)
        assert policy.compiled_decide(queues, 100.0) is not None
    queues[3].push(99, 100.0, SLO / 3)  # a request with its own deadline: a second run
    decision = policy.compiled_decide(copy.deepcopy(queues), 100.0)
    assert decision is not None and decision == python.decide(queues, 100.0)
    for k in range(MAX_RUNS):  # budgets interleaved past MAX_RUNS runs: numpy's matrix decides
        queues[3].push(100 + k, 100.0, SLO / (2 + k % 2))
    assert policy.compiled_decide(queues, 100.0) is None
    assert policy.decide(queues, 100.0) is not None


def test_a_vanishing_budget_in_a_deep_state_is_clipped_without_overflow() -> None:
    latency = _latency(3)
    now = 100.0
    queues = [TaskQueue() for _ in range(3)]
    queues[0].push(0, now - 1e-3, 5e-324)
    for k in range(400):
        queues[1].push(10 + k, now - 0.04 + k * 1e-4, SLO)
    for form in ("code", "paper"):
        urgency = Urgency(form)
        deep = deep_candidates(queues, now, latency, urgency)
        assert all(math.isfinite(c.score) for c in deep)
        reference = reference_candidates(queues, now, latency, urgency)
        assert [c.score for c in deep] == pytest.approx([c.score for c in reference], rel=1e-11)


@pytest.mark.skipif(compiled_decide is None, reason="edgeserve.scheduler._quick is not built")
@pytest.mark.parametrize("batch_cap", [None, 3])
@pytest.mark.parametrize("batch_rule", ["lookahead", "max"])
@pytest.mark.parametrize("urgency", [Urgency(), Urgency("code"), Urgency("paper", clip=2.0)], ids=str)
def test_the_compiled_deep_decision_is_pythons_to_the_bit(
    batch_cap: int | None, batch_rule: str, urgency: Urgency
) -> None:
    rng = np.random.default_rng(17)
    for n_models, cpu in ((3, True), (6, True), (16, False)):
        latency = _latency(n_models, cpu)
        policy = GuardedStabilityPolicy(latency, urgency, batch_cap=batch_cap, batch_rule=batch_rule)
        python = GuardedStabilityPolicy(
            latency, urgency, batch_cap=batch_cap, batch_rule=batch_rule, compiled=False
        )
        for _ in range(15):
            now = 300.0 + float(rng.uniform(0.0, 10.0))
            queues = _fill(
                rng, n_models, int(rng.choice([250, 1000])), now, float(rng.choice([0.2, 1.0, 5.0]))
            )
            twin = copy.deepcopy(queues)
            decision = policy.compiled_decide(queues, now)
            assert decision is not None and decision == python.decide(twin, now)
