"""What every request gets back: exactly one Result with an explicit status, never a silent drop."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import numpy as np

from edgeserve.errors import EdgeServeError


class Status(str, enum.Enum):
    """How a request ended. Only `ok` carries an output."""

    OK = "ok"
    REJECTED = "rejected"  # the model's queue was full
    EXPIRED = "expired"  # could no longer make its deadline (lazy drop) or dropped by the policy
    ERROR = "error"  # the backend raised while running the batch
    INVALID = "invalid"  # unknown model, wrong dtype or shape; refused before queueing
    SHUTDOWN = "shutdown"  # the server stopped before it could be served

    def __str__(self) -> str:
        return self.value


class RequestFailed(EdgeServeError):
    """Raised by Result.raise_for_status() for any status but `ok`."""

    def __init__(self, result: Result) -> None:
        detail = f": {result.error}" if result.error else ""
        super().__init__(f"request to {result.model!r} ended {result.status.value}{detail}")
        self.result = result


@dataclass(slots=True)
class Result:
    """One request's answer. Times are seconds on time.monotonic(); nan where a stage never happened.

    Treat it as read-only. It is not frozen because a frozen dataclass costs 2-3 us more to build,
    and the server builds one per request on its event loop (docs/runtime.md, "The path under
    overload").

    queued: arrival at the server; dispatch: the scheduler picked its batch; start/end: the batch
    ran on the executor between these. `deadline` is absolute (queued + budget).
    `outputs` holds every output of the exit that ran by name (`output` is the first of them).
    An answer from an upstream (`served_by` names it) has no local start: start is nan, `dispatch`
    is when its batch was sent and `batch_size` the size of that batch.
    """

    status: Status
    model: str
    output: np.ndarray | None = None  # the first of `outputs`: a classifier's logits
    exit_index: int | None = None
    exit_name: str | None = None
    expected_accuracy: float | None = None
    batch_size: int = 0
    queued: float = math.nan
    dispatch: float = math.nan
    start: float = math.nan
    end: float = math.nan
    deadline: float = math.nan
    error: str | None = None
    served_by: str = "local"  # or the name of the upstream that computed `output` (docs/offload.md)
    outputs: dict[str, np.ndarray] | None = None  # every output of the exit that ran, by name

    @property
    def ok(self) -> bool:
        return self.status is Status.OK

    @property
    def refused(self) -> bool:
        """Answered at once, never queued (invalid, rejected, shutdown, or captured too long ago)."""
        return math.isnan(self.deadline)

    @property
    def queue_ms(self) -> float:
        """Arrival to start of its batch on the executor."""
        return (self.start - self.queued) * 1000.0

    @property
    def service_ms(self) -> float:
        """Time its batch spent in the backend."""
        return (self.end - self.start) * 1000.0

    @property
    def total_ms(self) -> float:
        """Arrival to answer (to the end of its batch, or to when it was refused or dropped)."""
        return (self.end - self.queued) * 1000.0

    @property
    def late(self) -> bool:
        """Finished after its deadline (a violation even though the output is there)."""
        return self.end > self.deadline

    def raise_for_status(self) -> Result:
        """This result if `ok`, else RequestFailed carrying it."""
        if self.status is not Status.OK:
            raise RequestFailed(self)
        return self
