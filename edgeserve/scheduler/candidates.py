"""Per-queue candidates (model, exit, batch, predicted time, score) and the shared rules that make them.

Every policy that picks "the deepest exit that still meets every deadline in the batch" uses
`choose_exit`; every policy that minimises a score uses `pick_min`, so ties are broken the same
way everywhere: scores within TIE_RTOL of the best count as equal and the lowest model index wins.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

from edgeserve.scheduler.latency import ModelLatency

EXIT_RULES = ("adaptive", "final", "shallowest", "protective", "safe")
TIE_RTOL = 1e-9


class Candidate(NamedTuple):
    """Serving queue `model` now: its batch, exit (position among allowed exits) and score.
    (A NamedTuple: a decision makes one per queue, and the executor waits for the decision.)"""

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
    spares = [s - m.by_batch[b - 1][0] for m, b, s in zip(models, batches, slacks, strict=True)]
    exits = []
    for i, (model, batch, slack) in enumerate(zip(models, batches, slacks, strict=True)):
        column = model.by_batch[batch - 1]
        shallowest, limit = column[0], slack
        for j, spare in enumerate(spares):
            if shallowest <= spare < limit and j != i:  # j is still rescuable if this batch goes shallow
                limit = spare
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


def pick_min(scores: Sequence[float]) -> int:
    """Index of the smallest score; near-ties (relative TIE_RTOL) go to the lowest index."""
    best = min(scores)
    if math.isinf(best) or math.isnan(best):
        return next(i for i, s in enumerate(scores) if s == best or (math.isnan(best) and math.isnan(s)))
    limit = best + TIE_RTOL * abs(best)
    return next(i for i, s in enumerate(scores) if s <= limit)
