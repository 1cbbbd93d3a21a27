"""The factorised stability score in plain Python: the fast path for paper-sized queue states.

Same algebra as scoring_numpy's factorised method (see there): per queue with one deadline
budget D_q, the tasks are ordered by y = w / D_q, so for candidate m (service time delta_m,
s = delta_m / D_q) the clipped tasks are the prefix with y >= theta - s, found by bisection, and
the rest contribute e^s times a suffix sum of e^(y - 1) (paper form: of e^y - 1, plus
(e^s - 1) per task). Per decision that is O(N) work for the y's and O(M^2 log N) for the
candidates, instead of the loop's O(M N) calls to u(). Without numpy's per-call overhead this
wins below a few hundred queued tasks; it is what the executor thread runs between two batches
under load, so it keeps to the fewest Python steps (no key functions, no per-task branches).
"""

from __future__ import annotations

import math
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
    exp, expm1 = math.exp, math.expm1
    e1 = math.e - 1.0

    # Per queue: (index, length, budget, -y's (non-decreasing), how many are clipped, suffix sums
    # of the unclipped tasks' factors). FIFO by age with one budget: the clipped tasks (y >=
    # theta) are a prefix, and every candidate clips at least those (its shift is >= 0). -y is
    # kept so that the bisections need no key function (negation is exact: the same numbers).
    live = []
    models, batches, slacks = [], [], []
    for q_index, queue in enumerate(queues):
        n = len(queue)
        if not n:
            continue
        budget = queue.uniform_budget
        if budget is None:
            raise ValueError(f"queue {q_index} mixes deadline budgets; use the numpy direct method")
        arrivals = queue.arrivals.tolist()
        neg_ys = [(a - now) / budget for a in arrivals]
        k = bisect_right(neg_ys, -theta)  # tasks 0..k-1 are clipped (y >= theta)
        newest_first = neg_ys[: k - 1 if k else None : -1]  # the unclipped tasks, summed from the tail
        factors = [exp(-v - 1.0) for v in newest_first] if code else [expm1(-v) for v in newest_first]
        suffix = list(accumulate(factors, initial=0.0))
        suffix.reverse()  # suffix[i - k] = sum of the factors of tasks i..n-1, for i >= k
        live.append((q_index, n, budget, neg_ys, k, suffix))
        model = latency.models[q_index]
        models.append(model)
        batches.append(min(n, model.max_batch, batch_cap or model.max_batch))
        # One budget and FIFO order: the head has the earliest deadline of the batch (pushed as
        # arrival + budget, the same sum in the same precision).
        slacks.append((arrivals[0] + budget) - now)
    exits, eligible = choose_exits(models, batches, slacks, exit_rule)
    candidates = []
    for (m, *_), model, batch, exit_pos, ok in zip(live, models, batches, exits, eligible, strict=True):
        delta = model.by_batch[batch - 1][exit_pos]
        score = 0.0
        for q, n, budget, neg_ys, k, suffix in live:
            shift = delta / budget
            clipped_prefix = bisect_right(neg_ys, shift - theta)  # y >= theta - shift (>= k)
            served = batch if q == m else 0
            if clipped_prefix > served:
                score += clip * (clipped_prefix - served)
                first = clipped_prefix
            else:
                first = served
            if first >= n:
                continue  # every task clipped or served; shift may be huge (a tiny budget): no exp
            if code:
                score += exp(shift) * suffix[first - k]
            else:
                score += (exp(shift) * suffix[first - k] + (n - first) * expm1(shift)) / e1
        candidates.append(Candidate(m, exit_pos, batch, delta, score, ok))
    return candidates
