"""Which queued tasks go upstream: the offload rule, pure (it reads the queues and returns a plan).

The rule (`plan`), run by the Server before each scheduling decision and on arrivals while a batch
runs:

1. Local prediction. The executor is free at `free_at` (now, or the running batch's predicted end).
   Every queued task of every model gets a predicted local completion from a simulation of the
   most favourable local service: the shallowest exit, full batches (up to B_max), models served
   earliest-deadline-first by the deadline of their queue's head. So a task counts as "missing
   locally" only when even the fastest local service, after the running batch and the other
   models' queued work ahead of it, finishes after its deadline.
2. While simulating, a missing task of a model with an upstream route whose predicted completion
   (now + base RTT + bytes / bandwidth + the upstream's service time, conservative quantiles from
   LinkEstimator) meets its deadline is taken out of the local plan: the tasks behind it then
   predict earlier, so only the excess over local capacity is chosen. Missing tasks that no
   upstream can save stay local (they are served late or expired as usual).
3. The chosen tasks of each model go as whole batches (at most the upstream's max batch), least
   slack first, to the upstream predicted to answer soonest that has an in-flight slot and a
   breaker that allows it; each batch's prediction is checked again at its real size, and tasks
   it would no longer save stay queued.

offloader.py applies the plan, as the Server applies a policy's Decision.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from edgeserve.scheduler import LatencyModel, TaskQueue

Predict = Callable[[int, int, int], float]  # (batch, bytes, batches ahead) -> seconds to the answer


@dataclass
class Route:
    """An upstream that may take batches of one model now."""

    upstream: int
    max_batch: int
    slots: int  # batches it may still take now (in-flight cap, or the one half-open probe)
    predict: Predict
    in_flight: int = 0  # our batches already on their way to it (they are served before a new one)


@dataclass(frozen=True)
class Offload:
    """A planned batch: these queued task ids of `model` go to `upstream`."""

    upstream: int
    model: int
    ids: tuple[int, ...]


def plan(
    queues: Sequence[TaskQueue],
    latency: LatencyModel,
    now: float,
    free_at: float,
    routes: dict[int, list[Route]],
    sample_bytes: Sequence[int],
) -> list[Offload]:
    """The batches to send upstream (see the module docstring for the rule). Pure: reads only."""
    if not routes:
        return []
    deadlines = [q.deadlines.tolist() for q in queues]
    sizes = [len(q) for q in queues]
    pos = [0] * len(queues)
    chosen: dict[int, list[int]] = {m: [] for m in routes}  # queue positions, deadline order
    t = now if math.isnan(free_at) else max(now, free_at)
    while True:
        m = -1
        for k in range(len(queues)):
            if pos[k] < sizes[k] and (m < 0 or deadlines[k][pos[k]] < deadlines[m][pos[m]]):
                m = k
        if m < 0:
            break
        model = latency.models[m]
        stop = min(pos[m] + model.max_batch, sizes[m])
        batch = list(range(pos[m], stop))
        pos[m] = stop
        done = t + model.latency(0, len(batch))
        if m in routes:
            best = routes[m][0]
            moved: list[int] = []
            for i in batch:
                size = min(len(chosen[m]) + len(moved) + 1, best.max_batch)
                ahead = best.in_flight + (len(chosen[m]) + len(moved)) // best.max_batch
                remote = now + best.predict(size, size * sample_bytes[m], ahead)
                if deadlines[m][i] < done and remote <= deadlines[m][i]:
                    moved.append(i)
            if moved:
                chosen[m].extend(moved)
                kept = len(batch) - len(moved)
                done = t + model.latency(0, kept) if kept else t
        t = done
    out: list[Offload] = []
    for m, taken in chosen.items():
        ids = queues[m].ids
        rest = sorted(taken, key=lambda i: deadlines[m][i])
        for route in routes[m]:
            while rest and route.slots > 0:
                chunk, rest = rest[: route.max_batch], rest[route.max_batch :]
                answer = now + route.predict(len(chunk), len(chunk) * sample_bytes[m], route.in_flight)
                saved = [i for i in chunk if deadlines[m][i] >= answer]
                if saved:
                    out.append(Offload(route.upstream, m, tuple(int(ids[i]) for i in saved)))
                    route.slots -= 1
                    route.in_flight += 1
    return out
