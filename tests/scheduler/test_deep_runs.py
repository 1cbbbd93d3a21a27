"""Deep queues made of a few runs of one budget each (scoring_deep run by run, and its copy in
_quick.c): what a server's queues hold for about a deadline after its planned budget steps (the
old budget's tasks first, then the new one's), and requests with their own deadlines. The
decision equals the per-task reference loop's, the compiled one Python's to the bit, over random
states and long lives that cross run boundaries; the queue's runs stay what its budgets say."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from scheduler_support import agrees_with_loop

from edgeserve.scheduler import LatencyModel, TaskQueue, Urgency
from edgeserve.scheduler.fast_scoring import fast_candidates
from edgeserve.scheduler.guarded import GuardedStabilityPolicy, compiled_decide
from edgeserve.scheduler.queues import RUN_CACHED, RUN_FIELDS
from edgeserve.scheduler.reference import reference_candidates
from edgeserve.scheduler.scoring_deep import MAX_RUNS, deep_candidates
from edgeserve.scheduler.synthetic import paper_gpu_profiles

SLO = 0.050
STEP = 0.2e-3  # the server's planned budget moves in 0.2 ms steps


def _latency(n_models: int) -> LatencyModel:
    tables = paper_gpu_profiles(20)
    return LatencyModel.from_profiles(
        [tables[i % 3] for i in range(n_models)], names=[f"m{i}" for i in range(n_models)]
    )


def _runs_of(queue: TaskQueue) -> list[tuple[int, int, float]]:
    """The runs the queue's budgets make (what TaskQueue.runs must say)."""
    budgets = queue.budgets.tolist()
    found: list[tuple[int, int, float]] = []
    for i, b in enumerate(budgets):
        if found and found[-1][2] == b:
            found[-1] = (found[-1][0], i + 1, b)
        else:
            found.append((i, i + 1, b))
    return found


def _budgets(rng: np.random.Generator, runs: int, wide: bool) -> list[float]:
    """`runs` budgets, consecutive ones different: the server's 0.2 ms steps, or (wide) requests'
    own deadlines, some much tighter than the older tasks' (their deadlines come first)."""
    out = [SLO]
    while len(out) < runs:
        if wide:
            b = SLO * float(rng.choice([0.2, 0.4, 0.6, 1.0, 1.5]))
        else:
            b = out[-1] + STEP * float(rng.choice([-2, -1, 1]))
        if b != out[-1]:
            out.append(b)
    return out


def _fill(rng: np.random.Generator, n_models: int, depth: int, now: float, max_age: float) -> list[TaskQueue]:
    """`depth` tasks over the models (some queues empty), each queue 1-4 runs of one budget."""
    queues = [TaskQueue(capacity=4) for _ in range(n_models)]
    share = rng.dirichlet(np.full(n_models, 0.7))
    share[rng.random(n_models) < 0.2] = 0.0
    share = share / share.sum() if share.sum() else np.full(n_models, 1.0 / n_models)
    for m, count in enumerate(rng.multinomial(depth, share).tolist()):
        if not count:
            continue
        runs = int(rng.integers(1, 5))
        budgets = _budgets(rng, runs, wide=bool(rng.random() < 0.4))
        cuts = (
            sorted(rng.choice(np.arange(1, count), min(runs, count) - 1, replace=False).tolist())
            if count > 1
            else []
        )
        ages = np.sort(rng.uniform(0.0, max_age * SLO, count))[::-1].tolist()
        r = 0
        for k, age in enumerate(ages):
            while r < len(cuts) and k >= cuts[r]:
                r += 1
            queues[m].push(100_000 * m + k, now - age, budgets[r])
    return queues


TAKEN = {"compiled": 0, "mixed": 0}  # what the compiled path decided (the tests check it took its share)


def _decide(policy: GuardedStabilityPolicy, queues: list[TaskQueue], now: float):
    """policy.decide, counting the decisions the compiled path took (on queues mixing budgets)."""
    got = policy.compiled_decide(queues, now)
    if got is not None:
        TAKEN["compiled"] += 1
        TAKEN["mixed"] += any(q.run_count > 1 for q in queues)
        return got
    return policy._decide(queues, now)


def _check(policy, python, loop, queues, now, twin=None):
    """The compiled decision is Python's to the bit (on a twin whose sums Python keeps), and the
    reference loop's (model, exit, batch, predicted time)."""
    twin = copy.deepcopy(queues) if twin is None else twin
    got = _decide(policy, queues, now)
    assert got == python.decide(twin, now)
    return agrees_with_loop(got, loop, queues, now)


@pytest.mark.parametrize("n_models", [3, 16])
@pytest.mark.parametrize("urgency", [Urgency(), Urgency("code")], ids=str)
def test_decisions_on_queues_of_a_few_runs_equal_the_reference(n_models: int, urgency: Urgency) -> None:
    rng = np.random.default_rng(40 + n_models)
    latency = _latency(n_models)
    policy = GuardedStabilityPolicy(latency, urgency)
    python = GuardedStabilityPolicy(latency, urgency, compiled=False)
    loop = GuardedStabilityPolicy(latency, urgency, scorer="loop")
    several = compiled = 0
    for _ in range(12):
        now = 1e4 + float(rng.uniform(0.0, 1e3))
        max_age = float(rng.choice([0.3, 1.0, 4.0, 40.0]))
        queues = _fill(rng, n_models, int(rng.choice([1000, 1500, 3000])), now, max_age)
        several += max(q.run_count for q in queues) > 1
        compiled += policy.compiled_decide(copy.deepcopy(queues), now) is not None
        _check(policy, python, loop, queues, now)
        candidates = fast_candidates(queues, now, latency, urgency, "safe")
        reference = reference_candidates(queues, now, latency, urgency, "safe")
        assert [(c.model, c.exit_pos, c.batch, c.eligible) for c in candidates] == [
            (c.model, c.exit_pos, c.batch, c.eligible) for c in reference
        ]
        assert [c.score for c in candidates] == pytest.approx([c.score for c in reference], rel=1e-9)
    assert several >= 10
    assert compiled_decide is None or compiled == 12  # the compiled path takes them all


def test_the_batchs_tightest_deadline_may_be_in_a_later_run() -> None:
    """A run of tight requests behind older tasks with a generous budget: the batch spans both, and
    its exit must meet the later run's deadlines (earlier than the head's); the look-ahead sorts
    each batch's deadlines. Scored run by run (deep), compiled and in Python, as the loop does."""
    latency = _latency(3)
    urgency = Urgency()
    policy = GuardedStabilityPolicy(latency, urgency)
    python = GuardedStabilityPolicy(latency, urgency, compiled=False)
    loop = GuardedStabilityPolicy(latency, urgency, scorer="loop")
    now = 100.0
    exits = set()
    taken = TAKEN["mixed"]
    for tight in (0.004, 0.006, 0.009, 0.012, 0.02):
        queues = [TaskQueue() for _ in range(3)]
        for k in range(6):  # generous: due in ~38 ms
            queues[0].push(k, now - 0.012 + k * 1e-4, SLO)
        for k in range(60):  # tight, behind them: due in `tight`
            queues[0].push(100 + k, now - 1e-4 + k * 1e-6, tight)
        for m in (1, 2):
            for k in range(150):
                queues[m].push(1000 * m + k, now - 0.03 + k * 2e-4, SLO)
        assert queues[0].run_count == 2 and queues[0].deadlines[:10].argmin() == 6
        decision = _check(policy, python, loop, queues, now)
        candidates = deep_candidates(queues, now, latency, urgency, "safe")
        reference = reference_candidates(queues, now, latency, urgency, "safe")
        assert [(c.exit_pos, c.eligible) for c in candidates] == [(c.exit_pos, c.eligible) for c in reference]
        exits.add(candidates[0].exit_pos)
        assert decision is not None
    assert len(exits) > 1  # the later run's deadline chose the exit
    assert compiled_decide is None or TAKEN["mixed"] - taken == 5  # compiled, run by run


@pytest.mark.parametrize(("n_models", "depth"), [(3, 1000), (16, 1000), (3, 3000)])
def test_a_long_life_across_run_boundaries_keeps_the_decision_exact(n_models: int, depth: int) -> None:
    """A server's life in fast-forward: each round the decision (compiled, Python on a twin and, every
    few rounds, the loop), its batch popped, time moving on by it, arrivals pushed with the server's
    planned budget (stepping by 0.2 ms now and then: for about a deadline each queue holds two or
    three runs), now and then a request with its own deadline, a lazy drop of the heads, a drop in
    the middle, a task put back, a queue emptied; stalls in which heads pass the clip. Runs start,
    are popped, merge (a drop between two runs of one budget) and the queues go back to one budget."""
    rng = np.random.default_rng(depth + 7 * n_models)
    latency = _latency(n_models)
    urgency = Urgency()
    policy = GuardedStabilityPolicy(latency, urgency)
    python = GuardedStabilityPolicy(latency, urgency, compiled=False)
    loop = GuardedStabilityPolicy(latency, urgency, scorer="loop")
    now = 5e4
    planned = [SLO] * n_models
    queues = [TaskQueue(capacity=4) for _ in range(n_models)]
    for m in range(n_models):
        for k, at in enumerate(np.linspace(now - SLO, now, depth // n_models).tolist()):
            queues[m].push(m * 10**6 + k, at, SLO)
    twin = copy.deepcopy(queues)
    next_id = 10**8
    most = back_to_one = interleaved = 0
    taken, mixed = TAKEN["compiled"], TAKEN["mixed"]
    mixed_before = [False] * n_models
    over = 0
    for round_ in range(900):
        over += max(q.run_count for q in queues) > MAX_RUNS
        if round_ % 6 == 0:  # the loop is slow at depth: it checks every few rounds
            decision = _check(policy, python, loop, queues, now, twin)
        else:
            decision = _decide(policy, queues, now)
            assert python.decide(twin, now) == decision  # to the bit
        for m, queue in enumerate(queues):
            assert queue.runs() == _runs_of(queue)
            assert queue.runs() == twin[m].runs()
            most = max(most, queue.run_count)
            interleaved += queue.run_count > MAX_RUNS
            back_to_one += mixed_before[m] and queue.run_count == 1
            mixed_before[m] = queue.run_count > 1
        if decision is None:
            break
        slow = 40.0 if round_ % 60 == 59 else 1.0
        elapsed = decision.predicted_s * slow + SLO / 100
        now += elapsed
        missing = depth - sum(map(len, queues)) + decision.batch
        arrivals = [
            (int(rng.integers(0, n_models)), at) for at in np.linspace(now - elapsed, now, missing + 1)[1:]
        ]
        for m in range(n_models):  # the lag moved: the planned budget steps
            if rng.random() < 0.12 / n_models:
                planned[m] = SLO + STEP * float(rng.integers(-3, 2))
        event = rng.random()
        m = int(rng.integers(0, n_models))
        own = rng.random() < 0.06 / n_models  # some requests with their own deadlines
        if round_ in (300, 600):  # a client's burst of them into one queue: interleaved, numpy's matrix
            arrivals = [(0, at) for _, at in arrivals]
        for life in (queues, twin):
            life[decision.model].pop(decision.batch)
            for k, (owner, at) in enumerate(arrivals):
                budget = planned[owner]
                if (own and k % 3 == 0) or (round_ in (300, 600) and k % 2):
                    budget = SLO * (0.5 + 0.1 * (k % 5))
                life[owner].push(next_id + k, float(at), budget)
            queue = life[m]
            if event < 0.08 and len(queue) > 20:  # lazy drop: the heads past their deadline
                late = int(np.searchsorted(queue.deadlines, now))
                queue.remove(queue.ids[: max(late, 1)].copy())
            elif event < 0.1 and len(queue) > 20:  # a drop in the middle (maybe a whole run)
                start, stop, _ = (
                    queue.runs()[-2] if queue.run_count > 2 else (len(queue) // 2, len(queue) // 2 + 3, 0)
                )
                queue.remove(queue.ids[start:stop].copy())
            elif event < 0.11 and len(queue) > 20:  # an offload failed: a task back in its place
                gone = queue.ids[5].copy()
                arrival, budget = float(queue.arrivals[5]), float(queue.budgets[5])
                queue.remove([gone])
                queue.insert(int(gone), arrival, budget)
            elif event < 0.115:  # a queue served empty
                queue.pop(len(queue))
        next_id += len(arrivals)
    assert most >= 3 and back_to_one > 5 and interleaved  # every kind of queue was met
    if compiled_decide is not None:  # the compiled path took every decision but past MAX_RUNS runs
        assert TAKEN["compiled"] - taken == 900 - over and TAKEN["mixed"] - mixed > 200, (TAKEN, over)


def test_runs_start_at_push_and_go_at_pop() -> None:
    queue = TaskQueue(capacity=4)
    assert queue.run_count == 0 and queue.uniform_budget is None and queue.runs() == []
    for k in range(5):
        queue.push(k, float(k), 0.05)
    assert queue.run_count == 1 and queue.uniform_budget == 0.05
    for k in range(5, 9):
        queue.push(k, float(k), 0.0498)  # the planned budget stepped
    queue.push(9, 9.0, 0.05)
    assert queue.runs() == [(0, 5, 0.05), (5, 9, 0.0498), (9, 10, 0.05)] and queue.uniform_budget is None
    queue.pop(3)
    assert queue.runs() == [(0, 2, 0.05), (2, 6, 0.0498), (6, 7, 0.05)]
    queue.pop(2)  # the oldest run is gone
    assert queue.runs() == [(0, 4, 0.0498), (4, 5, 0.05)]
    queue.remove([5, 6, 7, 8])  # the middle: the runs are read again
    assert queue.runs() == [(0, 1, 0.05)] and queue.uniform_budget == 0.05
    queue.insert(100, 8.5, 0.03)
    assert queue.runs() == [(0, 1, 0.03), (1, 2, 0.05)]
    queue.pop(1)
    assert queue.runs() == [(0, 1, 0.05)] and queue.uniform_budget == 0.05  # back to one budget
    queue.pop(1)
    assert queue.run_count == 0
    for k in range(1000):  # many runs, compactions and growth: push and pop stay O(1) amortised
        queue.push(k, 10.0 + k, 0.05 if (k // 7) % 2 else 0.04)
        if k % 3 == 0:
            queue.pop(1)
    assert queue.runs() == _runs_of(queue)
    assert queue._runs.size <= 8 * RUN_FIELDS * (queue.run_count + 1)


def test_a_run_keeps_its_sums_when_an_older_run_is_popped() -> None:
    """Each run's sums are its own: popping the older run, or a compaction, does not rebuild them."""
    latency = _latency(2)
    urgency = Urgency()
    queues = [TaskQueue(capacity=8), TaskQueue()]
    now = 10.0
    for k in range(300):
        queues[0].push(k, now - 0.04 + k * 1e-4, SLO if k < 150 else SLO - STEP)
        queues[1].push(1000 + k, now - 0.04 + k * 1e-4, SLO)
    deep_candidates(queues, now, latency, urgency)
    second = queues[0]._run_head + 1
    pivot = float(queues[0]._runs[second * RUN_FIELDS + 3])
    assert queues[0]._runs[second * RUN_FIELDS + RUN_CACHED] == SLO - STEP
    queues[0].pop(160)
    assert queues[0].run_count == 1
    candidates = deep_candidates(queues, now, latency, urgency)
    assert float(queues[0]._runs[queues[0]._run_head * RUN_FIELDS + 3]) == pivot  # extended, not rebuilt
    reference = reference_candidates(queues, now, latency, urgency)
    assert [c.score for c in candidates] == pytest.approx([c.score for c in reference], rel=1e-11)
