"""Checks shared by the scheduler tests."""

from __future__ import annotations

import pytest

from edgeserve.scheduler.decision import Dispatch
from edgeserve.scheduler.guarded import GuardedStabilityPolicy
from edgeserve.scheduler.queues import TaskQueue


def agrees_with_loop(
    got: Dispatch | None, loop: GuardedStabilityPolicy, queues: list[TaskQueue], now: float
) -> Dispatch | None:
    """`got` is the reference loop's decision on `queues` at `now`: the same model, exit, batch and
    predicted time, the score to rounding."""
    expected = loop.decide(queues, now)
    if expected is None:
        assert got is None
        return None
    assert got is not None
    assert (got.model, got.exit, got.batch, got.predicted_s) == (
        expected.model,
        expected.exit,
        expected.batch,
        expected.predicted_s,
    )
    assert got.score == pytest.approx(expected.score, rel=1e-9)
    return got
