"""The factorised stability score for deep queues: O(log n) per (candidate, queue), not O(n).

Why: on a fast GPU with 50 ms deadlines a queue holds hundreds to thousands of tasks (a deadline
is many batches long), and the other scorers touch every task at every decision (an exp each):
the decision grew to hundreds of microseconds while the GPU waited for it.

The algebra is scoring_python's (one budget D per queue, a finite clip, FIFO by age): for
candidate m with shift s = delta_m / D, the clipped tasks are a prefix of the queue (found by
bisection) and the unclipped rest contributes e^s times a sum of e^y over a suffix of the queue,
y = (now - a) / D. Here that suffix sum comes from prefix sums the queue keeps (TaskQueue's
cache) instead of a pass over the tasks:

    e^y_k = e^((now - pivot) / D) * w_k,   w_k = e^((pivot - a_k) / D),
    sum over k >= i of w_k = P[tail - 1] - P[i - 1],   P[i] = w_anchor + ... + w_i.

P is kept in two parts (hi + lo, a compensated sum: each addition's rounding error goes to lo),
so the difference keeps its digits however large the prefix before i has grown. Each decision
extends P over the tasks that arrived since the last one (one exp each, once in a task's life).
Its start (the anchor) and the pivot move when they must:

- the weight before the first unclipped task (tasks popped or clipped since the anchor) exceeds
  DOMINANCE times the rest: that prefix is subtracted from the rest's sums (shift_down, exact
  with its rounding error kept in lo: a few flops per task, no exp) and the anchor moves to the
  first unclipped task (clipped tasks stay clipped as time goes on). About once per
  ln(DOMINANCE) ~ 14 deadlines of time;
- rebuilt (an exp per unclipped task, pivot at the first of them): the cache was built for
  another budget, or the queue's own changes spoilt it (insert, or remove, in the middle:
  TaskQueue._spoil), or time moved backwards, or the newest task arrived more than PIVOT_SPAN
  budgets after the pivot (before its weight could underflow; once per 64 deadlines of time).
  Compaction (TaskQueue._make_room) carries the sums along, and a queue that empties starts
  afresh at no cost.

Queues that mix budgets in a few contiguous runs (TaskQueue's runs: a server's planned budget
steps by 0.2 ms as its lag moves, and for about a deadline the queue holds the old budget's tasks,
then the new one's; up to MAX_RUNS runs) are scored run by run: each run is FIFO by age with one
budget D_r, so it has its own prefix sums (its own pivot, anchor and rebases, kept in its row of
TaskQueue._runs; the sums share the queue's _hi/_lo, each run's from its own anchor), its clipped
tasks are a prefix of it (bisection with its own D_r) and the served batch, a prefix of the
queue, is a prefix of each run. A candidate's score is the sum over queues and runs, in order.
The batch's slack (its exit) is its tightest deadline: a run's tightest is its oldest task's, so
it is the least over the runs the batch spans (a later run with a shorter budget may bind).

The score differs from the per-task loop's (reference.py) by rounding only, as the other
factorised scorers' do; decisions are the loop's (tests/scheduler/test_deep_scoring.py). The
compiled decision (_quick.c) does exactly this arithmetic in this order, so its Dispatch equals
this module's to the bit; this Python copy is the path where the extension is not built.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Sequence

from edgeserve.scheduler.candidates import Candidate, choose_exits
from edgeserve.scheduler.latency import LatencyModel
from edgeserve.scheduler.queues import (
    RUN_ANCHOR,
    RUN_BUDGET,
    RUN_CACHED,
    RUN_DONE,
    RUN_FIELDS,
    RUN_PIVOT,
    RUN_START,
    TaskQueue,
)
from edgeserve.scheduler.urgency import Urgency

# Rebase when the weight before the first unclipped task exceeds this many times the rest's: the
# difference of two prefix sums then loses at most 20 of a double's 52 bits, ~10 digits are left.
DOMINANCE = 2.0**20
# Rebase when the newest task arrived more than this many budgets after the pivot: its weight
# e^-64 ~ 2^-92 is then still held by the high/low pair of sums (~106 bits) beside a weight of 1.
PIVOT_SPAN = 64.0
# Queues of up to this many runs of one budget are scored run by run; beyond (budgets interleaved:
# requests with their own deadlines), numpy's direct matrix. A run costs one bisection and a few
# flops per candidate, so 8 runs over 16 models (~30 us compiled) stay below the matrix's ~100 us
# at 1,000 tasks; interleaved budgets make runs of a task or two, where the matrix is as cheap.
MAX_RUNS = 8


def first_above(arrivals: memoryview, lo: int, hi: int, now: float, budget: float, limit: float) -> int:
    """The first index in [lo, hi) whose -y = (arrival - now) / budget exceeds `limit` (hi if none):
    bisect_right over the -y's without computing them all (the same numbers: monotone in arrival)."""
    while lo < hi:
        mid = (lo + hi) // 2
        if limit < (arrivals[mid] - now) / budget:
            hi = mid
        else:
            lo = mid + 1
    return lo


def shift_down(hi: memoryview, lo: memoryview, start: int, stop: int, base_hi: float, base_lo: float) -> None:
    """Subtract the prefix (base_hi, base_lo) from the prefix sums in [start, stop): they then
    start at `start`. Each high part's rounding error goes to its low part (TwoSum), so nothing is
    lost however large the base was."""
    minus = -base_hi
    for i in range(start, stop):
        a = hi[i]
        s = a + minus
        bb = s - a
        hi[i] = s
        lo[i] = (lo[i] - base_lo) + ((a - (s - bb)) + (minus - bb))


def refresh(
    queue: TaskQueue, row: int, start: int, stop: int, now: float, theta: float
) -> tuple[int, int, float]:
    """Bring the prefix sums of one run of `queue` (its tasks [start, stop), the floats of _runs
    from `row` on) up to its end for this decision (extend, or rebase where it must).

    Returns (k0, anchor, cexp): k0 the run's first task not clipped even with no shift (y < theta),
    anchor the cache's first task (<= k0), cexp = (now - pivot) / budget. _quick.c's
    `deep_refresh` is the same code.
    """
    arrivals = memoryview(queue._arrival)
    hi, lo = memoryview(queue._hi), memoryview(queue._lo)
    runs = memoryview(queue._runs)
    budget = runs[row + RUN_BUDGET]
    k0 = first_above(arrivals, start, stop, now, budget, -theta)
    cached, pivot = runs[row + RUN_CACHED], runs[row + RUN_PIVOT]
    anchor, done = int(runs[row + RUN_ANCHOR]), int(runs[row + RUN_DONE])
    if not (
        cached == budget
        and anchor <= k0
        and k0 <= done
        and done <= stop
        and (arrivals[stop - 1] - pivot) / budget <= PIVOT_SPAN
    ):  # rebuild: a new pivot and anchor, at the first task that is not clipped
        anchor = done = k0
        pivot = arrivals[k0] if k0 < stop else now
    for i in range(done, stop):  # the tasks that arrived since: one exp each
        w = math.exp((pivot - arrivals[i]) / budget)
        if i == anchor:
            hi[i] = w
            lo[i] = 0.0
        else:
            a = hi[i - 1]
            s = a + w
            bb = s - a
            hi[i] = s
            lo[i] = lo[i - 1] + ((a - (s - bb)) + (w - bb))
    if k0 > anchor and hi[k0 - 1] > DOMINANCE * (hi[stop - 1] - hi[k0 - 1]):
        shift_down(hi, lo, k0, stop, hi[k0 - 1], lo[k0 - 1])  # anchor at k0: the rest keeps its digits
        anchor = k0
    runs[row + RUN_CACHED], runs[row + RUN_PIVOT] = budget, pivot
    runs[row + RUN_ANCHOR], runs[row + RUN_DONE] = float(anchor), float(stop)
    return k0, anchor, (now - pivot) / budget


def queue_runs(queue: TaskQueue) -> list[tuple[int, int, int, float]]:
    """The live runs of `queue`, oldest first: (row in _runs, start, stop, budget), as the scorer
    reads them (the oldest run starts at the head)."""
    runs = memoryview(queue._runs)
    h, t = queue._head, queue._tail
    found = []
    for r in range(queue._run_head, queue._run_tail):
        row = r * RUN_FIELDS
        start = max(int(runs[row + RUN_START]), h)
        stop = int(runs[row + RUN_FIELDS + RUN_START]) if r + 1 < queue._run_tail else t
        found.append((row, start, stop, runs[row + RUN_BUDGET]))
    return found


def deep_candidates(
    queues: Sequence[TaskQueue],
    now: float,
    latency: LatencyModel,
    urgency: Urgency,
    exit_rule: str = "adaptive",
    batch_cap: int | None = None,
) -> list[Candidate]:
    """Same candidates as reference_candidates. Needs a finite clip and at most MAX_RUNS runs of
    one budget per queue (one, the usual queue; a few after a server's planned budget steps).

    A queue of several runs is scored run by run: each run is FIFO by age with one budget, so its
    clipped tasks are a prefix of it and the rest a suffix sum of its own prefix sums; the served
    batch is a prefix of the queue, so of each run too. The batch's slack (for its exit) is its
    tightest deadline: within a run the oldest task's, so the least over the runs it spans.
    """
    theta = urgency.threshold
    clip = urgency.clip
    code = urgency.form == "code"
    if math.isinf(theta):
        raise ValueError("the factorised scorer needs a finite clip; use the numpy direct method")
    exp = math.exp
    e1 = math.e - 1.0

    live = []
    models, batches, slacks = [], [], []
    for q_index, queue in enumerate(queues):
        if not queue:
            continue
        if queue.run_count > MAX_RUNS:
            raise ValueError(
                f"queue {q_index} mixes deadline budgets in {queue.run_count} runs (more than "
                f"{MAX_RUNS}); use the numpy direct method"
            )
        model = latency.models[q_index]
        batch = min(len(queue), model.max_batch, batch_cap or model.max_batch)
        deadlines = memoryview(queue._deadline)
        served = queue._head + batch
        runs, slack = [], math.inf
        for row, start, stop, budget in queue_runs(queue):
            if start < served:  # in the batch: its oldest task is the run's tightest there
                slack = min(slack, deadlines[start] - now)
            runs.append((start, stop, budget, *refresh(queue, row, start, stop, now, theta)))
        live.append((q_index, queue, runs))
        models.append(model)
        batches.append(batch)
        slacks.append(slack)
    if not live:
        return []
    exits, eligible = choose_exits(models, batches, slacks, exit_rule)
    deltas = [model.by_batch[b - 1][e] for model, b, e in zip(models, batches, exits, strict=True)]
    largest = max(deltas)
    terms = []
    for q, queue, runs in live:
        arrivals = memoryview(queue._arrival)
        hi, lo = memoryview(queue._hi), memoryview(queue._lo)
        for start, stop, budget, k0, anchor, cexp in runs:
            # Every candidate's clipped prefix of this run lies in [k0, k1]: their -y's, for bisect
            k1 = first_above(arrivals, k0, stop, now, budget, largest / budget - theta)
            window = [(arrivals[i] - now) / budget for i in range(k0, k1)]
            terms.append(
                (q, budget, k0, anchor, cexp, window, hi, lo, start, stop, hi[stop - 1], lo[stop - 1])
            )
    candidates = []
    for (m, queue, _), batch, exit_pos, delta, ok in zip(live, batches, exits, deltas, eligible, strict=True):
        score = 0.0
        mine = queue._head + batch  # the served batch: the queue's first tasks
        for q, budget, k0, anchor, cexp, window, hi, lo, start, stop, hi_t, lo_t in terms:
            shift = delta / budget
            clipped = k0 + bisect_right(window, shift - theta)  # = first_above(..., k0, k1, ...)
            served = start
            if q == m and mine > start:  # the batch's part of this run
                served = mine if mine < stop else stop
            if clipped > served:
                score += clip * (clipped - served)
                first = clipped
            else:
                first = served
            if first >= stop:
                continue
            pre_hi, pre_lo = (hi[first - 1], lo[first - 1]) if first > anchor else (0.0, 0.0)
            total = (hi_t - pre_hi) + (lo_t - pre_lo)
            if code:
                score += exp(cexp + shift - 1.0) * total
            else:
                score += (exp(cexp + shift) * total - (stop - first)) / e1
        candidates.append(Candidate(m, exit_pos, batch, delta, score, ok))
    return candidates
