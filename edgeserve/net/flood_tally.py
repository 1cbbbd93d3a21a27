"""How much a connection sent past its window lately: what tells a flood from a busy client.

Counts run over periods of `period_s` (the frontend's POLITE_S); "lately" is the current period
and, while it is younger than one period, the one before, so that a count never drops to zero
just because a period began. Another front door on the same server (the HTTP front) is seen the
same way, as one more client (`PeerFront`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from edgeserve.runtime import FrontendStats

LIGHT_TRACK = 16
LIGHT_RATIO = 4


@dataclass
class Counts:
    """One period's counts."""

    refused: int = 0  # frames refused past the window, whatever the window was
    accepted: int = 0  # requests accepted, whatever the window was
    # Requests accepted and frames refused while the connection had its full window (not the
    # small one after a hold): a hold makes its client's frames pile up and go stale, so counts
    # taken meanwhile would make every held connection look like a flood forever.
    full_accepted: int = 0
    full_refused: int = 0


@dataclass
class FloodTally:
    """One connection's counts by period, in the loop's time."""

    period_s: float
    start: float = -math.inf
    now: Counts = field(default_factory=Counts)
    before: Counts = field(default_factory=Counts)

    def roll(self, t: float) -> Counts:
        """The current period's counts at loop time `t` (a new period begins past `period_s`)."""
        age = t - self.start
        if age >= self.period_s:
            self.before = self.now if age < 2 * self.period_s else Counts()
            self.now = Counts()
            self.start = t
        return self.now

    def count(self, t: float, accepted: int, refused: int, full: bool) -> None:
        """Count, at loop time `t`, requests accepted and frames refused; `full`: with the
        connection's full window (not the small one after a hold)."""
        counts = self.roll(t)
        counts.accepted += accepted
        counts.refused += refused
        if full:
            counts.full_accepted += accepted
            counts.full_refused += refused

    def lately(self, t: float) -> Counts:
        """The counts of the last one to two periods at loop time `t`."""
        age = t - self.start
        if age >= 2 * self.period_s:
            return Counts()
        if age >= self.period_s:
            return self.now
        now, before = self.now, self.before
        return Counts(
            now.refused + before.refused,
            now.accepted + before.accepted,
            now.full_accepted + before.full_accepted,
            now.full_refused + before.full_refused,
        )

    def light(self, t: float) -> bool:
        """Lately it had LIGHT_TRACK or more requests accepted and at most one refused for every
        LIGHT_RATIO accepted: a client within its rate whose bursts now and then pass its even
        share of the in-flight total. Without such a track record (a new client) it is not."""
        counts = self.lately(t)
        return counts.accepted >= LIGHT_TRACK and counts.refused * LIGHT_RATIO <= counts.accepted

    def floods_heavily(self, t: float, ratio: float) -> bool:
        """Refused at least `ratio` times as many frames as it had accepted, with its full window:
        it sends several times what its window lets through. A client only somewhat over its
        window (one connection of several, sending more than its even share) is not held: a hold
        would idle the executor its frames could have used."""
        counts = self.lately(t)
        return counts.full_refused >= ratio * max(counts.full_accepted, 1)


@dataclass
class PeerFront:
    """Another front door's traffic, read from its FrontendStats, as one more client beside the
    socket front's connections: a flood is held only while every other client sending is polite
    (Frontend.polite_others), and without this a polite client over HTTP beside a socket flood
    was never counted, so the flood was never held for it. Its requests count as accepted, its
    `rejected` samples as refused; polite while at most one in LIGHT_RATIO was refused lately."""

    stats: FrontendStats
    tally: FloodTally
    seen: tuple[int, int] = (0, 0)  # requests and rejected samples at the last look
    looked: float = -math.inf  # loop time of the last look

    def lately(self, t: float) -> tuple[bool, bool]:
        """(sent lately, polite) at loop time `t`."""
        counts = (self.stats.requests, self.stats.by_status.get("rejected", 0))
        if t - self.looked < 2 * self.tally.period_s:  # else what came since is older than lately
            self.tally.count(t, counts[0] - self.seen[0], counts[1] - self.seen[1], full=True)
        self.seen, self.looked = counts, t
        lately = self.tally.lately(t)
        sending = lately.accepted > 0
        return sending, sending and lately.refused * LIGHT_RATIO <= lately.accepted
