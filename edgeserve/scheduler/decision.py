"""What a policy answers each round, and the protocol every policy follows.

A policy sees the per-model queues (indexed in the order of its LatencyModel) and the current
time, and answers one of:

- `Dispatch(model, exit, batch)`: run the first `batch` tasks of queue `model` at exit `exit`;
- `Wait(until)`: nothing now; ask again at `until` (or at the next arrival, whichever is first);
- `None`: every queue is empty.

Either answer may carry `drops`: tasks the policy gives up on (Symphony drops tasks already past
their deadline). The caller removes them first and answers them `expired`, then dispatches.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from edgeserve.scheduler.queues import TaskQueue


@dataclass(frozen=True)
class Drop:
    """Tasks of one model's queue that will not be served (answered `expired`)."""

    model: int
    task_ids: tuple[int, ...]


@dataclass(frozen=True)
class Dispatch:
    """Serve the first `batch` tasks of queue `model` (after drops) at exit `exit`.

    `exit` is the index into the model's manifest exits (0 = shallowest); `predicted_s` is the
    profile latency the policy assumed, and `score` its stability score where it has one.
    """

    model: int
    exit: int
    batch: int
    predicted_s: float = math.nan
    score: float | None = None
    drops: tuple[Drop, ...] = ()


@dataclass(frozen=True)
class Wait:
    """Dispatch nothing now; decide again at `until` (math.inf: only when a task arrives)."""

    until: float = math.inf
    drops: tuple[Drop, ...] = ()


Decision = Dispatch | Wait


@runtime_checkable
class Policy(Protocol):
    """A scheduling policy. Called between batches on the runtime's event loop: keep it cheap."""

    name: str

    def decide(self, queues: Sequence[TaskQueue], now: float) -> Decision | None:
        """The next action for these queues at time `now` (seconds, same clock as arrivals)."""
