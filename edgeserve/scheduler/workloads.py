"""Arrival patterns beyond the paper's Poisson, for judging policies on traffic they were not tuned on.

Every generator keeps the long-run mean rate of each model at `rates[m]` (a spike adds on top, by
design), is seeded per (seed, model, stream) and returns an ArrivalTrace like arrivals.py:

- `mmpp`: two-state Markov-modulated Poisson. HIGH at `high` x the mean a fraction `share` of the
  time, LOW otherwise (mean preserved); `shared=True` drives every model with one chain (a scene
  change seen by every camera), else one chain per model.
- `diurnal`: rate x (1 + depth sin(2 pi t / period)), a compressed day.
- `spike`: the mean rate, times `factor` during [start, start + length).

Non-homogeneous Poisson by thinning: candidates at the peak rate, kept with probability rate(t)/peak.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from edgeserve.scheduler.arrivals import ArrivalTrace, _merge

RateShape = Callable[[np.ndarray], np.ndarray]  # multiplier of the mean rate at times t


def _rng(seed: int, model: int, stream: int) -> np.random.Generator:
    return np.random.default_rng([seed, model, stream, 4099])


def _thinned(
    rate: float, peak: float, shape: RateShape, duration_s: float, rng: np.random.Generator
) -> np.ndarray:
    if rate <= 0:
        return np.empty(0)
    count = rng.poisson(rate * peak * duration_s)
    t = np.sort(rng.uniform(0.0, duration_s, count))
    keep = rng.random(t.size) * peak < shape(t)
    return t[keep]


def _two_state_path(
    duration_s: float, rng: np.random.Generator, share: float, mean_high_s: float
) -> tuple[np.ndarray, np.ndarray]:
    """Switch times and HIGH flags of a two-state Markov chain, started stationary."""
    mean_low_s = mean_high_s * (1.0 - share) / share
    edges, flags = [0.0], []
    high = bool(rng.random() < share)
    t = 0.0
    while t < duration_s:
        flags.append(high)
        t += rng.exponential(mean_high_s if high else mean_low_s)
        edges.append(t)
        high = not high
    return np.array(edges), np.array(flags)


def _path_shape(edges: np.ndarray, flags: np.ndarray, high: float, low: float) -> RateShape:
    def shape(t: np.ndarray) -> np.ndarray:
        idx = np.searchsorted(edges, t, side="right") - 1
        return np.where(flags[np.clip(idx, 0, flags.size - 1)], high, low)

    return shape


def mmpp(
    rates: Sequence[float],
    duration_s: float,
    seed: int = 0,
    shared: bool = True,
    high: float = 3.0,
    share: float = 0.25,
    mean_high_s: float = 0.3,
) -> ArrivalTrace:
    """Markov-modulated Poisson: HIGH (`high` x mean) a fraction `share` of the time, LOW otherwise."""
    if not 0 < share < 1 or high * share > 1:
        raise ValueError(f"need 0 < share < 1 and high * share <= 1, got high={high}, share={share}")
    low = (1.0 - high * share) / (1.0 - share)
    common = _two_state_path(duration_s, _rng(seed, 1 << 20, 1), share, mean_high_s)
    per_model = []
    for m, rate in enumerate(rates):
        edges, flags = common if shared else _two_state_path(duration_s, _rng(seed, m, 1), share, mean_high_s)
        per_model.append(
            _thinned(rate, high, _path_shape(edges, flags, high, low), duration_s, _rng(seed, m, 2))
        )
    return _merge(per_model, duration_s)


def diurnal(
    rates: Sequence[float],
    duration_s: float,
    seed: int = 0,
    depth: float = 0.8,
    period_s: float | None = None,
) -> ArrivalTrace:
    """Sinusoidal rate, mean `rates[m]`, peak (1 + depth) x; one period per `period_s` (default: the run)."""
    period = period_s or duration_s

    def shape(t: np.ndarray) -> np.ndarray:
        return 1.0 + depth * np.sin(2.0 * np.pi * t / period)

    return _merge(
        [_thinned(r, 1.0 + depth, shape, duration_s, _rng(seed, m, 3)) for m, r in enumerate(rates)],
        duration_s,
    )


def spike(
    rates: Sequence[float],
    duration_s: float,
    seed: int = 0,
    factor: float = 3.0,
    start_frac: float = 0.4,
    length_frac: float = 0.15,
) -> ArrivalTrace:
    """The mean rate with one `factor` x spike over [start, start + length) (fractions of the run)."""
    a, b = start_frac * duration_s, (start_frac + length_frac) * duration_s

    def shape(t: np.ndarray) -> np.ndarray:
        return np.where((t >= a) & (t < b), factor, 1.0)

    return _merge(
        [_thinned(r, factor, shape, duration_s, _rng(seed, m, 4)) for m, r in enumerate(rates)], duration_s
    )
