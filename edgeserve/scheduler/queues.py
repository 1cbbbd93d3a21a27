"""Per-model FIFO queues of waiting tasks, kept as parallel numpy arrays.

The runtime appends a task when a request arrives and pops a batch from the head when the
scheduler dispatches it, both O(1) amortised. The policies read the live part of the arrays as
numpy views, so scoring a thousand queued tasks needs no per-task Python objects.
"""

from __future__ import annotations

import numpy as np


class TaskQueue:
    """FIFO of one model's waiting tasks: id, arrival time, absolute deadline and deadline budget.

    Times are seconds on one monotonic clock. `deadline = arrival + budget` is computed once at
    push, so every policy (and the reference loop) compares slack with exactly the same numbers.
    """

    __slots__ = ("_arrival", "_budget", "_budget_counts", "_deadline", "_head", "_ids", "_tail")

    def __init__(self, capacity: int = 64) -> None:
        capacity = max(int(capacity), 4)
        self._ids = np.empty(capacity, dtype=np.int64)
        self._arrival = np.empty(capacity, dtype=np.float64)
        self._deadline = np.empty(capacity, dtype=np.float64)
        self._budget = np.empty(capacity, dtype=np.float64)
        self._head = 0
        self._tail = 0
        # How many live tasks have each budget: O(1) to keep, and tells the fast scorer whether
        # the queue is ordered by normalised queuing time (one budget) or not.
        self._budget_counts: dict[float, int] = {}

    def __len__(self) -> int:
        return self._tail - self._head

    def __bool__(self) -> bool:
        return self._tail > self._head

    def __repr__(self) -> str:
        return f"TaskQueue(len={len(self)})"

    def push(self, task_id: int, arrival: float, budget: float) -> None:
        """Append a task that arrived at `arrival` and must finish within `budget` seconds."""
        if budget <= 0:
            raise ValueError(f"task {task_id}: deadline budget must be positive, got {budget}")
        if self._tail > self._head and arrival < self._arrival[self._tail - 1]:
            raise ValueError(
                f"task {task_id}: arrival {arrival} is earlier than the queue's newest task; "
                "push tasks in arrival order (the queue is FIFO by age)"
            )
        if self._tail == self._ids.size:
            self._make_room()
        i = self._tail
        self._ids[i] = task_id
        self._arrival[i] = arrival
        self._budget[i] = budget
        self._deadline[i] = arrival + budget
        self._tail = i + 1
        self._budget_counts[budget] = self._budget_counts.get(budget, 0) + 1

    def insert(self, task_id: int, arrival: float, budget: float) -> None:
        """Put a task back in its place by arrival (after any task that arrived at the same time).

        For tasks that left the queue and return (an offloaded batch whose upstream failed): they
        keep their arrival and deadline, so the FIFO-by-age order the policies rely on holds. O(len).
        """
        if budget <= 0:
            raise ValueError(f"task {task_id}: deadline budget must be positive, got {budget}")
        if not self or arrival >= self._arrival[self._tail - 1]:
            self.push(task_id, arrival, budget)
            return
        if self._tail == self._ids.size:
            self._make_room()
        h, t = self._head, self._tail
        i = h + int(np.searchsorted(self._arrival[h:t], arrival, side="right"))
        for arr, value in (
            (self._ids, task_id),
            (self._arrival, arrival),
            (self._budget, budget),
            (self._deadline, arrival + budget),
        ):
            arr[i + 1 : t + 1] = arr[i:t].copy()
            arr[i] = value
        self._tail = t + 1
        self._budget_counts[budget] = self._budget_counts.get(budget, 0) + 1

    def pop(self, n: int) -> np.ndarray:
        """Remove the `n` oldest tasks and return their ids (a copy)."""
        if not 0 <= n <= len(self):
            raise ValueError(f"cannot pop {n} tasks from a queue of {len(self)}")
        ids = self._ids[self._head : self._head + n].copy()
        self._forget_budgets(self._budget[self._head : self._head + n])
        self._head += n
        if self._head == self._tail:
            self._head = self._tail = 0
        return ids

    def remove(self, task_ids: np.ndarray | list[int] | tuple[int, ...]) -> np.ndarray:
        """Remove the given tasks wherever they are (drops); return the ids actually removed. O(len)."""
        live = self.ids
        gone = np.isin(live, np.asarray(task_ids, dtype=np.int64))
        if not gone.any():
            return np.empty(0, dtype=np.int64)
        removed = live[gone].copy()
        self._forget_budgets(self.budgets[gone])
        keep = ~gone
        n = int(keep.sum())
        h = self._head
        for arr in (self._ids, self._arrival, self._budget, self._deadline):
            arr[h : h + n] = arr[h : self._tail][keep]
        self._tail = h + n
        if self._head == self._tail:
            self._head = self._tail = 0
        return removed

    @property
    def uniform_budget(self) -> float | None:
        """The one deadline budget all queued tasks share, or None (empty, or mixed budgets)."""
        if len(self._budget_counts) != 1:
            return None
        return next(iter(self._budget_counts))

    @property
    def ids(self) -> np.ndarray:
        return self._ids[self._head : self._tail]

    @property
    def arrivals(self) -> np.ndarray:
        return self._arrival[self._head : self._tail]

    @property
    def budgets(self) -> np.ndarray:
        return self._budget[self._head : self._tail]

    @property
    def deadlines(self) -> np.ndarray:
        return self._deadline[self._head : self._tail]

    def _forget_budgets(self, budgets: np.ndarray) -> None:
        counts = self._budget_counts
        if len(counts) == 1:  # one budget (the usual queue): every one of these is it
            budget, count = next(iter(counts.items()))
            if count > budgets.size:
                counts[budget] = count - budgets.size
            else:
                del counts[budget]
            return
        for budget in budgets.tolist():
            left = counts[budget] - 1
            if left:
                counts[budget] = left
            else:
                del counts[budget]

    def _make_room(self) -> None:
        """Compact to the front, doubling the buffers when more than half is live (amortised O(1))."""
        n = len(self)
        capacity = self._ids.size * 2 if n > self._ids.size // 2 else self._ids.size
        for name in ("_ids", "_arrival", "_budget", "_deadline"):
            old = getattr(self, name)
            new = old if capacity == old.size else np.empty(capacity, dtype=old.dtype)
            new[:n] = old[self._head : self._tail]
            setattr(self, name, new)
        self._head, self._tail = 0, n
