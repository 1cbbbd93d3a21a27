"""Per-model FIFO queues of waiting tasks, kept as parallel numpy arrays.

The runtime appends a task when a request arrives and pops a batch from the head when the
scheduler dispatches it, both O(1) amortised. The policies read the live part of the arrays as
numpy views, so scoring a thousand queued tasks needs no per-task Python objects.

The queue is kept as *runs*: stretches of consecutive tasks with one deadline budget (a server's
queue is one run, or a few for about a deadline after its planned budget steps; requests with
their own deadlines make many). Push starts a run when the budget differs from the newest task's,
pop drops the runs it empties: both stay O(1) amortised.

Each run also carries the deep scorer's cache (scoring_deep.py): the compensated prefix sums of
its tasks' weights e^((pivot - arrival) / budget), which the scorer extends as tasks arrive and
rebases when it must. The queue only says which part of it its own changes spoil (the run's
cached budget, pivot, anchor, done; see scoring_deep), so push and pop cost what they did.
"""

from __future__ import annotations

import math

import numpy as np

# One run per RUN_FIELDS floats of TaskQueue._runs (rows _run_head .. _run_tail - 1, oldest first):
# its first task's index (the oldest run's may be before _head: popped), its budget, then the deep
# scorer's cache of it: the budget it was built for (NaN: nothing cached), pivot, anchor, done.
RUN_START, RUN_BUDGET, RUN_CACHED, RUN_PIVOT, RUN_ANCHOR, RUN_DONE = range(6)
RUN_FIELDS = 6


class TaskQueue:
    """FIFO of one model's waiting tasks: id, arrival time, absolute deadline and deadline budget.

    Times are seconds on one monotonic clock. `deadline = arrival + budget` is computed once at
    push, so every policy (and the reference loop) compares slack with exactly the same numbers.
    """

    __slots__ = (
        "_arrival",
        "_budget",
        "_deadline",
        "_head",
        "_hi",
        "_ids",
        "_last_budget",
        "_lo",
        "_run_head",
        "_run_tail",
        "_runs",
        "_tail",
    )

    def __init__(self, capacity: int = 64) -> None:
        capacity = max(int(capacity), 4)
        self._ids = np.empty(capacity, dtype=np.int64)
        self._arrival = np.empty(capacity, dtype=np.float64)
        self._deadline = np.empty(capacity, dtype=np.float64)
        self._budget = np.empty(capacity, dtype=np.float64)
        # The deep scorer's cache (scoring_deep): compensated prefix sums of the tasks' weights
        # (high and low parts), each run's from its own anchor; the rest of it is in _runs.
        self._hi = np.empty(capacity, dtype=np.float64)
        self._lo = np.empty(capacity, dtype=np.float64)
        self._head = 0
        self._tail = 0
        # The runs of one budget (RUN_FIELDS floats each, see above): one run is the usual queue,
        # ordered by normalised queuing time; a few, the factorised scorers still apply per run.
        self._runs = np.zeros(4 * RUN_FIELDS, dtype=np.float64)
        self._run_head = 0
        self._run_tail = 0
        self._last_budget = np.nan  # the newest task's budget (NaN: empty)

    def __len__(self) -> int:
        return self._tail - self._head

    def __bool__(self) -> bool:
        return self._tail > self._head

    def last_deadline(self) -> float:
        """The newest task's deadline (-inf when empty): with one budget, the latest (FIFO by age)."""
        return float(self._deadline[self._tail - 1]) if self._tail > self._head else -math.inf

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
        if budget != self._last_budget:  # a new run (or the first): its cache starts empty
            self._new_run(i, budget)

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
        self._rebuild_runs(i)

    def pop(self, n: int) -> np.ndarray:
        """Remove the `n` oldest tasks and return their ids (a copy)."""
        if not 0 <= n <= len(self):
            raise ValueError(f"cannot pop {n} tasks from a queue of {len(self)}")
        ids = self._ids[self._head : self._head + n].copy()
        self._head += n
        if self._head == self._tail:
            self._clear()  # the indices start again at 0
        elif self._run_tail - self._run_head > 1:
            self._drop_runs()
        return ids

    def remove(self, task_ids: np.ndarray | list[int] | tuple[int, ...]) -> np.ndarray:
        """Remove the given tasks wherever they are (drops); return the ids actually removed. O(len)."""
        live = self.ids
        gone = np.isin(live, np.asarray(task_ids, dtype=np.int64))
        if not gone.any():
            return np.empty(0, dtype=np.int64)
        removed = live[gone].copy()
        keep = ~gone
        n = int(keep.sum())
        h = self._head
        if not keep[: removed.size].any():  # the oldest tasks (a lazy drop's): as pop does
            self._head = h + removed.size
            if self._head < self._tail and self._run_tail - self._run_head > 1:
                self._drop_runs()
        else:
            for arr in (self._ids, self._arrival, self._budget, self._deadline):
                arr[h : h + n] = arr[h : self._tail][keep]
            self._tail = h + n
            self._rebuild_runs(h + int(gone.argmax()))
        if self._head == self._tail:
            self._clear()
        return removed

    @property
    def uniform_budget(self) -> float | None:
        """The one deadline budget all queued tasks share, or None (empty, or mixed budgets)."""
        if self._run_tail - self._run_head != 1:
            return None
        return float(self._runs[self._run_head * RUN_FIELDS + RUN_BUDGET])

    @property
    def run_count(self) -> int:
        """How many runs of one budget the queue is made of (0: empty; 1: one budget)."""
        return self._run_tail - self._run_head

    def runs(self) -> list[tuple[int, int, float]]:
        """The runs, oldest first: (start, stop, budget), indices into `ids`/`arrivals`/..."""
        h, t, runs = self._head, self._tail, self._runs
        rows = range(self._run_head, self._run_tail)
        starts = [max(int(runs[r * RUN_FIELDS + RUN_START]), h) - h for r in rows] + [t - h]
        return [
            (starts[i], starts[i + 1], float(runs[r * RUN_FIELDS + RUN_BUDGET])) for i, r in enumerate(rows)
        ]

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

    def _new_run(self, start: int, budget: float) -> None:
        """Append a run starting at task index `start` (amortised O(1): the rows compact or double)."""
        r = self._run_tail
        if (r + 1) * RUN_FIELDS > self._runs.size:
            live = self._runs[self._run_head * RUN_FIELDS : r * RUN_FIELDS]
            rows = r - self._run_head
            size = self._runs.size * 2 if rows * 2 * RUN_FIELDS > self._runs.size else self._runs.size
            runs = np.zeros(size, dtype=np.float64) if size != self._runs.size else self._runs
            runs[: live.size] = live
            self._runs, self._run_head, r = runs, 0, rows
        row = r * RUN_FIELDS
        runs = self._runs
        runs[row + RUN_START] = start
        runs[row + RUN_BUDGET] = budget
        runs[row + RUN_CACHED] = np.nan
        self._run_tail = r + 1
        self._last_budget = budget

    def _drop_runs(self) -> None:
        """Forget the runs wholly before the head (popped): the oldest live run is the head's."""
        runs, r, head = self._runs, self._run_head, self._head
        while r + 1 < self._run_tail and runs[(r + 1) * RUN_FIELDS + RUN_START] <= head:
            r += 1
        self._run_head = r

    def _clear(self) -> None:
        self._head = self._tail = 0
        self._run_head = self._run_tail = 0
        self._last_budget = np.nan

    def _rebuild_runs(self, index: int) -> None:
        """The tasks from `index` on changed place (insert, or remove in the middle): the runs are
        read again from the budgets (O(len), as the change itself), and each run's cache ends
        before `index` (a run that starts where it did, with its budget, keeps the rest)."""
        h, t = self._head, self._tail
        old = {}
        for r in range(self._run_head, self._run_tail):
            row = self._runs[r * RUN_FIELDS : (r + 1) * RUN_FIELDS].copy()
            old[(max(int(row[RUN_START]), h), float(row[RUN_BUDGET]))] = row
        budgets = self._budget[h:t]
        starts = [h, *(h + 1 + np.flatnonzero(budgets[1:] != budgets[:-1])).tolist()] if t > h else []
        self._run_head = self._run_tail = 0
        self._last_budget = np.nan
        for start in starts:
            budget = float(self._budget[start])
            self._new_run(start, budget)
            kept = old.get((start, budget))
            if kept is None or start >= index or index <= kept[RUN_ANCHOR]:
                continue  # nothing of its cache holds
            row = (self._run_tail - 1) * RUN_FIELDS
            self._runs[row : row + RUN_FIELDS] = kept
            self._runs[row + RUN_START] = start  # was at or before it (before: popped)
            self._runs[row + RUN_DONE] = min(kept[RUN_DONE], index)
        self._last_budget = float(self._budget[t - 1]) if t > h else np.nan

    def _make_room(self) -> None:
        """Compact to the front, doubling the buffers when more than half is live (amortised O(1))."""
        n = len(self)
        capacity = self._ids.size * 2 if n > self._ids.size // 2 else self._ids.size
        for name in ("_ids", "_arrival", "_budget", "_deadline"):
            old = getattr(self, name)
            new = old if capacity == old.size else np.empty(capacity, dtype=old.dtype)
            new[:n] = old[self._head : self._tail]
            setattr(self, name, new)
        self._carry_sums(capacity)
        self._head, self._tail = 0, n

    def _carry_sums(self, capacity: int) -> None:
        """Move the runs and the deep scorer's sums to the front with the tasks (before _head
        changes). The oldest run's sums, if they started before the head, lose that prefix:
        subtracted as scoring_deep.shift_down does, its rounding error kept in the low part."""
        h, t = self._head, self._tail
        old_hi, old_lo = self._hi, self._lo
        base_hi, base_lo = (float(old_hi[h - 1]), float(old_lo[h - 1])) if h else (0.0, 0.0)
        if capacity != old_hi.size:
            self._hi = np.empty(capacity, dtype=np.float64)
            self._lo = np.empty(capacity, dtype=np.float64)
        self._hi[: t - h] = old_hi[h:t]  # each run's part as it is (what no cache covers is not read)
        self._lo[: t - h] = old_lo[h:t]
        runs = self._runs
        for r in range(self._run_head, self._run_tail):
            row = r * RUN_FIELDS
            stop = int(runs[row + RUN_FIELDS + RUN_START]) if r + 1 < self._run_tail else t
            runs[row + RUN_START] = max(runs[row + RUN_START] - h, 0.0)
            anchor, done = int(runs[row + RUN_ANCHOR]), int(runs[row + RUN_DONE])
            cached = runs[row + RUN_CACHED]
            if not (cached == cached and done > h and anchor <= done <= stop):
                runs[row + RUN_CACHED] = np.nan  # nothing worth keeping: the scorer rebuilds it
                continue
            if anchor < h:  # the oldest run: TwoSum of each high part and -base, vectorised
                hi, lo = self._hi[: done - h].copy(), self._lo[: done - h].copy()
                minus = -base_hi
                s = hi + minus
                bb = s - hi
                self._lo[: done - h] = (lo - base_lo) + ((hi - (s - bb)) + (minus - bb))
                self._hi[: done - h] = s
                anchor = h
            runs[row + RUN_ANCHOR], runs[row + RUN_DONE] = anchor - h, done - h
