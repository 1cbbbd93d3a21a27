"""Structured logging: one line per event, logfmt or JSON, journald-friendly.

    level=info logger=edgeserve.serve event="listening" url=unix:///run/edgeserve/edgeserve.sock

Key=values come from `extra=`: `log.info("listening", extra={"url": url})`. Under journald (its
stream on our stderr, $JOURNAL_STREAM) lines carry no timestamp (the journal adds its own) and
start with the sd-daemon(3) `<N>` priority prefix, so `journalctl -p warning` filters by level.
Every value is escaped onto the line, tracebacks included, so one event is always one line.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from typing import IO, Any

LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("auto", "logfmt", "json")

# syslog priorities (sd-daemon.h SD_ERR .. SD_DEBUG) by logging level
PRIORITIES = {logging.CRITICAL: 2, logging.ERROR: 3, logging.WARNING: 4, logging.INFO: 6, logging.DEBUG: 7}
_STANDARD = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "taskName"}
_BARE = re.compile(r"[A-Za-z0-9_.:/@+\-]+")


def priority(levelno: int) -> int:
    """The syslog priority for a logging level (the nearest one at or above it)."""
    for level in sorted(PRIORITIES, reverse=True):
        if levelno >= level:
            return PRIORITIES[level]
    return PRIORITIES[logging.DEBUG]


def fields(record: logging.LogRecord) -> dict[str, Any]:
    """The event as ordered key/values: level, logger, event, then the record's `extra=` keys."""
    out: dict[str, Any] = {
        "level": record.levelname.lower(),
        "logger": record.name,
        "event": record.getMessage(),
    }
    for key, value in record.__dict__.items():
        if key not in _STANDARD and not key.startswith("_"):
            out[key] = value
    if record.exc_info:
        out["exc"] = logging.Formatter().formatException(record.exc_info)
    return out


def logfmt_value(value: Any) -> str:
    """A logfmt value: bare when it is a simple token, else double-quoted with escapes."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.6g}"
    text = value if isinstance(value, str) else str(value)
    if text and _BARE.fullmatch(text):
        return text
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    return f'"{escaped}"'


def _timestamp(created: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + f".{int(created % 1 * 1000):03d}Z"


class LineFormatter(logging.Formatter):
    """logfmt or JSON, optional timestamp, optional `<N>` priority prefix; never a newline inside."""

    def __init__(
        self, fmt: str = "logfmt", *, timestamps: bool = True, priority_prefix: bool = False
    ) -> None:
        super().__init__()
        if fmt not in ("logfmt", "json"):
            raise ValueError(f"log format must be logfmt or json, got {fmt!r}")
        self.fmt = fmt
        self.timestamps = timestamps
        self.priority_prefix = priority_prefix

    def format(self, record: logging.LogRecord) -> str:
        data = fields(record)
        if self.timestamps:
            data = {"ts": _timestamp(record.created), **data}
        if self.fmt == "json":
            line = json.dumps(data, default=str, separators=(",", ":"))
        else:
            line = " ".join(f"{key}={logfmt_value(value)}" for key, value in data.items())
        return f"<{priority(record.levelno)}>{line}" if self.priority_prefix else line


def under_journald(stream: IO[str], env: dict[str, str] | None = None) -> bool:
    """True when `stream` is the journal's: $JOURNAL_STREAM ("dev:inode") names its file."""
    value = (os.environ if env is None else env).get("JOURNAL_STREAM", "")
    if not value:
        return False
    try:
        dev, ino = (int(part) for part in value.split(":"))
        stat = os.fstat(stream.fileno())
    except (ValueError, OSError, AttributeError):
        return False
    return (stat.st_dev, stat.st_ino) == (dev, ino)


def configure(
    level: str = "info",
    fmt: str = "auto",
    stream: IO[str] | None = None,
    env: dict[str, str] | None = None,
) -> logging.Handler:
    """Route the root logger to one line-per-event handler on `stream` (stderr); returns it.

    fmt "auto" is logfmt. Under journald lines have no timestamp and a priority prefix. Calling
    again (a reload) replaces the handler this function installed, leaving others alone.
    """
    if level not in LOG_LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LOG_LEVELS)}, got {level!r}")
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, got {fmt!r}")
    stream = sys.stderr if stream is None else stream
    journal = under_journald(stream, env)
    handler = logging.StreamHandler(stream)
    handler.set_name("edgeserve")
    handler.setFormatter(
        LineFormatter("json" if fmt == "json" else "logfmt", timestamps=not journal, priority_prefix=journal)
    )
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == "edgeserve"]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    return handler
