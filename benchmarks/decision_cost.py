"""Microseconds per scheduling decision: the fast stability scorer against the per-task Python loop.

Both decide on the same random queue states in the same run (interleaved, so machine noise hits
both alike); every decision is checked to agree. Scales: the paper's (3 models x 4 exits x
B_max 10, ~30 queued tasks), a middle one, and 16 models with 1000 queued tasks; plus requests
carrying their own deadlines (the exact fallback path). The default policy is also timed without
its compiled path (scheduler/_quick.c), on the usual states, on light ones (what a server sees) and
with requests' own deadlines.

    .venv/bin/python benchmarks/decision_cost.py            # ~1 minute on 2 cores
    .venv/bin/python benchmarks/decision_cost.py --states 100

Queue depth (--depths): the default policy as the server builds it (make_policy(DEFAULT_POLICY)
with SchedulerConfig's urgency, as runtime/server.py `_scheduling` does), on deep FIFO queues as
an overloaded server holds them, over a stream of decisions: each round's batch popped, the clock
moved on by its predicted time, heads older than --max-age SLOs expired (lazy drop) and every queue
topped up with arrivals spread over the round, so the queues push and pop between decisions as in
a server. Latency model: the H200 profile tables (/work/shared/data/gpu-h200, resnet50/101/152-cifar;
16 models reuse them cyclically) and the synthetic paper profile; one SLO (50 ms) per model, as a
server makes budgets, and with --mixed requests with their own deadlines (0.6, 1 or 2 SLOs).
--baseline DIR times the same cases under another copy of the package (the code before a change:
`git worktree add` or a copy of edgeserve/ with its built extensions) in a child process.

    .venv/bin/python benchmarks/decision_cost.py --depths 10 100 1000 3000 --mixed \
        --decisions 500 --baseline /tmp/edgeserve-base     # ~1 minute on 2 cores

Measured so (2 shared cores, x86-64, 2026-11-28; before = the commit before scoring_deep.py, in
the same run; us per decision, P50 / P95):

    case (one SLO per model)        before            after
    gpu    3 models   1000 tasks    117 / 155       4.3 / 10
    gpu    3 models   3000 tasks    165 / 382       5.6 / 18
    gpu   16 models     10 tasks    141 / 745       6.3 / 7.1
    gpu   16 models    100 tasks    160 / 232        10 / 19
    gpu   16 models   1000 tasks    255 / 1100       16 / 57
    gpu   16 models   3000 tasks    483 / 782        27 / 72
    paper  3 models   1000 tasks    136 / 361       6.1 / 16
    paper  3 models   3000 tasks    163 / 441       6.9 / 24
    paper 16 models   1000 tasks    545 / 1190       31 / 84
    paper 16 models   3000 tasks    503 / 738        38 / 239 (another run: 38 / 114)
    3 models, 10 and 100 tasks: 2.7-3.9 / 3.5-4.8 both (the small compiled path, unchanged)

Where the time went before: past 200 tasks (or 3 * models^2 + tasks > 200: 16 models even with 10
tasks) the compiled path declined and Python decided: the numpy factorised scorer (~25 numpy calls
and an exp per queued task: 60-70 % at 3 models) and the guard's look-ahead in Python
(queue_chunks, none_doomed, doomed: 20-40 %, most at 16 models). Now the compiled path decides
every state whose queues each have one budget, with scoring_deep's sums (O(log n) per candidate
and queue); what is left at 16 models is the guard's search over 16 x 4 chunks (~30 us, in C).

Budgets mixed in runs (--runs: a server's planned budget steps by 0.2 ms as its measured lag
moves, runtime/server.py `_enqueue`; here once per SLO of time, so every queue holds two runs, the
newer one 0.2 ms shorter or longer; at the start, the last third of each queue shorter). Each
queue is scored run by run from each run's own prefix sums (scoring_deep, up to MAX_RUNS = 8 runs
per queue), compiled. Same machine, same run, before = the code before runs (one budget per
queue only; mixed queues went to numpy's matrix); us per decision, P50 / P95:

    .venv/bin/python benchmarks/decision_cost.py --depths 1000 3000 --runs --decisions 500 \
        --baseline /tmp/edgeserve-base-runs

    case (2 budgets in runs)        before            after
    gpu    3 models   1000 tasks    102 / 161         4.4 / 8.3
    gpu    3 models   3000 tasks    135 / 172         5.3 / 11
    gpu   16 models   1000 tasks    262 / 396          19 / 49
    gpu   16 models   3000 tasks    976 / 1380         29 / 72
    paper  3 models   1000 tasks    177 / 230         5.1 / 8.5
    paper  3 models   3000 tasks    140 / 193         6.3 / 14
    paper 16 models   1000 tasks    812 / 933          32 / 70
    paper 16 models   3000 tasks    941 / 1490         32 / 74
    one SLO per model: unchanged (0.9-1.0x; on a fixed 16 x 1000 state the compiled call is ~7 %
    quicker, 20.8 vs 22.3 us; the depth rows' P95 is noisier in the first, checked, process)

Queues whose budgets interleave (requests with their own deadlines, --mixed: more than 8 runs in
some queue) still take numpy's O(models x tasks) matrix past the loop's size: 95-1100 us P50, as
before. Without the compiled extension, Python scores runs at ~1 us per (candidate, run): at 16
models x 2 runs ~0.6 ms, slower than the matrix was (~0.25 ms); with one budget as before.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from edgeserve.profile import ProfileTable
from edgeserve.scheduler import DEFAULT_POLICY, PolicyOptions, make_policy
from edgeserve.scheduler.guarded import GuardedStabilityPolicy
from edgeserve.scheduler.latency import LatencyModel
from edgeserve.scheduler.queues import TaskQueue
from edgeserve.scheduler.stability import StabilityPolicy
from edgeserve.scheduler.synthetic import paper_gpu_profiles
from edgeserve.scheduler.urgency import Urgency

SLO = 0.050
# The GPU profile tables measured on an H200 (resnet50/101/152-cifar); 16 models reuse them cyclically.
GPU_PROFILES = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "gpu-h200"


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


# ---- the queue-depth axis: the default policy as a server builds it, on deep FIFO queues ----------


@dataclass(frozen=True)
class DepthCase:
    profile: str  # "gpu" (the H200 tables) or "paper" (the synthetic paper profile)
    models: int
    depth: int  # tasks queued over all models
    mixed_budgets: bool = False  # requests carrying their own deadlines (0.6, 1 or 2 SLOs)
    max_age: float = 1.0  # the oldest task's age, in SLOs (lazy drop past it)
    runs: bool = False  # two budgets in runs: the planned budget steps by 0.2 ms once per SLO

    @property
    def label(self) -> str:
        budgets = "one SLO/model"
        if self.mixed_budgets or self.runs:
            budgets = "own deadlines" if self.mixed_budgets else "2 budgets in runs"
        return f"{self.profile:5s} {self.models:2d} models {self.depth:5d} tasks  {budgets}"


def depth_latency(profile: str, n_models: int, gpu_dir: Path) -> LatencyModel:
    """The three ResNets' latencies, reused cyclically for more models (as a server reads them)."""
    if profile == "paper":
        tables = paper_gpu_profiles(samples=20)
    else:
        tables = [ProfileTable.load(gpu_dir / f"resnet{n}-cifar.json") for n in (50, 101, 152)]
    picked = [tables[i % 3] for i in range(n_models)]
    return LatencyModel.from_profiles(picked, names=[f"{t.model}-{i}" for i, t in enumerate(picked)])


# --runs: the server's planned budget (runtime/server.py `_enqueue`) steps by 0.2 ms as its measured
# lag moves; here once per SLO of time, so that a queue spanning an SLO always holds two runs, the
# newer one (the last third at the start) 0.2 ms shorter or longer.
BUDGET_STEP = 0.2e-3


def _budget(rng: np.random.Generator, case: DepthCase, at: float = 0.0, start: float = 0.0) -> float:
    if case.mixed_budgets:
        return SLO * float(rng.choice([0.6, 1.0, 2.0]))
    if case.runs:  # the step fell 1/3 SLO before the start, then every SLO: alternately down and up
        return SLO - BUDGET_STEP * (int(np.floor((at - start) / SLO + 1.0 / 3.0)) % 2 == 0)
    return SLO


def depth_stream(case: DepthCase, decisions: int, check_every: int, gpu_dir: Path, seed: int = 0) -> dict:
    """P50/P95 us of the default policy's decision (make_policy(DEFAULT_POLICY) with the server's
    options) over a stream of `decisions` rounds on deep queues, as an overloaded server holds them.

    Start: `depth` tasks over the models (rates 3:2:1, cyclically), each queue's arrivals spread
    uniformly over the last max_age SLOs. Each round: decide (timed), pop the dispatched batch,
    advance the clock by its predicted time, expire the heads older than max_age SLOs (the
    server's lazy drop), then top every queue up to its depth with arrivals spread over the round
    (so the queues keep pushing and popping, as in a server). Every `check_every`-th decision is
    compared with the per-task reference loop's (model, exit, batch).
    """
    rng = np.random.default_rng(seed)
    latency = depth_latency(case.profile, case.models, gpu_dir)
    options = PolicyOptions(urgency=Urgency("paper", 10.0))  # the server's defaults (SchedulerConfig)
    policy = make_policy(DEFAULT_POLICY, latency, options)
    reference = make_policy(DEFAULT_POLICY, latency, replace(options, scorer="loop"))
    rates = np.array([(3.0, 2.0, 1.0)[i % 3] for i in range(case.models)])
    targets = rng.multinomial(case.depth, rates / rates.sum())
    now = 1000.0
    queues = [TaskQueue() for _ in range(case.models)]
    next_id = 0
    start = now
    for m, count in enumerate(targets.tolist()):
        for age in np.sort(rng.uniform(0.0, case.max_age * SLO, count))[::-1].tolist():
            queues[m].push(next_id, now - age, _budget(rng, case, now - age, start))
            next_id += 1
    times, checked = [], 0
    for i in range(decisions):
        t0 = time.perf_counter_ns()
        decision = policy.decide(queues, now)
        times.append((time.perf_counter_ns() - t0) / 1000.0)
        assert decision is not None
        if check_every and i % check_every == 0:
            expected = reference.decide(queues, now)
            got = (decision.model, decision.exit, decision.batch)
            assert got == (expected.model, expected.exit, expected.batch), (case, i, decision, expected)
            checked += 1
        queues[decision.model].pop(decision.batch)
        before, now = now, now + decision.predicted_s
        for m, queue in enumerate(queues):
            arrivals = queue.arrivals
            late = int(np.searchsorted(arrivals, now - case.max_age * SLO, side="right"))
            if late:
                queue.pop(late)
            missing = int(targets[m]) - len(queue)
            if missing > 0:
                for at in np.linspace(before, now, missing + 1)[1:].tolist():
                    queue.push(next_id, at, _budget(rng, case, at, start))
                    next_id += 1
    t = np.array(times)
    return {"p50": float(np.percentile(t, 50)), "p95": float(np.percentile(t, 95)), "checked": checked}


def depth_cases(args: argparse.Namespace) -> list[DepthCase]:
    cases = []
    for profile in args.profiles:
        for models in args.models:
            for depth in args.depths:
                cases.append(DepthCase(profile, models, depth, max_age=args.max_age))
                if args.runs:
                    cases.append(DepthCase(profile, models, depth, max_age=args.max_age, runs=True))
                if args.mixed:
                    cases.append(DepthCase(profile, models, depth, True, args.max_age))
    return cases


def depth_table(args: argparse.Namespace) -> None:
    """The depth table; with --baseline DIR, the same cases under another copy of the package (a
    checkout of the code before a change), run in a child process just after each case."""
    import edgeserve

    print(
        f"us per decision of the default policy ({DEFAULT_POLICY}, {Urgency('paper', 10.0).describe()}), "
        f"{args.decisions} rounds per case, queues spread over {args.max_age:g} SLO ({SLO * 1e3:g} ms)"
    )
    print(
        f"package: {Path(edgeserve.__file__).parent}"
        + (f"; baseline: {args.baseline}" if args.baseline else "")
    )
    header = f"{'case':44s} {'p50':>8s} {'p95':>8s}"
    if args.baseline:
        header += f" {'base p50':>9s} {'base p95':>9s} {'p50 x':>7s}"
    print(header)
    print("-" * len(header))
    for case in depth_cases(args):
        r = depth_stream(case, args.decisions, args.check_every, args.gpu_profiles)
        line = f"{case.label:44s} {r['p50']:8.1f} {r['p95']:8.1f}"
        if args.baseline:
            b = _baseline_case(args, case)
            line += f" {b['p50']:9.1f} {b['p95']:9.1f} {b['p50'] / r['p50']:6.1f}x"
        print(line, flush=True)
    if args.check_every:
        print(f"every {args.check_every}th decision agreed with the reference loop's (model, exit, batch)")


def _baseline_case(args: argparse.Namespace, case: DepthCase) -> dict:
    env = dict(os.environ, PYTHONPATH=str(args.baseline))
    command = [
        sys.executable, __file__, "--one-case", json.dumps(case.__dict__), "--decisions", str(args.decisions),
        "--check-every", "0", "--gpu-profiles", str(args.gpu_profiles),
    ]  # fmt: skip
    out = subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--states", type=int, default=200, help="random queue states per scale (default 200)")
    parser.add_argument("--repeat", type=int, default=5, help="timed decisions per state (default 5)")
    depth = parser.add_argument_group("queue depth (the default policy as a server builds it)")
    depth.add_argument(
        "--depths", type=int, nargs="+", help="tasks queued over all models: the depth table only"
    )
    depth.add_argument("--models", type=int, nargs="+", default=[3, 16], help="models (default 3 16)")
    depth.add_argument(
        "--profiles", nargs="+", choices=("gpu", "paper"), default=["gpu", "paper"],
        help="latency model: the H200 tables (--gpu-profiles) and/or the synthetic paper profile",
    )  # fmt: skip
    depth.add_argument(
        "--gpu-profiles", type=Path, default=GPU_PROFILES, help="resnet{50,101,152}-cifar.json"
    )
    depth.add_argument("--mixed", action="store_true", help="also requests with their own deadlines")
    depth.add_argument(
        "--runs", action="store_true", help="also two budgets in runs (the server's 0.2 ms budget steps)"
    )
    depth.add_argument("--max-age", type=float, default=1.0, help="oldest task's age in SLOs (default 1)")
    depth.add_argument("--decisions", type=int, default=300, help="rounds per case (default 300)")
    depth.add_argument(
        "--check-every", type=int, default=10, help="compare with the reference loop (0: never)"
    )
    depth.add_argument("--baseline", type=Path, help="a copy of the package before a change, timed alike")
    depth.add_argument("--one-case", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one_case:  # a child of --baseline: one case, its numbers as JSON
        case = DepthCase(**json.loads(args.one_case))
        print(json.dumps(depth_stream(case, args.decisions, args.check_every, args.gpu_profiles)))
        return
    if args.depths:
        depth_table(args)
        return

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
