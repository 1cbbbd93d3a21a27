"""When the loop runs the Server's next decision, and its turns that do not sleep.

A decision is made once per loop turn after work arrives (`kick`: a burst of arrivals is
batched together, and the callback waits for the turn's reads), or at one timer: a Wait's `until`
or, in expire mode, the moment a queued task turns hopeless (`arm`). After a batch that leaves
the server idle, the loop may poll a while instead of sleeping (`idle`, idle_poll.py).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence

from edgeserve.runtime.idle_poll import IdlePoll
from edgeserve.runtime.pipeline import Pipeline
from edgeserve.runtime.settings import RuntimeSettings
from edgeserve.scheduler.queues import TaskQueue


def hopeless_at(queues: Sequence[TaskQueue], shallowest_s: Sequence[float]) -> float:
    """When the first queued task turns hopeless: its deadline less its model's batch of one at
    the shallowest exit (inf: none queued)."""
    hopeless = math.inf
    for m, queue in enumerate(queues):
        if queue:
            hopeless = min(hopeless, float(queue.deadlines.min()) - shallowest_s[m])
    return hopeless


class Wakeups:
    """The Server's loop callbacks that decide: `decide(wake_at=-inf, here=False)` is
    Server._decide; `loop` is set as the Server starts."""

    def __init__(
        self,
        pipeline: Pipeline,
        idle_poll: IdlePoll,
        decide: Callable[..., None],
        settings: RuntimeSettings,
    ) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self._pipeline = pipeline
        self._idle_poll = idle_poll
        self._decide = decide
        self._slack_s, self._min_s = settings.timer_slack_s, settings.min_wakeup_s
        self._lag_weight = settings.lag_weight
        self._timer: asyncio.TimerHandle | None = None
        self._pending = False
        self._kicked_at = 0.0

    def kick(self) -> None:
        """Decide soon (once per loop iteration, so a burst of arrivals is batched together)."""
        pipeline = self._pipeline
        if pipeline.busy or self._pending or pipeline.closed:
            return
        assert self.loop is not None
        self._pending = True
        self._kicked_at = now = time.monotonic()
        self._idle_poll.busy(now)
        self.loop.call_soon(self._decide_now)

    def _decide_now(self) -> None:
        self._pending = False
        pipeline = self._pipeline
        pipeline.loop_delay += self._lag_weight * (time.monotonic() - self._kicked_at - pipeline.loop_delay)
        self._decide(here=True)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def arm(self, until: float, hopeless: float = math.inf) -> None:
        """One wake-up: a Wait's `until` (fired `timer_slack_s` early, the policy then asked as of
        `until`), or `hopeless` (expire mode: hopeless_at) if that is sooner."""
        self.cancel()
        assert self.loop is not None
        if until - self._slack_s <= hopeless and not math.isinf(until):
            delay = max(until - self._slack_s - time.monotonic(), self._min_s)
            self._timer = self.loop.call_later(delay, self._decide, until)
        elif not math.isinf(hopeless):
            delay = max(hopeless - time.monotonic(), self._min_s)
            self._timer = self.loop.call_later(delay, self._decide)

    def idle(self, now: float) -> None:
        """The last batch left the server idle at `now`: poll, if the idle poll says so."""
        if self._idle_poll.idle(now):
            assert self.loop is not None
            self.loop.call_soon(self._poll)

    def _poll(self) -> None:
        """One more loop turn that does not sleep, while the server stays idle (idle_poll.py): the
        loop's epoll does not block while a callback is ready, so the next request is read without
        a wake-up from a halted core. Reads, timers and other callbacks run in between as usual."""
        if self._idle_poll.polling(time.monotonic()) and not self._pipeline.closed:
            assert self.loop is not None
            self.loop.call_soon(self._poll)
