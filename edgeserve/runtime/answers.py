"""Every request's one Result: made from its batch, its refusal or its drop, handed to its front
once (the task book says whether it had one), and counted after its delivery (no answer waits for
the counters)."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import numpy as np

from edgeserve.manifest import Manifest
from edgeserve.runtime.answer_holders import AnswerHolders
from edgeserve.runtime.counters import Counters
from edgeserve.runtime.executor import BatchRun
from edgeserve.runtime.results import Result, Status
from edgeserve.runtime.tasks import Task, TaskBook
from edgeserve.runtime.validation import output_names, outputs_problem

_log = logging.getLogger(__name__)


def deliver(reply: Callable[[Result], object], result: Result) -> None:
    """Hand a Result to its front; a front's fault must not cost the other answers of a batch."""
    try:
        reply(result)
    except Exception:
        _log.exception("a front failed to take the answer of a %r request", result.model)


class Answers:
    """The Server's answers: `manifests` are set as it starts (the exits' names and accuracies);
    `counters` is replaced with the Server's; `lock` is the one the queues share (Pipeline)."""

    def __init__(
        self, book: TaskBook, names: Sequence[str], counters: Counters, lock: AbstractContextManager[Any]
    ) -> None:
        self.book = book
        self.names = tuple(names)
        self.counters = counters
        self.lock = lock
        self.manifests: list[Manifest] = []
        # per model and exit: the names its outputs are answered under (validation.output_names)
        self.output_names: list[list[tuple[str, ...]]] = []
        # The fronts that write the answers handed out together in one write per connection.
        self.holders = AnswerHolders()

    def load(self, manifests: list[Manifest]) -> None:
        """The served models' manifests, in the Server's order."""
        self.manifests = manifests
        self.output_names = [output_names(m) for m in manifests]

    def refuse(self, key: str, status: Status, now: float, error: str, model: str | None = None) -> Result:
        """Answer at once without queueing; counted under `key` (a served model or UNKNOWN_MODEL).
        An `expired` (past its deadline before it could be queued) is a deadline violation too."""
        self.counters.requests[(key, status.value)] += 1
        if status is Status.EXPIRED:
            self.counters.violations[key] += 1
        return Result(status=status, model=key if model is None else model, queued=now, end=now, error=error)

    def result(
        self,
        task: Task,
        status: Status,
        end: float,
        *,
        error: str | None = None,
        outputs: dict[str, np.ndarray] | None = None,
        exit: int | None = None,
        start: float = math.nan,
        batch_size: int = 0,
    ) -> Result:
        manifest = self.manifests[task.model]
        spec = manifest.exits[exit] if exit is not None else None
        return Result(
            status=status,
            model=self.names[task.model],
            output=None if not outputs else next(iter(outputs.values())),
            outputs=outputs,
            exit_index=exit,
            exit_name=spec.name if spec else None,
            expected_accuracy=spec.accuracy if spec else None,
            batch_size=batch_size,
            queued=task.queued,
            dispatch=task.dispatch,
            start=start,
            end=end,
            deadline=task.requested,
            error=error,
        )

    def finish(self, task: Task, result: Result) -> None:
        """Answer a task exactly once and count the answer."""
        if self.deliver(task, result):
            self.count([result])

    def deliver(self, task: Task, result: Result) -> bool:
        """Hand a task its answer unless it had one (later answers, e.g. after shutdown, are
        ignored); whether this one went out."""
        if not self.book.answer(task):
            return False
        deliver(task.reply, result)
        return True

    def batch(self, m: int, exit: int, tasks: list[Task], run: BatchRun) -> None:
        """Answer the tasks of a finished batch (held, for the fronts that write them together),
        then count them."""
        outputs = run.outputs
        error = None if run.error is None else f"{type(run.error).__name__}: {run.error}"
        if error is None:
            error = outputs_problem(outputs, len(tasks))
        ran: dict[str, Any] = {"start": run.start, "batch_size": len(tasks)}
        names = self.output_names[m][exit]
        answered: list[Result] = []
        self.holders.hold()
        try:
            for i, task in enumerate(tasks):
                if error is not None or outputs is None:
                    result = self.result(task, Status.ERROR, run.end, error=error, exit=exit, **ran)
                else:
                    mine = {name: value[i] for name, value in zip(names, outputs.values(), strict=False)}
                    result = self.result(task, Status.OK, run.end, outputs=mine, exit=exit, **ran)
                if self.deliver(task, result):
                    answered.append(result)
        finally:
            self.holders.release()
        self.count(answered)

    def count(self, answered: list[Result]) -> None:
        """The counters of answers that share their status, model, exit and times (one answer, or
        a batch's): each `ok` counter once per batch, not once per answer (the same counts)."""
        counters = self.counters
        if not answered or answered[0].status is not Status.OK:
            for result in answered:
                counters.requests[(result.model, result.status.value)] += 1
                if result.status is Status.EXPIRED:
                    counters.violations[result.model] += 1
            return
        first, n = answered[0], len(answered)
        model, end = first.model, first.end
        counters.requests[(model, Status.OK.value)] += n
        late = sum(result.late for result in answered)
        if late:
            counters.violations[model] += late
        if first.exit_name is not None:
            counters.exit_mix[(model, first.exit_name)] += n
        counters.observe_ok_batch(model, [result.queued for result in answered], first.start, end)
        counters.served[(model, first.served_by)] += n

    def drain(self, status: Status, now: float, error: str) -> None:
        """Empty every queue, answering each task `status`."""
        for m in range(len(self.book.queues)):
            with self.lock:
                tasks = self.book.drain(m)
            for task in tasks:
                self.finish(task, self.result(task, status, now, error=error))
            self.counters.queue_depth[self.names[m]] = 0

    def hopeless(self, now: float, shallowest_s: Sequence[float]) -> list[tuple[Task, Result]]:
        """Lazy drop (holding the lock): the tasks even the shallowest exit at batch 1 cannot save,
        out of their queues, with their `expired` Results (answered by the caller, after the lock)."""
        out: list[tuple[Task, Result]] = []
        for m, queue in enumerate(self.book.queues):
            if not queue:
                continue
            hopeless = queue.deadlines < now + shallowest_s[m]
            if hopeless.any():
                for task in self.book.drop(m, queue.ids[hopeless].copy()):
                    out.append((task, self.result(task, Status.EXPIRED, now, error="cannot meet deadline")))
        return out
