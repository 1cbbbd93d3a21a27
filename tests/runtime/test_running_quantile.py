"""The running quantile the plans use for a finished batch's wait for the loop."""

from __future__ import annotations

import numpy as np

from edgeserve.runtime.running_quantile import RunningQuantile


def settle(tracker: RunningQuantile, samples: np.ndarray) -> np.ndarray:
    return np.array([tracker.observe(float(x)) for x in samples])


def test_it_settles_at_the_quantile_of_a_long_tailed_wait_not_at_its_mean() -> None:
    rng = np.random.default_rng(7)
    waits = rng.exponential(1e-3, 20_000)  # mean 1 ms, P90 2.3 ms
    values = settle(RunningQuantile(0.9, 50e-6), waits)[5_000:]
    assert abs(values.mean() - np.quantile(waits, 0.9)) < 0.15e-3
    assert values.mean() > 2 * waits.mean()


def test_it_follows_a_change_of_load_within_a_few_hundred_samples_and_never_goes_below_zero() -> None:
    rng = np.random.default_rng(8)
    tracker = RunningQuantile(0.9, 50e-6)
    settle(tracker, rng.exponential(1e-3, 5_000))
    assert tracker.value > 1.5e-3
    after = settle(tracker, rng.exponential(20e-6, 1_000))  # the contention is gone
    assert after[500] < 0.1e-3
    assert after.min() >= 0.0
    settle(tracker, rng.exponential(1e-3, 200))  # and is back: the tracker climbs at 45 us a sample
    assert tracker.value > 1.0e-3


def test_each_sample_moves_it_by_at_most_one_step() -> None:
    tracker = RunningQuantile(0.9, 50e-6, value=1e-3)
    assert tracker.observe(1.0) == 1e-3 + 45e-6  # far above: still one step up
    assert abs(tracker.observe(0.0) - (1e-3 + 40e-6)) < 1e-12  # below: (1 - 0.9) of a step down
