"""Run metrics as the paper reports them, overall and per model, after warm-up exclusion.

- violation ratio: (finished late + dropped) / (finished + dropped); late means latency > budget;
- P50/P95/P99 end-to-end latency (arrival to completion) of finished tasks;
- throughput: finished tasks completed inside the arrival window per second of that window
  (from the first measured arrival), so draining a backlog after arrivals stop does not count;
- mean accuracy: per-exit accuracy of the exit each finished task used (None without a table);
- exit mix: share of finished tasks per exit name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from edgeserve.scheduler.accuracy import AccuracyTable
from edgeserve.scheduler.simulator import DROPPED, FINISHED, TaskLog


@dataclass(frozen=True)
class Metrics:
    scope: str  # "all" or a model name
    tasks: int
    finished: int
    dropped: int
    late: int
    violation_ratio: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    throughput_rps: float
    mean_accuracy: float | None
    exit_mix: dict[str, float] = field(default_factory=dict)


def summarize(
    log: TaskLog,
    model_names: tuple[str, ...],
    exit_names: tuple[tuple[str, ...], ...],
    accuracy: AccuracyTable | None = None,
    warmup_tasks: int = 0,
) -> list[Metrics]:
    """Metrics overall (first) and per model. `exit_names[m]` are model m's manifest exit names."""
    measured = np.arange(log.arrival.size) >= warmup_tasks
    scopes = [("all", measured)]
    scopes += [(name, measured & (log.model == m)) for m, name in enumerate(model_names)]
    first_arrival = float(log.arrival[measured][0]) if measured.any() else log.horizon_s
    window = max(log.horizon_s - first_arrival, 1e-12)
    out = []
    for scope, mask in scopes:
        finished = mask & (log.state == FINISHED)
        dropped = mask & (log.state == DROPPED)
        latency = log.latency[finished]
        late = int((latency > log.budget[finished]).sum())
        n_fin, n_drop = int(finished.sum()), int(dropped.sum())
        total = n_fin + n_drop
        p50, p95, p99 = (
            (float(v) * 1000.0 for v in np.percentile(latency, [50, 95, 99])) if n_fin else (math.nan,) * 3
        )
        models = log.model[finished].tolist()
        names = [exit_names[m][e] for m, e in zip(models, log.exit[finished].tolist(), strict=True)]
        mix: dict[str, float] = {}
        for name in names:
            mix[name] = mix.get(name, 0) + 1
        mix = {k: v / n_fin for k, v in sorted(mix.items(), key=lambda kv: _exit_order(kv[0], exit_names))}
        acc = None
        if accuracy is not None and n_fin:
            acc = float(np.mean([accuracy.of(model_names[m], n) for m, n in zip(models, names, strict=True)]))
        done_in_window = int((finished & (log.finish <= log.horizon_s)).sum())
        out.append(
            Metrics(
                scope=scope,
                tasks=total,
                finished=n_fin,
                dropped=n_drop,
                late=late,
                violation_ratio=(late + n_drop) / total if total else math.nan,
                p50_ms=p50,
                p95_ms=p95,
                p99_ms=p99,
                throughput_rps=done_in_window / window,
                mean_accuracy=acc,
                exit_mix=mix,
            )
        )
    return out


def _exit_order(name: str, exit_names: tuple[tuple[str, ...], ...]) -> tuple[int, str]:
    """Sort exit names shallow to deep (by their position in the first model that has them)."""
    for names in exit_names:
        if name in names:
            return (names.index(name), name)
    return (len(exit_names), name)
