"""The stability score of every candidate at once, vectorised with numpy (large queue states).

For candidate queue m with predicted service time delta_m, every task k that stays queued gets
u((w_k + delta_m) / D_k) and S_m is their sum (EdgeServing Eq. 4). Two exact evaluations:

- factorised, O(N + M^2 log N): below the clip u is alpha * e^x (+ a constant), and
  e^((w + delta) / D) = e^(w / D) * e^(delta / D). When every queue has one deadline budget D_q
  (the usual case: the model's SLO), a queue's tasks are ordered by w / D, so the clipped tasks
  of any candidate form a prefix found by binary search and the unclipped rest is a suffix sum of
  e^(w / D) scaled by e^(delta / D_q). One pass computes all suffix sums for all candidates.
- direct, O(M * N): the (candidate x task) matrix of urgencies. Used when some queue mixes
  deadline budgets (requests that carry their own) or the clip is off, where the prefix property
  or the bounded suffix sums no longer hold.

Both agree with the per-task loop in reference.py to ~1e-12 relative
(tests/scheduler/test_scheduler_scoring.py).
numpy's per-call overhead (~1 us) makes this slower than scoring_python below a few hundred tasks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from edgeserve.scheduler.candidates import Candidate, choose_exits
from edgeserve.scheduler.latency import LatencyModel
from edgeserve.scheduler.queues import TaskQueue
from edgeserve.scheduler.urgency import Urgency


def numpy_candidates(
    queues: Sequence[TaskQueue],
    now: float,
    latency: LatencyModel,
    urgency: Urgency,
    exit_rule: str = "adaptive",
    batch_cap: int | None = None,
    method: str = "auto",
) -> list[Candidate]:
    """Same candidates as reference_candidates. `method`: auto (factorised when it is exact), factorised
    or direct."""
    models = [i for i, q in enumerate(queues) if len(q)]
    if not models:
        return []
    live = [queues[i] for i in models]
    arrivals = np.concatenate([q.arrivals for q in live])
    budgets = np.concatenate([q.budgets for q in live])
    deadlines = np.concatenate([q.deadlines for q in live])
    lens = np.array([len(q) for q in live], dtype=np.int64)
    ends = np.cumsum(lens)
    starts = ends - lens
    idx = np.array(models, dtype=np.int64)
    batch = np.minimum(lens, latency.max_batches[idx])
    if batch_cap is not None:
        np.minimum(batch, batch_cap, out=batch)

    # Tightest slack in each candidate batch: min over its first b tasks of (deadline - now).
    bounds = np.empty(2 * len(models), dtype=np.int64)
    bounds[0::2] = starts
    bounds[1::2] = starts + batch
    slack = np.minimum.reduceat(np.append(deadlines, np.inf), bounds)[0::2] - now

    exit_pos, eligible = _exits(latency, idx, batch, slack, exit_rule)
    table = latency.padded[idx, :, batch - 1]
    delta = table[np.arange(len(models)), exit_pos]

    waits = now - arrivals
    if method == "auto":
        uniform = all(q.uniform_budget is not None for q in live)
        method = "factorised" if uniform and math.isfinite(urgency.clip) else "direct"
    if method == "factorised":
        scores = _factorised(waits, budgets, lens, starts, ends, batch, delta, urgency)
    elif method == "direct":
        scores = _direct(waits, budgets, starts, batch, delta, urgency)
    else:
        raise ValueError(f"unknown scoring method {method!r}; choose auto, factorised or direct")
    return [
        Candidate(m, int(e), int(b), float(d), float(s), ok)
        for m, e, b, d, s, ok in zip(models, exit_pos, batch, delta, scores, eligible, strict=True)
    ]


def _exits(
    latency: LatencyModel, idx: np.ndarray, batch: np.ndarray, slack: np.ndarray, rule: str
) -> tuple[np.ndarray, list[bool]]:
    everyone = [True] * idx.size
    if rule == "shallowest":
        return np.zeros(idx.size, dtype=np.int64), everyone
    if rule == "final":
        return latency.n_exits[idx] - 1, everyone
    if rule in ("protective", "safe"):
        models = [latency.models[i] for i in idx.tolist()]
        exits, eligible = choose_exits(models, batch.tolist(), slack.tolist(), rule)
        return np.array(exits, dtype=np.int64), eligible
    if rule != "adaptive":
        raise ValueError(f"unknown exit rule {rule!r}")
    table = latency.padded[idx, :, batch - 1]  # inf where a model has fewer exits: never feasible
    feasible = table <= slack[:, None]
    deepest = table.shape[1] - 1 - np.argmax(feasible[:, ::-1], axis=1)
    return np.where(feasible.any(axis=1), deepest, 0), everyone


def _direct(
    waits: np.ndarray,
    budgets: np.ndarray,
    starts: np.ndarray,
    batch: np.ndarray,
    delta: np.ndarray,
    urgency: Urgency,
) -> np.ndarray:
    """u((w + delta_m) / D) for every (candidate, task), with each candidate's own batch zeroed."""
    with np.errstate(over="ignore"):  # a vanishing budget gives x = inf, which u() clips
        u = urgency.of((waits[None, :] + delta[:, None]) / budgets[None, :])
    rows = np.repeat(np.arange(batch.size), batch)
    offsets = np.arange(rows.size) - np.repeat(np.cumsum(batch) - batch, batch)
    u[rows, np.repeat(starts, batch) + offsets] = 0.0
    return u.sum(axis=1)


def _factorised(
    waits: np.ndarray,
    budgets: np.ndarray,
    lens: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    batch: np.ndarray,
    delta: np.ndarray,
    urgency: Urgency,
) -> np.ndarray:
    """Requires one budget per queue and a finite clip (see the module docstring)."""
    n_queues = lens.size
    theta = urgency.threshold
    with np.errstate(over="ignore"):  # a vanishing budget gives inf: clipped below
        y = waits / budgets  # normalised queuing time now; non-increasing within each queue
        shift = delta[:, None] / budgets[starts][None, :]  # [candidate, queue]: delta_m / D_q

    # Clipped tasks of queue q under candidate m: y >= theta - shift, a prefix of q. One global
    # searchsorted over keys that are ascending within a queue and separated between queues.
    y_top = np.minimum(y, theta)
    below = max(0.0, -float(y.min()))  # > 0 only if a task arrived "after" now
    spacing = theta + 1.0 + below
    key = np.repeat(np.arange(n_queues) * spacing, lens) - y_top
    query = np.arange(n_queues)[None, :] * spacing + np.minimum(shift - theta, below)
    clipped_prefix = np.searchsorted(key, query.ravel(), side="right").reshape(query.shape) - starts[None, :]

    # Suffix sums of the per-task factor, bounded by the clip (y_top), so the differences are exact
    # to ~N ulp of the score.
    factor = np.exp(y_top - 1.0) if urgency.form == "code" else np.expm1(y_top)
    suffix = np.zeros(factor.size + 1)
    suffix[:-1] = np.cumsum(factor[::-1])[::-1]

    served = np.zeros((n_queues, n_queues), dtype=np.int64)
    served[np.arange(n_queues), np.arange(n_queues)] = batch  # a candidate's own batch leaves its queue
    first = np.maximum(clipped_prefix, served)
    tail_sum = suffix[starts[None, :] + first] - suffix[ends][None, :]
    clipped = clipped_prefix - np.minimum(clipped_prefix, served)
    # Where a queue keeps unclipped tasks, shift < theta - y of its first one, so e^shift is finite;
    # elsewhere the terms are zero but shift can be huge (a tiny budget): keep inf * 0 out of them.
    shift = np.where(first < lens[None, :], shift, 0.0)
    if urgency.form == "code":
        unclipped = np.exp(shift) * tail_sum
    else:  # sum (e^(y+s) - 1) = e^s * sum(e^y - 1) + n * (e^s - 1), all terms non-negative
        unclipped = (np.exp(shift) * tail_sum + (lens[None, :] - first) * np.expm1(shift)) / (math.e - 1.0)
    return (urgency.clip * clipped + unclipped).sum(axis=1)
