"""The stability score computed the straightforward way: a Python loop over every queued task.

This is how the authors' code evaluates it (per task, per candidate) and it is kept as the oracle:
the property tests check the fast scorer against it and benchmarks/decision_cost.py times both.
"""

from __future__ import annotations

from collections.abc import Sequence

from edgeserve.scheduler.candidates import Candidate, choose_exits
from edgeserve.scheduler.latency import LatencyModel
from edgeserve.scheduler.queues import TaskQueue
from edgeserve.scheduler.urgency import Urgency


def reference_candidates(
    queues: Sequence[TaskQueue],
    now: float,
    latency: LatencyModel,
    urgency: Urgency,
    exit_rule: str = "adaptive",
    batch_cap: int | None = None,
) -> list[Candidate]:
    """One candidate per non-empty queue, in model order (EdgeServing Algorithm 1, steps 1-5)."""
    snapshot = [(q.arrivals.tolist(), q.budgets.tolist(), q.deadlines.tolist()) for q in queues]
    live, batches, slacks = [], [], []
    for m, (arrivals, _, deadlines) in enumerate(snapshot):
        if not arrivals:
            continue
        model = latency.models[m]
        batch = min(len(arrivals), model.max_batch, batch_cap or model.max_batch)
        live.append(m)
        batches.append(batch)
        slacks.append(min(d - now for d in deadlines[:batch]))
    models = [latency.models[m] for m in live]
    exits, eligible = choose_exits(models, batches, slacks, exit_rule)
    candidates = []
    for m, model, batch, exit_pos, ok in zip(live, models, batches, exits, eligible, strict=True):
        delta = model.latency(exit_pos, batch)
        score = 0.0
        for q, (q_arrivals, q_budgets, _) in enumerate(snapshot):
            start = batch if q == m else 0  # the served batch leaves the queue
            for k in range(start, len(q_arrivals)):
                score += urgency((now - q_arrivals[k] + delta) / q_budgets[k])
        candidates.append(Candidate(m, exit_pos, batch, delta, score, ok))
    return candidates
