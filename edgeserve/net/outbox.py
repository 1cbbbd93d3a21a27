"""A connection's outgoing frames: the answers of one loop turn leave in one write.

Under overload a read's refusals number in the hundreds and a batch's answers in the dozens: one
write each would be a system call and a wake-up of the client each. So frames are queued and
written together at the end of the loop turn (`write`), or at once with what is queued before
them (`send`: a finished batch's answer, which at the end of the turn would wait behind the
turn's reads).
"""

from __future__ import annotations

import asyncio
import os


class Outbox:
    """The frames queued for one connection, and how they reach its socket."""

    __slots__ = ("_loop", "_transport", "fd", "frames")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._transport: asyncio.Transport | None = None
        self.frames: list[bytes] = []  # to write at the end of this loop turn
        self.fd = -1  # the socket's descriptor while the transport is open (`transmit`), else -1

    def attach(self, transport: asyncio.Transport, fd: int) -> None:
        """`fd`: the socket's, where it carries plain bytes (no TLS), else -1."""
        self._transport, self.fd = transport, fd

    def write(self, frame: bytes) -> None:
        """Queue a frame; the frames of one loop turn (refusals, the hello) leave in one write."""
        if not self.frames:
            self._loop.call_soon(self.flush)
        self.frames.append(frame)

    def flush_soon(self) -> None:
        """Frames were queued (by the refusals, straight into `frames`): write them this turn."""
        self._loop.call_soon(self.flush)

    def send(self, frame: bytes) -> None:
        """Write `frame` now, after what is queued before it."""
        if self.frames:
            self.frames.append(frame)
            self.flush()
        else:
            self.transmit(frame)

    def flush(self) -> None:
        transport = self._transport
        if self.frames and transport is not None and not transport.is_closing():
            self.transmit(b"".join(self.frames))
        self.frames.clear()

    def transmit(self, data: bytes) -> None:
        """Write `data` to the socket with the GIL released, then leave the rest to the transport.

        uvloop's `transport.write` makes its write() syscall holding the GIL. Sending an answer
        wakes the client, and on a busy box the woken client often takes the loop thread's core
        in the middle of that call: the loop is then off its CPU for ~20 us per write, GIL in hand,
        while the executor thread, its batch done, waits for the GIL to return from ONNX Runtime
        and to decide the next batch. os.write releases the GIL for the syscall. It is used only
        while the transport has nothing buffered (so the bytes keep their order); what the socket
        does not take now, or an error, goes to transport.write, which buffers, applies the write
        flow control, or reports the error and closes as before."""
        transport = self._transport
        assert transport is not None
        if self.fd >= 0 and not transport.get_write_buffer_size() and not transport.is_closing():
            try:
                sent = os.write(self.fd, data)
            except OSError:  # EAGAIN, or an error the transport's own write will meet and report
                sent = 0
            if sent == len(data):
                return
            data = data[sent:]
        transport.write(data)
