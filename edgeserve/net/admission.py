"""How many requests each connection may have in flight, and when a flood is left unread.

As `Policy.decide` is to the Server, this is to the socket front: counts and a clock in, numbers
out; the Frontend owns one `Admission`, each Connection a `Share` of it, and the Connection applies
what it says (accepts or refuses a frame, pauses its socket). A connection's room is written once
(`Admission.room`), over all five regimes of its window:

- below the in-flight total: `max_in_flight`, or with `[listen] share_total` its even share of the
  total where that is more, shared among the busy connections (those with requests in flight,
  itself counted) or the ones sending, whichever are more: a client alone keeps the executor's
  queue as full as several would;
- at the total: an even share of it among the busy connections, at most `max_in_flight`, at least 1;
- a light client (FloodTally: a record of requests served and few refused) keeps its whole
  `max_in_flight`: the even share binds the busy, a light one's bursts pass;
- a held flood (`flood_window`), or one of several floods beside a polite client
  (`shared_flood_window`), for `polite_s` after its read (`after_read`).

What a connection sent past its window lately (FloodTally) is what tells a flood from a busy
client; the HTTP front's clients count beside the connections, as one more client (PeerFront).
The tally is consulted once per read (`after_read`), and per frame only for `room`.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from edgeserve.net.settings import AdmissionSettings
from edgeserve.runtime import FrontendStats


@dataclass(slots=True)
class Counts:
    """One period's counts."""

    refused: int = 0  # frames refused past the window, whatever the window was
    accepted: int = 0  # requests accepted, whatever the window was
    # Requests accepted and frames refused while the connection had its full window (not the
    # small one after a hold): a hold makes its client's frames pile up and go stale, so counts
    # taken meanwhile would make every held connection look like a flood forever.
    full_accepted: int = 0
    full_refused: int = 0


@dataclass(slots=True)
class FloodTally:
    """One connection's counts by period, in the loop's time. "Lately" is the current period and,
    while it is younger than one period, the one before, so that a count never drops to zero just
    because a period began."""

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

    def light(self, t: float, track: int, ratio: int) -> bool:
        """Lately it had `track` or more requests accepted and at most one refused for every
        `ratio` accepted: a client within its rate whose bursts now and then pass its even share
        of the in-flight total. Without such a track record (a new client) it is not. (Asked per
        frame: the sums of `lately` without building its Counts.)"""
        age = t - self.start
        if age >= 2 * self.period_s:
            accepted = refused = 0
        elif age >= self.period_s:
            accepted, refused = self.now.accepted, self.now.refused
        else:
            now, before = self.now, self.before
            accepted, refused = now.accepted + before.accepted, now.refused + before.refused
        return accepted >= track and refused * ratio <= accepted

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
    (Admission.polite_others), and without this a polite client over HTTP beside a socket flood
    was never counted, so the flood was never held for it. Its requests count as accepted, its
    `rejected` samples as refused; polite while at most one in `light_ratio` was refused lately."""

    stats: FrontendStats
    tally: FloodTally
    light_ratio: int
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
        return sending, sending and lately.refused * self.light_ratio <= lately.accepted


@dataclass(slots=True, eq=False)
class Share:
    """One connection's part in the admission: what it has in flight, whether and when it last
    sent, what it sent past its window lately, and the small window it has after a flood."""

    tally: FloodTally
    in_flight: int = 0  # accepted requests still to be answered
    greeted: bool = False  # its hello was accepted
    last_data: float = 0.0  # loop.time() of the last bytes received: the clock of its decisions
    last_flood: float = -math.inf  # loop.time() of the last read with flood_frames past the window
    small_window: int = 1  # its window while last_data < small_until (after a flood)
    small_until: float = -math.inf


class Admission:
    """The windows of one front's connections (see the module's docstring for the rule)."""

    def __init__(self, settings: AdmissionSettings, peers: Sequence[FrontendStats] = ()) -> None:
        self.settings = settings
        self.max_in_flight = 0  # per connection ([listen] max_in_flight, resolved: Frontend.listen)
        self.share_total = False  # [listen] share_total
        self.total = 0  # the in-flight total in force (Frontend.refresh_total)
        self.in_flight = 0  # accepted requests not answered yet, all connections
        self.busy = 0  # connections with requests in flight: they share the total
        self.refusing = 0  # connections whose refusals wait for the next loop turn
        self.drained: asyncio.Event | None = None  # set when in_flight reaches 0 (Frontend.drain)
        self.shares: set[Share] = set()  # the admitted connections'
        # The other fronts on this server (the HTTP front's stats): their clients count beside the
        # connections when a flood is to be held for the polite ones (polite_others).
        self.peers = [
            PeerFront(stats, FloodTally(settings.polite_s), settings.light_ratio) for stats in peers
        ]
        self._sending = (-math.inf, 0)  # (loop.time() counted at, greeted connections sending lately)

    def share(self) -> Share:
        """A new connection's share (counted once it is admitted: `join`)."""
        return Share(FloodTally(self.settings.polite_s), small_window=self.settings.flood_window)

    def join(self, share: Share) -> None:
        self.shares.add(share)

    def leave(self, share: Share) -> None:
        self.shares.discard(share)

    def room(self, share: Share) -> int:
        """How many requests `share`'s connection may accept now, one after the other, its window
        moving with each (the total grows, and its first makes it busy): up to the window while
        under the total, then up to its share. At most 0: its window is full, a frame is refused."""
        mine, now = share.in_flight, share.last_data
        if now < share.small_until:  # a held flood, or one of several beside a polite client
            return share.small_window - mine
        mif, total, sending = self.max_in_flight, self.total, self.sending(now)
        busy_then = max(self.busy + (mine == 0), 1)
        cap = max(mif, total // max(busy_then, sending)) if self.share_total else mif  # below the total
        room = max(min(cap - mine, total - self.in_flight), max(1, min(mif, total // busy_then)) - mine, 0)
        settings = self.settings
        if share.tally.light(now, settings.light_track, settings.light_ratio):
            return max(room, mif - mine)  # a light client's bursts pass: the even share binds the busy
        return room

    def accept(self, share: Share) -> None:
        """Count a request that will be answered (it now holds a place in the window)."""
        now = share.last_data
        share.tally.count(now, 1, 0, now >= share.small_until)
        share.in_flight += 1
        self.in_flight += 1
        if share.in_flight == 1:
            self.busy += 1

    def answered(self, share: Share) -> None:
        share.in_flight -= 1
        self.in_flight -= 1
        if share.in_flight == 0:
            self.busy -= 1
        if self.in_flight == 0 and self.drained is not None:
            self.drained.set()

    def defer(self, waiting: bool) -> None:
        """A connection's refusals wait for the next loop turn (True), or have run (False)."""
        self.refusing += 1 if waiting else -1

    def after_read(self, share: Share, refused: int, held: bool, clock: Callable[[], float]) -> float:
        """Count the frames a read refused past the window; how long to leave its socket unread
        (0: read on). A read flood_frames past the window floods; a heavy flood (floods_heavily)
        not `held` already is held beside polite clients only, and beside other floods keeps being
        read with a small window instead (polite_others). `clock`: the loop's time now."""
        settings, tally, now = self.settings, share.tally, share.last_data
        tally.count(now, 0, refused, now >= share.small_until)
        if refused < settings.flood_frames:
            return 0.0
        share.last_flood = now
        if held or not tally.floods_heavily(now, settings.flood_ratio):
            return 0.0
        t = clock()
        others, polite = self.polite_others(share, t)
        if not polite:
            return 0.0
        if polite < others:  # several floods: each keeps being read, with a small window
            share.small_window, share.small_until = settings.shared_flood_window, t + settings.polite_s
            return 0.0
        pause = settings.flood_pause_s
        share.small_window, share.small_until = settings.flood_window, t + pause + settings.polite_s
        return pause

    def polite(self, share: Share, now: float) -> bool:
        """Within its window lately: no read flood_frames past it for polite_s, and fewer than
        flood_frames refused over the last periods."""
        settings = self.settings
        return (
            now - share.last_flood > settings.polite_s
            and share.tally.lately(now).refused < settings.flood_frames
        )

    def polite_others(self, share: Share, now: float) -> tuple[int, int]:
        """How many other greeted clients sent lately, and how many of them are polite. A hold
        serves the polite ones only beside a lone flood: beside another, holds left the executor
        idle (every held client's frames go stale behind its hold), so the floods keep being read
        with a small window instead (docs/runtime.md)."""
        others = [s for s in self.shares if s is not share and s.greeted and now - s.last_data < 1.0]
        senders, polite = len(others), sum(self.polite(s, now) for s in others)
        for peer in self.peers:  # an HTTP front's clients: one more client, polite or not
            sending, light = peer.lately(now)
            senders, polite = senders + sending, polite + light
        return senders, polite

    def sending(self, now: float) -> int:
        """How many greeted clients sent in the last sending_s (counted again every
        sending_every_s): with `share_total`, a busy connection's window below the total is at
        most its even share among these too, so that a client sending now and then (between its
        requests it has none in flight) does not find the queues filled by one that sends more."""
        counted_at, count = self._sending
        if now - counted_at > self.settings.sending_every_s:
            recent = self.settings.sending_s
            count = sum(s.greeted and now - s.last_data < recent for s in self.shares)
            self._sending = (now, count)
        return count
