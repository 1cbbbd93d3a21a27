"""The Open Inference Protocol's error answer, `{"error": ...}` as application/json, shared by the
front's handlers, its connection protocol (unparsable requests, refusals, timeouts) and decoding."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

MAX_ERROR_CHARS = 1024  # an error text longer than this is cut (and says so)
_REASONS = {408: "Request Timeout", 503: "Service Unavailable"}


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


def _cut(message: str) -> str:
    if len(message) > MAX_ERROR_CHARS:
        return f"{message[:MAX_ERROR_CHARS]}...[cut, {len(message)} chars]"
    return message


def error_response(status: int, message: str, headers: Any = None) -> web.Response:
    """The protocol's error answer: {"error": message}, the message cut to MAX_ERROR_CHARS."""
    return web.json_response({"error": _cut(message)}, status=status, headers=headers)


def raw_error(status: int, message: str, headers: dict[str, str] | None = None) -> bytes:
    """A whole HTTP/1.1 error answer as bytes, closing the connection: what a connection gets
    written straight to its transport when it is refused or timed out, with no request to answer."""
    body = json.dumps({"error": _cut(message)}).encode()
    lines = [
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}",
        "Content-Type: application/json; charset=utf-8",
        f"Content-Length: {len(body)}",
        "Connection: close",
        *(f"{k}: {v}" for k, v in (headers or {}).items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body
