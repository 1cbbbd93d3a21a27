"""Sweeps of simulator runs over loads, SLOs, exit subsets, model mixes, traffic kinds and policies.

The load axis is the paper's: `load` is the arrival rate (req/s) of a model with ratio 1; model
i receives ratios[i] * load (the paper: 3:2:1 for ResNet50:101:152, sweeping the ResNet152 rate).
"""

from __future__ import annotations

import csv
import itertools
import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgeserve.errors import EdgeServeError
from edgeserve.profile import ProfileTable
from edgeserve.scheduler.accuracy import AccuracyTable
from edgeserve.scheduler.arrivals import ArrivalTrace, bursty, poisson, replay
from edgeserve.scheduler.latency import LatencyModel
from edgeserve.scheduler.metrics import Metrics, summarize
from edgeserve.scheduler.policies import POLICIES, PolicyOptions, make_policy
from edgeserve.scheduler.service import ServiceTimes
from edgeserve.scheduler.simulator import simulate
from edgeserve.scheduler.urgency import Urgency

TRAFFIC = ("poisson", "bursty", "replay")


@dataclass(frozen=True)
class Mix:
    """Served model instances: `models[i]` is the profile name, `names[i]` the instance name."""

    label: str
    models: tuple[str, ...]

    @property
    def names(self) -> tuple[str, ...]:
        seen: dict[str, int] = {}
        out = []
        for m in self.models:
            seen[m] = seen.get(m, 0) + 1
            out.append(m if seen[m] == 1 else f"{m}#{seen[m]}")
        return tuple(out)

    @classmethod
    def parse(cls, text: str, known: Sequence[str]) -> Mix:
        """'ResNet50+ResNet101+ResNet152' or 'ResNet50*3' (terms joined by '+', 'NAME*COUNT' repeats)."""
        models: list[str] = []
        for term in text.split("+"):
            match = re.fullmatch(r"\s*(.+?)\s*(?:\*\s*(\d+))?\s*", term)
            name, count = (match.group(1), int(match.group(2) or 1)) if match else (term, 1)
            if name not in known:
                raise EdgeServeError(
                    f"model mix {text!r}: no profile for {name!r} (loaded: {', '.join(known)})"
                )
            models += [name] * count
        return cls(text, tuple(models))


@dataclass(frozen=True)
class SweepSpec:
    policies: tuple[str, ...]
    loads: tuple[float, ...]
    mixes: tuple[Mix, ...]
    ratios: tuple[float, ...] | None = None  # per instance of a mix; None: all 1
    slos_ms: tuple[float, ...] = (50.0,)
    exit_sets: tuple[tuple[str, ...] | None, ...] = (None,)  # None: all exits
    traffic: tuple[str, ...] = ("poisson",)
    replay_path: Path | None = None
    duration_s: float = 20.0
    warmup_tasks: int = 100
    seeds: tuple[int, ...] = (0,)
    quantile: str = "p95"
    max_batch: int = 10
    urgency: Urgency = field(default_factory=Urgency)
    service_mode: str = "samples"
    dispatch_overhead_s: float = 0.0  # simulator.simulate's
    burst_peak: float = 3.0
    burst_on_s: float = 0.2

    def runs(self) -> list[tuple[str, Mix, tuple[str, ...] | None, float, float, int, str]]:
        """Every (traffic, mix, exits, slo, load, seed, policy), policies innermost."""
        return list(
            itertools.product(
                self.traffic, self.mixes, self.exit_sets, self.slos_ms, self.loads, self.seeds, self.policies
            )
        )


def ratios_for(spec: SweepSpec, mix: Mix) -> tuple[float, ...]:
    if spec.ratios is None:
        return (1.0,) * len(mix.models)
    if len(spec.ratios) != len(mix.models):
        raise EdgeServeError(
            f"--ratios gives {len(spec.ratios)} numbers but mix {mix.label!r} has {len(mix.models)} models"
        )
    return spec.ratios


def all_final_capacity(
    tables: dict[str, ProfileTable], mix: Mix, ratios: Sequence[float], max_batch: int
) -> float:
    """The load (ratio-1 rate, req/s) at which All-Final saturates the accelerator: each model served
    at its final exit in full batches of `max_batch` at the cells' mean latency."""
    seconds_per_load = 0.0
    for model, ratio in zip(mix.models, ratios, strict=True):
        table = tables[model]
        batch = min(max_batch, table.max_batch)
        final = len(table.exit_names) - 1
        seconds_per_load += ratio * table.latency_ms(final, batch, "mean") / 1000.0 / batch
    return 1.0 / seconds_per_load


def _trace(spec: SweepSpec, traffic: str, mix: Mix, rates: list[float], seed: int) -> ArrivalTrace:
    if traffic == "poisson":
        return poisson(rates, spec.duration_s, seed)
    if traffic == "bursty":
        return bursty(rates, spec.duration_s, seed, spec.burst_peak, spec.burst_on_s)
    if traffic == "replay":
        if spec.replay_path is None:
            raise EdgeServeError("--traffic replay needs --replay FILE (CSV with columns time_s,model)")
        return replay(spec.replay_path, mix.names, spec.duration_s)
    raise EdgeServeError(f"unknown traffic {traffic!r}; choose from {', '.join(TRAFFIC)}")


def run_sweep(
    spec: SweepSpec,
    tables: dict[str, ProfileTable],
    accuracy: AccuracyTable | None,
    source_label: str = "",
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Simulate every run of `spec`; one row per (run, scope) with scope "all" or an instance name."""
    for policy in spec.policies:
        if policy not in POLICIES:
            raise EdgeServeError(f"unknown policy {policy!r}; choose from {', '.join(POLICIES)}")
    runs = spec.runs()
    rows: list[dict[str, Any]] = []
    for traffic, mix, exits, slo_ms, load, seed, policy_name in _progress(runs, progress):
        ordered = [tables[m] for m in mix.models]
        latency = LatencyModel.from_profiles(ordered, spec.quantile, spec.max_batch, exits, mix.names)
        rates = [r * load for r in ratios_for(spec, mix)]
        trace = _trace(spec, traffic, mix, rates, seed)
        policy = make_policy(policy_name, latency, PolicyOptions(urgency=spec.urgency))
        service = ServiceTimes(ordered, spec.service_mode, spec.quantile)
        budgets = [slo_ms / 1000.0] * len(ordered)
        log = simulate(policy, trace, service, budgets, seed, spec.dispatch_overhead_s)
        instance_accuracy = None
        if accuracy is not None:
            instance_accuracy = AccuracyTable(
                accuracy.source, {n: accuracy.by_model[m] for n, m in zip(mix.names, mix.models, strict=True)}
            )
        metrics = summarize(
            log, mix.names, tuple(t.exit_names for t in ordered), instance_accuracy, spec.warmup_tasks
        )
        key = {
            "policy": policy_name,
            "label": POLICIES[policy_name].label,
            "traffic": traffic,
            "mix": mix.label,
            "exits": "+".join(exits) if exits else "all",
            "slo_ms": slo_ms,
            "load_rps": load,
            "total_rate_rps": sum(rates),
            "seed": seed,
        }
        for m in metrics:
            rows.append(
                {**key, **metrics_row(m), "profile": source_label, "accuracy_source": _acc_source(accuracy)}
            )
    return rows


def metrics_row(m: Metrics) -> dict[str, Any]:
    return {
        "scope": m.scope,
        "tasks": m.tasks,
        "finished": m.finished,
        "dropped": m.dropped,
        "late": m.late,
        "violation_pct": round(100.0 * m.violation_ratio, 4),
        "p50_ms": round(m.p50_ms, 3),
        "p95_ms": round(m.p95_ms, 3),
        "p99_ms": round(m.p99_ms, 3),
        "throughput_rps": round(m.throughput_rps, 2),
        "mean_accuracy_pct": None if m.mean_accuracy is None else round(100.0 * m.mean_accuracy, 3),
        "exit_mix": ";".join(f"{k}:{v:.4f}" for k, v in m.exit_mix.items()),
    }


def _acc_source(accuracy: AccuracyTable | None) -> str:
    return accuracy.source if accuracy is not None else "none"


def _progress(runs: list, enabled: bool) -> Iterator:
    if not enabled:
        yield from runs
        return
    from tqdm import tqdm

    yield from tqdm(runs, desc="simulate", unit="run", file=sys.stderr, leave=False)


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def format_table(rows: list[dict[str, Any]], scope: str = "all") -> str:
    """Policy x load table of violation %, P95 ms and mean accuracy %, one block per other setting."""
    selected = [r for r in rows if r["scope"] == scope]
    lines: list[str] = []
    groups = sorted({(r["traffic"], r["mix"], r["exits"], r["slo_ms"]) for r in selected}, key=str)
    for traffic, mix, exits, slo in groups:
        block = [
            r
            for r in selected
            if (r["traffic"], r["mix"], r["exits"], r["slo_ms"]) == (traffic, mix, exits, slo)
        ]
        loads = sorted({r["load_rps"] for r in block})
        policies = list(dict.fromkeys(r["policy"] for r in block))
        lines.append(
            f"\n{traffic} traffic, mix {mix}, exits {exits}, SLO {slo:g} ms"
            "  (cells: violation % / P95 ms / accuracy %)"
        )
        lines.append(f"{'policy':26s}" + "".join(f"{f'load {lo:g}':>22s}" for lo in loads))
        for policy in policies:
            cells = []
            for lo in loads:
                runs = [r for r in block if r["policy"] == policy and r["load_rps"] == lo]
                viol = sum(r["violation_pct"] for r in runs) / len(runs)
                p95 = sum(r["p95_ms"] for r in runs) / len(runs)
                accs = [r["mean_accuracy_pct"] for r in runs if r["mean_accuracy_pct"] is not None]
                acc = f"{sum(accs) / len(accs):5.1f}" if accs else "  -  "
                cells.append(f"{viol:6.2f}/{min(p95, 99999):7.1f}/{acc}")
            lines.append(f"{policy:26s}" + "".join(f"{c:>22s}" for c in cells))
    return "\n".join(lines)
