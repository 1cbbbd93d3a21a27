"""The task book: the one place that makes "exactly one answer per task" true."""

from __future__ import annotations

import asyncio
import math

import numpy as np

from edgeserve.runtime.tasks import TaskBook


def _book_with(n: int, loop: asyncio.AbstractEventLoop) -> tuple[TaskBook, list]:
    book = TaskBook(models=2)
    tasks = [
        book.add(0, np.zeros(1, np.float32), loop.create_future(), now=float(i), budget=1.0) for i in range(n)
    ]
    return book, tasks


def test_a_task_is_answered_once_and_then_forgotten() -> None:
    loop = asyncio.new_event_loop()
    try:
        book, (task,) = _book_with(1, loop)
        assert [t.id for t in book.pop(0, 1, now=5.0)] == [task.id] and task.dispatch == 5.0
        assert book.answer(task) is True
        assert book.answer(task) is False
        assert task.id not in book.open
    finally:
        loop.close()


def test_requeued_tasks_return_by_arrival_with_their_deadlines_unless_answered_or_closed() -> None:
    loop = asyncio.new_event_loop()
    try:
        book, tasks = _book_with(4, loop)
        sent = book.take(0, [tasks[0].id, tasks[2].id], now=9.0)
        assert [t.id for t in sent] == [tasks[0].id, tasks[2].id]
        book.answer(tasks[2])  # answered meanwhile (e.g. at shutdown): stays out
        back = book.requeue(sent)
        assert back == [tasks[0]] and math.isnan(tasks[0].dispatch)
        queue = book.queues[0]
        assert queue.ids.tolist() == [tasks[0].id, tasks[1].id, tasks[3].id]
        assert queue.deadlines.tolist() == [t.deadline for t in (tasks[0], tasks[1], tasks[3])]
        book.closed = True
        assert book.requeue(book.take(0, [tasks[1].id], now=10.0)) == []
    finally:
        loop.close()


def test_only_a_queued_task_can_be_withdrawn() -> None:
    loop = asyncio.new_event_loop()
    try:
        book, tasks = _book_with(2, loop)
        (running,) = book.pop(0, 1, now=1.0)
        assert book.withdraw(running) is False and running.id in book.open
        assert book.withdraw(tasks[1]) is True
        assert tasks[1].id not in book.open and len(book.queues[0]) == 0
    finally:
        loop.close()


def test_a_task_read_before_the_newest_queued_one_takes_its_place_by_age_with_its_deadline() -> None:
    loop = asyncio.new_event_loop()
    try:
        book = TaskBook(models=1)
        x = np.zeros(1, np.float32)
        first = book.add(0, x, loop.create_future(), now=10.0, budget=1.0, arrival=9.9)
        second = book.add(0, x, loop.create_future(), now=10.1, budget=1.0, arrival=10.05)
        late_read = book.add(0, x, loop.create_future(), now=10.2, budget=1.0, arrival=10.0)
        queue = book.queues[0]
        assert queue.ids.tolist() == [first.id, late_read.id, second.id]  # FIFO by age
        assert queue.arrivals.tolist() == [9.9, 10.0, 10.05]
        assert late_read.deadline == 11.0 and late_read.queued == 10.2
        assert queue.uniform_budget == 1.0  # one budget: the policy's fast scoring applies
    finally:
        loop.close()
