"""The upstream circuit breaker: opens on consecutive failures, probes once after a cooldown."""

from __future__ import annotations

from edgeserve.runtime.offload.breaker import BreakerState, CircuitBreaker


def test_opens_after_consecutive_failures_only() -> None:
    b = CircuitBreaker(failures_to_open=3, cooldown_s=1.0)
    b.failure(0.0)
    b.failure(0.1)
    b.success(0.2)  # resets the run
    b.failure(0.3)
    b.failure(0.4)
    assert b.state(0.4) is BreakerState.CLOSED and b.allow(0.4)
    b.failure(0.5)
    assert b.state(0.5) is BreakerState.OPEN and not b.allow(0.6)


def test_half_open_lets_exactly_one_probe_through_and_success_closes() -> None:
    b = CircuitBreaker(failures_to_open=1, cooldown_s=1.0)
    b.failure(0.0)
    assert not b.allow(0.99)
    assert b.state(1.0) is BreakerState.HALF_OPEN
    assert b.allow(1.0, peek=True) and b.allow(1.0, peek=True)  # peeking takes nothing
    assert b.allow(1.0)
    assert not b.allow(1.01)  # the probe is out
    b.success(1.05)
    assert b.state(1.05) is BreakerState.CLOSED and b.allow(1.06)


def test_a_failed_probe_reopens_with_a_doubled_cooldown_up_to_the_cap() -> None:
    b = CircuitBreaker(failures_to_open=1, cooldown_s=1.0, max_cooldown_s=3.0)
    b.failure(0.0)
    t = 1.0
    for cooldown in (2.0, 3.0, 3.0):
        assert b.allow(t)
        b.failure(t)
        assert b.state(t + cooldown - 0.01) is BreakerState.OPEN
        t += cooldown
        assert b.state(t) is BreakerState.HALF_OPEN
    b.allow(t)
    b.success(t)
    b.failure(t + 1)  # closed again with the base cooldown
    assert b.state(t + 2) is BreakerState.HALF_OPEN and b.opened == 5
