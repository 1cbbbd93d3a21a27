"""Whether the event loop polls, instead of sleeping, for a moment after the server goes idle.

A loop that sleeps in epoll between two requests is woken by the kernel when the next one comes.
On a VM that wake-up crosses the hypervisor (an interrupt to a halted virtual CPU: 20-50 us), and
while the core halts its caches cool, so the next batch runs slower too. A client that sends its
next request soon after its answer (one request at a time, a camera's pipeline waiting for each
result) pays both on every request. While the loop has a callback ready its epoll does not block,
so a callback that schedules itself again (Wakeups._poll) keeps the loop, and its core, awake
without delaying anything the loop has to do: reads, timers and other callbacks run in between.

Polling costs a core's time, so it lasts at most `window_s` after each batch that leaves the
server idle, and happens only while most idle periods end within that window (`hit_rate`, kept
for every idle period, polled or not): a sparse or periodic stream (a 30 fps camera) makes the
loop sleep as before, and polling resumes by itself when requests come back to back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

HIT_WEIGHT = 0.05  # EWMA weight of the latest idle period (ended within the window or not)
MIN_HIT_RATE = 0.5  # poll while at least this share of idle periods end within the window


@dataclass(slots=True)
class IdlePoll:
    """The idle periods after batches (each begins at `idle` and ends at `busy`) and their polling."""

    window_s: float
    hit_rate: float = 1.0
    idle_since: float = math.nan  # when the current idle period began; nan while there is none
    until: float = -math.inf  # the current polling goes on until then, unless the period ends
    polled_s: float = 0.0  # time the loop spent polling (edgeserve_idle_poll_seconds_total)

    def idle(self, now: float) -> bool:
        """The last batch left the server idle at `now`: whether to poll (until `until`)."""
        self.stop(now)
        self.idle_since = now
        if self.window_s <= 0.0 or self.hit_rate < MIN_HIT_RATE:
            return False
        self.until = now + self.window_s
        return True

    def busy(self, now: float) -> None:
        """Work came: the idle period, if one began, ends, and so does its polling."""
        since = self.idle_since
        if since == since:  # not nan
            self.stop(now)
            self.idle_since = math.nan
            hit = 1.0 if now - since <= self.window_s else 0.0
            self.hit_rate += HIT_WEIGHT * (hit - self.hit_rate)

    def polling(self, now: float) -> bool:
        """Whether to poll once more; when not, the polling stops and is counted."""
        if now < self.until:
            return True
        self.stop(now)
        return False

    def stop(self, now: float) -> None:
        if self.until > -math.inf:
            self.polled_s += min(now, self.until) - self.idle_since
            self.until = -math.inf
