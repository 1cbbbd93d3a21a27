"""The latency model the scheduler reads: one quantile of every (model, exit, batch) profile cell.

Built once from ProfileTables; milliseconds become seconds here and nowhere else. An exit subset
(the paper's "layer1+final" experiments) keeps only some exits; decisions still name exits by
their manifest index.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from edgeserve.errors import ProfileError
from edgeserve.profile import ProfileTable


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
    # executor on average, i.e. throughput (the batch look-ahead, candidates.split_batch). A
    # heavy-tailed cell's p95 says little about it. Unknown: the planning quantile stands in.
    mean: np.ndarray | None = field(default=None, repr=False, compare=False)
    # by_batch[b-1][exit_pos]: the same numbers as Python floats, for per-call scalar lookups;
    # mean_by_batch likewise for `mean` (or the planning quantile where it is unknown).
    by_batch: tuple[tuple[float, ...], ...] = field(init=False, repr=False, compare=False)
    mean_by_batch: tuple[tuple[float, ...], ...] = field(init=False, repr=False, compare=False)

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
