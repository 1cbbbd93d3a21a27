"""A circuit breaker per upstream: stop sending to a server that keeps failing, probe it now and then.

closed --N consecutive failures--> open --cooldown passes--> half-open (one probe batch allowed)
half-open --probe succeeds--> closed;  half-open --probe fails--> open again, cooldown doubled
(up to max_cooldown_s), so a dead upstream costs one failed batch per (growing) cooldown, not one
per decision. Time is passed in, so tests drive it without sleeping.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass

_log = logging.getLogger(__name__)


class BreakerState(str, enum.Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half-open"

    def __str__(self) -> str:
        return self.value


@dataclass
class CircuitBreaker:
    """`allow(now)` before sending a batch; then exactly one of `success(now)` / `failure(now)`."""

    failures_to_open: int = 3
    cooldown_s: float = 1.0
    max_cooldown_s: float = 30.0
    _state: BreakerState = BreakerState.CLOSED
    _failures: int = 0  # consecutive, while closed
    _open_until: float = 0.0
    _cooldown: float = 0.0  # the current one (grows while half-open probes fail)
    _probe_out: bool = False  # half-open: the one probe batch is in flight
    opened: int = 0  # how many times it opened (for tests and logs)
    name: str = "upstream"  # for the log lines when it opens and closes

    def __post_init__(self) -> None:
        if self.failures_to_open < 1 or self.cooldown_s <= 0 or self.max_cooldown_s < self.cooldown_s:
            raise ValueError("need failures_to_open >= 1 and 0 < cooldown_s <= max_cooldown_s")
        self._cooldown = self.cooldown_s

    def state(self, now: float) -> BreakerState:
        """The state as of `now` (an open breaker whose cooldown passed reads half-open)."""
        if self._state is BreakerState.OPEN and now >= self._open_until:
            self._state = BreakerState.HALF_OPEN
            self._probe_out = False
        return self._state

    def allow(self, now: float, *, peek: bool = False) -> bool:
        """May a batch go now? Closed: yes. Half-open: only one, the probe. Open: no.

        `peek=True` asks without taking the half-open probe slot (for planning).
        """
        state = self.state(now)
        if state is BreakerState.CLOSED:
            return True
        if state is BreakerState.HALF_OPEN and not self._probe_out:
            self._probe_out = not peek
            return True
        return False

    def success(self, now: float) -> None:
        """A batch came back: close (and forget the failures and the grown cooldown)."""
        if self._state is not BreakerState.CLOSED:
            _log.warning("circuit breaker of %s closed: it answers again", self.name)
        self._state = BreakerState.CLOSED
        self._failures = 0
        self._cooldown = self.cooldown_s
        self._probe_out = False

    def failure(self, now: float) -> None:
        """A batch failed or timed out: count it; open at the threshold, or at once when half-open."""
        state = self.state(now)
        if state is BreakerState.HALF_OPEN:
            self._cooldown = min(self._cooldown * 2.0, self.max_cooldown_s)
            self._open(now)
        elif state is BreakerState.CLOSED:
            self._failures += 1
            if self._failures >= self.failures_to_open:
                self._open(now)
        # already open: a batch sent before it opened failed too; nothing more to learn

    def _open(self, now: float) -> None:
        _log.warning(
            "circuit breaker of %s opened: nothing is offloaded to it for %.1f s, then one probe batch",
            self.name,
            self._cooldown,
        )
        self._state = BreakerState.OPEN
        self._open_until = now + self._cooldown
        self._failures = 0
        self._probe_out = False
        self.opened += 1
