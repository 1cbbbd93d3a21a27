"""A request the Open Inference Protocol front refuses before queueing; the answer's shape is
wire/http_errors.py's, shared with the metrics endpoint."""

from __future__ import annotations


class OipRequestError(Exception):
    """A request the frontend refuses before queueing: `status` and the {"error": ...} text;
    `close`: the connection is closed after the answer (a client not worth keeping)."""

    def __init__(
        self, status: int, message: str, headers: dict[str, str] | None = None, *, close: bool = False
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers
        self.close = close
