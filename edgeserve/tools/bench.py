"""A load generator: Poisson arrivals per model, one connection per model over the socket, or
pooled HTTP connections to any Open Inference Protocol server (edgeserve.tools.oip_target).

Every request sent is counted exactly once: answered (by status), or still unanswered after the
drain timeout at the end. Requests sent during the warm-up are answered but not counted.
Latency is measured on the client (send to answer); a deadline violation is an `ok` answer the
server marked late, or `expired`, or `rejected`, over all answered requests. An `ok` answer that
the server finished in time but that reached the client past its deadline (a client that cannot
send at the rate asked: its requests wait for a pooled connection) is not a violation; the report
says how many there were when they are more than 1 %.
"""

from __future__ import annotations

import asyncio
import csv
import math
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from edgeserve.errors import EdgeServeError
from edgeserve.wire.client import AsyncClient, unknown_served_model

PAPER_RATIOS = (3.0, 2.0, 1.0)
CLIENT_LATE_SHARE = 0.01  # above this share of `ok` answers late at the client only, the report says so
INPUT_POOL = 16


class Answer(Protocol):
    """What the bench reads from an answer (the socket's Reply, edgeserve.tools.oip_target.Answer)."""

    status: str
    exit_name: str | None
    expected_accuracy: float | None
    late: bool


class Target(Protocol):
    """One protocol's client: the served models' input specs and a send that resolves to an Answer."""

    @property
    def models(self) -> dict[str, Any]: ...

    def send(self, model: str, x: np.ndarray, *, deadline_ms: float | None = None) -> asyncio.Future[Any]: ...

    async def close(self) -> None: ...


async def connect_target(settings: BenchSettings, models: list[str] | None = None) -> Target:
    """http(s):// -> an Open Inference Protocol target; unix:// or tcp:// -> edgeserve's socket."""
    if settings.target.startswith(("http://", "https://")):
        from edgeserve.tools.oip_target import OipTarget

        return await OipTarget.connect(settings.target, models, binary=settings.binary)
    return await AsyncClient.connect(settings.target, token=settings.token)


@dataclass(frozen=True)
class BenchSettings:
    target: str  # unix:///path, tcp://host:port or http://host:port (Open Inference Protocol)
    rates: dict[str, float]  # requests/s per model; empty: derived from ratios and total_rate
    duration_s: float = 10.0
    warmup_s: float = 1.0
    token: str | None = None
    deadline_ms: float | None = None  # None: each model's SLO
    drain_timeout_s: float = 5.0
    seed: int = 0
    binary: bool = True  # http targets: the binary tensor extension (False: JSON tensors)


@dataclass
class Record:
    """One request sent after the warm-up."""

    model: str
    sent: float  # seconds since the measured phase began
    latency_ms: float = math.nan
    status: str = "unanswered"
    exit_name: str | None = None
    expected_accuracy: float | None = None
    late: bool = False

    @property
    def violation(self) -> bool:
        return self.status in ("expired", "rejected") or (self.status == "ok" and self.late)


@dataclass
class BenchResult:
    settings: BenchSettings
    rates: dict[str, float]
    records: list[Record] = field(default_factory=list)
    elapsed_s: float = 0.0
    slo_ms: dict[str, float] = field(default_factory=dict)  # per model: its deadline budget


def split_rate(models: list[str], ratios: tuple[float, ...], total_rate: float) -> dict[str, float]:
    """Per-model rates in the given ratios (paper default 3:2:1) summing to total_rate."""
    if len(ratios) != len(models):
        raise EdgeServeError(
            f"--ratios has {len(ratios)} values for {len(models)} models ({', '.join(models)})"
        )
    if any(r < 0 for r in ratios) or sum(ratios) <= 0:
        raise EdgeServeError(f"--ratios must be non-negative with a positive sum, got {ratios}")
    return {m: total_rate * r / sum(ratios) for m, r in zip(models, ratios, strict=True)}


def default_ratios(n: int) -> tuple[float, ...]:
    return PAPER_RATIOS if n == 3 else (1.0,) * n


def synthetic_inputs(spec: dict[str, Any], count: int, rng: np.random.Generator) -> list[Any]:
    """`count` random samples for a model as the hello reply describes it (`spec`): an array for a
    model with one input, else a map from input name to array. Floats are standard normal, bools
    random, integers small (0..255): a model that needs particular values (a sample rate) needs
    real inputs instead."""
    tensors = spec.get("inputs") or {"x": spec["input"]}

    def one(entry: dict[str, Any]) -> np.ndarray:
        shape, dtype = tuple(entry["shape"]), np.dtype(entry["dtype"])
        if dtype.kind == "f":
            return rng.standard_normal(shape).astype(dtype)
        if dtype.kind == "b":
            return rng.integers(0, 2, size=shape).astype(bool)
        return rng.integers(0, 255, size=shape).astype(dtype)

    if len(tensors) == 1:
        return [one(next(iter(tensors.values()))) for _ in range(count)]
    return [{name: one(entry) for name, entry in tensors.items()} for _ in range(count)]


def _inputs(spec: dict[str, Any], rng: np.random.Generator) -> list[Any]:
    return synthetic_inputs(spec, INPUT_POOL, rng)


async def run_bench(
    settings: BenchSettings, on_tick: Callable[[float, int, int], None] | None = None
) -> BenchResult:
    """Drive the server for warm-up + duration; `on_tick(elapsed_s, sent, answered)` ~5 times a second."""
    models = list(settings.rates)
    clients = {m: await connect_target(settings, models) for m in models}
    try:
        table = next(iter(clients.values())).models
        unknown = [m for m in models if m not in table]
        if unknown:
            raise EdgeServeError(unknown_served_model(unknown[0], list(table), settings.target))
        result = BenchResult(settings, dict(settings.rates))
        for m in models:
            slo = settings.deadline_ms if settings.deadline_ms is not None else table[m].get("slo_ms")
            if isinstance(slo, int | float):
                result.slo_ms[m] = float(slo)
        rng = np.random.default_rng(settings.seed)
        inputs = {m: _inputs(table[m], rng) for m in models}
        pending: set[asyncio.Future[Any]] = set()
        start = time.monotonic()
        measured_from = start + settings.warmup_s
        end = measured_from + settings.duration_s
        counts = {"sent": 0, "answered": 0}

        def record_reply(record: Record | None, future: asyncio.Future[Any], sent_at: float) -> None:
            pending.discard(future)
            counts["answered"] += record is not None
            if record is None or future.cancelled() or future.exception() is not None:
                return
            reply: Answer = future.result()
            record.latency_ms = (time.monotonic() - sent_at) * 1000.0
            record.status = reply.status
            record.exit_name = reply.exit_name
            record.expected_accuracy = reply.expected_accuracy
            record.late = reply.late

        async def arrivals(model: str, rate: float, seed: int) -> None:
            if rate <= 0:
                return
            draw = random.Random(seed)
            client, pool = clients[model], inputs[model]
            due = time.monotonic() + draw.expovariate(rate)
            while due < end:
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                now = time.monotonic()
                record = None
                if now >= measured_from:
                    record = Record(model, now - measured_from)
                    result.records.append(record)
                    counts["sent"] += 1
                future = client.send(model, pool[draw.randrange(len(pool))], deadline_ms=settings.deadline_ms)
                pending.add(future)
                future.add_done_callback(lambda f, r=record, t=now: record_reply(r, f, t))
                due += draw.expovariate(rate)

        async def ticker() -> None:
            while True:
                if on_tick is not None:
                    on_tick(max(0.0, time.monotonic() - measured_from), counts["sent"], counts["answered"])
                await asyncio.sleep(0.2)

        tick = asyncio.ensure_future(ticker())
        try:
            await asyncio.gather(
                *(arrivals(m, r, settings.seed + i) for i, (m, r) in enumerate(settings.rates.items()))
            )
            if pending:
                await asyncio.wait(set(pending), timeout=settings.drain_timeout_s)
        finally:
            tick.cancel()
        # ok/s counts over the sending and, if answers came later, until the last of them: a
        # client that fell behind would otherwise report more than the server answered per second.
        last = max((r.sent + r.latency_ms / 1000.0 for r in result.records if r.latency_ms >= 0), default=0.0)
        result.elapsed_s = max(min(time.monotonic(), end) - measured_from, last)
        return result
    finally:
        for client in clients.values():
            await client.close()


CAPACITY_IN_FLIGHT = 4  # a few, as cameras keep: more measures batch throughput no deadline allows


async def measure_capacity(settings: BenchSettings, in_flight: int = CAPACITY_IN_FLIGHT) -> float:
    """Closed loop: `in_flight` requests always outstanding, models drawn in the ratio of
    settings.rates; the `ok` answers per second over settings.duration_s (after the warm-up).

    This is the most the box serves right now (its cores, what else runs, the backend's threads),
    the number open-loop traffic should be set against: near it every request queues.
    """
    models = list(settings.rates)
    client = await connect_target(settings, models)
    try:
        table = client.models
        unknown = [m for m in models if m not in table]
        if unknown:
            raise EdgeServeError(unknown_served_model(unknown[0], list(table), settings.target))
        rng = np.random.default_rng(settings.seed)
        inputs = {m: _inputs(table[m], rng) for m in models}
        weights = [max(settings.rates[m], 0.0) for m in models]
        if sum(weights) <= 0:
            weights = [1.0] * len(models)
        measured_from = time.monotonic() + settings.warmup_s
        end = measured_from + settings.duration_s
        counted = [0]

        async def loop(k: int) -> None:
            draw = random.Random(settings.seed + k)
            while time.monotonic() < end:
                model = draw.choices(models, weights)[0]
                pool = inputs[model]
                reply = await client.send(
                    model, pool[draw.randrange(len(pool))], deadline_ms=settings.deadline_ms
                )
                if time.monotonic() >= measured_from and reply.status == "ok":
                    counted[0] += 1

        await asyncio.gather(*(loop(k) for k in range(in_flight)))
        return counted[0] / settings.duration_s
    finally:
        await client.close()


@dataclass(frozen=True)
class Summary:
    """One row of the report."""

    name: str
    sent: int
    ok: int
    unanswered: int
    violation_pct: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    throughput: float
    accuracy: float
    exit_mix: str


def _percent(part: int, whole: int) -> str:
    value = 100.0 * part / whole
    return f"{value:.1f}%" if value < 10 else f"{value:.0f}%"


def summarize(name: str, records: list[Record], elapsed_s: float) -> Summary:
    answered = [r for r in records if r.status != "unanswered"]
    ok = [r for r in answered if r.status == "ok"]
    latencies = np.array([r.latency_ms for r in ok]) if ok else np.array([math.nan])
    p50, p95, p99 = (float(np.percentile(latencies, q)) for q in (50, 95, 99))
    exits = Counter(r.exit_name for r in ok)
    mix = " ".join(f"{e}:{_percent(n, len(ok))}" for e, n in sorted(exits.items(), key=lambda kv: str(kv[0])))
    accuracies = [r.expected_accuracy for r in ok if r.expected_accuracy is not None]
    return Summary(
        name=name,
        sent=len(records),
        ok=len(ok),
        unanswered=len(records) - len(answered),
        violation_pct=100.0 * sum(r.violation for r in answered) / len(answered) if answered else math.nan,
        p50_ms=p50,
        p95_ms=p95,
        p99_ms=p99,
        throughput=len(ok) / elapsed_s if elapsed_s > 0 else math.nan,
        accuracy=float(np.mean(accuracies)) if accuracies else math.nan,
        exit_mix=mix or "-",
    )


def summaries(result: BenchResult) -> list[Summary]:
    rows = [summarize(m, [r for r in result.records if r.model == m], result.elapsed_s) for m in result.rates]
    return [*rows, summarize("all", result.records, result.elapsed_s)]


def format_report(result: BenchResult) -> str:
    header = (
        f"{'model':<12} {'sent':>6} {'ok':>6} {'unans':>5} {'viol%':>6} {'p50ms':>7} {'p95ms':>7} "
        f"{'p99ms':>7} {'ok/s':>7} {'acc':>6}  exit mix"
    )
    lines = [header, "-" * len(header)]
    for s in summaries(result):
        lines.append(
            f"{s.name:<12} {s.sent:>6} {s.ok:>6} {s.unanswered:>5} {s.violation_pct:>6.1f} {s.p50_ms:>7.2f} "
            f"{s.p95_ms:>7.2f} {s.p99_ms:>7.2f} {s.throughput:>7.1f} {s.accuracy:>6.3f}  {s.exit_mix}"
        )
    statuses = Counter(r.status for r in result.records)
    lines.append("statuses: " + ", ".join(f"{k} {v}" for k, v in sorted(statuses.items())))
    ok = [r for r in result.records if r.status == "ok" and r.model in result.slo_ms]
    behind = sum(not r.late and r.latency_ms > result.slo_ms[r.model] for r in ok)
    if ok and behind > CLIENT_LATE_SHARE * len(ok):
        lines.append(
            f"client: {behind} of {len(ok)} ok answers ({_percent(behind, len(ok))}) came back past "
            "their deadline though the server had them done in time (viol% does not count them): "
            "the time went in this client (its connection pool, its CPU) or between the processes; "
            + (
                "send less"  # already over a UNIX socket: nothing cheaper to switch to
                if result.settings.target.startswith("unix://")
                else "send less, or over unix://"
            )
        )
    return "\n".join(lines)


def write_csv(result: BenchResult, path: Path) -> None:
    """One row per measured request."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(
            ["model", "sent_s", "status", "latency_ms", "exit", "expected_accuracy", "late", "violation"]
        )
        for r in result.records:
            writer.writerow(
                [
                    r.model,
                    f"{r.sent:.6f}",
                    r.status,
                    f"{r.latency_ms:.4f}",
                    r.exit_name or "",
                    r.expected_accuracy if r.expected_accuracy is not None else "",
                    int(r.late),
                    int(r.violation),
                ]
            )


def write_plot(result: BenchResult, path: Path) -> None:
    """Latency CDF per model (ok answers) with each model's SLO, and the exit mix; needs matplotlib.

    Colours come from edgeserve.plotting, so a model has the same colour here as in the profile plot.
    """
    from edgeserve.plotting import SLO_STYLE, color, pyplot

    plt = pyplot()
    fig, (cdf, mix) = plt.subplots(1, 2, figsize=(11, 4.2))
    for model in result.rates:
        lat = np.sort([r.latency_ms for r in result.records if r.model == model and r.status == "ok"])
        if lat.size:
            cdf.plot(lat, np.arange(1, lat.size + 1) / lat.size, label=model, color=color(model))
        if model in result.slo_ms:
            style = {**SLO_STYLE, "color": color(model)}
            cdf.axvline(result.slo_ms[model], label=f"SLO {model} {result.slo_ms[model]:g} ms", **style)
    cdf.set_xlabel("client latency (ms)")
    cdf.set_ylabel("fraction of ok answers")
    cdf.set_title("latency CDF (dashed: each model's SLO)", fontsize=9)
    cdf.legend(fontsize=7)
    cdf.grid(alpha=0.3)
    exits = sorted({str(r.exit_name) for r in result.records if r.status == "ok"})
    shades = plt.get_cmap("viridis")
    bottom = np.zeros(len(result.rates))
    for i, exit_name in enumerate(exits):
        share = []
        for model in result.rates:
            ok = [r for r in result.records if r.model == model and r.status == "ok"]
            share.append(100.0 * sum(str(r.exit_name) == exit_name for r in ok) / max(1, len(ok)))
        mix.bar(
            list(result.rates),
            share,
            bottom=bottom,
            label=exit_name,
            color=shades(i / max(1, len(exits) - 1)),
        )
        bottom += np.array(share)
    for tick, model in zip(mix.get_xticklabels(), result.rates, strict=False):
        tick.set_color(color(model))
    mix.set_ylabel("exit mix (% of ok answers)")
    mix.set_title("exit taken per model", fontsize=9)
    mix.legend(title="exit", fontsize=7)
    rate = sum(result.rates.values())
    fig.suptitle(
        f"edgeserve bench {result.settings.target}: {rate:g} requests/s for {result.settings.duration_s:g} s",
        fontsize=10,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
