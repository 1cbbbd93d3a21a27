"""Per-queue candidates (model, exit, batch, predicted time, score) and the shared rules that make them.

Every policy that picks "the deepest exit that still meets every deadline in the batch" uses
`choose_exit`; every policy that minimises a score uses `pick_min`, so ties are broken the same
way everywhere: scores within TIE_RTOL of the best count as equal and the lowest model index wins.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from edgeserve.scheduler.latency import ModelLatency

EXIT_RULES = ("adaptive", "final", "shallowest", "protective", "safe")
TIE_RTOL = 1e-9
# Batch look-ahead (split_batch): a smaller batch is chosen only when it serves the same tasks in
# at least this much less predicted time than the largest batch that is within it of the best;
# profile noise of a few percent must not flip the batch size.
BATCH_RTOL = 0.05
# What one more dispatch costs beyond its profiled batch time (the decision, the hand-off to the
# executor thread): splitting must pay for it.
DISPATCH_OVERHEAD_S = 100e-6


@dataclass(frozen=True)
class Candidate:
    """Serving queue `model` now: its batch, exit (position among allowed exits) and score."""

    model: int
    exit_pos: int
    batch: int
    delta_s: float
    score: float
    eligible: bool = True  # False: the "safe" rule set this candidate aside (see choose_exits)


def choose_exit(model: ModelLatency, rule: str, batch: int, slack_s: float) -> int:
    """Exit position for a batch whose tightest task has `slack_s` seconds left.

    adaptive: the deepest exit with latency <= slack, else the shallowest (EdgeServing Eq. 6);
    final: the deepest allowed exit; shallowest: the first allowed exit. ("protective" and "safe"
    need every queue's state: see choose_exits.)
    """
    if rule == "adaptive":
        return model.deepest_feasible(batch, slack_s)
    if rule == "final":
        return len(model.exit_ids) - 1
    if rule == "shallowest":
        return 0
    raise ValueError(f"unknown exit rule {rule!r}; choose one of {EXIT_RULES}")


def protective_exits(
    models: Sequence[ModelLatency], batches: Sequence[int], slacks: Sequence[float]
) -> list[int]:
    """Exit position per candidate under the "protective" rule (edgeserve's improvement).

    The paper's rule takes the deepest exit that meets the served batch's own deadlines, and may
    thereby push another queue's oldest task past the point where even its shallowest exit can
    finish in time. Here the batch may take at most the tightest of: its own slack, and each other
    queue's spare time (its slack minus its own batch at its shallowest exit), counting only the
    queues that this batch's shallowest exit would leave rescuable. The deepest exit within that
    limit is chosen; if none fits, the paper's rule decides.
    """
    need = [m.by_batch[b - 1][0] for m, b in zip(models, batches, strict=True)]
    exits = []
    for i, (model, batch, slack) in enumerate(zip(models, batches, slacks, strict=True)):
        column = model.by_batch[batch - 1]
        limit = slack
        for j, (other_slack, other_need) in enumerate(zip(slacks, need, strict=True)):
            spare = other_slack - other_need
            if j != i and spare >= column[0]:  # j is still rescuable if this batch goes shallow
                limit = min(limit, spare)
        pos = len(column) - 1
        while pos >= 0 and column[pos] > limit:
            pos -= 1
        exits.append(pos if pos >= 0 else model.deepest_feasible(batch, slack))
    return exits


def choose_exits(
    models: Sequence[ModelLatency], batches: Sequence[int], slacks: Sequence[float], rule: str
) -> tuple[list[int], list[bool]]:
    """Exit position and eligibility of every candidate (all non-empty queues) under `rule`.

    "safe" (edgeserve's improvement, docs/scheduler.md): each queue keeps the paper's exit, but a
    candidate whose exit would push another still-rescuable queue past rescue (its exit is deeper
    than the protective one) is set aside while any candidate is safe; if none is, every candidate
    takes its protective exit.
    """
    everyone = [True] * len(models)
    if rule == "protective":
        return protective_exits(models, batches, slacks), everyone
    if rule == "safe":
        paper = [m.deepest_feasible(b, s) for m, b, s in zip(models, batches, slacks, strict=True)]
        protective = protective_exits(models, batches, slacks)
        safe = [a <= p for a, p in zip(paper, protective, strict=True)]
        return (paper, safe) if any(safe) else (protective, everyone)
    return [choose_exit(m, rule, b, s) for m, b, s in zip(models, batches, slacks, strict=True)], everyone


def split_batch(
    model: ModelLatency,
    exit_pos: int,
    n: int,
    overhead_s: float = DISPATCH_OVERHEAD_S,
    rtol: float = BATCH_RTOL,
) -> int:
    """The batch size to serve now, of the `n` head tasks the paper's rule would batch (its Eq. 5).

    Look-ahead: serve those n tasks back to back in batches of b (FIFO, the last one smaller) at
    this exit. With the quantile the policy plans with, that takes P(b) = (n // b) * L(b) + L(n % b);
    on average (the profile's mean) it occupies the executor C(b), plus `overhead_s` per batch.

    - Safe: only sizes with P(b) <= P(n). Then each of the n tasks finishes, as planned, no later
      than in the paper's one batch of n, and every other queue waits no longer: a split never
      loses a task that the paper's batch would save.
    - Cheap: of those, the largest b whose C(b) is within `rtol` of the least: the same tasks
      for less executor time, i.e. more throughput (the mean, not the p95, is what a stream of
      batches costs; a heavy-tailed cell's p95 misleads).

    Where batching pays (the paper's GPU: L(10) ~ 2 L(1)) that is b = n, the paper's rule; where a
    batch grows faster than its size (a CPU cell whose batch of 10 costs more than two of 5), the
    same tasks are served in smaller, quicker batches.
    """
    if n <= 1:
        return n
    plan, mean = model.by_batch, model.mean_by_batch
    limit = _split_time(plan, exit_pos, n, n, 0.0)
    costs = [
        _split_time(mean, exit_pos, n, b, overhead_s)
        if _split_time(plan, exit_pos, n, b, 0.0) <= limit
        else math.inf
        for b in range(1, n + 1)
    ]
    cheapest = min(costs) * (1.0 + rtol)
    b = n
    while costs[b - 1] > cheapest:
        b -= 1
    return b


def _split_time(
    table: tuple[tuple[float, ...], ...], exit_pos: int, n: int, b: int, overhead_s: float
) -> float:
    full, rest = divmod(n, b)
    t = full * (table[b - 1][exit_pos] + overhead_s)
    return t + (table[rest - 1][exit_pos] + overhead_s if rest else 0.0)


def pick_min(scores: Sequence[float]) -> int:
    """Index of the smallest score; near-ties (relative TIE_RTOL) go to the lowest index."""
    best = min(scores)
    if math.isinf(best) or math.isnan(best):
        return next(i for i, s in enumerate(scores) if s == best or (math.isnan(best) and math.isnan(s)))
    limit = best + TIE_RTOL * abs(best)
    return next(i for i, s in enumerate(scores) if s <= limit)
