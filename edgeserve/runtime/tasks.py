"""The task book: every request the Server holds, queued or running, and its per-model FIFO queues.

The Server and its offloader share this one object instead of each other's members: the queues
are what the scheduler and the offload planner read, `open` maps an id to its task until it is
answered, and `answer` is the single place that makes "exactly one answer per task" true.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from edgeserve.runtime.results import Result
from edgeserve.runtime.validation import Sample
from edgeserve.scheduler import TaskQueue


@dataclass(eq=False, slots=True)
class Task:
    """One request inside the Server. Times are absolute on time.monotonic(): `requested` is the
    request's own deadline, `deadline` the one the scheduler plans to, earlier by the answer's way
    back to its caller (Server._enqueue). `reply` gets its Result, once (a front's callback: no
    future and no extra loop callback per request)."""

    id: int
    model: int
    x: Sample
    reply: Callable[[Result], object]
    queued: float
    deadline: float
    requested: float
    arrival: float  # where its queue ages it from: when its budget started (for a front, the read)
    dispatch: float = math.nan  # when its batch was picked (or sent upstream); nan while queued


class TaskBook:
    """Queued and running tasks of one Server, on its loop thread only (no locks)."""

    def __init__(self, models: int) -> None:
        self.queues: list[TaskQueue] = [TaskQueue() for _ in range(models)]
        self.open: dict[int, Task] = {}  # not answered yet: queued, running locally or upstream
        self.closed = False  # shutting down: nothing goes back into a queue
        self._next_id = 0

    def __len__(self) -> int:
        return len(self.open)

    def queued(self) -> bool:
        """Some queue holds a task."""
        return any(self.queues)

    def add(
        self,
        model: int,
        x: Sample,
        reply: Callable[[Result], object],
        now: float,
        budget: float,
        requested: float | None = None,
        arrival: float | None = None,
    ) -> Task:
        """Queue a new task, planned to finish within `budget` seconds of `arrival` (default
        `now`; a front's request: when it was read, its budget runs from then); `requested`: the
        request's own budget, when longer. The queue stays FIFO by arrival: a task read before the
        newest queued one (it waited in its connection's buffer) goes in its place by age."""
        arrival = now if arrival is None else arrival
        requested = budget if requested is None else max(requested, budget)
        task = Task(self._next_id, model, x, reply, now, arrival + budget, arrival + requested, arrival)
        self._next_id += 1
        self.queues[model].insert(task.id, arrival, budget)
        self.open[task.id] = task
        return task

    def take(self, model: int, ids: Iterable[int], now: float) -> list[Task]:
        """Remove these queued ids from the queue and mark them dispatched at `now` (they stay open)."""
        tasks = [self.open[i] for i in self.queues[model].remove(list(ids)).tolist()]
        for task in tasks:
            task.dispatch = now
        return tasks

    def pop(self, model: int, n: int, now: float) -> list[Task]:
        """The first `n` tasks of the queue, dispatched at `now` (a local batch)."""
        tasks = [self.open[i] for i in self.queues[model].pop(n).tolist()]
        for task in tasks:
            task.dispatch = now
        return tasks

    def drop(self, model: int, ids: Iterable[int]) -> list[Task]:
        """Remove these ids from the queue without dispatching them (they are about to be answered)."""
        return [self.open[i] for i in self.queues[model].remove(list(ids)).tolist()]

    def drain(self, model: int) -> list[Task]:
        """Empty one queue."""
        queue = self.queues[model]
        return [self.open[i] for i in queue.pop(len(queue)).tolist()]

    def requeue(self, tasks: Iterable[Task]) -> list[Task]:
        """Put dispatched tasks back in their queues by arrival, keeping their deadlines; the ones
        already answered (e.g. at shutdown), or all of them once the book is closed, are skipped."""
        if self.closed:
            return []
        back = [t for t in tasks if t.id in self.open]
        for task in back:
            task.dispatch = math.nan
            self.queues[task.model].insert(task.id, task.arrival, task.deadline - task.arrival)
        return back

    def withdraw(self, task: Task) -> bool:
        """Forget a queued task whose caller gave up; False if it is running or already answered."""
        if task.id not in self.open or not math.isnan(task.dispatch):
            return False
        self.queues[task.model].remove([task.id])
        del self.open[task.id]
        return True

    def answer(self, task: Task) -> bool:
        """Close the task's entry; True only the first time, so a task is answered exactly once."""
        return self.open.pop(task.id, None) is not None
