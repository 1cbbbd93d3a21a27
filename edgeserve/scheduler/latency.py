"""The latency model the scheduler reads: one quantile of every (model, exit, batch) profile cell.

Built once from ProfileTables; milliseconds become seconds here and nowhere else. An exit subset
(the paper's "layer1+final" experiments) keeps only some exits; decisions still name exits by
their manifest index.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from edgeserve.errors import ProfileError
from edgeserve.profile import ProfileTable

# [batch-1][exit_pos] -> seconds
Table = tuple[tuple[float, ...], ...]

# Batch look-ahead (split_batch): the largest batch whose mean executor time is within this
# fraction of the cheapest is served, so that profile noise of a few percent does not shrink it.
BATCH_RTOL = 0.05
# What one more dispatch costs beyond its profiled batch time (the decision, the hand-off to the
# executor thread): splitting must pay for it.
DISPATCH_OVERHEAD_S = 100e-6


def split_batch(
    plan: Table,
    mean: Table,
    exit_pos: int,
    n: int,
    overhead_s: float = DISPATCH_OVERHEAD_S,
    rtol: float = BATCH_RTOL,
    alone: bool = False,
) -> int:
    """The batch size to serve now, of the `n` head tasks the paper's rule would batch (its Eq. 5).

    `plan` and `mean` are [batch-1][exit_pos] tables (ModelLatency.by_batch, .mean_by_batch);
    ModelLatency.batch_for looks the answer up, precomputed for every (exit, n).

    Look-ahead: serve those n tasks back to back in batches of b (FIFO, the last one smaller) at
    this exit. With the quantile the policy plans with, that takes P(b) = (n // b) * L(b) + L(n % b);
    on average (the profile's mean) it occupies the executor C(b), plus `overhead_s` per batch.

    - Safe: only sizes with P(b) <= P(n). Then each of the n tasks finishes, as planned, no later
      than in the paper's one batch of n, and every other queue waits no longer: a split never
      loses a task that the paper's batch would save.
    - Cheap: of those, the largest b whose C(b) is within `rtol` of the least: the same tasks
      for less executor time, i.e. more throughput (the mean, not the p95, is what a stream of
      batches costs; a heavy-tailed cell's p95 misleads).

    Where batching pays (the paper's GPU: L(10) ~ 2 L(1)) that is b = n, the paper's rule; where a
    batch grows faster than its size (a CPU cell whose batch of 10 costs more than two of 5), the
    same tasks are served in smaller, quicker batches.

    `alone`: these n tasks are all that is waiting, so a split delays no other queue. Then a split
    is planned as its batches' means plus the largest single tail (quantile - mean) among them,
    not as the sum of their quantiles: several short batches rarely all draw their tails, and
    summing p95s kept heavy-tailed CPU batches whole at light load (docs/scheduler.md).
    """
    if n <= 1:
        return n

    def planned(b: int) -> float:
        if alone:
            return _tail_time(plan, mean, exit_pos, n, b)
        return _split_time(plan, exit_pos, n, b, 0.0)

    limit = planned(n)
    costs = [
        _split_time(mean, exit_pos, n, b, overhead_s) if planned(b) <= limit else math.inf
        for b in range(1, n + 1)
    ]
    cheapest = min(costs) * (1.0 + rtol)
    b = n
    while costs[b - 1] > cheapest:
        b -= 1
    return b


def _tail_time(plan: Table, mean: Table, exit_pos: int, n: int, b: int) -> float:
    """n tasks in batches of b on average, plus the worst one batch's tail beyond its mean."""
    rest = n % b
    sizes = (b, rest) if rest else (b,)
    tail = max(plan[s - 1][exit_pos] - mean[s - 1][exit_pos] for s in sizes)
    return _split_time(mean, exit_pos, n, b, 0.0) + max(tail, 0.0)


def _split_time(table: Table, exit_pos: int, n: int, b: int, overhead_s: float) -> float:
    """Seconds to serve n tasks in batches of b, back to back (FIFO, the last batch n % b)."""
    full, rest = divmod(n, b)
    t = full * (table[b - 1][exit_pos] + overhead_s)
    return t + (table[rest - 1][exit_pos] + overhead_s if rest else 0.0)


@dataclass(frozen=True)
class ModelLatency:
    """One model's allowed exits (shallow to deep) and their latency in seconds, [exit, batch-1]."""

    name: str
    exit_names: tuple[str, ...]
    exit_ids: tuple[int, ...]
    max_batch: int
    seconds: np.ndarray
    # The profile's median per cell (seconds, same shape), when known: online calibration compares
    # observed batch times with it (a median of few samples is steadier than their p95).
    typical: np.ndarray | None = field(default=None, repr=False, compare=False)
    # The profile's mean per cell (seconds, same shape), when known: what a batch costs the
    # executor on average, i.e. throughput (the batch look-ahead, split_batch). A
    # heavy-tailed cell's p95 says little about it. Unknown: the planning quantile stands in.
    mean: np.ndarray | None = field(default=None, repr=False, compare=False)
    # by_batch[b-1][exit_pos]: the same numbers as Python floats, for per-call scalar lookups;
    # mean_by_batch likewise for `mean` (or the planning quantile where it is unknown).
    by_batch: Table = field(init=False, repr=False, compare=False)
    mean_by_batch: Table = field(init=False, repr=False, compare=False)
    # splits[n-1][exit_pos]: split_batch's answer for n head tasks at that exit (batch_for);
    # alone_splits the same when those n are all that is waiting (split_batch's `alone`).
    splits: tuple[tuple[int, ...], ...] = field(init=False, repr=False, compare=False)
    alone_splits: tuple[tuple[int, ...], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.seconds.shape != (len(self.exit_ids), self.max_batch):
            raise ValueError(f"{self.name}: latency array {self.seconds.shape} != exits x batches")
        if not np.all(np.isfinite(self.seconds)) or np.any(self.seconds <= 0):
            raise ProfileError(f"{self.name}: profile has missing or non-positive latencies")
        if self.mean is not None and (
            self.mean.shape != self.seconds.shape
            or not np.all(np.isfinite(self.mean))
            or np.any(self.mean <= 0)
        ):
            raise ProfileError(f"{self.name}: mean latencies missing, non-positive or of the wrong shape")
        object.__setattr__(self, "by_batch", tuple(tuple(col) for col in self.seconds.T.tolist()))
        self._set_mean_by_batch()

    def _set_mean_by_batch(self) -> None:
        if self.mean is None:
            object.__setattr__(self, "mean_by_batch", self.by_batch)
        else:
            object.__setattr__(self, "mean_by_batch", tuple(tuple(col) for col in self.mean.T.tolist()))
        for name, alone in (("splits", False), ("alone_splits", True)):
            table = tuple(
                tuple(
                    split_batch(self.by_batch, self.mean_by_batch, e, n, alone=alone)
                    for e in range(len(self.exit_ids))
                )
                for n in range(1, self.max_batch + 1)
            )
            object.__setattr__(self, name, table)

    def batch_for(self, exit_pos: int, n: int, alone: bool = False) -> int:
        """How many of the `n` head tasks to serve now at this exit (split_batch; O(1)); `alone`:
        they are every task waiting."""
        return (self.alone_splits if alone else self.splits)[n - 1][exit_pos]

    def latency(self, exit_pos: int, batch: int) -> float:
        return self.by_batch[batch - 1][exit_pos]

    def _set_seconds(self, seconds: np.ndarray) -> None:
        """Replace the table in place (LatencyModel.set_seconds is the only caller)."""
        seconds = np.ascontiguousarray(seconds, dtype=np.float64)
        if seconds.shape != self.seconds.shape:
            raise ValueError(f"{self.name}: latency array {seconds.shape} != {self.seconds.shape}")
        if not np.all(np.isfinite(seconds)) or np.any(seconds <= 0):
            raise ValueError(f"{self.name}: latencies must be finite and positive")
        if self.mean is not None:  # the mean moves with the cell (calibration scales cells)
            object.__setattr__(self, "mean", self.mean * (seconds / self.seconds))
        object.__setattr__(self, "seconds", seconds)
        object.__setattr__(self, "by_batch", tuple(tuple(col) for col in seconds.T.tolist()))
        self._set_mean_by_batch()

    def deepest_feasible(self, batch: int, slack: float) -> int:
        """Position of the deepest exit that finishes within `slack` seconds, else 0 (Eq. 6)."""
        column = self.by_batch[batch - 1]
        for pos in range(len(column) - 1, -1, -1):
            if column[pos] <= slack:
                return pos
        return 0


@dataclass(frozen=True)
class LatencyModel:
    """All served models in scheduling order (the order that breaks ties)."""

    models: tuple[ModelLatency, ...]
    quantile: str = "p95"
    # Padded [model, exit, batch-1] array (inf where a model has fewer exits or batches) for the
    # vectorised scorer; derived, not part of equality.
    padded: np.ndarray = field(init=False, repr=False, compare=False)
    max_batches: np.ndarray = field(init=False, repr=False, compare=False)
    n_exits: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.models:
            raise ValueError("a latency model needs at least one model")
        n_exits = max(len(m.exit_ids) for m in self.models)
        n_batch = max(m.max_batch for m in self.models)
        padded = np.full((len(self.models), n_exits, n_batch), np.inf)
        for i, m in enumerate(self.models):
            padded[i, : len(m.exit_ids), : m.max_batch] = m.seconds
        object.__setattr__(self, "padded", padded)
        object.__setattr__(self, "max_batches", np.array([m.max_batch for m in self.models], dtype=np.int64))
        object.__setattr__(self, "n_exits", np.array([len(m.exit_ids) for m in self.models], dtype=np.int64))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.models)

    def set_seconds(self, model: int, seconds: np.ndarray) -> None:
        """Replace model `model`'s [exit, batch-1] table in place: online calibration's one mutation.

        Policies hold this object and read it at every decision, so the next decision uses the
        new numbers without rebuilding anything. Call it between decisions (on the event loop).
        """
        m = self.models[model]
        m._set_seconds(seconds)
        self.padded[model, : len(m.exit_ids), : m.max_batch] = m.seconds

    def __len__(self) -> int:
        return len(self.models)

    @classmethod
    def from_profiles(
        cls,
        tables: Sequence[ProfileTable],
        quantile: str = "p95",
        max_batch: int | None = None,
        exits: Sequence[str] | None = None,
        names: Sequence[str] | None = None,
    ) -> LatencyModel:
        """Read `quantile` of every cell. `exits` keeps only those exit names (each model must have
        at least one of them); `names` renames the instances (the same profile served twice)."""
        models = []
        for i, table in enumerate(tables):
            name = names[i] if names is not None else table.model
            batch = table.max_batch if max_batch is None else max_batch
            if batch > table.max_batch:
                raise ProfileError(
                    f"profile of {table.model!r} covers batch 1..{table.max_batch}, not {batch}; "
                    f"lower --max-batch or re-run `edgeserve-profile --max-batch {batch}`"
                )
            keep = [
                j for j, exit_name in enumerate(table.exit_names) if exits is None or exit_name in set(exits)
            ]
            if not keep:
                raise ProfileError(
                    f"model {table.model!r} has none of the exits {list(exits or [])}; "
                    f"its exits are {list(table.exit_names)}"
                )
            matrix = table.matrix(quantile)[keep, :batch] / 1000.0
            typical = table.matrix("p50")[keep, :batch] / 1000.0
            mean = table.matrix("mean")[keep, :batch] / 1000.0
            models.append(
                ModelLatency(
                    name=name,
                    exit_names=tuple(table.exit_names[j] for j in keep),
                    exit_ids=tuple(keep),
                    max_batch=batch,
                    seconds=np.ascontiguousarray(matrix),
                    typical=np.ascontiguousarray(typical),
                    mean=np.ascontiguousarray(mean),
                )
            )
        return cls(models=tuple(models), quantile=quantile)
