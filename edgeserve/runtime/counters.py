"""Serving counters the metrics endpoint exports: plain numbers, updated on the event loop only.

The registry is owned by one Server and touched only from its loop thread, so it needs no locks;
`snapshot()` copies it into plain dicts that are safe to hand to another thread or serialise.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

DECISION_RESERVOIR = 4096  # recent decision times kept for p50/p99; memory stays bounded


@dataclass
class Timing:
    """Count and sum of a duration, plus the most recent samples for quantiles."""

    count: int = 0
    total_s: float = 0.0
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=DECISION_RESERVOIR))

    def add(self, seconds: float) -> None:
        self.count += 1
        self.total_s += seconds
        self.recent.append(seconds)

    def snapshot(self) -> dict[str, float]:
        p50, p99 = np.percentile(list(self.recent), [50, 99]) if self.recent else (float("nan"),) * 2
        mean = self.total_s / self.count if self.count else float("nan")
        return {
            "count": self.count,
            "sum_s": self.total_s,
            "mean_us": mean * 1e6,
            "p50_us": float(p50) * 1e6,
            "p99_us": float(p99) * 1e6,
        }


@dataclass
class Counters:
    """Requests by (model, status), queue depth per model, exit mix, violations, timings."""

    requests: Counter[tuple[str, str]] = field(default_factory=Counter)
    cancelled: Counter[str] = field(default_factory=Counter)
    queue_depth: dict[str, int] = field(default_factory=dict)
    exit_mix: Counter[tuple[str, str]] = field(default_factory=Counter)
    violations: Counter[str] = field(default_factory=Counter)
    batches: Counter[str] = field(default_factory=Counter)
    decision: Timing = field(default_factory=Timing)
    busy_s: float = 0.0
    started: float = field(default_factory=time.monotonic)

    def snapshot(self) -> dict[str, Any]:
        """A plain-dict copy: {"requests": {model: {status: n}}, ...}."""
        requests: dict[str, dict[str, int]] = {}
        for (model, status), n in sorted(self.requests.items()):
            requests.setdefault(model, {})[status] = n
        exits: dict[str, dict[str, int]] = {}
        for (model, exit_name), n in sorted(self.exit_mix.items()):
            exits.setdefault(model, {})[exit_name] = n
        wall = time.monotonic() - self.started
        return {
            "requests": requests,
            "cancelled": dict(self.cancelled),
            "queue_depth": dict(self.queue_depth),
            "exit_mix": exits,
            "violations": dict(self.violations),
            "batches": dict(self.batches),
            "decision": self.decision.snapshot(),
            "executor_busy_s": self.busy_s,
            "wall_s": wall,
            "utilisation": self.busy_s / wall if wall > 0 else 0.0,
        }
