"""Service times for the simulator, drawn from the profile's recorded samples.

The scheduler predicts with one quantile (p95) of each cell; the simulated accelerator takes a
random recorded sample of the same cell, so predictions are wrong the way they are on a device.
`mode="quantile"` replays the prediction exactly instead (for hand-checked tests).

Which sample is a quantile position u in [0, 1) that the caller draws (the simulator: one per
task, used by the batch the task heads), mapped through the cell's sorted samples. With u drawn
uniformly every cell keeps its recorded distribution; with u tied to the task, two policies that
serve the same task first in a batch see the same luck: common random numbers, so that comparing
two policies on one trace measures their decisions, not which of them drew the slow batches.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edgeserve.profile import ProfileTable

SERVICE_MODES = ("samples", "quantile")


class ServiceTimes:
    def __init__(self, tables: Sequence[ProfileTable], mode: str = "samples", quantile: str = "p95") -> None:
        if mode not in SERVICE_MODES:
            raise ValueError(f"unknown service-time mode {mode!r}; choose one of {SERVICE_MODES}")
        self.mode = mode
        self._cells: list[dict[tuple[int, int], np.ndarray]] = []
        for table in tables:
            cells = {}
            for (exit_id, batch), cell in table.cells.items():
                if mode == "samples":
                    cells[(exit_id, batch)] = np.sort(np.asarray(cell.samples_ms, dtype=np.float64)) / 1000.0
                else:
                    cells[(exit_id, batch)] = np.array([cell.stats.get(quantile) / 1000.0])
            self._cells.append(cells)

    def draw(self, model: int, exit_id: int, batch: int, u: float) -> float:
        """Seconds the batch occupies the accelerator: the cell's sample at quantile position u."""
        samples = self._cells[model][(exit_id, batch)]
        return float(samples[min(int(u * samples.size), samples.size - 1)])
