"""Online latency calibration: the profile the scheduler reads follows the hardware it runs on.

Why: the offline profile is measured once, but a Jetson runs the same engine slower when it
throttles, when nvpmodel or the clocks change, or when another process shares the GPU. The
runtime times every batch it runs; this module turns those times into the latency table.

Pure: no I/O, no clock of its own (callers pass `now`), no threads. Per (model, exit, batch) cell:

- each batch gives a ratio observed / typical (the profile cell's median), clipped to
  [1/CLIP, CLIP] so one stall cannot move anything much;
- bounded memory: a ring of the last CELL_WINDOW ratios per cell and MODEL_WINDOW per model;
- estimate: the median of the ratios (robust to outliers and to a profile cell whose p95 came out
  high from few samples); the scheduler's cell becomes the profile's quantile (p95) x that scale,
  so the shape of each cell's tail is kept. A cell with at least CELL_MIN ratios of its own uses
  them; other cells (never run, or rarely) are scaled by their model's estimate (their neighbours);
- drift, with hysteresis: a model is drifting once its estimate leaves [1/START, START] and until
  it comes back within [1/END, END]. While it drifts its table is the profile scaled cell by cell;
  otherwise the profile itself (noise inside the band never reaches the scheduler);
- publishing: at most once per MIN_INTERVAL_S, and only when a cell moved by more than MIN_CHANGE,
  the LatencyModel is updated in place (LatencyModel.set_seconds): the next decision uses it.

Drift start and end come back as messages for the caller to log. A model whose speed sits near
the band's edge can start and end a drift every second; after an end, its next message waits
LOG_QUIET_S and then says how many starts and ends went unlogged, so a service that runs for
months does not fill its journal (the scheduler still follows every change at once).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgeserve.scheduler.latency import LatencyModel

CLIP = 4.0
CELL_WINDOW = 16
CELL_MIN = 6
MODEL_WINDOW = 24
MODEL_MIN = 8
START = 1.2
END = 1.1
MIN_INTERVAL_S = 0.5
MIN_CHANGE = 0.03
LOG_QUIET_S = 60.0


def _estimate(ratios: deque[float]) -> float:
    """The median, as np.median gives it, in well under a microsecond for a ring this small (np.median
    costs ~8 us, and this runs on every batch, on the thread that decides the next one)."""
    ordered = sorted(ratios)
    half = len(ordered) // 2
    return ordered[half] if len(ordered) % 2 else (ordered[half - 1] + ordered[half]) / 2


@dataclass
class _ModelState:
    base: np.ndarray  # the profile's [exit_pos, batch-1] seconds (the quantile the scheduler reads)
    typical: np.ndarray  # the profile's median per cell: what one batch usually takes
    cells: dict[tuple[int, int], deque[float]] = field(default_factory=dict)
    last: dict[tuple[int, int], float] = field(default_factory=dict)  # last observed seconds
    ratios: deque[float] = field(default_factory=lambda: deque(maxlen=MODEL_WINDOW))
    drifting: bool = False
    scale: float = 1.0
    logged_drifting: bool = False  # what the last drift message said
    changes: int = 0  # drift starts and ends since that message
    log_after: float = -float("inf")  # after an end: no message before this (flapping)


class LatencyCalibrator:
    """Learns each cell's latency from observed batch times and updates `latency` in place."""

    def __init__(self, latency: LatencyModel, min_interval_s: float = MIN_INTERVAL_S) -> None:
        self.latency = latency
        self.min_interval_s = min_interval_s
        self._models = [
            _ModelState(m.seconds.copy(), (m.seconds if m.typical is None else m.typical).copy())
            for m in latency.models
        ]
        self._exit_pos = [{e: i for i, e in enumerate(m.exit_ids)} for m in latency.models]
        self._dirty = False
        self._published_at = -float("inf")
        self.updates = 0  # how many times the table was published

    def observe(self, model: int, exit_id: int, batch: int, seconds: float, now: float) -> list[str]:
        """Record one batch (manifest exit index); returns drift messages (start / end) to log."""
        pos = self._exit_pos[model].get(exit_id)
        state = self._models[model]
        if pos is None or not 1 <= batch <= state.base.shape[1] or not seconds > 0:
            return []  # an exit this profile does not schedule, or a failed batch: nothing to learn
        ratio = min(max(seconds / float(state.typical[pos, batch - 1]), 1.0 / CLIP), CLIP)
        ring = state.cells.get((pos, batch))
        if ring is None:
            ring = state.cells[(pos, batch)] = deque(maxlen=CELL_WINDOW)
        ring.append(ratio)
        state.ratios.append(ratio)
        state.last[(pos, batch)] = seconds
        messages = self._update_drift(model, state, now)
        self._dirty = True
        if now - self._published_at >= self.min_interval_s:
            self.publish(now)
        return messages

    def _update_drift(self, model: int, state: _ModelState, now: float) -> list[str]:
        if len(state.ratios) < MODEL_MIN:
            return []
        state.scale = _estimate(state.ratios)
        if not state.drifting and not 1.0 / START <= state.scale <= START:
            state.drifting, state.changes = True, state.changes + 1
        elif state.drifting and 1.0 / END <= state.scale <= END:
            state.drifting, state.changes = False, state.changes + 1
        if state.drifting == state.logged_drifting or now < state.log_after:
            return []
        name = self.latency.models[model].name
        if state.drifting:
            line = (
                f"latency drift started: {name} runs at {state.scale:.2f}x its profile "
                f"(median of its last {len(state.ratios)} batches); scheduling with the measured latency"
            )
        else:
            line = (
                f"latency drift ended: {name} is back within {END - 1:.0%} of its profile "
                f"({state.scale:.2f}x)"
            )
            state.log_after = now + LOG_QUIET_S
        if state.changes > 1:
            line += f"; {state.changes - 1} more drift starts and ends since the last message, not logged"
        state.logged_drifting, state.changes = state.drifting, 0
        return [line]

    def table(self, model: int) -> np.ndarray:
        """The [exit_pos, batch-1] seconds the scheduler should use for `model` now."""
        state = self._models[model]
        if not state.drifting:
            return state.base
        table = state.base * state.scale
        for (pos, batch), ring in state.cells.items():
            if len(ring) >= CELL_MIN:
                table[pos, batch - 1] = state.base[pos, batch - 1] * _estimate(ring)
        return table

    def publish(self, now: float) -> bool:
        """Write changed tables into the LatencyModel; True if anything changed."""
        self._published_at = now
        if not self._dirty:
            return False
        self._dirty = False
        changed = False
        for m, model in enumerate(self.latency.models):
            table = self.table(m)
            if np.any(np.abs(table / model.seconds - 1.0) > MIN_CHANGE) or (
                table is self._models[m].base and not np.array_equal(table, model.seconds)
            ):
                self.latency.set_seconds(m, table)
                changed = True
        self.updates += changed
        return changed

    def drifting(self, model: int) -> bool:
        return self._models[model].drifting

    def cells(self) -> list[dict[str, Any]]:
        """Predicted (what the scheduler uses) and last observed seconds of every cell that ran."""
        out = []
        for model, state in zip(self.latency.models, self._models, strict=True):
            for (pos, batch), seconds in sorted(state.last.items()):
                out.append(
                    {
                        "model": model.name,
                        "exit": model.exit_names[pos],
                        "batch": batch,
                        "predicted_s": float(model.seconds[pos, batch - 1]),
                        "observed_s": seconds,
                        "drifting": state.drifting,
                    }
                )
        return out

    def calibrated(self) -> dict[str, Any]:
        """The calibrated tables as JSON-ready data (ms, [exit][batch-1]), for the profile write-back."""
        models = {}
        for m, model in enumerate(self.latency.models):
            state = self._models[m]
            models[model.name] = {
                "exit_names": list(model.exit_names),
                "scale": state.scale,
                "drifting": state.drifting,
                "batches_seen": len(state.ratios),
                "latency_ms": np.round(self.table(m) * 1000.0, 4).tolist(),
                "profile_ms": np.round(state.base * 1000.0, 4).tolist(),
            }
        return {"schema_version": 1, "quantile": self.latency.quantile, "models": models}
