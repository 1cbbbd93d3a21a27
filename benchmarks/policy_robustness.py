"""Is the default policy beaten anywhere? Every shipped policy on a wide family of workloads.

Family: Poisson (the paper's 3:2:1), Markov-modulated bursts shared by all models and independent
per model, a diurnal cycle, a 3x spike, skewed mixes (1:1:6 to the deepest model, 6:1:1), 2 to 16
models, tight / the paper's / loose SLOs; loads 0.3x to 3x of the All-Final capacity; on the
paper's RTX 3080 profile (synthetic) and on profiles measured on this machine's CPU
(tests/scheduler/data/cpu: the demo's digits CNNs, ONNX Runtime, 1 and 2 threads).

A rival *beats* the default on a workload when it has fewer violations by more than
max(0.05 point, 10 % of the default's) at an accuracy no lower than the default's minus 0.5 point
(means over seeds). Regret = default's violations - the best such rival's (0 if none qualifies).
Each beaten cell also says in what share of paired bootstrap resamples of its seeds the verdict
still holds: below ~95 %, which seeds were drawn may be what decided it.

    nice -n 19 .venv/bin/python benchmarks/policy_robustness.py --seeds 3 --jobs 2   # ~25 min, 2 cores
    .venv/bin/python benchmarks/policy_robustness.py --quick                         # ~2 min subset
    .venv/bin/python benchmarks/policy_robustness.py --plot out/robustness.png
    .venv/bin/python benchmarks/policy_robustness.py --seeds 0 --rows-from out/rows.json --plot out/r.png
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from edgeserve.profile import ProfileCell, ProfileTable
from edgeserve.scheduler import DEFAULT_POLICY, POLICIES, LatencyModel, make_policy
from edgeserve.scheduler.accuracy import AccuracyTable, paper_accuracy
from edgeserve.scheduler.arrivals import ArrivalTrace, poisson
from edgeserve.scheduler.metrics import summarize
from edgeserve.scheduler.service import ServiceTimes
from edgeserve.scheduler.simulator import simulate
from edgeserve.scheduler.synthetic import paper_gpu_profiles
from edgeserve.scheduler.workloads import diurnal, mmpp, spike

CPU_DIR = Path(__file__).resolve().parent.parent / "tests" / "scheduler" / "data" / "cpu"
LOADS = (0.3, 0.8, 1.0, 1.2, 2.0, 3.0)
# SLO levels as multiples of the slowest model's final exit at B_max (p95): on the paper's GPU
# profile (18.7 ms) tight = 20 ms, paper = 50 ms, loose = 150 ms.
SLO_LEVELS = {"tight": 20 / 18.734, "paper": 50 / 18.734, "loose": 150 / 18.734}


@dataclass(frozen=True)
class Workload:
    name: str
    traffic: str  # poisson | mmpp-shared | mmpp-indep | diurnal | spike
    ratios: tuple[float, ...] = (3.0, 2.0, 1.0)  # per model; cycled when there are more models
    models: int = 3
    slo: str = "paper"


WORKLOADS = (
    Workload("poisson 3:2:1", "poisson"),
    Workload("bursty shared", "mmpp-shared"),
    Workload("bursty independent", "mmpp-indep"),
    Workload("diurnal", "diurnal"),
    Workload("spike 3x", "spike"),
    Workload("mix 1:1:6", "poisson", (1.0, 1.0, 6.0)),
    Workload("mix 6:1:1", "poisson", (6.0, 1.0, 1.0)),
    Workload("mix 1:1:6 bursty", "mmpp-indep", (1.0, 1.0, 6.0)),
    Workload("2 models", "poisson", (1.0, 1.0), models=2),
    Workload("8 models bursty", "mmpp-indep", (1.0,), models=8),
    Workload("16 models", "poisson", (1.0, 2.0), models=16),
    Workload("tight SLO", "poisson", slo="tight"),
    Workload("tight SLO bursty", "mmpp-shared", slo="tight"),
    Workload("tight SLO 1:1:6", "poisson", (1.0, 1.0, 6.0), slo="tight"),
    Workload("loose SLO", "poisson", slo="loose"),
    Workload("loose SLO spike", "spike", slo="loose"),
)
QUICK = ("bursty independent", "spike 3x", "mix 1:1:6", "tight SLO", "8 models bursty")


@dataclass(frozen=True)
class Profile:
    label: str
    tables: tuple[ProfileTable, ...]
    accuracy: AccuracyTable


def load_profiles(which: Sequence[str]) -> list[Profile]:
    out = []
    if "gpu" in which:
        tables = paper_gpu_profiles()
        acc = paper_accuracy({t.model: t.exit_names for t in tables})
        out.append(Profile("gpu (paper RTX 3080, synthetic)", tuple(tables), acc))
    for sub in sorted(CPU_DIR.glob("*/")) if any(w.startswith("cpu") for w in which) else []:
        if "cpu" not in which and f"cpu-{sub.name}" not in which:
            continue
        tables = tuple(ProfileTable.load(p) for p in sorted(sub.glob("*.profile.json")))
        acc_data = json.loads((sub / "accuracy.json").read_text())
        acc = AccuracyTable(acc_data["source"], acc_data["by_model"])
        out.append(Profile(f"cpu-{sub.name} (measured)", tables, acc))
    return out


def scaled(table: ProfileTable, factor: float, name: str) -> ProfileTable:
    """A copy of `table` whose samples are `factor` x slower, renamed (more models than profiles)."""
    out = replace(table, model=name, cells={})
    for (e, b), cell in table.cells.items():
        out.add(ProfileCell.from_samples(e, b, np.asarray(cell.samples_ms) * factor))
    return out


def instances(profile: Profile, n: int) -> tuple[list[ProfileTable], AccuracyTable]:
    """n model instances: the profile's models in turn, each round 15 % slower than the last."""
    base = list(profile.tables)
    tables, acc = [], {}
    for i in range(n):
        src = base[i % len(base)]
        k = i // len(base)
        name = src.model if k == 0 else f"{src.model}#{k}"
        tables.append(src if k == 0 else scaled(src, 1.0 + 0.15 * k, name))
        acc[name] = profile.accuracy.by_model[src.model]
    # the deepest model last, as in the paper's ordering (a 1:1:6 mix skews to it)
    return tables, AccuracyTable(profile.accuracy.source, acc)


def capacity(tables: Sequence[ProfileTable], ratios: Sequence[float], max_batch: int = 10) -> float:
    """Ratio-1 rate at which All-Final saturates the accelerator (mean latency, full batches)."""
    per = sum(
        r * t.latency_ms(len(t.exit_names) - 1, max_batch, "mean") / 1000.0 / max_batch
        for t, r in zip(tables, ratios, strict=True)
    )
    return 1.0 / per


def trace_for(traffic: str, rates: list[float], duration: float, seed: int) -> ArrivalTrace:
    if traffic == "poisson":
        return poisson(rates, duration, seed)
    if traffic == "mmpp-shared":
        return mmpp(rates, duration, seed, shared=True)
    if traffic == "mmpp-indep":
        return mmpp(rates, duration, seed, shared=False)
    if traffic == "diurnal":
        return diurnal(rates, duration, seed)
    if traffic == "spike":
        return spike(rates, duration, seed)
    raise ValueError(traffic)


@dataclass(frozen=True)
class Job:
    profile: int
    workload: Workload
    load: float
    seed: int
    policies: tuple[str, ...]
    duration: float


_PROFILES: list[Profile] = []


def _init(which: Sequence[str]) -> None:
    _PROFILES[:] = load_profiles(which)


def run_job(job: Job) -> list[dict]:
    profile = _PROFILES[job.profile]
    w = job.workload
    tables, acc = instances(profile, w.models)
    ratios = [w.ratios[i % len(w.ratios)] for i in range(w.models)]
    ref = max(t.latency_ms(len(t.exit_names) - 1, 10, "p95") for t in tables) / 1000.0
    slo = SLO_LEVELS[w.slo] * ref
    rates = [r * job.load * capacity(tables, ratios) for r in ratios]
    trace = trace_for(w.traffic, rates, job.duration, job.seed)
    latency = LatencyModel.from_profiles(tables, "p95", 10)
    service = ServiceTimes(tables)
    names = tuple(t.model for t in tables)
    exits = tuple(t.exit_names for t in tables)
    rows = []
    for name in job.policies:
        log = simulate(make_policy(name, latency), trace, service, [slo] * len(tables), job.seed)
        m = summarize(log, names, exits, acc, warmup_tasks=100)[0]
        rows.append(
            {
                "profile": profile.label,
                "workload": w.name,
                "load": job.load,
                "seed": job.seed,
                "policy": name,
                "violation_pct": 100.0 * m.violation_ratio,
                "p95_ms": m.p95_ms,
                "accuracy_pct": 100.0 * (m.mean_accuracy or 0.0),
                "slo_ms": slo * 1000.0,
            }
        )
    return rows


def beaten(default: dict, rival: dict) -> bool:
    margin = max(0.05, 0.1 * default["violation_pct"])
    return (
        rival["violation_pct"] < default["violation_pct"] - margin
        and rival["accuracy_pct"] >= default["accuracy_pct"] - 0.5
    )


def verdict_support(rows: list[dict], cell: tuple, default: str, rival: str, draws: int = 2000) -> float:
    """How often `beaten(default, rival)` still holds when the cell's seeds are resampled (paired,
    with replacement): near 1, the loss is the policies'; near 0.5 or below, which seeds were
    drawn decides it (a few heavy-tailed service times, or one burst, move a cell's mean)."""
    fields = ("violation_pct", "accuracy_pct")
    per_seed: dict[str, dict[int, dict]] = {default: {}, rival: {}}
    for r in rows:
        if (r["profile"], r["workload"], r["load"]) == cell and r["policy"] in per_seed:
            per_seed[r["policy"]][r["seed"]] = r
    seeds = sorted(set(per_seed[default]) & set(per_seed[rival]))
    mine = np.array([[per_seed[default][s][f] for f in fields] for s in seeds])
    theirs = np.array([[per_seed[rival][s][f] for f in fields] for s in seeds])
    picks = np.random.default_rng(0).integers(0, len(seeds), size=(draws, len(seeds)))
    held = sum(
        beaten(
            dict(zip(fields, mine[i].mean(axis=0), strict=True)),
            dict(zip(fields, theirs[i].mean(axis=0), strict=True)),
        )
        for i in picks
    )
    return held / draws


def aggregate(rows: list[dict]) -> dict[tuple, dict]:
    """Means over seeds per (profile, workload, load, policy)."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["profile"], r["workload"], r["load"], r["policy"]), []).append(r)
    return {
        k: {
            f: float(np.mean([r[f] for r in v]))
            for f in ("violation_pct", "p95_ms", "accuracy_pct", "slo_ms")
        }
        for k, v in groups.items()
    }


def report(cells: dict[tuple, dict], default: str, policies: Sequence[str]) -> list[dict]:
    """Print per (profile, workload) a table of loads; return one regret row per cell."""
    out = []
    keys = sorted(
        {(p, w) for p, w, _, _ in cells}, key=lambda k: (k[0], [x.name for x in WORKLOADS].index(k[1]))
    )
    for prof, work in keys:
        loads = sorted({lo for p, w, lo, _ in cells if (p, w) == (prof, work)})
        slo = next(v["slo_ms"] for k, v in cells.items() if k[:2] == (prof, work))
        print(f"\n{prof} | {work} | SLO {slo:.1f} ms   (violation % / P95 ms / accuracy %)")
        print(f"{'policy':26s}" + "".join(f"{f'{lo:g}x':>22s}" for lo in loads))
        for pol in policies:
            line = f"{pol:26s}"
            for lo in loads:
                c = cells[(prof, work, lo, pol)]
                line += (
                    f"{c['violation_pct']:7.3f}/{min(c['p95_ms'], 9999):6.1f}/{c['accuracy_pct']:5.1f}".rjust(
                        22
                    )
                )
            print(line)
        line = f"{'regret (best rival)':26s}"
        for lo in loads:
            d = cells[(prof, work, lo, default)]
            rivals = [(p, cells[(prof, work, lo, p)]) for p in policies if p != default]
            winners = [(p, c) for p, c in rivals if beaten(d, c)]
            qualifying = [(p, c) for p, c in rivals if c["accuracy_pct"] >= d["accuracy_pct"] - 0.5]
            best = min(qualifying, key=lambda pc: pc[1]["violation_pct"], default=None)
            regret = max(0.0, d["violation_pct"] - best[1]["violation_pct"]) if best else 0.0
            tag = ("BEATEN by " + winners[0][0]) if winners else (best[0] if best else "-")
            line += f"{regret:+.3f} {tag[:14]}".rjust(22)
            out.append(
                {
                    "profile": prof,
                    "workload": work,
                    "load": lo,
                    "regret": regret,
                    "beaten": bool(winners),
                    "best_rival": best[0] if best else None,
                }
            )
        print(line)
    return out


def summary(cells: dict[tuple, dict], regrets: list[dict], default: str, policies: Sequence[str]) -> None:
    """Per profile: cells, how many the default loses clearly (and to whom), mean violations."""
    print(f"\n{'profile':34s} {'cells':>5s} {'beaten':>6s}  mean violation % (accuracy %) per policy")
    for prof in sorted({r["profile"] for r in regrets}):
        mine = [r for r in regrets if r["profile"] == prof]
        lost = [r for r in mine if r["beaten"]]
        by: dict[str, int] = {}
        for r in lost:
            by[r["best_rival"]] = by.get(r["best_rival"], 0) + 1
        means = []
        for pol in policies:
            vals = [v for k, v in cells.items() if k[0] == prof and k[3] == pol]
            viol = np.mean([v["violation_pct"] for v in vals])
            acc = np.mean([v["accuracy_pct"] for v in vals])
            means.append(f"{pol} {viol:.2f} ({acc:.1f})")
        print(f"{prof:34s} {len(mine):5d} {len(lost):6d}  " + "; ".join(means))
        if by:
            print(
                " " * 48
                + "beaten by: "
                + ", ".join(f"{p} {n}" for p, n in sorted(by.items(), key=lambda x: -x[1]))
            )


def plot(regrets: list[dict], path: Path, default: str = DEFAULT_POLICY) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sorted({(r["profile"], r["workload"]) for r in regrets})
    loads = sorted({r["load"] for r in regrets})
    grid = np.full((len(rows), len(loads)), np.nan)
    for r in regrets:
        grid[rows.index((r["profile"], r["workload"])), loads.index(r["load"])] = r["regret"]
    fig, ax = plt.subplots(figsize=(2 + 0.9 * len(loads), 1 + 0.28 * len(rows)))
    im = ax.imshow(grid, aspect="auto", cmap="Reds", vmin=0.0, vmax=max(0.1, float(np.nanmax(grid))))
    ax.set_xticks(range(len(loads)), [f"{lo:g}x" for lo in loads])
    ax.set_yticks(range(len(rows)), [f"{p.split(' ')[0]} | {w}" for p, w in rows], fontsize=7)
    for i in range(len(rows)):
        for j in range(len(loads)):
            ax.text(j, i, f"{grid[i, j]:.2f}", ha="center", va="center", fontsize=6)
    ax.set_xlabel("load (x All-Final capacity)")
    ax.set_title(f"{default}: regret vs best rival (violation points)", fontsize=9)
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--duration", type=float, default=8.0, help="simulated seconds per run")
    parser.add_argument("--profiles", default="gpu,cpu", help="gpu, cpu (all measured), cpu-NAME")
    parser.add_argument("--workload", action="append", help="only these workloads (repeatable)")
    parser.add_argument("--loads", default=",".join(map(str, LOADS)))
    parser.add_argument(
        "--policy", action="append", choices=POLICIES, help="policies (default: every shipped one)"
    )
    parser.add_argument("--quick", action="store_true", help=f"workloads {', '.join(QUICK)}; GPU; 1 seed")
    parser.add_argument("--json", type=Path, help="write the per-seed rows here")
    parser.add_argument("--plot", type=Path, help="heat map of the default's regret")
    parser.add_argument(
        "--default",
        default=DEFAULT_POLICY,
        choices=POLICIES,
        help=f"the policy judged against the others (default: {DEFAULT_POLICY}); e.g. an earlier default",
    )
    parser.add_argument(
        "--rows-from",
        type=Path,
        action="append",
        help="per-seed rows of an earlier --json run to add (same conditions; rows run now replace "
        "them); e.g. run the rivals once, then only the policy under study",
    )
    args = parser.parse_args(argv)
    default = args.default
    which = ["gpu"] if args.quick else args.profiles.split(",")
    names = set(args.workload or (QUICK if args.quick else [w.name for w in WORKLOADS]))
    if unknown := names - {w.name for w in WORKLOADS}:
        choices = ", ".join(w.name for w in WORKLOADS)
        parser.error(f"unknown workload {', '.join(sorted(unknown))}; choose from {choices}")
    workloads = [w for w in WORKLOADS if w.name in names]
    policies = tuple(args.policy or POLICIES)
    if default not in policies and not args.rows_from:
        policies = (default, *policies)
    seeds = 1 if args.quick else args.seeds
    loads = [float(x) for x in args.loads.split(",")]
    profiles = load_profiles(which)
    known = ["gpu", "cpu", *(f"cpu-{d.name}" for d in sorted(CPU_DIR.glob("*/")))]
    if unknown := [w for w in which if w not in known]:
        parser.error(f"unknown profile {', '.join(unknown)}; choose from {', '.join(known)}")
    jobs = [
        Job(p, w, lo, s, policies, args.duration)
        for p in range(len(profiles))
        for w in workloads
        for lo in loads
        for s in range(seeds)
    ]
    print(
        f"{len(jobs)} jobs x {len(policies)} policies, {args.duration:g} s each, {args.jobs} processes",
        file=sys.stderr,
    )
    with ProcessPoolExecutor(args.jobs, initializer=_init, initargs=(which,)) as pool:
        rows = []
        for done, batch in enumerate(pool.map(run_job, jobs, chunksize=1), start=1):
            rows += batch
            if done % max(1, len(jobs) // 20) == 0:
                print(f"  {done}/{len(jobs)} jobs", file=sys.stderr, flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows))
    ran = {(r["profile"], r["workload"], r["load"], r["seed"], r["policy"]) for r in rows}
    for path in args.rows_from or []:
        earlier = json.loads(path.read_text())
        rows += [
            r for r in earlier if (r["profile"], r["workload"], r["load"], r["seed"], r["policy"]) not in ran
        ]
        policies = (*policies, *dict.fromkeys(r["policy"] for r in earlier if r["policy"] not in policies))
    cells = aggregate(rows)
    cells = {k: v for k, v in cells.items() if all((*k[:3], p) in cells for p in policies)}
    regrets = report(cells, default, policies)
    lost = [r for r in regrets if r["beaten"]]
    for r in lost:
        r["support"] = verdict_support(
            rows, (r["profile"], r["workload"], r["load"]), default, r["best_rival"]
        )
    print(f"\n{default} beaten clearly in {len(lost)} of {len(regrets)} cells", end="")
    print(
        ""
        if not lost
        else ": "
        + "; ".join(
            f"{r['profile'].split(' ')[0]} {r['workload']} {r['load']:g}x by {r['best_rival']}"
            f" (holds in {100 * r['support']:.0f} % of seed resamples)"
            for r in lost
        )
    )
    if lost:
        firm = sum(r["support"] >= 0.95 for r in lost)
        print(f"{firm} of the {len(lost)} hold in at least 95 % of resamples of the seeds (paired bootstrap)")
    print(f"max regret {max(r['regret'] for r in regrets):.3f} points")
    summary(cells, regrets, default, policies)
    if args.plot:
        plot(regrets, args.plot, default)
        print(f"heat map: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
