"""What a camera stream reports: one JSON line per answered frame, and per-stream counters.

Ages (capture to answer) go into a log-spaced histogram, so a camera running for months keeps
P50/P99 in constant memory; the periodic summary reads a second histogram reset every period.
"""

from __future__ import annotations

import json
import math
import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import IO, Any

import numpy as np

BINS_PER_DECADE = 50
MIN_MS = 0.01
DECADES = 8  # 0.01 ms .. 1e6 ms (~17 min)


@dataclass
class AgeHistogram:
    """Counts of ages in ms, log-spaced (relative error ~2.3% per bin)."""

    counts: np.ndarray = field(
        default_factory=lambda: np.zeros(BINS_PER_DECADE * DECADES + 2, dtype=np.int64)
    )

    def add(self, ms: float) -> None:
        if ms <= MIN_MS:
            k = 0
        else:
            k = min(int(math.log10(ms / MIN_MS) * BINS_PER_DECADE) + 1, len(self.counts) - 1)
        self.counts[k] += 1

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    def quantile(self, q: float) -> float | None:
        """The upper edge of the bin holding the q-quantile (ms); None when empty."""
        total = self.total
        if total == 0:
            return None
        k = int(np.searchsorted(np.cumsum(self.counts), q * total, side="left"))
        return MIN_MS * 10 ** (k / BINS_PER_DECADE)

    def reset(self) -> None:
        self.counts[:] = 0


@dataclass
class StreamStats:
    """One stream's counters since start (`*_period` since the last summary)."""

    name: str
    frames_in: int = 0
    sent: int = 0
    dropped: int = 0  # replaced by a newer frame before it could be sent (latest-frame)
    answered: Counter[str] = field(default_factory=Counter)  # by status
    late: int = 0  # ok, but after the deadline
    lost: int = 0  # in flight when the server connection dropped
    ages: AgeHistogram = field(default_factory=AgeHistogram)
    period_ages: AgeHistogram = field(default_factory=AgeHistogram)
    period_in: int = 0
    period_answered: int = 0
    period_dropped: int = 0
    period_late: int = 0

    def frame_in(self) -> None:
        self.frames_in += 1
        self.period_in += 1

    def drop(self) -> None:
        self.dropped += 1
        self.period_dropped += 1

    def answer(self, status: str, late: bool, age_ms: float) -> None:
        self.answered[status] += 1
        self.period_answered += 1
        if late:
            self.late += 1
            self.period_late += 1
        if status == "ok":
            self.ages.add(age_ms)
            self.period_ages.add(age_ms)

    def summary(self, seconds: float, *, final: bool = False) -> dict[str, Any]:
        """Key/values for the one-line summary; `final` covers the whole run, else the period."""
        if final:
            fields = {
                "frames_in": self.frames_in,
                "sent": self.sent,
                "answered": sum(self.answered.values()),
                "ok": self.answered.get("ok", 0),
                "dropped_at_source": self.dropped,
                "late": self.late,
                "lost": self.lost,
            }
            other = {k: v for k, v in self.answered.items() if k != "ok"}
            fields.update(other)
            ages = self.ages
        else:
            per_s = max(seconds, 1e-9)
            fields = {
                "fps_in": round(self.period_in / per_s, 1),
                "fps_answered": round(self.period_answered / per_s, 1),
                "dropped_at_source": self.period_dropped,
                "late": self.period_late,
            }
            ages = self.period_ages
        p50, p99 = ages.quantile(0.5), ages.quantile(0.99)
        fields["age_p50_ms"] = None if p50 is None else round(p50, 2)
        fields["age_p99_ms"] = None if p99 is None else round(p99, 2)
        return {"source": self.name, **fields}

    def reset_period(self) -> None:
        self.period_in = self.period_answered = self.period_dropped = self.period_late = 0
        self.period_ages.reset()


def answer_record(
    source: str,
    frame_index: int,
    pos: int,
    capture_ts: float,
    answer_ts: float,
    reply: Any,
    *,
    full: bool = False,
) -> dict[str, Any]:
    """One JSON line: which frame, when, the status, the exit and the output (top-1 or in full)."""
    record: dict[str, Any] = {
        "source": source,
        "frame": frame_index,
        "pos": pos,
        "capture_ts": round(capture_ts, 6),
        "answer_ts": round(answer_ts, 6),
        "age_ms": round((answer_ts - capture_ts) * 1000.0, 3),
        "status": reply.status,
        "late": bool(reply.late),
        "exit": reply.exit_name,
    }
    output = reply.output
    if reply.ok and output is not None:
        flat = np.asarray(output).reshape(-1)
        top = int(flat.argmax())
        record["class"] = top
        record["score"] = round(float(flat[top]), 4)
        if full:
            record["output"] = np.asarray(output).tolist()
    if reply.error:
        record["error"] = reply.error
    return record


class JsonLines:
    """Writes records as JSON lines to a file or stdout ("-"), one flush per line."""

    def __init__(self, path: str | None) -> None:
        self._own = path not in (None, "-")
        self._stream: IO[str] = open(path, "a", encoding="utf-8") if self._own else sys.stdout  # noqa: SIM115

    def write(self, record: dict[str, Any]) -> None:
        try:
            self._stream.write(json.dumps(record, separators=(",", ":")) + "\n")
            self._stream.flush()
        except BrokenPipeError:  # `| head`: the reader left; keep serving quietly
            pass

    def close(self) -> None:
        if self._own:
            self._stream.close()
