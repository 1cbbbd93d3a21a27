"""`edgeserve bench`: drive a running server with Poisson traffic and report deadline violations.

The target is edgeserve's socket (unix://, tcp://) or any Open Inference Protocol endpoint
(http://: edgeserve's own HTTP frontend, Triton, KServe), with the same load and the same report.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

EPILOG = """\
examples:
  # the paper's 3:2:1 mix over the served models at 150 requests/s in total, for 10 s
  edgeserve bench --target unix:///tmp/edgeserve.sock --total-rate 150 --duration 10
  # explicit per-model rates, with a CSV of every request and a plot
  edgeserve bench --target tcp://127.0.0.1:7070 --model digits-s --rate 60 --model digits-m --rate 40 \\
      --csv out/bench.csv --plot out/bench.png
  # what the box can take right now (closed loop), to set --total-rate against (e.g. half of it)
  edgeserve bench --target unix:///tmp/edgeserve.sock --capacity --duration 3
  # the same load over the Open Inference Protocol (edgeserve's [listen] http, or Triton/KServe)
  edgeserve bench --target http://127.0.0.1:8000 --total-rate 150 --duration 10          # binary tensors
  edgeserve bench --target http://127.0.0.1:8000 --model digits-m --rate 50 --json       # JSON tensors

Violation % = (ok but late + expired + rejected) / answered: "late" is the server's verdict.
Latencies are measured on the client; when more than 1 % of the ok answers came back past their
deadline though the server had them done in time (this client could not keep up: its requests
waited for a pooled connection or for its CPU), a `client:` line says how many. ok/s counts from
the first measured send to the end of the sending or to the last answer, whichever is later.
Over HTTP, statuses come from the HTTP codes (429 rejected, 504 expired, ...; docs/oip.md) and the
exit mix and lateness from edgeserve's response parameters; another server's answers count as
ok with an unknown exit.
"""


def _ratios(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--ratios takes numbers separated by commas, got {text!r}"
        ) from None


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="load-test a running server over its socket or the Open Inference Protocol",
        description="Send Poisson traffic per model to `edgeserve serve` (or any Open Inference Protocol "
        "server) and report violation ratio, "
        "P50/P95/P99 latency, throughput, expected accuracy and exit mix.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--target",
        required=True,
        help="unix:///path/to.sock, tcp://host:port, or http://host:port (Open Inference Protocol)",
    )
    encoding = parser.add_mutually_exclusive_group()
    encoding.add_argument(
        "--binary",
        dest="binary",
        action="store_true",
        default=True,
        help="http targets: send and receive tensors as raw bytes (the binary tensor extension; default)",
    )
    encoding.add_argument(
        "--json", dest="binary", action="store_false", help="http targets: send and receive tensors as JSON"
    )
    parser.add_argument("--token", help="the server's listen.token, if it has one")
    parser.add_argument(
        "--model", action="append", default=[], help="a model to load (repeatable); default: all"
    )
    parser.add_argument(
        "--rate", action="append", type=float, default=[], help="requests/s for the --model before"
    )
    parser.add_argument("--ratios", type=_ratios, help="relative rates of the models, e.g. 3,2,1 (default)")
    parser.add_argument(
        "--total-rate", type=float, default=60.0, help="requests/s over all models (default 60)"
    )
    parser.add_argument("--duration", type=float, default=10.0, help="measured seconds (default 10)")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds sent but not counted (default 1)")
    parser.add_argument("--deadline-ms", type=float, help="budget per request (default: each model's SLO)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--csv", type=Path, help="write one row per request here")
    parser.add_argument("--plot", type=Path, help="write a latency CDF and exit-mix plot here (PNG)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument(
        "--capacity",
        action="store_true",
        help="instead of Poisson traffic: keep a few requests always in flight for --duration s (closed "
        "loop) and print the ok answers per second, the most this box serves now; set --total-rate "
        "relative to it (e.g. half)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from edgeserve.errors import EdgeServeError, require_module
    from edgeserve.loop import run as run_loop
    from edgeserve.tools.bench import (
        CAPACITY_IN_FLIGHT,
        BenchSettings,
        connect_target,
        default_ratios,
        format_report,
        measure_capacity,
        run_bench,
        split_rate,
        write_csv,
        write_plot,
    )
    from edgeserve.wire.client import parse_target

    if args.rate and len(args.rate) != len(args.model):
        raise EdgeServeError(
            f"{len(args.rate)} --rate for {len(args.model)} --model: give one --rate after each --model "
            "(or --ratios with --total-rate)"
        )
    if args.rate and args.ratios:
        raise EdgeServeError("--rate and --ratios are exclusive: drop one")
    if args.duration <= 0 or args.warmup < 0:
        raise EdgeServeError(
            f"--duration {args.duration:g} / --warmup {args.warmup:g}: the duration must be positive "
            "and the warm-up non-negative"
        )
    if args.total_rate <= 0 or any(r < 0 for r in args.rate):
        raise EdgeServeError("--total-rate must be positive and every --rate non-negative")
    if args.plot is not None:  # before the run, not after it
        require_module("matplotlib", "--plot")
    if not args.target.startswith(("http://", "https://")):
        parse_target(args.target)
    settings = BenchSettings(
        target=args.target,
        rates={},
        duration_s=args.duration,
        warmup_s=args.warmup,
        token=args.token,
        deadline_ms=args.deadline_ms,
        seed=args.seed,
        binary=args.binary,
    )
    if args.rate:
        rates = dict(zip(args.model, args.rate, strict=True))
    else:

        async def served_models() -> list[str]:
            probe = await connect_target(settings)
            try:
                return list(probe.models)
            finally:
                await probe.close()

        models = args.model or run_loop(served_models())
        rates = split_rate(models, args.ratios or default_ratios(len(models)), args.total_rate)
    settings = replace(settings, rates=rates)
    if args.capacity:
        capacity = run_loop(measure_capacity(settings))
        smallest = min((r for r in rates.values() if r > 0), default=1.0)
        mix = ":".join(f"{r / smallest:.3g}" for r in rates.values())
        print(
            f"bench: capacity {capacity:.0f} requests/s ({', '.join(rates)} in the ratio {mix}; closed loop, "
            f"{CAPACITY_IN_FLIGHT} in flight, {args.duration:g} s after {args.warmup:g} s warm-up)"
        )
        return 0
    shown = ", ".join(f"{m} {r:.1f}/s" for m, r in rates.items())
    print(
        f"bench: {args.target}: {shown}; warm-up {args.warmup:g} s, measuring {args.duration:g} s", flush=True
    )
    bar = tqdm(
        total=round(args.duration, 1),
        unit="s",
        disable=True if args.no_progress else None,  # None: no bar when stderr is not a terminal
        file=sys.stderr,
        bar_format="{l_bar}{bar}| {n:.1f}/{total} s {postfix}",
    )

    def tick(elapsed: float, sent: int, answered: int) -> None:
        bar.n = round(min(elapsed, args.duration), 1)
        bar.set_postfix_str(f"sent {sent} answered {answered}", refresh=True)

    try:
        result = run_loop(run_bench(settings, tick))
    finally:
        bar.n = round(args.duration, 1)
        bar.close()
    print(format_report(result))
    if args.csv:
        write_csv(result, args.csv)
        print(f"bench: wrote {args.csv}")
    if args.plot:
        write_plot(result, args.plot)
        print(f"bench: wrote {args.plot}")
    return 0
