"""The compiled decision (scheduler/_quick.c) against the Python path it replaces: the same
Dispatch, to the bit, on random states (one budget per queue, and budgets mixed); None (the Python
path decides) wherever it does not apply."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from edgeserve.profile import ProfileTable
from edgeserve.scheduler import Dispatch, LatencyModel, TaskQueue, Urgency
from edgeserve.scheduler.fast_scoring import SMALL_LOOP, SMALL_STATE
from edgeserve.scheduler.guarded import GuardedStabilityPolicy, compiled_decide
from edgeserve.scheduler.scoring_deep import MAX_RUNS
from edgeserve.scheduler.synthetic import paper_gpu_profiles

CPU = Path(__file__).parent / "data" / "cpu" / "t1"
needs_compiled = pytest.mark.skipif(compiled_decide is None, reason="edgeserve.scheduler._quick is not built")


def test_the_compiled_path_is_built_wherever_a_c_compiler_is() -> None:
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler on this machine: the Python path decides")
    assert compiled_decide is not None, "reinstall (`pip install -e .`, `make` does it) to build _quick.c"


def _latencies() -> list[LatencyModel]:
    gpu = paper_gpu_profiles(samples=20)
    cpu = [ProfileTable.load(CPU / f"digits-{s}.profile.json") for s in "sml"]
    return [
        LatencyModel.from_profiles(gpu),
        LatencyModel.from_profiles(cpu),
        LatencyModel.from_profiles([gpu[2]]),  # one model: no guard
        LatencyModel.from_profiles(cpu * 2, names=[f"m{i}" for i in range(6)]),  # six queues
    ]


def _queues(rng: np.random.Generator, latency: LatencyModel, now: float) -> list[TaskQueue]:
    """Queues from idle to far past their deadlines; some empty. Each has one budget (its own),
    except that now and then some tasks bring their own (a request's deadline_ms, a camera's
    capture time), a few of them tighter than older tasks'. Arrivals on a coarse grid, now and
    then, so that deadlines tie within and across queues."""
    slowest = max(float(m.seconds.max()) for m in latency.models)
    grid = slowest * float(rng.choice([0.0, 0.5]))
    own = float(rng.choice([0.0, 0.0, 0.3]))  # the share of tasks with a budget of their own
    queues = []
    for m in range(len(latency.models)):
        queue = TaskQueue(capacity=4)
        budget = slowest * float(rng.choice([0.3, 1.0, 2.5, 8.0]))
        size = int(rng.choice([0, 1, 3, 9, 25]))
        ages = rng.uniform(0.0, budget * rng.choice([0.2, 1.0, 3.0]), size)
        if grid:
            ages = np.round(ages / grid) * grid
        for k, age in enumerate(sorted(ages, reverse=True)):
            mine = budget * float(rng.choice([0.5, 0.9, 1.5])) if rng.random() < own else budget
            queue.push(100 * m + k, now - age, mine)
        queues.append(queue)
    return queues


def _compiled(policy: GuardedStabilityPolicy, queues: list[TaskQueue], now: float) -> Dispatch | None:
    """The compiled path's decision, or None (the Python path decides)."""
    return policy.compiled_decide(queues, now)


@needs_compiled
@pytest.mark.parametrize("urgency", [Urgency(), Urgency("code"), Urgency("paper", clip=2.0)], ids=str)
@pytest.mark.parametrize("batch_cap", [None, 3])
@pytest.mark.parametrize("batch_rule", ["lookahead", "max"])
def test_the_compiled_path_decides_exactly_as_python(
    urgency: Urgency, batch_cap: int | None, batch_rule: str
) -> None:
    rng = np.random.default_rng(7)
    taken = fallbacks = overruled = mixed = deep = 0
    for latency in _latencies():
        compiled = GuardedStabilityPolicy(latency, urgency, batch_cap=batch_cap, batch_rule=batch_rule)
        python = GuardedStabilityPolicy(
            latency, urgency, batch_cap=batch_cap, batch_rule=batch_rule, compiled=False
        )
        assert compiled.compiled and not python.compiled
        for _ in range(400):
            now = 1000.0 + float(rng.uniform(0.0, 1.0))
            queues = _queues(rng, latency, now)
            if _compiled(compiled, queues, now) is None:
                fallbacks += 1
            else:
                taken += 1
                mixed += any(queue and queue.uniform_budget is None for queue in queues)
                live = [queue for queue in queues if queue]
                deep += sum(map(len, live)) + 3 * len(live) ** 2 > SMALL_STATE  # scoring_deep's sums
                unguarded = python._inner.decide(queues, now)  # the stability pick, before the guard
                decision = python.decide(queues, now)
                overruled += (decision.model, decision.exit) != (unguarded.model, unguarded.exit)
            assert compiled.decide(queues, now) == python.decide(queues, now)  # floats compared exactly
    print(
        f"{taken} compiled ({mixed} mixing budgets, {deep} deep, {overruled} overruled), {fallbacks} Python"
    )
    assert taken > 400 and mixed > 100 and deep and overruled > 50 and fallbacks > 50  # every path exercised


@needs_compiled
def test_the_compiled_path_leaves_to_python_what_it_does_not_cover() -> None:
    latency = _latencies()[0]
    policy = GuardedStabilityPolicy(latency)
    now, slo = 10.0, 0.05
    assert _compiled(policy, [TaskQueue() for _ in range(3)], now) is None  # nothing queued

    mixed = [TaskQueue() for _ in range(3)]
    mixed[0].push(1, now - 0.01, slo)
    mixed[0].push(2, now - 0.005, slo / 2)  # a request with its own deadline: the loop's scores
    assert _compiled(policy, mixed, now) == GuardedStabilityPolicy(latency, compiled=False).decide(mixed, now)
    for k in range(SMALL_LOOP):  # tasks x live queues past SMALL_LOOP
        mixed[2].push(10 + k, now - 0.004 + k * 1e-5, slo)
    # past the loop's size, two runs of one budget each: scoring_deep's sums, run by run
    assert _compiled(policy, mixed, now) == GuardedStabilityPolicy(latency, compiled=False).decide(mixed, now)
    for k in range(MAX_RUNS):  # budgets interleaved, more runs than MAX_RUNS: numpy's matrix
        mixed[0].push(3 + k, now - 0.004, slo if k % 2 else slo / 2)
    assert mixed[0].run_count > MAX_RUNS
    assert _compiled(policy, mixed, now) is None

    big = [TaskQueue() for _ in range(3)]
    for k in range(SMALL_STATE + 1):
        big[1].push(k, now - 0.04 + k * 1e-5, slo)
    # one budget per queue: past the plain scorer's size the sums the queues keep (scoring_deep)
    assert _compiled(policy, big, now) == GuardedStabilityPolicy(latency, compiled=False).decide(big, now)
    big[0].push(1000, now - 0.01, slo)
    big[0].push(1001, now - 0.005, slo / 2)  # two runs, past the loop's size: still the sums
    assert _compiled(policy, big, now) == GuardedStabilityPolicy(latency, compiled=False).decide(big, now)
    for k in range(MAX_RUNS):
        big[0].push(1002 + k, now - 0.004, slo / (2 + k % 2))  # interleaved: numpy's matrix
    assert _compiled(policy, big, now) is None

    # A head only saved if served first (test_guarded's first case): the guard looks further, and
    # overrules the stability pick (queue 2's long queue) in C as in Python.
    doomed = [TaskQueue() for _ in range(3)]
    doomed[0].push(0, now - 0.047, slo)
    for k in range(10):
        doomed[2].push(1 + k, now - 0.030, slo)
    assert policy._inner.decide(doomed, now).model == 2
    assert _compiled(policy, doomed, now).model == 0
    assert policy.decide(doomed, now) == GuardedStabilityPolicy(latency, compiled=False).decide(doomed, now)

    light = [TaskQueue() for _ in range(3)]
    light[1].push(0, now - 0.001, slo)
    light_decision = _compiled(policy, light, now)
    exit_pos = latency.models[1].exit_ids.index(light_decision.exit)
    assert (light_decision.model, light_decision.batch) == (1, 1)
    assert light_decision.predicted_s == latency.models[1].latency(exit_pos, 1)
