"""How long bytes wait in a socket before the event loop reads them: the part of a client's
deadline that the server's read time cannot see; planned for up to 1 ms, exported as a gauge.

Why: a client counts its deadline from its send, the server from its read. Beside a client that
takes most of a core, the loop is often off its CPU or inside a long callback when a frame comes:
at 2x load the frames of a client written from the docs alone waited 1.0 ms at the median before
the read, a fifth of the digits models' deadlines. So a socket request's plan leaves room for
the running median of that wait, up to PLANNED_MAX_S on top of `[listen] reply_margin_ms`.
Why a cap: at 10x the frames served are the newest of their reads, which waited far less than a
frame arriving at a random instant (1.1-2.1 ms there); plans that much short on 5-10 ms deadlines
cost a fast client a third or more of its goodput at 10x, where 1 ms at most did not
(docs/overload-journal.md, "The wait before the read").

Why a timer fd: the kernel makes it readable at a set instant, as a client's write makes its
socket readable, and the loop reads it in its turn like any socket; the time of that read minus
that instant is the wait a frame arriving then had. No thread (a thread would wait for the GIL
before it could stamp a time) and nanosecond expiries (the loop's own timers are millisecond-
granular, as coarse as what is measured). Linux only (timerfd through ctypes: os.timerfd_*
arrive in Python 3.13); elsewhere the wait is never measured and stays 0.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import random
import time
from collections.abc import Callable

from edgeserve.runtime.running_quantile import RunningQuantile

PROBE_HZ = 200.0  # probes a second while clients are connected: a read and a re-arm, ~10 us each
QUANTILE = 0.5  # the median wait
STEP_S = 50e-6  # the running quantile's step (it follows a change of load within ~0.2 s)
HOLD_S = 0.2e-3  # the held value moves in steps this large: requests alike keep one budget to the bit
PLANNED_MAX_S = 1e-3  # the most of it the plans leave room for (see above)

_CLOCK_MONOTONIC = 1  # the clock of time.monotonic() on Linux
_TFD_NONBLOCK = os.O_NONBLOCK
_TFD_CLOEXEC = os.O_CLOEXEC
_TFD_TIMER_ABSTIME = 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


class TimerFd:
    """A one-shot CLOCK_MONOTONIC timerfd: readable from `arm_at(t)`'s instant t on."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)  # the process's own symbols, the C library's among them
        self._settime = libc.timerfd_settime  # AttributeError where there is no timerfd (not Linux)
        self._settime.argtypes = [
            ctypes.c_int,
            ctypes.c_int,
            ctypes.POINTER(_Itimerspec),
            ctypes.POINTER(_Itimerspec),
        ]
        fd = libc.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
        if fd < 0:
            error = ctypes.get_errno()
            raise OSError(error, f"timerfd_create: {os.strerror(error)}")
        self.fd: int = fd
        self._spec = _Itimerspec()

    def arm_at(self, instant: float) -> None:
        """Readable at time.monotonic() == instant."""
        seconds = int(instant)
        value = self._spec.it_value
        value.tv_sec = seconds
        value.tv_nsec = int((instant - seconds) * 1e9)
        if self._settime(self.fd, _TFD_TIMER_ABSTIME, ctypes.byref(self._spec), None) < 0:
            error = ctypes.get_errno()
            raise OSError(error, f"timerfd_settime: {os.strerror(error)}")

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def timer_fd() -> TimerFd | None:
    """A TimerFd, or None where the system has none (the wait is then not measured)."""
    try:
        return TimerFd()
    except (OSError, AttributeError):
        return None


class ReadLag:
    """The running median of a probe's wait to be read, held in HOLD_S steps; `on_change(value)`
    when the held value moves. Probes at random instants (Poisson, PROBE_HZ) while resumed:
    regular ones could fall into step with the loop's own rhythm (a batch every few ms)."""

    def __init__(self, on_change: Callable[[float], object], rate_hz: float = PROBE_HZ) -> None:
        self.on_change = on_change
        self.rate_hz = rate_hz
        self.value = 0.0  # the held median wait, seconds
        self.estimate = RunningQuantile(QUANTILE, STEP_S)
        self.probes = 0  # probes read
        self._timer: TimerFd | None = None  # while resumed
        self._loop: asyncio.AbstractEventLoop | None = None
        self._due = 0.0  # the armed instant
        self._unavailable = False  # no timerfd on this system: the wait stays 0
        self._random = random.Random()

    @property
    def measuring(self) -> bool:
        """Probes are armed (resumed, on a system with a timerfd)."""
        return self._timer is not None

    def resume(self) -> None:
        """Probe (call it on the loop that reads the sockets): clients are connected."""
        if self._timer is not None or self._unavailable:
            return
        self._timer = timer_fd()
        if self._timer is None:
            self._unavailable = True
            return
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._timer.fd, self._on_probe)
        self._arm(time.monotonic())

    def pause(self) -> None:
        """No probes, and no descriptor held: no client is connected, and an idle box is not
        woken for them. The estimate is kept for the next clients."""
        timer, self._timer = self._timer, None
        if timer is not None:
            assert self._loop is not None
            if not self._loop.is_closed():
                self._loop.remove_reader(timer.fd)
            timer.close()

    def _arm(self, now: float) -> None:
        assert self._timer is not None
        self._due = now + self._random.expovariate(self.rate_hz)
        self._timer.arm_at(self._due)

    def _on_probe(self) -> None:
        now = time.monotonic()
        if self._timer is None:
            return
        try:
            os.read(self._timer.fd, 8)
        except BlockingIOError:
            return
        self.probes += 1
        wait = self.estimate.observe(max(now - self._due, 0.0))
        if abs(wait - self.value) > HOLD_S:
            self.value = wait
            self.on_change(wait)
        self._arm(now)
