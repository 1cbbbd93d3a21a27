"""Discrete-event simulation of one non-preemptive accelerator shared by time division.

Events are arrivals, batch completions and policy wake-ups. Whenever the accelerator is idle
and something happened, the policy decides: drops are applied, then a dispatch occupies the
accelerator for a service time drawn from the profile (ServiceTimes, at the quantile position of
the batch's first task: common random numbers across policies), or a Wait sets a wake-up.
Arrivals stop at the trace's duration and the queues are then drained, so every task ends
exactly once: finished or dropped. Same trace, policy and seed: identical log.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from edgeserve.scheduler.arrivals import ArrivalTrace
from edgeserve.scheduler.decision import Dispatch, Policy, Wait
from edgeserve.scheduler.queues import TaskQueue
from edgeserve.scheduler.service import ServiceTimes

QUEUED, FINISHED, DROPPED = 0, 1, 2


@dataclass(frozen=True)
class TaskLog:
    """What happened to every task of a run, indexed by task id (= arrival order)."""

    model: np.ndarray
    arrival: np.ndarray
    budget: np.ndarray
    start: np.ndarray  # nan when dropped
    finish: np.ndarray  # finish time, or drop time when dropped
    exit: np.ndarray  # manifest exit index, -1 when dropped
    batch: np.ndarray  # size of the batch it ran in, 0 when dropped
    state: np.ndarray  # FINISHED or DROPPED
    horizon_s: float  # arrivals came in [0, horizon_s)
    batches: int

    @property
    def latency(self) -> np.ndarray:
        return self.finish - self.arrival


class PolicyError(RuntimeError):
    """The policy asked for something impossible (a bigger batch than queued, a wake-up in the past)."""


def simulate(
    policy: Policy,
    trace: ArrivalTrace,
    service: ServiceTimes,
    budgets_s: Sequence[float],
    seed: int = 0,
    dispatch_overhead_s: float = 0.0,
) -> TaskLog:
    """Run `trace` through `policy`; task k of model m has deadline budget budgets_s[m].

    `dispatch_overhead_s`: the accelerator stands idle that long before each batch starts (a
    runtime's decision, hand-off and wake-up; 0 for an ideal one).
    """
    if not 0.0 <= dispatch_overhead_s < math.inf:
        raise ValueError(f"dispatch_overhead_s must be finite and >= 0, got {dispatch_overhead_s}")
    n = len(trace)
    n_models = len(budgets_s)
    luck = np.random.default_rng([seed, 7919]).random(n).tolist()  # per task: ServiceTimes.draw
    queues = [TaskQueue() for _ in range(n_models)]
    times = trace.times.tolist()
    models = trace.models.tolist()
    budget_of = [float(b) for b in budgets_s]

    start = np.full(n, math.nan)
    finish = np.full(n, math.nan)
    exit_used = np.full(n, -1, dtype=np.int64)
    batch_size = np.zeros(n, dtype=np.int64)
    state = np.zeros(n, dtype=np.int8)

    next_arrival = 0
    busy_until = math.inf  # completion time of the running batch
    running: np.ndarray | None = None
    wake = math.inf
    batches = 0
    now = 0.0
    while True:
        upcoming = times[next_arrival] if next_arrival < n else math.inf
        now = min(upcoming, busy_until, wake if running is None else math.inf)
        if math.isinf(now):
            break
        if running is not None and busy_until <= now:
            state[running] = FINISHED
            running, busy_until = None, math.inf
        while next_arrival < n and times[next_arrival] <= now:
            m = models[next_arrival]
            queues[m].push(next_arrival, times[next_arrival], budget_of[m])
            next_arrival += 1
        if wake <= now:
            wake = math.inf
        if running is not None or not any(queues):
            continue
        decision = policy.decide(queues, now)
        if decision is None:
            continue
        for drop in decision.drops:
            removed = queues[drop.model].remove(drop.task_ids)
            if removed.size != len(set(drop.task_ids)):
                raise PolicyError(f"{policy.name}: dropped tasks that are not queued for model {drop.model}")
            state[removed] = DROPPED
            finish[removed] = now
        if isinstance(decision, Dispatch):
            queue = queues[decision.model]
            if not 1 <= decision.batch <= len(queue):
                raise PolicyError(f"{policy.name}: batch of {decision.batch} from a queue of {len(queue)}")
            running = queue.pop(decision.batch)
            u = luck[int(running[0])]
            begin = now + dispatch_overhead_s
            busy_until = begin + service.draw(decision.model, decision.exit, decision.batch, u)
            start[running] = begin
            finish[running] = busy_until
            exit_used[running] = decision.exit
            batch_size[running] = decision.batch
            batches += 1
            wake = math.inf
        elif isinstance(decision, Wait):
            if decision.until <= now and not decision.drops:
                raise PolicyError(
                    f"{policy.name}: asked to wait until {decision.until}, which is not after {now}"
                )
            wake = max(decision.until, now)  # == now: decide again at once, after the drops
    if (state == QUEUED).any():
        raise PolicyError(f"{policy.name}: {int((state == QUEUED).sum())} tasks were never served or dropped")
    return TaskLog(
        model=trace.models.copy(),
        arrival=trace.times.copy(),
        budget=np.array([budget_of[m] for m in models], dtype=np.float64),
        start=start,
        finish=finish,
        exit=exit_used,
        batch=batch_size,
        state=state,
        horizon_s=trace.duration_s,
        batches=batches,
    )
