"""The paper's baselines that do not use the stability score.

- QueueOrderPolicy: pick a queue by a local rule, then an exit by a fixed rule.
  All-Final = LQF + final exit; All-Early = LQF + shallowest exit;
  Early-Exit+LQF = LQF + deepest feasible exit; Early-Exit+EDF = earliest deadline + deepest feasible.
- SymphonyPolicy: deferred batching (Chen et al., 2024) as the EdgeServing authors run it: drop
  tasks already past their deadline, and dispatch a model's batch only once waiting for one more
  request would make its tightest task miss; otherwise wait.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from edgeserve.scheduler.candidates import EXIT_RULES, choose_exit
from edgeserve.scheduler.decision import Dispatch, Drop, Wait
from edgeserve.scheduler.latency import LatencyModel
from edgeserve.scheduler.queues import TaskQueue

QUEUE_RULES = ("lqf", "edf")


class QueueOrderPolicy:
    """Longest queue first (lqf) or earliest deadline first (edf); ties go to the lower model index."""

    def __init__(
        self,
        latency: LatencyModel,
        select: str,
        exit_rule: str,
        name: str,
        batch_cap: int | None = None,
    ) -> None:
        if select not in QUEUE_RULES:
            raise ValueError(f"unknown queue rule {select!r}; choose one of {QUEUE_RULES}")
        if exit_rule not in EXIT_RULES:
            raise ValueError(f"unknown exit rule {exit_rule!r}; choose one of {EXIT_RULES}")
        self.latency = latency
        self.select = select
        self.exit_rule = exit_rule
        self.batch_cap = batch_cap
        self.name = name

    def decide(self, queues: Sequence[TaskQueue], now: float) -> Dispatch | None:
        best: tuple[float, int, int, float] | None = None  # (key, model, batch, tightest deadline)
        for m, queue in enumerate(queues):
            n = len(queue)
            if not n:
                continue
            model = self.latency.models[m]
            batch = min(n, model.max_batch, self.batch_cap or model.max_batch)
            tightest = float(queue.deadlines[:batch].min())
            key = -n if self.select == "lqf" else tightest
            if best is None or key < best[0]:
                best = (key, m, batch, tightest)
        if best is None:
            return None
        _, m, batch, tightest = best
        model = self.latency.models[m]
        exit_pos = choose_exit(model, self.exit_rule, batch, tightest - now)
        return Dispatch(m, model.exit_ids[exit_pos], batch, predicted_s=model.latency(exit_pos, batch))


class SymphonyPolicy:
    """Deferred batching at the final exit, each model on its own; the most urgent ready batch runs.

    For a queue with n live tasks, B_max' = min(n, B_max): the first B in 1..B_max' - 1 with
    min(deadline of the first B+1) - L(B+1) <= now is dispatched (one more request would miss),
    or B_max' once min(deadline of the first B_max') - L(B_max') <= now. Among ready queues the
    earliest latest-start wins (then the larger batch, the longer queue, the lower index).
    If none is ready it waits until the earliest time one would be.
    """

    def __init__(self, latency: LatencyModel, name: str = "symphony") -> None:
        self.latency = latency
        self.name = name

    def decide(self, queues: Sequence[TaskQueue], now: float) -> Dispatch | Wait | None:
        drops: list[Drop] = []
        ready: list[tuple[float, int, int, int, int]] = []  # (latest start, -B, -n, model, B)
        wake = math.inf
        any_live = False
        for m, queue in enumerate(queues):
            if not queue:
                continue
            deadlines = queue.deadlines
            expired = deadlines < now
            if expired.any():
                drops.append(Drop(m, tuple(queue.ids[expired].tolist())))
                deadlines = deadlines[~expired]
            n = deadlines.size
            if not n:
                continue
            any_live = True
            model = self.latency.models[m]
            final = len(model.exit_ids) - 1
            cap = min(n, model.max_batch)
            tightest = deadlines[:cap].tolist()
            running = math.inf
            for b in range(1, cap + 1):
                running = min(running, tightest[b - 1])
                if b < cap:  # would one more request (b + 1) miss?
                    latest = min(running, tightest[b]) - model.latency(final, b + 1)
                else:
                    latest = running - model.latency(final, b)
                if latest <= now:
                    ready.append((latest, -b, -n, m, b))
                    break
                wake = min(wake, latest)
        if ready:
            _, _, _, m, b = min(ready)
            model = self.latency.models[m]
            final = len(model.exit_ids) - 1
            return Dispatch(
                m, model.exit_ids[final], b, predicted_s=model.latency(final, b), drops=tuple(drops)
            )
        if any_live or drops:
            return Wait(until=wake, drops=tuple(drops))
        return None
