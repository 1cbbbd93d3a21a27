"""`edgeserve simulate`: run the scheduling policies on a profile in the discrete-event simulator.

Imported to build the parser: keep module-level imports light (no numpy-heavy work, no torch,
no matplotlib).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from edgeserve.errors import EdgeServeError

if TYPE_CHECKING:
    from edgeserve.profile import ProfileTable
    from edgeserve.scheduler.sweep import Mix, SweepSpec

EPILOG = """\
examples:
  # the paper's protocol on the SYNTHETIC RTX 3080 profile: 3:2:1 Poisson, SLO 50 ms, all policies
  edgeserve simulate --paper-gpu --ratios 3,2,1 --loads 20,60,100,140,180,220,240 --out out/sim

  # your measured profiles, loads from 20% to 150% of the All-Final capacity
  edgeserve simulate --repository engines --model resnet50-cifar-w0.25 --model resnet101-cifar-w0.25 \\
      --model resnet152-cifar-w0.25 --ratios 3,2,1 --auto-rates 0.2,0.6,1.0,1.5 --accuracy-table paper

  # exit subsets and SLOs (paper Figs. 7 and 8), only the stability policy
  edgeserve simulate --paper-gpu --ratios 3,2,1 --policy stability --exits all --exits layer1+final \\
      --exits layer3+final --slo-ms 20,50,70 --loads 100,200

  # model mixes with equal rates (paper Fig. 9), bursty traffic
  edgeserve simulate --paper-gpu --mix 'ResNet50*3' --mix ResNet50+ResNet101+ResNet152 --traffic bursty

  # replay recorded arrivals (CSV with header time_s,model)
  edgeserve simulate --paper-gpu --traffic replay --replay arrivals.csv --duration 60

Outputs in --out: sweep.csv (one row per run and scope: 'all' or a model) and PNG figures.
Service times are drawn from each cell's recorded samples; the policies predict with --quantile.
"""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "simulate",
        help="compare scheduling policies on a profile in a discrete-event simulator",
        description=(
            "Simulate one accelerator shared by time division between early-exit models, under each\n"
            "scheduling policy (the EdgeServing stability score and the paper's baselines), sweeping\n"
            "loads, SLOs, exit subsets, model mixes and traffic. Prints a policy x load table\n"
            "(violation % / P95 ms / mean accuracy %) and writes a CSV and plots."
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    src = parser.add_argument_group("profiles (pick one source)")
    src.add_argument("--repository", type=Path, help="model repository (with --model); e.g. engines")
    src.add_argument(
        "--model", action="append", default=[], help="model in the repository (repeatable, in order)"
    )
    src.add_argument(
        "--fingerprint", help="profile fingerprint key to use (default: the only or the newest profile)"
    )
    src.add_argument(
        "--profile-json", type=Path, action="append", default=[], help="profile table file (repeatable)"
    )
    src.add_argument(
        "--paper-gpu",
        action="store_true",
        help="SYNTHETIC ResNet50/101/152 profile from the paper's RTX 3080 per-exit latencies (batch scaling "
        "and noise are assumptions, see edgeserve/scheduler/synthetic.py)",
    )
    src.add_argument(
        "--accuracy-table",
        choices=("auto", "manifest", "paper", "none"),
        default="auto",
        help="per-exit accuracy: measured (manifest), the authors' CIFAR-100 table (paper), none; "
        "auto = manifest when every exit was measured, paper for --paper-gpu, else none",
    )

    sweep = parser.add_argument_group("sweep")
    sweep.add_argument(
        "--policy",
        action="append",
        default=[],
        help="policy (repeatable; default: all). Names: see --list-policies (* marks a server's default)",
    )
    sweep.add_argument("--list-policies", action="store_true", help="print the policies and exit")
    sweep.add_argument(
        "--loads", type=_floats, help="loads: req/s of a ratio-1 model, e.g. 20,60,120 (default 20..240)"
    )
    sweep.add_argument(
        "--auto-rates",
        type=_floats,
        metavar="FRACTIONS",
        help="loads as fractions of the All-Final capacity, e.g. 0.2,0.6,1,1.5 (instead of --loads)",
    )
    sweep.add_argument(
        "--ratios", type=_floats, help="rate ratio per model of the mix, e.g. 3,2,1 (default all 1)"
    )
    sweep.add_argument("--slo-ms", type=_floats, default=(50.0,), help="deadline budgets in ms (default 50)")
    sweep.add_argument(
        "--exits", action="append", default=[], help="exit subset, e.g. layer1+final, or 'all' (repeatable)"
    )
    sweep.add_argument(
        "--mix", action="append", default=[], help="model mix, e.g. ResNet50*3 or A+B (repeatable)"
    )
    sweep.add_argument(
        "--traffic",
        action="append",
        default=[],
        choices=("poisson", "bursty", "replay"),
        help="arrival process (repeatable; default poisson)",
    )
    sweep.add_argument("--replay", type=Path, help="CSV of arrivals (time_s,model) for --traffic replay")
    sweep.add_argument(
        "--burst-peak", type=float, default=3.0, help="bursty: ON rate / mean rate (default 3)"
    )
    sweep.add_argument(
        "--burst-on-s", type=float, default=0.2, help="bursty: mean ON period in s (default 0.2)"
    )

    run = parser.add_argument_group("run")
    run.add_argument("--duration", type=float, default=20.0, help="seconds of arrivals per run (default 20)")
    run.add_argument(
        "--warmup-tasks", type=int, default=100, help="first tasks left out of metrics (default 100)"
    )
    run.add_argument("--seeds", type=int, default=1, help="runs per setting with seeds 0..N-1 (default 1)")
    run.add_argument(
        "--quantile",
        default="p95",
        choices=("mean", "p50", "p90", "p95", "p99"),
        help="profile quantile the policies predict with (default p95)",
    )
    run.add_argument("--max-batch", type=int, default=10, help="batch cap B_max (default 10)")
    run.add_argument(
        "--urgency",
        choices=("code", "paper"),
        default="paper",
        help="urgency form: code = min(e^(x-1), clip) (authors' code), paper = "
        "min((e^x-1)/(e-1), clip) (the paper's text; default)",
    )
    run.add_argument("--clip", type=float, default=10.0, help="urgency clip (default 10; inf disables)")
    run.add_argument(
        "--service",
        choices=("samples", "quantile"),
        default="samples",
        help="service times: profile samples (realistic) or the predicted quantile",
    )
    run.add_argument(
        "--dispatch-overhead-us",
        type=_microseconds,
        default=0.0,
        help="the accelerator stands idle this long before each batch: a runtime's wake-up, "
        "decision and hand-off (default 0; benchmarks/runtime_vs_simulator.py prints the server's, "
        "about 60-150 us on a 2-core CPU)",
    )
    run.add_argument(
        "--out", type=Path, default=Path("out/simulate"), help="output folder (default out/simulate)"
    )
    run.add_argument("--no-plots", action="store_true", help="write the CSV only")
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(func=run_simulate)


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def _microseconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of microseconds, got {text!r}") from None
    if not 0.0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def run_simulate(args: argparse.Namespace) -> int:
    from edgeserve.errors import require_module

    if not args.no_plots:  # before the sweep, not after it
        require_module("matplotlib", "simulate's plots", "add --no-plots for the CSV only")
    from edgeserve.scheduler import sources
    from edgeserve.scheduler.accuracy import manifest_accuracy, paper_accuracy
    from edgeserve.scheduler.policies import DEFAULT_POLICY, POLICIES
    from edgeserve.scheduler.sweep import (
        Mix,
        SweepSpec,
        format_table,
        run_sweep,
        write_csv,
    )
    from edgeserve.scheduler.urgency import Urgency

    if args.list_policies:
        for spec in POLICIES.values():
            mark = "*" if spec.name == DEFAULT_POLICY else " "
            print(f"{mark} {spec.name:26s} {spec.label:26s} {spec.summary}")
        print(f"* the default of a server ([scheduler] policy unset): {DEFAULT_POLICY}")
        return 0
    chosen = sum(bool(x) for x in (args.repository or args.model, args.profile_json, args.paper_gpu))
    if chosen != 1:
        raise EdgeServeError(
            "give exactly one profile source: --repository DIR --model NAME..., --profile-json FILE..., "
            "or --paper-gpu"
        )
    if args.repository or args.model:
        if not (args.repository and args.model):
            raise EdgeServeError("--repository needs at least one --model (and --model needs --repository)")
        source = sources.from_repository(args.repository, args.model, args.fingerprint)
    elif args.profile_json:
        source = sources.from_json(args.profile_json)
    else:
        source = sources.paper_gpu(max_batch=max(args.max_batch, 10))
    for note in source.notes:
        print(note, file=sys.stderr)

    exits_by_model = {t.model: t.exit_names for t in source.tables}
    accuracy = None
    table_choice = args.accuracy_table
    if table_choice == "auto":
        measured = manifest_accuracy(source.manifests) if source.manifests else None
        accuracy = measured if measured else (paper_accuracy(exits_by_model) if args.paper_gpu else None)
    elif table_choice == "manifest":
        accuracy = manifest_accuracy(source.manifests) if source.manifests else None
        if accuracy is None:
            raise EdgeServeError(
                "--accuracy-table manifest: some exit has no measured accuracy in its manifest; measure it "
                "(`edgeserve export --help`) or pass --accuracy-table paper"
            )
    elif table_choice == "paper":
        accuracy = paper_accuracy(exits_by_model)
    print(f"accuracy: {accuracy.source if accuracy else 'none (no measured accuracy)'}", file=sys.stderr)

    names = [t.model for t in source.tables]
    mixes = tuple(Mix.parse(m, names) for m in args.mix) or (Mix("+".join(names), tuple(names)),)
    exit_sets = tuple(None if e == "all" else tuple(e.split("+")) for e in args.exits) or (None,)
    policies = tuple(args.policy) or tuple(POLICIES)
    base = SweepSpec(
        policies=policies,
        loads=(0.0,),
        mixes=mixes,
        ratios=tuple(args.ratios) if args.ratios else None,
        slos_ms=tuple(args.slo_ms),
        exit_sets=exit_sets,
        traffic=tuple(args.traffic) or ("poisson",),
        replay_path=args.replay,
        duration_s=args.duration,
        warmup_tasks=args.warmup_tasks,
        seeds=tuple(range(args.seeds)),
        quantile=args.quantile,
        max_batch=args.max_batch,
        urgency=Urgency(args.urgency, args.clip),
        service_mode=args.service,
        dispatch_overhead_s=args.dispatch_overhead_us / 1e6,
        burst_peak=args.burst_peak,
        burst_on_s=args.burst_on_s,
    )
    rows = []
    for mix in mixes:
        spec = _with_loads(base, mix, args, source.by_name)
        rows += run_sweep(spec, source.by_name, accuracy, source.label, progress=not args.quiet)
    csv_path = args.out / "sweep.csv"
    write_csv(rows, csv_path)
    print(f"profile: {source.label}")
    print(format_table(rows))
    print(f"\nwrote {csv_path}")
    if not args.no_plots:
        from edgeserve.scheduler.plots import plot_sweep

        for path in plot_sweep(rows, args.out, source.label):
            print(f"wrote {path}")
    return 0


def _with_loads(
    base: SweepSpec, mix: Mix, args: argparse.Namespace, tables: dict[str, ProfileTable]
) -> SweepSpec:
    """The sweep for one mix: explicit --loads, fractions of the All-Final capacity, or 20..240."""
    from dataclasses import replace

    from edgeserve.scheduler.sweep import all_final_capacity, ratios_for

    spec = replace(base, mixes=(mix,))
    if args.auto_rates:
        capacity = all_final_capacity(tables, mix, ratios_for(spec, mix), args.max_batch)
        print(f"{mix.label}: All-Final capacity {capacity:.1f} req/s per unit ratio", file=sys.stderr)
        return replace(spec, loads=tuple(round(f * capacity, 3) for f in args.auto_rates))
    return replace(
        spec, loads=tuple(args.loads) if args.loads else (20.0, 60.0, 100.0, 140.0, 180.0, 220.0, 240.0)
    )
