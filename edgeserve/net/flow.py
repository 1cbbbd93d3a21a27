"""Whether a connection's socket is read: one gate, paused while any of its reasons holds.

After uvicorn's FlowControl (uvicorn/protocols/flow_control.py), with named reasons instead of
one flag, because a connection stops reading for four independent reasons and each ends on its
own: a client that does not read its answers (WRITE: the transport's write buffer is above its
high-water mark, so the server never buffers without bound), frames left in the buffer for the
next loop turn (BACKLOG), a flood left unread for a while (HOLD, net/admission.py) and shutdown
(STOP). Reading resumes only when the last reason ends, so no site has to re-derive the others.

The reasons are plain ints (an IntFlag's `|` builds an object: the gate is touched every read).
"""

from __future__ import annotations

from typing import Protocol

WRITE = 1  # the client does not read its answers (pause_writing .. resume_writing)
BACKLOG = 2  # complete frames wait in the buffer for the next loop turn
HOLD = 4  # a flood left unread (Admission.after_read)
STOP = 8  # shutdown: no more frames from this client
NAMES = {WRITE: "write", BACKLOG: "backlog", HOLD: "hold", STOP: "stop"}


class Readable(Protocol):
    """What the gate needs of a transport."""

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


class ReadGate:
    """Reading is paused iff any reason is set. Without a transport (before it is made, and once
    the connection closes) the gate keeps its reasons and touches nothing."""

    __slots__ = ("_transport", "reasons")

    def __init__(self) -> None:
        self.reasons = 0
        self._transport: Readable | None = None

    def attach(self, transport: Readable) -> None:
        self._transport = transport

    def detach(self) -> None:
        """The connection closes: its transport is no longer paused or resumed."""
        self._transport = None

    def pause(self, reason: int) -> None:
        if not self.reasons and self._transport is not None:
            self._transport.pause_reading()
        self.reasons |= reason

    def resume(self, reason: int) -> None:
        """`reason` ends; reading resumes if it was the last."""
        if self.reasons & reason:
            self.reasons &= ~reason
            if not self.reasons and self._transport is not None:
                self._transport.resume_reading()

    @property
    def paused(self) -> bool:
        return bool(self.reasons)

    def __repr__(self) -> str:
        names = [name for bit, name in NAMES.items() if self.reasons & bit]
        return f"ReadGate({'|'.join(names) or 'reading'})"
