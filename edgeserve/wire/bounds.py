"""Bounds on what a peer can make the server do with a value: print it, or use it as a deadline.

`brief` renders any value in at most about `limit` characters without recursing more than a
few levels or copying more than a slice of a long string, so an error message or log line built
from client input stays small whatever the input is (a 1000-deep list, an 8 MB string, a 4000-digit
int). `timing_problem` is the one check of `deadline_ms` and `capture_ts`, used by the socket
codec (wire/frames.py) and by runtime/budget.request_budget (the embedding API and the HTTP front).
"""

from __future__ import annotations

import itertools
import math
import numbers
from typing import Any

BRIEF_LIMIT = 200  # characters of an offending value quoted in an error message or a log line
ERROR_TEXT_LIMIT = 1000  # characters: no error text sent, or logged, about client input is longer

MIN_DEADLINE_MS = 0.001  # 1 us: a smaller budget cannot be told from 0 by time.monotonic()
MAX_DEADLINE_MS = 86_400_000.0  # 1 day
MAX_CLOCK_SKEW_S = 86_400.0  # capture_ts further than 1 day from the server's clock: a bad clock

_DEPTH = 3  # containers nested deeper are shown as "<list of N items>"
_ITEMS = 8  # items shown per container
_INT_BITS = 128  # larger ints are shown as "<int of N bits>" (repr of a huge int is slow or raises)


def brief(value: object, limit: int = BRIEF_LIMIT) -> str:
    """At most about `limit` characters showing `value`; what is left out is marked "... (cut, ...)"."""
    try:
        text = _brief(value, _DEPTH, limit)
    except Exception:  # a hostile or broken __repr__ (embedding API): say what it is, not more
        text = f"<{type(value).__name__}>"
    return cut(text, max(limit, 40))


def cut(text: str, limit: int = ERROR_TEXT_LIMIT) -> str:
    """`text` if it is at most `limit` UTF-8 bytes, else its head, ASCII-escaped, marked as cut
    ("... (cut, N chars)"): `limit` characters and bytes in all (for limit >= 40)."""
    if len(text) <= limit and len(text.encode("utf-8", "surrogatepass")) <= limit:
        return text
    mark = f"... (cut, {len(text)} chars)"
    head = text[:limit].encode("ascii", "backslashreplace").decode("ascii")
    return head[: max(limit - len(mark), 0)] + mark


def _brief(value: object, depth: int, limit: int) -> str:
    if value is None or isinstance(value, (bool, float)):
        return repr(value)
    if isinstance(value, int):
        bits = value.bit_length()
        return repr(value) if bits <= _INT_BITS else f"<int of {bits} bits>"
    if isinstance(value, str):  # ascii(): a character of the answer is a byte on the wire
        keep = max(limit - 30, 8)  # room for the quotes and the mark
        if len(value) <= keep:
            return ascii(value)
        return f"{value[:keep]!a}... (cut, {len(value)} chars)"
    if isinstance(value, (bytes, bytearray, memoryview)):
        size = len(value)
        head = bytes(value[: max(min((limit - 40) // 4, 32), 1)])  # \xNN: 4 characters a byte
        return repr(head) if size <= len(head) else f"{head!r}... (cut, {size} bytes)"
    if isinstance(value, (list, tuple, set, frozenset, dict)):
        return _container(value, depth, limit)
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if isinstance(shape, tuple) and dtype is not None:  # numpy arrays and friends: never their data
        return f"<{type(value).__name__} {dtype} {list(shape)}>"
    if isinstance(value, numbers.Number):
        return cut(repr(value), limit)
    return f"<{type(value).__name__}>"


def _container(value: Any, depth: int, limit: int) -> str:
    kind, size = type(value).__name__, len(value)
    if depth <= 0:
        return f"<{kind} of {size} items>"
    if isinstance(value, dict):
        parts = [
            f"{_brief(k, depth - 1, limit)}: {_brief(v, depth - 1, limit)}"
            for k, v in itertools.islice(value.items(), _ITEMS)
        ]
        opening, closing = "{", "}"
    else:
        parts = [_brief(v, depth - 1, limit) for v in itertools.islice(value, _ITEMS)]
        opening, closing = {"list": "[]", "tuple": "()"}.get(kind, "{}")
    if size > _ITEMS:
        parts.append(f"... (cut, {size} items)")
    body = ", ".join(parts)
    if kind == "tuple" and size == 1:
        body += ","
    return f"{opening}{body}{closing}"


def real(value: object) -> float | None:
    """`value` as a finite float, or None: not a real number (bools are not), nan, ±inf, or an int
    too large for a float. numpy scalars count as real numbers."""
    if type(value) is float:  # the common case, without the ABC check below (~1 us)
        return value if math.isfinite(value) else None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    try:
        number = float(value)
    except (OverflowError, ValueError, TypeError):
        return None
    return number if math.isfinite(number) else None


def timing_problem(deadline_ms: object, capture_ts: object, now: float) -> str | None:
    """What is wrong with a request's deadline_ms / capture_ts (`now`: time.time()), or None.

    deadline_ms must lie in [MIN_DEADLINE_MS, MAX_DEADLINE_MS]; capture_ts within MAX_CLOCK_SKEW_S
    of `now` (further means the camera's clock is wrong, not that the frame is late). A capture_ts
    in range but older than the SLO is not a problem here: the caller answers it `expired`.
    """
    if deadline_ms is not None and capture_ts is not None:
        return "give deadline_ms or capture_ts, not both"
    if deadline_ms is not None:
        budget = real(deadline_ms)
        if budget is None or not MIN_DEADLINE_MS <= budget <= MAX_DEADLINE_MS:
            return (
                f"deadline_ms must be a positive number of milliseconds from {MIN_DEADLINE_MS:g} (1 us) "
                f"to {MAX_DEADLINE_MS:.0f} (1 day), got {brief(deadline_ms)}"
            )
    if capture_ts is not None:
        captured = real(capture_ts)
        if captured is None or captured <= 0:
            return f"capture_ts must be a Unix time in seconds, got {brief(capture_ts)}"
        age = now - captured
        if abs(age) > MAX_CLOCK_SKEW_S:
            when = "in the past" if age > 0 else "in the future"
            return (
                f"capture_ts is {abs(age):.6g} s {when} (more than {MAX_CLOCK_SKEW_S:.0f} s from the "
                "server's clock); is the camera's clock set?"
            )
    return None
