"""Microseconds per scheduling decision: the fast stability scorer against the per-task Python loop.

Both decide on the same random queue states in the same run (interleaved, so machine noise hits
both alike); every decision is checked to agree. Scales: the paper's (3 models x 4 exits x
B_max 10, ~30 queued tasks), a middle one, and 16 models with 1000 queued tasks; plus requests
carrying their own deadlines (the exact fallback path). The default policy is also timed without
its compiled path (scheduler/_quick.c), on the usual states, on light ones (what a server sees) and
with requests' own deadlines.

    .venv/bin/python benchmarks/decision_cost.py            # ~1 minute on 2 cores
    .venv/bin/python benchmarks/decision_cost.py --states 100
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, replace

import numpy as np

from edgeserve.scheduler import DEFAULT_POLICY, PolicyOptions, make_policy
from edgeserve.scheduler.guarded import GuardedStabilityPolicy
from edgeserve.scheduler.latency import LatencyModel
from edgeserve.scheduler.queues import TaskQueue
from edgeserve.scheduler.stability import StabilityPolicy
from edgeserve.scheduler.synthetic import paper_gpu_profiles
from edgeserve.scheduler.urgency import Urgency

SLO = 0.050


@dataclass(frozen=True)
class Scale:
    label: str
    models: int
    tasks: int
    mixed_budgets: bool = False
    exit_rule: str = "adaptive"
    policy: str = ""  # a policy name (make_policy) instead of StabilityPolicy(exit_rule)
    max_age: float = 1.5  # queued tasks' ages up to this many SLOs
    compiled: bool = True  # False: the default policy without its compiled path (_quick.c)


SCALES = (
    Scale("paper: 3 models x 4 exits x B10, 30 tasks", 3, 30),
    Scale("16 models, 200 tasks", 16, 200),
    Scale("16 models, 1000 tasks", 16, 1000),
    Scale("paper scale, per-request deadlines", 3, 30, mixed_budgets=True),
    Scale("16 models, 1000 tasks, per-request deadlines", 16, 1000, mixed_budgets=True),
    Scale("paper scale, edgeserve 'safe' exit rule", 3, 30, exit_rule="safe"),
    Scale("16 models, 1000 tasks, 'safe' exit rule", 16, 1000, exit_rule="safe"),
    Scale(f"paper scale, default policy ({DEFAULT_POLICY})", 3, 30, policy=DEFAULT_POLICY),
    Scale("paper scale, default, Python only", 3, 30, policy=DEFAULT_POLICY, compiled=False),
    # what the server sees below saturation and under admission control: nothing doomed, the
    # compiled path decides (the rows above are mostly past deadlines: the guard looks further)
    Scale("paper scale, default, ages < 0.3 SLO", 3, 30, policy=DEFAULT_POLICY, max_age=0.3),
    Scale(
        "paper scale, default, ages < 0.3 SLO, Python only",
        3,
        30,
        policy=DEFAULT_POLICY,
        max_age=0.3,
        compiled=False,
    ),
    Scale("paper scale, default, own deadlines", 3, 30, mixed_budgets=True, policy=DEFAULT_POLICY),
    Scale(
        "paper scale, default, own deadlines, Python only",
        3,
        30,
        mixed_budgets=True,
        policy=DEFAULT_POLICY,
        compiled=False,
    ),
    Scale(f"16 x 1000, default policy ({DEFAULT_POLICY})", 16, 1000, policy=DEFAULT_POLICY),
    Scale(
        "16 x 1000, default policy, per-request deadlines",
        16,
        1000,
        mixed_budgets=True,
        policy=DEFAULT_POLICY,
    ),
    # the default before the batch look-ahead, for comparison in the same run
    Scale("paper scale, stability-safe-maxbatch", 3, 30, policy="stability-safe-maxbatch"),
    Scale("16 x 1000, stability-safe-maxbatch", 16, 1000, policy="stability-safe-maxbatch"),
)


def latency_model(n_models: int) -> LatencyModel:
    """The synthetic paper profile, repeated with latency scale factors up to n_models models."""
    base = LatencyModel.from_profiles(paper_gpu_profiles(samples=20))
    models = []
    for i in range(n_models):
        src = base.models[i % 3]
        factor = 1.0 + 0.15 * (i // 3)
        models.append(replace(src, name=f"{src.name}-{i}", seconds=src.seconds * factor))
    return LatencyModel(tuple(models))


def random_state(rng: np.random.Generator, scale: Scale, now: float) -> list[TaskQueue]:
    """Tasks spread over the models, ages uniform in [0, max_age SLO] (by default some already late,
    some clipped)."""
    queues = [TaskQueue() for _ in range(scale.models)]
    ages = np.sort(rng.uniform(0.0, scale.max_age * SLO, scale.tasks))[::-1]
    owners = rng.integers(0, scale.models, scale.tasks)
    for k, (age, m) in enumerate(zip(ages, owners, strict=True)):
        budget = SLO * float(rng.choice([0.6, 1.0, 2.0])) if scale.mixed_budgets else SLO
        queues[m].push(k, now - float(age), budget)
    return queues


def measure(scale: Scale, states: int, repeat: int, seed: int = 0) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    latency = latency_model(scale.models)
    if scale.policy:  # the same policy, its stability scores from the fast path or the loop
        fast = make_policy(scale.policy, latency, PolicyOptions(scorer="fast"))
        if not scale.compiled:
            assert scale.policy == DEFAULT_POLICY, "compiled=False rows time the default policy"
            fast = GuardedStabilityPolicy(latency, name=scale.policy, compiled=False)
        loop = make_policy(scale.policy, latency, PolicyOptions(scorer="loop"))
    else:
        fast = StabilityPolicy(latency, Urgency(), scale.exit_rule, scorer="fast")
        loop = StabilityPolicy(latency, Urgency(), scale.exit_rule, scorer="loop")
    fast_us, loop_us = [], []
    now = 1000.0
    for _ in range(states):
        queues = random_state(rng, scale, now)
        a, b = fast.decide(queues, now), loop.decide(queues, now)
        assert a is not None and b is not None and (a.model, a.exit, a.batch) == (b.model, b.exit, b.batch)
        for _ in range(repeat):
            t0 = time.perf_counter_ns()
            fast.decide(queues, now)
            t1 = time.perf_counter_ns()
            loop.decide(queues, now)
            t2 = time.perf_counter_ns()
            fast_us.append((t1 - t0) / 1000.0)
            loop_us.append((t2 - t1) / 1000.0)
    f, lo = np.array(fast_us), np.array(loop_us)
    return {
        "fast_p50": float(np.percentile(f, 50)),
        "fast_p99": float(np.percentile(f, 99)),
        "loop_p50": float(np.percentile(lo, 50)),
        "loop_p99": float(np.percentile(lo, 99)),
        "speedup_p50": float(np.percentile(lo, 50) / np.percentile(f, 50)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--states", type=int, default=200, help="random queue states per scale (default 200)")
    parser.add_argument("--repeat", type=int, default=5, help="timed decisions per state (default 5)")
    args = parser.parse_args()

    print(f"us per decision (StabilityPolicy.decide, {Urgency().describe()}); loop = per-task Python loop,")
    print("timed on the same states in the same run")
    header = (
        f"{'scale':48s} {'fast p50':>9s} {'fast p99':>9s} {'loop p50':>9s} {'loop p99':>9s} {'loop/fast':>9s}"
    )
    print(header)
    print("-" * len(header))
    for scale in SCALES:
        repeat = args.repeat if scale.tasks <= 200 else max(1, args.repeat // 5)
        r = measure(scale, args.states, repeat)
        print(
            f"{scale.label:48s} {r['fast_p50']:9.1f} {r['fast_p99']:9.1f} {r['loop_p50']:9.1f} "
            f"{r['loop_p99']:9.1f} {r['speedup_p50']:8.1f}x"
        )
    print("targets: paper scale fast p50 <= 50 us; 16 x 1000 loop/fast >= 10x. All decisions agreed.")


if __name__ == "__main__":
    main()
