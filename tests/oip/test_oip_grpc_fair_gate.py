"""The gRPC front's gate (oipgrpc/fair_gate.py) on its own: requests go on while under the total,
past it in turns by peer, one request per peer each turn; a cancelled one never begins."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from edgeserve.oipgrpc.fair_gate import FairGate, Ticket


class Recorder:
    """Tickets that begin as tasks that never end by themselves; the names in the order they began."""

    def __init__(self) -> None:
        self.began: list[str] = []
        self.tasks: dict[str, asyncio.Task[object]] = {}

    def begin(self, name: str) -> Callable[[], asyncio.Task[object]]:
        def start() -> asyncio.Task[object]:
            self.began.append(name)
            task: asyncio.Task[object] = asyncio.ensure_future(asyncio.Event().wait())
            self.tasks[name] = task
            return task

        return start


def run(test: Callable[[], object]) -> None:
    async def main() -> None:
        test()
        for task in asyncio.all_tasks():
            if task is not asyncio.current_task():
                task.cancel()

    asyncio.run(main())


def test_under_the_total_every_request_goes_on_at_once() -> None:
    def test() -> None:
        gate, seen = FairGate(lambda in_flight: 4), Recorder()
        for i in range(4):
            gate.enter("a", Ticket(1), seen.begin(f"a{i}"))
        assert seen.began == ["a0", "a1", "a2", "a3"] and gate.in_flight == 4 and gate.waiting == 0

    run(test)


def test_past_the_total_the_peers_take_turns() -> None:
    def test() -> None:
        gate, seen = FairGate(lambda in_flight: 2), Recorder()
        tickets = {}
        for name in ("a0", "a1", "a2", "a3", "a4", "b0", "b1", "c0"):
            tickets[name] = Ticket(1)
            gate.enter(name[0], tickets[name], seen.begin(name))
        assert seen.began == ["a0", "a1"] and gate.waiting == 6
        for name in ("a0", "a1", "a2", "b0", "c0", "a3"):
            gate.leave(tickets[name])
        # a flood's line (a) gets one turn in three beside b and c, not its place in the arrivals
        assert seen.began == ["a0", "a1", "a2", "b0", "c0", "a3", "b1", "a4"]
        assert gate.in_flight == 2 and gate.waiting == 0

    run(test)


def test_a_request_of_several_samples_counts_each_and_alone_may_pass_the_total() -> None:
    def test() -> None:
        gate, seen = FairGate(lambda in_flight: 4), Recorder()
        big, small = Ticket(6), Ticket(1)
        gate.enter("a", big, seen.begin("big"))  # nothing in flight: it goes on, larger than the total
        gate.enter("b", small, seen.begin("small"))
        assert seen.began == ["big"] and gate.in_flight == 6
        gate.leave(big)
        assert seen.began == ["big", "small"] and gate.in_flight == 1

    run(test)


def test_a_cancelled_request_never_begins_and_a_running_one_is_cancelled() -> None:
    def test() -> None:
        gate, seen = FairGate(lambda in_flight: 1), Recorder()
        first, second, third = Ticket(1), Ticket(1), Ticket(1)
        gate.enter("a", first, seen.begin("first"))
        gate.enter("a", second, seen.begin("second"))
        gate.enter("b", third, seen.begin("third"))
        gate.cancel(second)
        gate.cancel(first)
        assert seen.tasks["first"].cancelling()
        gate.leave(first)  # (its task's end)
        assert seen.began == ["first", "third"] and gate.waiting == 0

    run(test)
