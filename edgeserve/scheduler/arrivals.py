"""Request arrival traces for the simulator: Poisson, bursty on/off, or a replayed CSV.

A trace is the merged, time-sorted list of (time_s, model index) over [0, duration). Every
generator is seeded per model (seed, model index), so a trace is reproducible and adding a
model does not reshuffle the others.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgeserve.errors import EdgeServeError


@dataclass(frozen=True)
class ArrivalTrace:
    times: np.ndarray  # seconds from the start, non-decreasing
    models: np.ndarray  # model index of each arrival
    duration_s: float  # arrivals lie in [0, duration_s)

    def __len__(self) -> int:
        return int(self.times.size)


def _merge(per_model: list[np.ndarray], duration_s: float) -> ArrivalTrace:
    times = np.concatenate(per_model) if per_model else np.empty(0)
    models = np.concatenate([np.full(t.size, m, dtype=np.int64) for m, t in enumerate(per_model)])
    order = np.lexsort((models, times))  # by time, then model index: deterministic ties
    return ArrivalTrace(times[order], models[order], duration_s)


def _rng(seed: int, model: int) -> np.random.Generator:
    return np.random.default_rng([seed, model])


def poisson(rates: Sequence[float], duration_s: float, seed: int = 0) -> ArrivalTrace:
    """Independent Poisson arrivals, `rates[m]` requests per second for model m."""
    per_model = []
    for m, rate in enumerate(rates):
        rng = _rng(seed, m)
        count = rng.poisson(rate * duration_s) if rate > 0 else 0
        per_model.append(np.sort(rng.uniform(0.0, duration_s, count)))
    return _merge(per_model, duration_s)


def bursty(
    rates: Sequence[float],
    duration_s: float,
    seed: int = 0,
    peak: float = 3.0,
    mean_on_s: float = 0.2,
) -> ArrivalTrace:
    """On/off Markov-modulated Poisson arrivals with the same mean rate as `poisson(rates)`.

    Each model alternates between ON periods (exponential, mean `mean_on_s`) at `peak` times its
    mean rate and silent OFF periods (exponential, mean `mean_on_s * (peak - 1)`), so it is ON a
    fraction 1/peak of the time and its long-run rate is `rates[m]`.
    """
    if peak < 1:
        raise ValueError(f"burst peak must be >= 1 (1 = plain Poisson), got {peak}")
    mean_off_s = mean_on_s * (peak - 1.0)
    per_model = []
    for m, rate in enumerate(rates):
        rng = _rng(seed, m)
        chunks = []
        t = 0.0
        on = rng.random() < 1.0 / peak  # start in the stationary distribution
        while t < duration_s:
            length = (
                rng.exponential(mean_on_s if on else mean_off_s) if (on or mean_off_s > 0) else duration_s
            )
            end = min(t + length, duration_s)
            if on and rate > 0:
                count = rng.poisson(rate * peak * (end - t))
                chunks.append(np.sort(rng.uniform(t, end, count)))
            t = end
            on = not on if mean_off_s > 0 else True
        per_model.append(np.concatenate(chunks) if chunks else np.empty(0))
    return _merge(per_model, duration_s)


def replay(path: Path, model_names: Sequence[str], duration_s: float | None = None) -> ArrivalTrace:
    """Arrivals from a CSV file with a header `time_s,model` (seconds, model name)."""
    index = {name: i for i, name in enumerate(model_names)}
    times, models = [], []
    try:
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            if reader.fieldnames is None or not {"time_s", "model"} <= set(reader.fieldnames):
                raise EdgeServeError(f"{path}: a replay file needs the header `time_s,model`")
            for line, row in enumerate(reader, start=2):
                name = row["model"].strip()
                if name not in index:
                    raise EdgeServeError(
                        f"{path}:{line}: model {name!r} is not simulated (models: {', '.join(model_names)})"
                    )
                try:
                    time_s = float(row["time_s"])
                except ValueError:
                    raise EdgeServeError(f"{path}:{line}: time_s {row['time_s']!r} is not a number") from None
                if time_s < 0:
                    raise EdgeServeError(f"{path}:{line}: time_s must be >= 0, got {time_s}")
                times.append(time_s)
                models.append(index[name])
    except FileNotFoundError:
        raise EdgeServeError(f"{path}: no such replay file") from None
    t = np.array(times, dtype=np.float64)
    end = float(duration_s) if duration_s is not None else (float(t.max()) + 1e-9 if t.size else 0.0)
    keep = t < end
    per_model = [np.sort(t[keep & (np.array(models) == m)]) for m in range(len(model_names))]
    return _merge(per_model, end)
