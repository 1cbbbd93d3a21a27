"""A running quantile of a stream of delays: the room the plans leave for an answer's way back.

Why not the mean: a wait that is short at the median and milliseconds long in its tail (the loop
off its CPU as a batch ends, on a box whose cores the clients share) is missed by a plan made to
its mean. Why this estimator: one comparison and one add per sample, no memory of the samples,
and it follows a change of load within a few hundred samples (the fixed-step stochastic
approximation of a quantile, the "frugal" streaming estimator).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RunningQuantile:
    """Settles where `quantile` of the samples are at or below it, moving at most `step` a sample."""

    quantile: float
    step: float
    value: float = 0.0

    def observe(self, sample: float) -> float:
        """Up by quantile x step past a sample above it, else down by (1 - quantile) x step (not
        below 0: these are delays); at the balance of the two, that share of samples is below."""
        if sample > self.value:
            self.value += self.quantile * self.step
        else:
            self.value = max(self.value - (1.0 - self.quantile) * self.step, 0.0)
        return self.value
