"""Tell systemd how the server is doing (sd_notify(3)), in pure stdlib; a no-op outside systemd.

systemd passes `NOTIFY_SOCKET` (a datagram socket path, or `@name` for an abstract one) to a
`Type=notify` service and `WATCHDOG_USEC` when `WatchdogSec=` is set. The Notifier sends:

- READY=1 once the models are loaded and warmed up and the listeners accept connections;
- WATCHDOG=1 every half watchdog interval from an event-loop callback, so a loop that hangs (a
  blocking call, a deadlock) stops petting and systemd restarts the service;
- STATUS=... every few seconds with the current load (what `systemctl status` shows);
- RELOADING=1 ... READY=1 around a SIGHUP reload, and STOPPING=1 when shutdown begins.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

_log = logging.getLogger(__name__)

STATUS_EVERY_S = 5.0


@dataclass(frozen=True)
class NotifySocket:
    """Where systemd listens: a filesystem path or an abstract name (leading NUL byte)."""

    address: str | bytes

    def send(self, *fields: str) -> bool:
        """Send one datagram of newline-separated `KEY=value` fields; False if it could not be sent."""
        payload = "\n".join(fields).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.setblocking(False)  # a full receive queue drops the message, never blocks the loop
                sock.sendto(payload, self.address)
        except OSError as exc:  # systemd gone, queue full or not ours: never take the server down
            _log.debug("sd_notify failed", extra={"error": str(exc), "fields": " ".join(fields)})
            return False
        return True


def notify_socket(env: Mapping[str, str] | None = None) -> NotifySocket | None:
    """The socket named by $NOTIFY_SOCKET (`@name` is abstract), or None when not run by systemd."""
    value = (os.environ if env is None else env).get("NOTIFY_SOCKET", "")
    if not value:
        return None
    if value.startswith("@"):
        return NotifySocket(b"\0" + value[1:].encode())
    if not value.startswith("/"):
        return None  # e.g. vsock: addresses this tiny client does not speak
    return NotifySocket(value)


def notify(*fields: str, env: Mapping[str, str] | None = None) -> bool:
    """sd_notify(0, ...): send the fields if $NOTIFY_SOCKET is set; False when it is not."""
    target = notify_socket(env)
    return target.send(*fields) if target is not None else False


def watchdog_interval(env: Mapping[str, str] | None = None, pid: int | None = None) -> float | None:
    """sd_watchdog_enabled(3): seconds from $WATCHDOG_USEC, or None when no watchdog is asked of
    this process ($WATCHDOG_PID, when set, must be our pid)."""
    env = os.environ if env is None else env
    try:
        usec = int(env.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    if usec <= 0:
        return None
    owner = env.get("WATCHDOG_PID")
    if owner:
        try:
            if int(owner) != (os.getpid() if pid is None else pid):
                return None
        except ValueError:
            return None
    return usec / 1_000_000


class LoadStatus:
    """The STATUS line from Server.snapshot(): queued, requests/s since the previous line,
    answered, deadline violations, executor utilisation. Call on the loop thread."""

    def __init__(self, snapshot: Callable[[], Mapping[str, Any]]) -> None:
        self._snapshot = snapshot
        self._previous: tuple[float, int] | None = None

    def __call__(self) -> str:
        snap = self._snapshot()
        now = time.monotonic()
        answered = sum(sum(by_status.values()) for by_status in snap.get("requests", {}).values())
        queued = sum(snap.get("queue_depth", {}).values())
        violations = sum(snap.get("violations", {}).values())
        rate = 0.0
        if self._previous is not None and now > self._previous[0]:
            rate = (answered - self._previous[1]) / (now - self._previous[0])
        self._previous = (now, answered)
        busy = 100.0 * float(snap.get("utilisation", 0.0))
        return (
            f"serving: {queued} queued, {rate:.1f} req/s, {answered} answered, "
            f"{violations} deadline violations, executor {busy:.0f}% busy"
        )


class Notifier:
    """The server's systemd notifications, driven by its event loop.

    `status` returns the STATUS text (called on the loop every `status_every_s`). Everything is
    a no-op when `target` is None, so `edgeserve serve` behaves the same outside systemd.
    """

    def __init__(
        self,
        target: NotifySocket | None,
        watchdog_s: float | None,
        status: Callable[[], str],
        status_every_s: float = STATUS_EVERY_S,
    ) -> None:
        self.target = target
        self.watchdog_s = watchdog_s
        self._status = status
        self._status_every_s = status_every_s
        self._handles: dict[str, asyncio.TimerHandle] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def from_env(cls, status: Callable[[], str], env: Mapping[str, str] | None = None) -> Notifier:
        return cls(notify_socket(env), watchdog_interval(env), status)

    def set_status(self, status: Callable[[], str]) -> None:
        """Replace the STATUS source (the server's load once it is serving)."""
        self._status = status

    @property
    def active(self) -> bool:
        return self.target is not None

    def send(self, *fields: str) -> bool:
        return self.target.send(*fields) if self.target is not None else False

    def start(self) -> None:
        """Begin petting the watchdog and posting STATUS (call on the running loop)."""
        if self.target is None:
            return
        self._loop = asyncio.get_running_loop()
        if self.watchdog_s is not None:
            self._pet()
        self._post_status()

    def ready(self, status: str | None = None) -> None:
        """READY=1: models loaded and warmed, listeners accepting (also ends a RELOADING=1)."""
        self.send("READY=1", f"STATUS={status or self._safe_status()}")

    def reloading(self) -> None:
        self.send("RELOADING=1", f"MONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}")

    def stopping(self, status: str = "stopping: answering the requests in flight") -> None:
        """STOPPING=1 and stop the periodic messages; the watchdog keeps being petted until stop()
        (a slow drain must not look like a hang)."""
        self._cancel("status")
        self.send("STOPPING=1", f"STATUS={status}")

    def stop(self) -> None:
        for name in list(self._handles):
            self._cancel(name)

    def _cancel(self, name: str) -> None:
        handle = self._handles.pop(name, None)
        if handle is not None:
            handle.cancel()

    def _pet(self) -> None:
        """WATCHDOG=1 from a loop callback, rescheduled each time: a blocked loop stops petting."""
        assert self._loop is not None and self.watchdog_s is not None
        self.send("WATCHDOG=1")
        self._handles["watchdog"] = self._loop.call_later(self.watchdog_s / 2, self._pet)

    def _post_status(self) -> None:
        assert self._loop is not None
        self.send(f"STATUS={self._safe_status()}")
        self._handles["status"] = self._loop.call_later(self._status_every_s, self._post_status)

    def _safe_status(self) -> str:
        try:
            return self._status()
        except Exception as exc:  # a status bug must not stop the watchdog
            with contextlib.suppress(Exception):
                _log.warning("status line failed", extra={"error": repr(exc)})
            return "serving"
