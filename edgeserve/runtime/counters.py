"""Serving counters the metrics endpoint exports: plain numbers, updated on the event loop only.

The registry is owned by one Server and touched only from its loop thread, so it needs no locks;
`snapshot()` copies it into plain dicts that are safe to hand to another thread or serialise.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

DECISION_RESERVOIR = 4096  # recent decision times kept for p50/p99; memory stays bounded

# Histogram upper bounds in seconds. Request buckets span the digits models' sub-millisecond answers
# up to the ResNets' hundreds of milliseconds and a stalled server's seconds; dense around typical
# 5-50 ms SLOs so that histogram_quantile() is precise where deadlines are decided.
LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03,
    0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
# A scheduler decision takes tens of microseconds (docs/runtime.md): microsecond-scale buckets.
DECISION_BUCKETS_S: tuple[float, ...] = (
    5e-6, 1e-5, 2e-5, 3e-5, 5e-5, 7.5e-5, 1e-4, 1.5e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 1e-2,
)  # fmt: skip
# The executor's idle gap while work waited (hand-off, decision, loop latency): tens of us to ms.
IDLE_GAP_BUCKETS_S: tuple[float, ...] = (
    1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 1e-1,
)  # fmt: skip
UTILISATION_WINDOW_S = 10.0  # executor utilisation is also reported over this recent window
UTILISATION_SLOTS = 10  # ... kept as this many per-slot busy totals (1 s each): O(1) memory


@dataclass
class FrontendStats:
    """A front's connection-level counters (the Server counts requests); each front keeps one and
    the metrics endpoint exports it, so it lives here, below both."""

    connections: int = 0
    open_connections: int = 0
    requests: int = 0
    discarded: int = 0  # answers whose client had gone
    protocol_errors: int = 0
    refused_auth: int = 0
    refused_connections: int = 0  # over listen.max_connections(_per_listener): error frame, closed
    timed_out_connections: int = 0  # no hello within hello_timeout_s, or idle for idle_timeout_s
    expired_on_arrival: int = 0
    flood_pauses: int = 0  # a client far past its window left unread while others had room
    process_cpu_seconds: float = 0.0  # CPU time of the front's own process ([listen] front_process)
    read_wait_seconds: float = 0.0  # a request's median wait in its socket before the read (net/read_lag.py)
    by_status: dict[str, int] = field(default_factory=dict)


@dataclass
class Histogram:
    """A Prometheus-style histogram: fixed upper bounds, per-bucket counts, sum and count.

    Memory is one int per bucket whatever the traffic; an observation is one bisect.
    """

    bounds: tuple[float, ...] = LATENCY_BUCKETS_S
    counts: list[int] = field(default_factory=list)  # per bucket, last one is +Inf (not cumulative)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        if list(self.bounds) != sorted(set(self.bounds)):
            raise ValueError(f"histogram bounds must be strictly increasing, got {self.bounds}")
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        """Count `value` in the first bucket whose upper bound is >= value (Prometheus' `le`)."""
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value
        self.count += 1

    def observe_many(self, values: Sequence[float]) -> None:
        """`observe` each value (the same counts and the same sum, added in the same order)."""
        counts, bounds, total = self.counts, self.bounds, self.total
        for value in values:
            counts[bisect_left(bounds, value)] += 1
            total += value
        self.total = total
        self.count += len(values)

    def snapshot(self) -> dict[str, Any]:
        """{"buckets": [[le, cumulative count], ..., [inf, count]], "sum": s, "count": n}."""
        cumulative, running = [], 0
        for bound, n in zip((*self.bounds, math.inf), self.counts, strict=True):
            running += n
            cumulative.append([bound, running])
        return {"buckets": cumulative, "sum": self.total, "count": self.count}


def _histograms(histograms: dict[str, Histogram]) -> dict[str, dict[str, Any]]:
    return {model: h.snapshot() for model, h in sorted(histograms.items())}


@dataclass
class BusyWindow:
    """Executor busy time over the last `window_s`, in `slots` fixed slots (a ring): O(1) memory.

    A batch's busy span is split across the slots it overlaps. `utilisation(now)` covers the
    current (partial) slot and the slots - 1 before it: between window_s - slot and window_s.
    """

    window_s: float = UTILISATION_WINDOW_S
    slots: int = UTILISATION_SLOTS
    started: float = field(default_factory=time.monotonic)
    _busy: list[float] = field(init=False, repr=False)  # busy seconds per slot
    _tag: list[int] = field(init=False, repr=False)  # which slot number each entry holds

    def __post_init__(self) -> None:
        self._busy = [0.0] * self.slots
        self._tag = [-1] * self.slots

    @property
    def slot_s(self) -> float:
        return self.window_s / self.slots

    def add(self, start: float, end: float) -> None:
        slot = self.slot_s
        while end > start:
            k = int(start // slot)
            upto = min(end, (k + 1) * slot)
            i = k % self.slots
            if self._tag[i] != k:
                self._tag[i], self._busy[i] = k, 0.0
            self._busy[i] += upto - start
            start = upto

    def utilisation(self, now: float) -> float:
        slot = self.slot_s
        current = int(now // slot)
        oldest = current - self.slots + 1
        busy = sum(b for b, k in zip(self._busy, self._tag, strict=True) if oldest <= k <= current)
        span = now - max(oldest * slot, self.started)
        return min(1.0, busy / span) if span > 0 else 0.0


@dataclass
class Timing:
    """Count and sum of a duration, plus the most recent samples for quantiles."""

    count: int = 0
    total_s: float = 0.0
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=DECISION_RESERVOIR))
    histogram: Histogram | None = None

    def add(self, seconds: float) -> None:
        self.count += 1
        self.total_s += seconds
        self.recent.append(seconds)
        if self.histogram is not None:
            self.histogram.observe(seconds)

    def snapshot(self) -> dict[str, Any]:
        p50, p99 = np.percentile(list(self.recent), [50, 99]) if self.recent else (float("nan"),) * 2
        mean = self.total_s / self.count if self.count else float("nan")
        snap: dict[str, Any] = {
            "count": self.count,
            "sum_s": self.total_s,
            "mean_us": mean * 1e6,
            "p50_us": float(p50) * 1e6,
            "p99_us": float(p99) * 1e6,
        }
        if self.histogram is not None:
            snap["histogram"] = self.histogram.snapshot()
        return snap


@dataclass
class Counters:
    """Requests by (model, status), queue depth per model, exit mix, violations, latency histograms,
    decision and executor timings."""

    requests: Counter[tuple[str, str]] = field(default_factory=Counter)
    cancelled: Counter[str] = field(default_factory=Counter)
    queue_depth: dict[str, int] = field(default_factory=dict)
    exit_mix: Counter[tuple[str, str]] = field(default_factory=Counter)
    violations: Counter[str] = field(default_factory=Counter)
    batches: Counter[str] = field(default_factory=Counter)
    served: Counter[tuple[str, str]] = field(default_factory=Counter)  # (model, "local" or upstream name)
    decision: Timing = field(default_factory=lambda: Timing(histogram=Histogram(DECISION_BUCKETS_S)))
    busy_s: float = 0.0
    busy_cpu_s: float = 0.0  # CPU time of the thread running the batches, within busy_s
    policy_failures: int = 0  # decisions the configured policy failed to make (the fallback made them)
    batches_ahead: int = 0  # batches the loop decided while the one before still ran (Pipeline.decide_ahead)
    exits_kept_shallower: int = 0  # batches served shallower than the policy chose (budget.deepest_kept)
    batch_overhead_s: float = 0.0  # budget.BatchOverhead: a saturated batch's cycle beyond its profile
    started: float = field(default_factory=time.monotonic)
    # Histograms per served model (keys come from the config's models only, so they stay bounded).
    request_duration: dict[str, Histogram] = field(default_factory=dict)  # `ok` answers: queued -> end
    queue_duration: dict[str, Histogram] = field(default_factory=dict)  # `ok` answers: queued -> start
    compute_duration: dict[str, Histogram] = field(default_factory=dict)  # per batch: start -> end
    compute_request_s: Counter[str] = field(default_factory=Counter)  # per `ok` answer: start -> end, summed
    inferences: Counter[str] = field(default_factory=Counter)  # samples in batches the backend ran
    busy_window: BusyWindow = field(default_factory=BusyWindow)
    idle_gap: Histogram = field(default_factory=lambda: Histogram(IDLE_GAP_BUCKETS_S))
    last_batch_end: float = -math.inf

    def host_cpu_s(self) -> float:
        """The process's CPU seconds outside the backend's batches: its Python (budget.Throughput)."""
        return time.process_time() - self.busy_cpu_s

    def observe_ok(self, model: str, queued: float, start: float, end: float) -> None:
        """An `ok` answer's request, queue and compute durations (time.monotonic() seconds)."""
        self.observe_ok_batch(model, (queued,), start, end)

    def observe_ok_batch(self, model: str, queued: Sequence[float], start: float, end: float) -> None:
        """`observe_ok` for the answers of one batch (one start and end): the same histograms and
        sums, for a fraction of the calls (the loop does this for every served request)."""
        if model not in self.request_duration:
            self.request_duration[model] = Histogram()
            self.queue_duration[model] = Histogram()
        self.request_duration[model].observe_many([end - q for q in queued])
        if not math.isnan(start):  # an answer from elsewhere (offload) has no local start
            self.queue_duration[model].observe_many([start - q for q in queued])
            compute, each = self.compute_request_s[model], end - start
            for _ in queued:  # one addition per answer, as observe_ok adds them
                compute += each
            self.compute_request_s[model] = compute

    def observe_batch(
        self, model: str, start: float, end: float, size: int, ready: float = -math.inf
    ) -> None:
        """A batch the backend ran (whatever its outcome): compute time, samples, busy window, and
        the idle gap: how long the executor stood idle while this batch's first task waited
        (from the later of the previous batch's end and `ready`, that task's arrival)."""
        if self.last_batch_end > -math.inf:
            self.idle_gap.observe(max(0.0, start - max(self.last_batch_end, ready)))
        self.last_batch_end = end
        if model not in self.compute_duration:
            self.compute_duration[model] = Histogram()
        self.compute_duration[model].observe(end - start)
        self.inferences[model] += size
        self.busy_window.add(start, end)

    def snapshot(self) -> dict[str, Any]:
        """A plain-dict copy: {"requests": {model: {status: n}}, ...}."""
        requests: dict[str, dict[str, int]] = {}
        for (model, status), n in sorted(self.requests.items()):
            requests.setdefault(model, {})[status] = n
        exits: dict[str, dict[str, int]] = {}
        for (model, exit_name), n in sorted(self.exit_mix.items()):
            exits.setdefault(model, {})[exit_name] = n
        served: dict[str, dict[str, int]] = {}
        for (model, where), n in sorted(self.served.items()):
            served.setdefault(model, {})[where] = n
        now = time.monotonic()
        wall = now - self.started
        return {
            "requests": requests,
            "cancelled": dict(self.cancelled),
            "queue_depth": dict(self.queue_depth),
            "exit_mix": exits,
            "violations": dict(self.violations),
            "batches": dict(self.batches),
            "policy_failures": self.policy_failures,
            "batches_ahead": self.batches_ahead,
            "served": served,
            "decision": self.decision.snapshot(),
            "executor_busy_s": self.busy_s,
            "executor_busy_cpu_s": self.busy_cpu_s,
            "wall_s": wall,
            "utilisation": self.busy_s / wall if wall > 0 else 0.0,
            "utilisation_recent": self.busy_window.utilisation(now),
            "utilisation_window_s": self.busy_window.window_s,
            "request_duration": _histograms(self.request_duration),
            "queue_duration": _histograms(self.queue_duration),
            "compute_duration": _histograms(self.compute_duration),
            "compute_request_s": dict(self.compute_request_s),
            "inferences": dict(self.inferences),
            "idle_gap": self.idle_gap.snapshot(),
            "idle_gap_share": self.idle_gap.total / self.busy_s if self.busy_s > 0 else 0.0,
            "batch_overhead_s": self.batch_overhead_s,
            "exits_kept_shallower": self.exits_kept_shallower,
        }
