"""Profiling that talks: an estimate before the first cell, then progress with an ETA.

A profile runs (warm-up + repeats) x exits x batch sizes; on a 60 ms model that is minutes, and
a silent terminal for minutes reads as a hang. So, before measuring, one run of the deepest exit
at batch 1 and at the largest batch gives an estimate of the whole (an upper bound: earlier exits
are cheaper), printed with the flags that shorten it when it is long; then each finished cell
updates a progress bar with the time per cell and the ETA under a terminal, or, in a log (not a
terminal), a plain line every PLAIN_EVERY_S seconds.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

from edgeserve.manifest import Manifest
from edgeserve.runtime.backends.base import Backend
from edgeserve.runtime.validation import Feeds

SLOW_S = 60.0  # an estimate above this prints the flags that shorten it (a person waits, unsure)
# Without a terminal (a log, CI): one progress line this often (and at the end): a long profile
# writes a few lines a minute, and a silence past 10 s is one.
PLAIN_EVERY_S = 10.0
BAR_WIDTH = 24


def duration(seconds: float) -> str:
    """`42 s`, `7 min 5 s`, `1 h 12 min`."""
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        minutes, rest = divmod(round(seconds), 60)
        return f"{minutes} min {rest} s" if rest else f"{minutes} min"
    hours, rest = divmod(round(seconds) // 60, 60)
    return f"{hours} h {rest} min"


@dataclass(frozen=True)
class Estimate:
    """One run of the deepest exit at batch 1 and at the largest batch, and what they predict."""

    exits: int
    largest: int
    warmup: int
    repeats: int
    first_ms: float  # deepest exit, batch 1
    last_ms: float  # deepest exit, the largest batch

    def run_ms(self, batch: int) -> float:
        """One run at `batch`, straight between the two measured points."""
        if self.largest <= 1:
            return self.first_ms
        return self.first_ms + (self.last_ms - self.first_ms) * (batch - 1) / (self.largest - 1)

    def seconds(self, *, largest: int | None = None, repeats: int | None = None) -> float:
        """The whole profile's time (upper bound), or with another --max-batch / --repeats."""
        largest = self.largest if largest is None else min(largest, self.largest)
        runs = self.warmup + (self.repeats if repeats is None else repeats)
        return self.exits * runs * sum(self.run_ms(b) for b in range(1, largest + 1)) / 1000.0

    def line(self, model: str) -> str:
        """The first line: the estimate, and for a slow model the flags that shorten it."""
        total = self.seconds()
        text = (
            f"{model}: about {duration(total)} at most (one run of its deepest exit takes "
            f"{self.first_ms:.1f} ms at batch 1"
            + (f", {self.last_ms:.1f} ms at batch {self.largest}" if self.largest > 1 else "")
            + f"; {self.exits} exits x batch 1..{self.largest} x {self.warmup}+{self.repeats} runs)"
        )
        if total < SLOW_S:
            return text
        shorter = []
        batch = min(self.largest, 4)
        if batch < self.largest:
            shorter.append(f"--max-batch {batch} (about {duration(self.seconds(largest=batch))})")
        repeats = min(self.repeats, 20)
        if repeats < self.repeats:
            shorter.append(f"--repeats {repeats} (about {duration(self.seconds(repeats=repeats))})")
        if shorter:
            text += "; shorten it with " + " or ".join(shorter)
            text += ", at the cost of a smaller batch ceiling or a noisier table"
        return text


def estimate(
    backend: Backend,
    manifest: Manifest,
    inputs: dict[str, object],
    largest: int,
    warmup: int,
    repeats: int,
) -> Estimate:
    """Time one run of the deepest exit at batch 1 and at `largest` (after one untimed run each,
    which pays the first-run costs the warm-up pays in the profile)."""
    deepest = len(manifest.exits) - 1

    def once(batch: int) -> float:
        rows = {name: value[:batch] for name, value in inputs.items()}  # type: ignore[index]
        x: Feeds = rows if len(rows) > 1 else next(iter(rows.values()))  # type: ignore[assignment]
        backend.run(manifest.name, deepest, x)
        start = time.perf_counter()
        backend.run(manifest.name, deepest, x)
        return (time.perf_counter() - start) * 1000.0

    first = once(1)
    last = once(largest) if largest > 1 else first
    return Estimate(len(manifest.exits), largest, warmup, repeats, first, last)


class Progress:
    """Cells done of `total`: a bar with time per cell and ETA on a terminal, else a plain line
    every `every_s` seconds and at the end (the CLI's `on_cell`)."""

    def __init__(
        self,
        model: str,
        total: int,
        stream: TextIO | None = None,
        *,
        terminal: bool | None = None,
        every_s: float = PLAIN_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.model = model
        self.total = max(1, total)
        self.stream = sys.stderr if stream is None else stream
        self.terminal = self.stream.isatty() if terminal is None else terminal
        self.every_s = every_s
        self.clock = clock
        self.start = clock()
        self.done = 0
        self._last_line = self.start

    def text(self) -> str:
        elapsed = self.clock() - self.start
        per_cell = elapsed / self.done if self.done else 0.0
        eta = per_cell * (self.total - self.done)
        head = f"{self.model}: {self.done}/{self.total} cells"
        tail = f"{per_cell:.1f} s/cell, {duration(elapsed)} elapsed, ETA {duration(eta)}"
        if self.terminal:
            filled = BAR_WIDTH * self.done // self.total
            return f"{head} [{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {tail}"
        return f"{head} ({100 * self.done // self.total}%), {tail}"

    def update(self, exit: int = 0, batch: int = 0) -> None:
        self.done += 1
        now = self.clock()
        if self.terminal:
            self.stream.write("\r\x1b[K" + self.text())
            self.stream.flush()
        elif now - self._last_line >= self.every_s or self.done == self.total:
            self._last_line = now
            print(self.text(), file=self.stream, flush=True)

    def close(self) -> None:
        if self.terminal:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
