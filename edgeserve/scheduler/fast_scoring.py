"""The fast stability scorer: picks the exact method that is quickest for the queue state at hand.

- every queue has one deadline budget and the clip is finite (the usual case): the factorised
  score, in plain Python for small states (its cost grows with tasks + models^2), above that
  from the sums the queues keep (scoring_deep: O(log n) per candidate and queue, no pass over
  the tasks; the numpy factorised method stays available by name);
- budgets mixed (a server's planned budget stepping, requests carrying their own deadlines) or
  no clip: for small states the per-task loop of reference.py itself, the quickest exact method
  there; above it, where every queue is at most scoring_deep.MAX_RUNS runs of one budget (the
  server's steps) and the clip is finite, scoring_deep run by run; otherwise (budgets
  interleaved, or no clip) the direct numpy matrix.

reference.py holds the per-task loop these are tested and benchmarked against.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from edgeserve.scheduler.candidates import Candidate
from edgeserve.scheduler.latency import LatencyModel
from edgeserve.scheduler.queues import TaskQueue
from edgeserve.scheduler.reference import reference_candidates
from edgeserve.scheduler.scoring_deep import MAX_RUNS, deep_candidates
from edgeserve.scheduler.scoring_numpy import numpy_candidates
from edgeserve.scheduler.scoring_python import python_candidates
from edgeserve.scheduler.urgency import Urgency

# The plain Python scorer (scoring_python: O(tasks) per decision) up to this tasks + 3 * models^2;
# scoring_deep (the sums the queues keep: O(models^2 log tasks)) above. It was measured against
# numpy's factorised method (3 models x 30 tasks 19 us vs 65 us; 16 models x 200 tasks 205 us vs
# 99 us) and is kept: the compiled path (_quick.c) follows the same choice, and both scorers' sums
# round differently.
SMALL_STATE = 200
# The loop costs ~0.4 us per (candidate, task) pair; numpy-direct ~50 us whatever the size.
SMALL_LOOP = 120
METHODS = ("auto", "python", "deep", "numpy-factorised", "numpy-direct", "loop")


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
        finite = math.isfinite(urgency.clip)
        tasks = live = 0
        runs = 1  # the most runs of one budget in a queue
        for queue in queues:
            n = len(queue)
            if n:
                tasks += n
                live += 1
                runs = max(runs, queue.run_count)
        if finite and runs == 1:
            method = "python" if tasks + 3 * live**2 <= SMALL_STATE else "deep"
        elif tasks * live <= SMALL_LOOP:
            method = "loop"
        else:  # budgets mixed in a few runs per queue: scored run by run; interleaved: the matrix
            method = "deep" if finite and runs <= MAX_RUNS else "numpy-direct"
    if method == "python":
        return python_candidates(queues, now, latency, urgency, exit_rule, batch_cap)
    if method == "deep":
        return deep_candidates(queues, now, latency, urgency, exit_rule, batch_cap)
    if method == "numpy-factorised":
        return numpy_candidates(queues, now, latency, urgency, exit_rule, batch_cap, method="factorised")
    if method == "numpy-direct":
        return numpy_candidates(queues, now, latency, urgency, exit_rule, batch_cap, method="direct")
    if method == "loop":
        return reference_candidates(queues, now, latency, urgency, exit_rule, batch_cap)
    raise ValueError(f"unknown scoring method {method!r}; choose one of {METHODS}")
