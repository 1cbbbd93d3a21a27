"""ReadGate (net/flow.py) without a socket: reading is paused iff any reason holds, and the
transport hears of it only when the first reason starts and the last one ends."""

from __future__ import annotations

from edgeserve.net.flow import BACKLOG, HOLD, STOP, WRITE, ReadGate


class Transport:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def pause_reading(self) -> None:
        self.calls.append("pause")

    def resume_reading(self) -> None:
        self.calls.append("resume")


def gate() -> tuple[ReadGate, Transport]:
    transport, flow = Transport(), ReadGate()
    flow.attach(transport)
    return flow, transport


def test_reading_resumes_only_when_the_last_reason_ends() -> None:
    flow, transport = gate()
    flow.pause(WRITE)
    flow.pause(BACKLOG)
    flow.pause(HOLD)
    assert transport.calls == ["pause"] and flow.paused
    flow.resume(WRITE)
    flow.resume(HOLD)
    assert transport.calls == ["pause"] and flow.reasons == BACKLOG
    flow.resume(BACKLOG)
    assert transport.calls == ["pause", "resume"] and not flow.paused


def test_a_reason_that_does_not_hold_changes_nothing() -> None:
    flow, transport = gate()
    flow.resume(BACKLOG)  # (every read ends so)
    assert transport.calls == [] and not flow.paused
    flow.pause(STOP)
    flow.pause(STOP)
    flow.resume(WRITE)
    assert transport.calls == ["pause"] and flow.reasons == STOP


def test_a_closed_connection_keeps_its_reasons_and_touches_no_transport() -> None:
    flow, transport = gate()
    flow.pause(WRITE)
    flow.detach()
    flow.pause(BACKLOG)
    flow.resume(WRITE)
    flow.resume(BACKLOG)
    assert transport.calls == ["pause"] and not flow.paused
    unattached = ReadGate()  # before the connection is made
    unattached.pause(HOLD)
    assert unattached.paused and repr(unattached) == "ReadGate(hold)"
