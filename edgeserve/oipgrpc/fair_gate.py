"""Which gRPC requests go on to the Server, in turn by peer, when more are in flight than it should hold.

grpc takes RPCs in the order they come, whoever sends them, and one Python loop handles them, so
beside a flood of several connections a polite client's call waited behind the flood's, past its
deadline (docs/oip.md, "Under overload"). The socket front answers that with its in-flight total
and an even share of it per busy connection (net/admission.py); this is the same total for the
gRPC front (`Server.in_flight_limit`: what deadline admission would still take and what the host,
gRPC's thread included, can answer within the shortest deadline, by Little's law), and the share
taken in turns: past the total, each peer's requests wait here in its own line, and the lines are
served one request each in turn. A waiting request keeps its HTTP/2 stream, so a connection whose
streams (`grpc.max_concurrent_streams`) all wait here sends no more for grpc to queue ahead of the
others. Its wait counts against its deadline (`Server.infer(received=...)`).

Runs on the Server's loop, which alone touches it.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(slots=True, eq=False)
class Ticket:
    """One request's place: made on the gRPC loop, then touched only on the Server's."""

    size: int  # its samples: each counts in flight
    begin: Callable[[], asyncio.Task[object]] | None = None  # set when it enters the gate
    task: asyncio.Task[object] | None = None  # once let through
    cancelled: bool = False


class FairGate:
    """`enter` a ticket for a peer; it begins at once while under the total, else in its peer's
    turn; `leave` when its answer is ready. `total(in_flight)` is the in-flight total in force."""

    def __init__(self, total: Callable[[int], int]) -> None:
        self._total = total
        self._lines: OrderedDict[str, deque[Ticket]] = OrderedDict()  # peers in turn order
        self.in_flight = 0  # samples let through and not answered yet
        self.waiting = 0  # tickets waiting in the lines

    def enter(self, peer: str, ticket: Ticket, begin: Callable[[], asyncio.Task[object]]) -> None:
        ticket.begin = begin
        line = self._lines.get(peer)
        if line is None:
            line = self._lines[peer] = deque()
        line.append(ticket)
        self.waiting += 1
        self._let_through()

    def leave(self, ticket: Ticket) -> None:
        self.in_flight -= ticket.size
        self._let_through()

    def cancel(self, ticket: Ticket) -> None:
        """Its client went away: a waiting ticket is skipped, a running one's task cancelled."""
        ticket.cancelled = True
        if ticket.task is not None:
            ticket.task.cancel()

    def _let_through(self) -> None:
        """The heads of the lines, a peer at a time, while under the total (always one when none
        is in flight: a request larger than the total still goes on, alone)."""
        lines = self._lines
        while lines:
            peer, line = next(iter(lines.items()))
            ticket = line[0]
            if (
                not ticket.cancelled
                and self.in_flight
                and self.in_flight + ticket.size > self._total(self.in_flight)
            ):
                return
            line.popleft()
            self.waiting -= 1
            if line:
                lines.move_to_end(peer)
            else:
                del lines[peer]
            if ticket.cancelled:
                continue
            self.in_flight += ticket.size
            assert ticket.begin is not None
            ticket.task = ticket.begin()
