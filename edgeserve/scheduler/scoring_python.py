"""The factorised stability score in plain Python: the fast path for paper-sized queue states.

Same algebra as scoring_numpy's factorised method (see there): per queue with one deadline
budget D_q, the tasks are ordered by y = w / D_q, so for candidate m (service time delta_m,
s = delta_m / D_q) the clipped tasks are the prefix with y >= theta - s, found by bisection, and
the rest contribute e^s times a suffix sum of e^(y - 1) (paper form: of e^y - 1, plus
(e^s - 1) per task). Per decision that is O(N) work for the y's and O(M^2 log N) for the
candidates, instead of the loop's O(M N) calls to u(). Without numpy's per-call overhead this
wins below a few hundred queued tasks.
"""

from __future__ import annotations

import math
import operator
from bisect import bisect_right
from collections.abc import Sequence
from itertools import accumulate

from edgeserve.scheduler.candidates import Candidate, choose_exits
from edgeserve.scheduler.latency import LatencyModel
from edgeserve.scheduler.queues import TaskQueue
from edgeserve.scheduler.urgency import Urgency


def python_candidates(
    queues: Sequence[TaskQueue],
    now: float,
    latency: LatencyModel,
    urgency: Urgency,
    exit_rule: str = "adaptive",
    batch_cap: int | None = None,
) -> list[Candidate]:
    """Same candidates as reference_candidates. Needs one budget per queue and a finite clip."""
    theta = urgency.threshold
    clip = urgency.clip
    code = urgency.form == "code"
    if math.isinf(theta):
        raise ValueError("the factorised scorer needs a finite clip; use the numpy direct method")
    exp, expm1, neg = math.exp, math.expm1, operator.neg

    # Per queue: (index, length, budget, y's (non-increasing), suffix sums of the factor).
    live = []
    for q_index, queue in enumerate(queues):
        n = len(queue)
        if not n:
            continue
        budget = queue.uniform_budget
        if budget is None:
            raise ValueError(f"queue {q_index} mixes deadline budgets; use the numpy direct method")
        ys = [(now - a) / budget for a in queue.arrivals.tolist()]
        if code:
            factors = [exp(y - 1.0) if y < theta else clip for y in ys]
        else:
            factors = [expm1(y) if y < theta else clip * (math.e - 1.0) for y in ys]
        suffix = list(accumulate(reversed(factors), initial=0.0))
        suffix.reverse()  # suffix[i] = sum of factors[i:]
        live.append((q_index, n, budget, ys, suffix))

    models = [latency.models[m] for m, *_ in live]
    batches = [
        min(n, mod.max_batch, batch_cap or mod.max_batch)
        for (_, n, *_), mod in zip(live, models, strict=True)
    ]
    # One budget and FIFO order: the head has the earliest deadline of the batch.
    slacks = [float(queues[m].deadlines[0]) - now for m, *_ in live]
    exits, eligible = choose_exits(models, batches, slacks, exit_rule)
    candidates = []
    for (m, *_), model, batch, exit_pos, ok in zip(live, models, batches, exits, eligible, strict=True):
        delta = model.by_batch[batch - 1][exit_pos]
        score = 0.0
        for q, n, budget, ys, suffix in live:
            shift = delta / budget
            clipped_prefix = bisect_right(ys, shift - theta, key=neg)  # y >= theta - shift
            served = batch if q == m else 0
            first = max(clipped_prefix, served)
            score += clip * (clipped_prefix - min(clipped_prefix, served))
            if first >= n:
                continue  # every task clipped or served; shift may be huge (a tiny budget): no exp
            if code:
                score += exp(shift) * suffix[first]
            else:
                score += (exp(shift) * suffix[first] + (n - first) * expm1(shift)) / (math.e - 1.0)
        candidates.append(Candidate(m, exit_pos, batch, delta, score, ok))
    return candidates
