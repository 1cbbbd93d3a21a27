"""Drive the real runtime with the paper's workload and compare it with the simulator's prediction.

Three narrow CIFAR ResNets, Poisson arrivals 3:2:1 (ResNet50:101:152) at fractions of All-Final
capacity, SLO 50 ms, the default policy, ONNX Runtime on the CPU with one thread (the profile's
fingerprint). The same arrival trace goes through `edgeserve.scheduler.simulator` with the same
profile, so the table shows how far the runtime is from what the scheduler's model predicts.
Then the serving overhead: caller-side latency minus backend time at low load, and the
scheduler's time per decision.

    .venv/bin/python benchmarks/runtime_vs_simulator.py                 # ~1.5 min
    .venv/bin/python benchmarks/runtime_vs_simulator.py --loads 0.5 1.0 --duration 5
    .venv/bin/python benchmarks/runtime_vs_simulator.py --json out/runtime_vs_simulator.json

Each load has a third row, `sim-meas`: the simulator again, on the service the runtime's own
batches had in that run: each cell it ran often enough takes their times as its samples, every
other cell is scaled by its model's median of observed / profiled (printed as `measured
service`). On this CPU a batch inside the server runs up to 1.2-1.5x its profile at low load
(ONNX Runtime's `run` itself: `sys.setswitchinterval` 0.2 ms changes nothing, so not the GIL),
about 1.0x near capacity: the three models' weights take turns in the caches, and after an idle
gap a batch runs cold, where the profiler times one cell back to back. That slowdown is
physical, the runtime's scheduler plans with it (online calibration), and the plain simulator
cannot know it; `sim-meas` is the prediction the runtime should match. It also models the
server's own time before each batch (wake-up, decision, hand-off to the executor thread: the
run's median, printed as `dispatch overhead`) as idle accelerator time (`dispatch_overhead_s`).

Accuracy is the EdgeServing authors' per-exit CIFAR-100 table (these manifests carry no measured
accuracy), applied to the exit each finished request used, for runtime and simulator alike.
Missing models or profiles: `edgeserve export --model resnet50 --model resnet101 --model resnet152
--width 0.25` then `edgeserve-profile --threads 1 --repeats 50`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from edgeserve.errors import EdgeServeError
from edgeserve.loop import run
from edgeserve.profile import ProfileCell, ProfileTable
from edgeserve.repository import ModelRepository
from edgeserve.runtime.backends.onnxruntime import OnnxRuntimeBackend
from edgeserve.runtime.results import Result, Status
from edgeserve.runtime.server import Server
from edgeserve.scheduler import DEFAULT_POLICY, LatencyModel, PolicyOptions, make_policy
from edgeserve.scheduler.accuracy import AccuracyTable, paper_accuracy
from edgeserve.scheduler.arrivals import ArrivalTrace, poisson
from edgeserve.scheduler.metrics import summarize
from edgeserve.scheduler.service import ServiceTimes
from edgeserve.scheduler.simulator import simulate

MODELS = ("resnet50-cifar-w0.25", "resnet101-cifar-w0.25", "resnet152-cifar-w0.25")
RATIOS = (3.0, 2.0, 1.0)
MAX_BATCH = 10
WARMUP_TASKS = 100
MEASURED_MIN = 5  # batches of a cell before `sim-meas` takes their times as the cell's samples


@dataclass(frozen=True)
class Row:
    source: str
    load: float
    tasks: int
    violation: float
    p95_ms: float
    accuracy: float | None
    exit_mix: dict[str, float]
    decision_us: tuple[float, float] = (float("nan"), float("nan"))
    dispatch_overhead_us: float = 0.0  # what the simulation assumed (simulate's dispatch_overhead_s)


def capacity(tables: list[Any]) -> float:
    """Ratio-1 rate (req/s) at which All-Final saturates: final exit, full batches, mean latency."""
    seconds = sum(
        r * t.latency_ms(len(t.exit_names) - 1, MAX_BATCH, "mean") / 1000.0 / MAX_BATCH
        for r, t in zip(RATIOS, tables, strict=True)
    )
    return 1.0 / seconds


def config(root: Path, slo_ms: float, late_tasks: str) -> dict[str, Any]:
    return {
        "repository": str(root),
        "backend": {"name": "onnxruntime", "threads": 1, "warmup": 3},
        "scheduler": {"policy": DEFAULT_POLICY, "max_batch": MAX_BATCH, "late_tasks": late_tasks},
        "models": {m: {"slo_ms": slo_ms, "max_queue": 1024} for m in MODELS},
    }


async def drive(server: Server, trace: ArrivalTrace, inputs: list[np.ndarray]) -> list[Result]:
    """Fire each request at its trace time (open loop) and collect every Result in trace order."""
    times, models = trace.times.tolist(), trace.models.tolist()
    tasks = []
    t0 = time.monotonic()
    for i, (t, m) in enumerate(zip(times, models, strict=True)):
        delay = t0 + t - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(server.infer(MODELS[m], inputs[m][i % len(inputs[m])])))
    return list(await asyncio.gather(*tasks))


def runtime_row(load: float, results: list[Result], accuracy: AccuracyTable, snap: dict[str, Any]) -> Row:
    measured = results[WARMUP_TASKS:]
    ok = [r for r in measured if r.status is Status.OK]
    violations = sum(1 for r in measured if r.status is not Status.OK or r.late)
    mix: dict[str, float] = {}
    for r in ok:
        mix[r.exit_name or "?"] = mix.get(r.exit_name or "?", 0.0) + 1.0 / len(ok)
    acc = float(np.mean([accuracy.of(r.model, r.exit_name or "") for r in ok])) if ok else None
    decision = snap["decision"]
    return Row(
        "runtime",
        load,
        len(measured),
        violations / max(len(measured), 1),
        float(np.percentile([r.total_ms for r in ok], 95)) if ok else float("nan"),
        acc,
        mix,
        (decision["p50_us"], decision["p99_us"]),
    )


Batches = dict[tuple[int, float, float], tuple[int, int, float]]


def ran_batches(results: list[Result]) -> Batches:
    """The batches the runtime ran, by (model index, start, end): exit index, batch size and the
    arrival of its earliest task (a batch's tasks share its start and end)."""
    batches: Batches = {}
    for r in results:
        if r.status is Status.OK and r.exit_index is not None and r.batch_size:
            key = (MODELS.index(r.model), r.start, r.end)
            ready = batches[key][2] if key in batches else r.queued
            batches[key] = (r.exit_index, r.batch_size, min(ready, r.queued))
    return batches


def measured_profiles(batches: Batches, tables: list[ProfileTable]) -> tuple[list[ProfileTable], list[float]]:
    """The profiles as the runtime's batches ran in this run: a cell it ran at least
    MEASURED_MIN times takes those times as its samples; every other cell is scaled by its
    model's median of observed / profiled (the cell's median), returned too (1.0 for a model
    that ran no batch). A batch's tasks share its start and end."""
    observed: list[dict[tuple[int, int], list[float]]] = [{} for _ in tables]
    for (m, start, end), (exit_index, size, _) in batches.items():
        observed[m].setdefault((exit_index, size), []).append((end - start) * 1000.0)
    out, slowdown = [], []
    for table, cells in zip(tables, observed, strict=True):
        ratios = [ms / table.latency_ms(e, b, "p50") for (e, b), times in cells.items() for ms in times]
        factor = float(np.median(ratios)) if ratios else 1.0
        measured = {}
        for key, cell in table.cells.items():
            times = cells.get(key, [])
            samples = times if len(times) >= MEASURED_MIN else np.asarray(cell.samples_ms) * factor
            measured[key] = ProfileCell.from_samples(cell.exit, cell.batch, samples)
        out.append(replace(table, cells=measured))
        slowdown.append(factor)
    return out, slowdown


def dispatch_overhead(batches: Batches) -> float:
    """Median seconds the executor stood idle before a batch while its first task waited: the
    runtime's per-batch wake-up, decision and hand-off (the simulator's `dispatch_overhead_s`)."""
    gaps, prev_end = [], -np.inf
    for start, end, ready in sorted(
        (start, end, ready) for (_, start, end), (_, _, ready) in batches.items()
    ):
        if prev_end > -np.inf:
            gaps.append(max(0.0, start - max(prev_end, ready)))
        prev_end = end
    return float(np.median(gaps)) if gaps else 0.0


def simulator_row(
    load: float,
    trace: ArrivalTrace,
    tables: list[Any],
    slo_ms: float,
    acc: AccuracyTable,
    source: str = "simulator",
    overhead_s: float = 0.0,
) -> Row:
    latency = LatencyModel.from_profiles(tables, "p95", MAX_BATCH)
    policy = make_policy(DEFAULT_POLICY, latency, PolicyOptions())
    log = simulate(
        policy, trace, ServiceTimes(tables), [slo_ms / 1000.0] * len(tables), dispatch_overhead_s=overhead_s
    )
    exit_names = tuple(tuple(t.exit_names) for t in tables)
    overall = summarize(log, MODELS, exit_names, acc, WARMUP_TASKS)[0]
    return Row(
        source,
        load,
        overall.tasks,
        overall.violation_ratio,
        overall.p95_ms,
        overall.mean_accuracy,
        dict(overall.exit_mix),
        dispatch_overhead_us=overhead_s * 1e6,
    )


def format_rows(rows: list[Row]) -> str:
    exits = ("layer1", "layer2", "layer3", "final")
    head = f"{'load':>5} {'source':<9} {'tasks':>6} {'viol %':>7} {'P95 ms':>7} {'acc %':>6}  "
    head += " ".join(f"{e:>6}" for e in exits) + f"  {'decide p50/p99 us':>17}"
    lines = [head, "-" * len(head)]
    for r in rows:
        acc = f"{100 * r.accuracy:6.1f}" if r.accuracy is not None else f"{'-':>6}"
        mix = " ".join(f"{100 * r.exit_mix.get(e, 0.0):5.1f}%" for e in exits)
        dec = f"{r.decision_us[0]:7.1f} / {r.decision_us[1]:7.1f}" if r.source == "runtime" else ""
        lines.append(
            f"{r.load:5.2f} {r.source:<9} {r.tasks:6d} {100 * r.violation:7.2f} {r.p95_ms:7.2f} {acc}  "
            f"{mix}  {dec:>17}"
        )
    return "\n".join(lines)


def write_json(path: Path, rows: list[Row]) -> None:
    """One object per load: runtime and simulated P95 and violation ratio, and their differences,
    against the profile (`simulator_*`) and against the service the runtime measured (`measured_*`)."""
    out = []
    for runtime, simulated, measured in zip(rows[0::3], rows[1::3], rows[2::3], strict=True):
        row: dict[str, Any] = {"load": runtime.load, "runtime_p95_ms": runtime.p95_ms}
        row["runtime_violation"] = runtime.violation
        for name, sim in (("simulator", simulated), ("measured", measured)):
            row[f"{name}_p95_ms"] = sim.p95_ms
            row[f"{name}_p95_ratio"] = runtime.p95_ms / sim.p95_ms if sim.p95_ms else None
            row[f"{name}_violation"] = sim.violation
            row[f"{name}_violation_points"] = 100 * (runtime.violation - sim.violation)
        row["measured_dispatch_overhead_us"] = measured.dispatch_overhead_us
        row["runtime_decision_us_p50_p99"] = list(runtime.decision_us)
        out.append(row)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")


async def overhead(root: Path, inputs: list[np.ndarray], n: int) -> dict[str, float]:
    """One request at a time (no queueing): where the time goes besides the backend."""
    async with Server(config(root, 1000.0, "serve")) as server:
        caller, server_side = [], []
        for i in range(n):
            m = i % len(MODELS)
            t = time.monotonic()
            r = await server.infer(MODELS[m], inputs[m][i % len(inputs[m])])
            back = time.monotonic()
            r.raise_for_status()
            caller.append((back - t) * 1000.0 - r.service_ms)
            server_side.append(r.total_ms - r.service_ms)
            await asyncio.sleep(0.002)  # idle gap: each request meets an idle executor
        snap = server.snapshot()
    return {
        "caller_p50_us": float(np.percentile(caller, 50)) * 1000,
        "caller_p95_us": float(np.percentile(caller, 95)) * 1000,
        "server_p50_us": float(np.percentile(server_side, 50)) * 1000,
        "server_p95_us": float(np.percentile(server_side, 95)) * 1000,
        "decision_mean_us": snap["decision"]["mean_us"],
        "decision_p99_us": snap["decision"]["p99_us"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repository", type=Path, default=Path("engines"))
    parser.add_argument("--loads", type=float, nargs="+", default=[0.3, 0.7, 1.0, 1.3])
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of arrivals per load")
    parser.add_argument("--slo-ms", type=float, default=50.0)
    parser.add_argument("--late-tasks", choices=("serve", "expire"), default="serve")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="write one row per load (runtime vs simulator) here")
    args = parser.parse_args(argv)
    root = args.repository.resolve()
    try:
        repository = ModelRepository(root)
        manifests = [repository.load_manifest(m) for m in MODELS]
        fingerprint = OnnxRuntimeBackend(repository, threads=1, warmup=0).fingerprint()
        tables = [repository.load_profile(m, fingerprint) for m in manifests]
    except EdgeServeError as exc:
        print(f"runtime_vs_simulator: {exc}", file=sys.stderr)
        print(
            f"runtime_vs_simulator: this benchmark's models come from `edgeserve export --model resnet50"
            f" --model resnet101 --model resnet152 --width 0.25 --repository {args.repository}`, then"
            f" `edgeserve-profile --threads 1 --repeats 50 --repository {args.repository}`",
            file=sys.stderr,
        )
        return 1
    accuracy = paper_accuracy({m.name: m.exit_names for m in manifests})
    rng = np.random.default_rng(args.seed)
    inputs = [rng.standard_normal((64, *m.input.shape)).astype(np.float32) for m in manifests]
    cap = capacity(tables)
    print(
        f"profile: {fingerprint.key()}; All-Final capacity {cap:.1f} req/s for ratio 1 ({6 * cap:.0f} total)"
    )
    print(f"policy {DEFAULT_POLICY}, SLO {args.slo_ms:g} ms, late tasks: {args.late_tasks}")
    print(f"{args.duration:g} s per load, first {WARMUP_TASKS} tasks excluded; accuracy: {accuracy.source}\n")
    rows: list[Row] = []
    for load in args.loads:
        trace = poisson([r * load * cap for r in RATIOS], args.duration, args.seed)

        async def serve(trace: ArrivalTrace = trace) -> tuple[list[Result], dict[str, Any]]:
            async with Server(config(root, args.slo_ms, args.late_tasks)) as server:
                results = await drive(server, trace, inputs)
                return results, server.snapshot()

        results, snap = run(serve())
        batches = ran_batches(results)
        measured, slowdown = measured_profiles(batches, tables)
        gap = dispatch_overhead(batches)
        rows.append(runtime_row(load, results, accuracy, snap))
        rows.append(simulator_row(load, trace, tables, args.slo_ms, accuracy))
        rows.append(simulator_row(load, trace, measured, args.slo_ms, accuracy, "sim-meas", gap))
        print("\n".join(format_rows(rows[-3:]).splitlines()[-3:]), flush=True)
        print(
            "      measured service: " + ", ".join(f"{f:.2f}x" for f in slowdown) + " of the profile;"
            f" dispatch overhead {gap * 1e6:.0f} us per batch (median)"
        )
    print()
    print(format_rows(rows))
    if args.json is not None:
        write_json(args.json, rows)
        print(f"wrote {args.json}")
    o = run(overhead(root, inputs, 300))
    print(
        "\nserving overhead at low load (one request at a time, 300 requests):\n"
        f"  caller-side latency - backend time: p50 {o['caller_p50_us']:.0f} us, "
        f"p95 {o['caller_p95_us']:.0f} us\n"
        f"  server-side (arrival to batch end) - backend time: p50 {o['server_p50_us']:.0f} us, "
        f"p95 {o['server_p95_us']:.0f} us\n"
        f"  scheduler time per decision: mean {o['decision_mean_us']:.1f} us, "
        f"p99 {o['decision_p99_us']:.1f} us"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
