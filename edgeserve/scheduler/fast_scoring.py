"""The fast stability scorer: picks the exact method that is quickest for the queue state at hand.

- every queue has one deadline budget and the clip is finite (the usual case): the factorised
  score, in plain Python for small states (its cost grows with tasks + models^2, numpy's is
  ~60 us of call overhead almost regardless of size), with numpy above;
- otherwise (requests carrying their own deadlines, or no clip): the direct numpy matrix, or for
  small states the per-task loop of reference.py itself, which is then the quickest exact method.

reference.py holds the per-task loop these are tested and benchmarked against.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from edgeserve.scheduler.candidates import Candidate
from edgeserve.scheduler.latency import LatencyModel
from edgeserve.scheduler.queues import TaskQueue
from edgeserve.scheduler.reference import reference_candidates
from edgeserve.scheduler.scoring_numpy import numpy_candidates
from edgeserve.scheduler.scoring_python import python_candidates
from edgeserve.scheduler.urgency import Urgency

# Python wins while tasks + 3 * models^2 stays below this (measured: 3 models x 30 tasks 19 us vs
# 65 us; 16 models x 200 tasks 205 us vs 99 us).
SMALL_STATE = 200
# The loop costs ~0.4 us per (candidate, task) pair; numpy-direct ~50 us whatever the size.
SMALL_LOOP = 120
METHODS = ("auto", "python", "numpy-factorised", "numpy-direct", "loop")


def fast_candidates(
    queues: Sequence[TaskQueue],
    now: float,
    latency: LatencyModel,
    urgency: Urgency,
    exit_rule: str = "adaptive",
    batch_cap: int | None = None,
    method: str = "auto",
) -> list[Candidate]:
    """One candidate per non-empty queue, in model order, as reference_candidates computes them."""
    if method == "auto":
        factorisable = math.isfinite(urgency.clip)
        tasks = live = 0
        for queue in queues:
            n = len(queue)
            if n:
                tasks += n
                live += 1
                factorisable = factorisable and queue.uniform_budget is not None
        if not factorisable:
            method = "loop" if tasks * live <= SMALL_LOOP else "numpy-direct"
        else:
            method = "python" if tasks + 3 * live**2 <= SMALL_STATE else "numpy-factorised"
    if method == "python":
        return python_candidates(queues, now, latency, urgency, exit_rule, batch_cap)
    if method == "numpy-factorised":
        return numpy_candidates(queues, now, latency, urgency, exit_rule, batch_cap, method="factorised")
    if method == "numpy-direct":
        return numpy_candidates(queues, now, latency, urgency, exit_rule, batch_cap, method="direct")
    if method == "loop":
        return reference_candidates(queues, now, latency, urgency, exit_rule, batch_cap)
    raise ValueError(f"unknown scoring method {method!r}; choose one of {METHODS}")
