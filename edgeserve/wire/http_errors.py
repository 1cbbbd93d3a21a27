"""The HTTP listeners' error answer, `{"error": ...}` as application/json: the Open Inference
Protocol's shape, which the metrics endpoint answers in too (a client of either parses one shape)."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

MAX_ERROR_CHARS = 1024  # an error text longer than this is cut (and says so)
_REASONS = {408: "Request Timeout", 503: "Service Unavailable"}
# aiohttp's HTTPException headers that still apply to the JSON answer (405's Allow, 401's challenge).
KEPT_HEADERS = ("Allow", "WWW-Authenticate", "Retry-After")


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


def http_exception_response(exc: web.HTTPException) -> web.Response:
    """aiohttp's own error (an unknown route's 404, a wrong method's 405, 413) in the JSON shape."""
    kept = {k: exc.headers[k] for k in KEPT_HEADERS if k in exc.headers}
    return error_response(exc.status, exc.text or exc.reason, kept)
