"""A request's planned deadline and deadline admission, as pure functions of what the server knows.

Admission asks one question of a new request: can ANY exit of its model still answer it in time,
given the work the accelerator must do first? The least that work can be is every queued task
due no later than the new one, served in full batches at the shallowest exit, after the running
batch. Refusing only then keeps every request the scheduler could still serve — the early exits
carry the excess, as the simulator's policy does — and refuses at once what no exit can save.

The same arithmetic bounds the counts that used to be tuned by hand: no model's queue can hold
more tasks than the accelerator finishes within that model's deadline at the shallowest exit
(`queue_bound`), so a count bound derived from it never refuses before admission does. And what
the server really serves bounds what it should hold (Little's law, `Throughput`): requests in
flight beyond a deadline's worth of its measured answers per second are answered late wherever
they wait, in its queues or unread in its sockets (on a CPU the front, not the model, binds).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from edgeserve.scheduler.queues import TaskQueue
from edgeserve.wire.bounds import real, timing_problem


def shallow_costs(latency_s: Sequence[float]) -> tuple[float, ...]:
    """Seconds to serve 0..B tasks in one batch at the shallowest exit: (0, L(1), ..., L(B))."""
    return (0.0, *latency_s)


def work_s(n: int, costs: Sequence[float], overhead_s: float = 0.0) -> float:
    """Seconds the server needs for `n` tasks of one model at its shallowest exit, in full
    batches of B = len(costs) - 1 and one partial batch, each batch `overhead_s` longer than its
    profile (`BatchOverhead`)."""
    full = len(costs) - 1
    batches, rest = divmod(n, full)
    return batches * (costs[full] + overhead_s) + (costs[rest] + overhead_s if rest else 0.0)


def queue_bound(slo_s: float, costs: Sequence[float]) -> int:
    """The most tasks of one model the accelerator can answer within `slo_s` from now, serving
    nothing else, in full batches at the shallowest exit (at least one batch): a queue longer than
    this holds tasks no exit can answer in time, so admission refuses before it fills."""
    full = len(costs) - 1
    batches = max(math.floor(slo_s / costs[full]), 1) if costs[full] > 0 else 1
    return batches * full + full  # (+ a batch: what admission may still take as the head's batch runs)


def request_budget(
    slo_s: float, deadline_ms: object, capture_ts: object, wall_now: float
) -> tuple[float, str | None]:
    """(seconds from now to the request's deadline, None) or (nan, what is wrong with the request).

    `deadline_ms` is a budget from now, `capture_ts` the Unix time of the capture (the SLO `slo_s`
    runs from it), neither: the SLO from now; `wall_now` is time.time(). The bounds are the socket
    codec's (wire/bounds.timing_problem): deadline_ms from 1 us to 1 day, capture_ts within a day
    of the clock; any other value, of any type, is a problem (so `invalid`), never an exception. A
    capture_ts in range but past the SLO gives a budget <= 0, answered `expired`.
    """
    problem = timing_problem(deadline_ms, capture_ts, wall_now)
    if problem is not None:
        return math.nan, problem
    if capture_ts is not None:
        captured = real(capture_ts)
        assert captured is not None  # checked by timing_problem
        return slo_s - (wall_now - captured), None
    if deadline_ms is None:
        return slo_s, None
    budget_ms = real(deadline_ms)
    assert budget_ms is not None  # checked by timing_problem
    return budget_ms / 1000.0, None


def late_on_arrival(total: float, waited: float, slo_s: float, captured: bool, busy: bool) -> str:
    """Why a request whose `total` budget was spent before it was queued is answered `expired`:
    it was `captured` that long ago (its SLO runs from the capture), or it `waited` that long to
    be read, on a `busy` server (queues or a batch: overloaded) or an idle one (reading it took
    longer than its deadline)."""
    if captured:
        slo_ms = slo_s * 1000.0
        return f"captured {slo_ms - total * 1000.0:.1f} ms ago, past the {slo_ms:g} ms SLO"
    return f"waited {waited * 1000.0:.1f} ms to be read, past its {total * 1000.0:g} ms deadline " + (
        "(the server is overloaded)"
        if busy
        else "(the server is not busy: reading a request takes that long here; give a "
        "longer deadline_ms or slo_ms)"
    )


def planned_budget(
    total: float, waited: float, margin_s: float, lag_s: float, floor: float, step_s: float
) -> float:
    """Seconds from arrival the scheduler plans a request to finish in: its `total` budget less the
    answer's way back (`margin_s`, the front's) and the loop's measured delays (`lag_s`),
    never less than `floor` of what is left after the wait to be read.

    Why: the policy spends a task's slack on deeper exits up to its deadline, but the answer is not
    back at the caller then: the loop has yet to pick up the batch (the answer lag, a high
    quantile) and to run (the loop's delay, a mean), and a front's answer then crosses the kernel
    and the client's read (`margin_s`). So the scheduler plans to that much before the deadline;
    `late` still means the request's own deadline. The measured part is held steady (the Server moves it
    by `step_s` at least) and the plan counts from the read, so that requests alike get one
    budget to the bit: a queue with one budget is ordered by urgency, and the policy scores it in
    a fraction of the time (scheduler/fast_scoring.py), which the executor waits for between two
    batches. The floor too is held to `step_s` steps of the read-to-queue wait: it binds for short
    deadlines under load, and a floor that moved with each request's microseconds of waiting gave
    every task its own budget again."""
    held_wait = math.ceil(waited / step_s) * step_s
    least = min(held_wait + floor * (total - held_wait), total)
    return max(total - margin_s - lag_s, least)


def admission_excess(
    queues: Sequence[TaskQueue],
    model: int,
    deadline: float,
    free_at: float,
    costs: Sequence[Sequence[float]],
    overhead_s: float = 0.0,
) -> float:
    """How many seconds too late the new task of `model`, due at `deadline` (absolute), would be
    answered at best: the running batch ends at `free_at`, then every queued task due no later
    than it (its own queue's whole FIFO, itself included) runs at the shallowest exit in full
    batches, each `overhead_s` longer than its profile says (`BatchOverhead`). <= 0: some exit
    can still answer it in time (admit); > 0: none can (refuse), and after that many seconds of
    serving a request like it would fit again.

    Refusing only then keeps every request some exit could serve; an idle server admits (nothing
    is ahead; a deadline no exit meets at all is refused at start, deadline_check.py), and with
    upstreams work the box cannot serve in time may go upstream instead (Server._enqueue)."""
    work = free_at - deadline
    for j, queue in enumerate(queues):
        n = len(queue)
        if j == model:
            n += 1
        elif not n:
            continue
        elif queue.uniform_budget is None:  # mixed budgets: the newest is not the latest
            n = int(np.count_nonzero(queue.deadlines <= deadline))
        elif queue.last_deadline() > deadline:  # one budget, FIFO by age: sorted by deadline
            n = int(np.searchsorted(queue.deadlines, deadline, side="right"))
        work += work_s(n, costs[j], overhead_s)
    return work


def overloaded(model: str, excess: float) -> str:
    """Why deadline admission refused a request of `model`: `excess` (admission_excess, > 0)."""
    return (
        f"overloaded: {model!r} cannot answer within this request's deadline now "
        f"(the work ahead needs {excess * 1000.0:.1f} ms more than it leaves)"
    )


def deepest_kept(
    queues: Sequence[TaskQueue],
    model: int,
    batch: int,
    at: float,
    exit_costs: Sequence[float],
    costs: Sequence[Sequence[float]],
    overhead_s: float = 0.0,
) -> int:
    """The deepest exit position, at most the one whose cost is last in `exit_costs` (this batch's
    seconds at exits 0..e), that keeps admission's promise to the tasks left behind: served after
    this batch at their shallowest exits in full batches, they still end by the latest of their
    deadlines. Admission took each of them because that held; a policy that spends a deadline's
    slack on the head's accuracy (it looks a few batches ahead) would otherwise make the tail late."""
    after = 0.0
    latest = -math.inf
    for j, queue in enumerate(queues):
        n = len(queue) - (batch if j == model else 0)
        if n <= 0:
            continue
        after += work_s(n, costs[j], overhead_s)
        deadlines = queue.deadlines
        latest = max(latest, float(deadlines[-1] if queue.uniform_budget is not None else deadlines.max()))
    if latest == -math.inf:
        return len(exit_costs) - 1
    spare = latest - (at + after)
    pos = len(exit_costs) - 1
    while pos > 0 and exit_costs[pos] > spare:
        pos -= 1
    return pos


def headroom(
    queues: Sequence[TaskQueue],
    free_in_s: float,
    budgets_s: Sequence[float],
    costs: Sequence[Sequence[float]],
    overhead_s: float = 0.0,
) -> int:
    """About how many more requests admission would take now: after the running batch (done in
    `free_in_s`) and all queued work, what is left of the most generous model's deadline budget,
    in tasks of that model at its shallowest exit in full batches (`overhead_s` as above). A
    front refuses past this cheaply, without decoding; the few it lets through are checked exactly."""
    queued = sum(work_s(len(q), c, overhead_s) for q, c in zip(queues, costs, strict=True) if q)
    best = 0
    for budget, c in zip(budgets_s, costs, strict=True):
        per_task = (c[-1] + overhead_s) / (len(c) - 1)
        left = budget - free_in_s - queued
        if left > 0:
            best = max(best, int(left / per_task) if per_task > 0 else 1 << 30)
    return best


@dataclass
class BatchOverhead:
    """What a batch costs the server beyond its (calibrated) profile while work waits, in seconds
    per batch: the gap before it (the loop's decision, the hand-off to the executor thread, reads
    and answers in between) and whatever slows the batch itself that calibration does not follow
    (the GIL; calibration clips a batch at 4x). Near zero on an accelerator the host keeps fed;
    on a CPU whose cores the front shares with the model, several times a small model's batch.
    Admission adds it to every batch of the work ahead, so that it refuses at the depth the
    server really drains, not the profile's.

    A batch's overhead is its time from when the executor could have started it (the end of the
    batch before, or its first task's arrival if later) to its end, less its prediction. Each
    moves the estimate by its predicted share of `horizon_s` (the longest deadline: what admission
    promises now is decided by about that much of the past), so that one stall (a page fault, a
    preempted thread) moves it by that batch's share, not by the stall's length: an estimate of
    a deadline or more would refuse everything while nothing ran to correct it.
    """

    horizon_s: float
    value: float = 0.0
    last_end: float = -math.inf

    def observe(self, ready: float, end: float, predicted_s: float) -> None:
        """A batch ended at `end`; its first task was ready at `ready`; the profile (as calibrated)
        predicted `predicted_s` for it."""
        last, self.last_end = self.last_end, end
        cycle = end - max(last, ready)
        if cycle <= 0 or predicted_s <= 0:
            return
        weight = min(predicted_s / self.horizon_s, 1.0)
        self.value = max(0.0, self.value + weight * (cycle - predicted_s - self.value))


@dataclass
class Throughput:
    """Little's law for the host: a request answered R seconds after it came keeps X * R requests
    in flight at X answers per second, so beyond X * D requests some wait past a deadline D, in
    the queues or unread in the sockets. The accelerator's side of that is deadline admission's
    (`headroom`); this is the host's: X is what its Python could answer per second of CPU
    (answers over the process's CPU time outside the backend's batches: one interpreter lock,
    one core at most), counted over ticks of `tick_s` (the longest deadline), and D the shortest
    deadline: whoever sends, the next request may be one of the tightest, and it waits behind
    the others in flight (a flood's even share included). On a CPU whose host binds (the front,
    the loop, the GIL) the total comes out near a deadline of what it answers; on an accelerator
    the host has time to spare and this does not bind. A tick with nothing answered, or with the
    host idle, says nothing: no bound then."""

    deadline_s: float  # the shortest deadline
    tick_s: float  # the longest
    served: int = 0  # answers this tick
    per_cpu_s: float = 0.0  # answers per host CPU second, over the last tick (0: unknown)
    since: float = -math.inf
    cpu_since: float = 0.0

    def observe(self, n: int) -> None:
        """`n` requests left a batch (answered, whatever their status)."""
        self.served += n

    def target(self, now: float, host_cpu: Callable[[], float], way_s: float = 0.0) -> float:
        """The in-flight total at `now` (`host_cpu`: the host's CPU seconds so far, asked once a
        tick): what the host can answer per second x the time the server has of the shortest
        deadline (less `way_s`, the requests' way in and the answers' way back); inf when unknown."""
        if now - self.since >= self.tick_s:
            host_cpu_s = host_cpu()
            busy = host_cpu_s - self.cpu_since
            fresh = now - self.since < 2 * self.tick_s  # (after a longer gap: start over)
            self.per_cpu_s = self.served / busy if fresh and busy > 0 else 0.0
            self.served = 0
            self.since, self.cpu_since = now, host_cpu_s
        if not self.per_cpu_s:
            return math.inf
        return self.per_cpu_s * max(self.deadline_s - way_s, 0.0)
