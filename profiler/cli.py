"""`edgeserve-profile`: measure the latency table the scheduler plans with, and optionally accuracy.

Heavy imports (ONNX Runtime, tqdm, matplotlib) happen inside the handler so `--help` is instant
and this module can also be registered as an `edgeserve profile` subcommand.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgeserve.config.server import BACKEND_NAMES, PRECISIONS
from edgeserve.errors import DEBUG_ENV, ProfileError, RepositoryError, guarded, require_module
from edgeserve.fingerprint import Fingerprint
from edgeserve.manifest import Manifest
from edgeserve.profile import QUANTILES, ProfileCell, ProfileTable
from edgeserve.profiler.evaluate import (
    EvalData,
    check_fits,
    exit_accuracies,
    load_eval_data,
    write_accuracies,
)
from edgeserve.profiler.measure import MeasureSettings, batch_limit, measure_model
from edgeserve.profiler.report import DEFAULT_CV_THRESHOLD, format_noisy, format_table, noisy_cells
from edgeserve.repository import ModelRepository, check_model_name, default_root
from edgeserve.runtime.backends.base import Backend

DESCRIPTION = """\
Measure how long every (model, exit, batch size) cell takes on this box and save the profile
table the scheduler plans with, keyed by this device's fingerprint (backend, CPU/GPU, threads,
library versions). Each cell runs alone, after warm-up, --repeats times. A profile that already
exists for this device, export and settings is printed instead of measured again (--force
re-measures). With --eval, also measures each exit's top-1 accuracy and writes it into the
model's manifest. With --import, measures nothing: stores a table measured on another box (a
Jetson, a GPU server), which the emulated backend (`[backend] name = "emulated"`) then serves
with on any box, and `edgeserve simulate --fingerprint KEY` simulates.
"""

EPILOG = """\
examples:
  edgeserve-profile                                  profile every model in ./engines
  edgeserve-profile --model resnet50 --model resnet101 --max-batch 10 --repeats 100
  edgeserve-profile --threads 1 --providers cpu      steadier numbers on a busy CPU box
  edgeserve-profile --providers cuda --plot out/latency.png
  edgeserve-profile --backend tensorrt --precision fp16   the engines from `edgeserve build-engines`
  edgeserve-profile --model resnet50 --eval cifar100_test.npz   per-exit accuracy into the manifest
  edgeserve-profile --json > profile-summary.json   machine-readable summary on stdout
  edgeserve-profile --import jetson/resnet50-cifar.json --model resnet50-cifar
                                                     store the Jetson's table for the emulated backend

The table shows p50, the quantile the scheduler reads (--quantile, default p95) and the
coefficient of variation (CV) of every cell; cells with CV above --cv-threshold are marked `!`
and listed with advice, because a noisy cell makes the scheduler's predictions unreliable.
Profiles live in <repository>/<model>/profiles/<fingerprint>.json.
"""


def _int_at_least(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse


_positive = _int_at_least(1)
_non_negative = _int_at_least(0)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", action="append", metavar="NAME", help="model to profile (repeatable; default: every model)"
    )
    parser.add_argument(
        "--repository",
        metavar="DIR",
        type=Path,
        default=None,
        help="model repository (default: $EDGESERVE_REPOSITORY or ./engines)",
    )
    parser.add_argument(
        "--max-batch", metavar="N", type=_positive, default=10, help="measure batch sizes 1..N (default 10)"
    )
    parser.add_argument(
        "--repeats", metavar="N", type=_positive, default=100, help="timed runs per cell (default 100)"
    )
    parser.add_argument(
        "--warmup",
        metavar="N",
        type=_non_negative,
        default=10,
        help="untimed runs before each cell (default 10)",
    )
    parser.add_argument(
        "--backend",
        choices=BACKEND_NAMES,
        default="onnxruntime",
        help="what runs the models: onnxruntime (default), tensorrt (engines from `edgeserve "
        "build-engines`), torch, or auto (the fastest one available here)",
    )
    parser.add_argument(
        "--precision",
        choices=PRECISIONS,
        default="fp32",
        help="with --backend tensorrt: which engines to profile (default fp32)",
    )
    parser.add_argument(
        "--device",
        default=None,
        metavar="DEV",
        help="with --backend torch: cpu, cuda or cuda:N (default: cuda if available); "
        "with tensorrt: cuda:N picks the GPU",
    )
    parser.add_argument(
        "--threads",
        metavar="N",
        type=_positive,
        default=None,
        help="ONNX Runtime (or torch) intra-op threads (default: CPU cores - 1)",
    )
    parser.add_argument(
        "--providers",
        default=None,
        metavar="LIST",
        help="comma-separated execution providers, e.g. cpu or cuda,cpu "
        "(default: CUDA if this onnxruntime has it, else CPU)",
    )
    parser.add_argument(
        "--quantile", choices=QUANTILES, default="p95", help="the latency the scheduler reads (default p95)"
    )
    parser.add_argument(
        "--cv-threshold",
        type=float,
        default=DEFAULT_CV_THRESHOLD,
        metavar="CV",
        help=f"flag cells whose coefficient of variation exceeds this (default {DEFAULT_CV_THRESHOLD})",
    )
    parser.add_argument(
        "--plot", type=Path, metavar="PNG", help="also draw latency vs batch size into this file"
    )
    parser.add_argument(
        "--eval", type=Path, metavar="NPZ", help="measure per-exit top-1 accuracy on this .npz (arrays x, y)"
    )
    parser.add_argument(
        "--npz",
        type=Path,
        metavar="FILE",
        help="time the cells on these representative samples (one array per input name, (N, ...)) "
        "instead of random ones: for a model whose latency depends on its input (a decoder, NMS)",
    )
    parser.add_argument("--force", action="store_true", help="measure even if a matching profile exists")
    parser.add_argument(
        "--write-calibrated",
        action="store_true",
        help="measure nothing: fold the calibrated latency tables a server left in "
        "<repository>/<model>/calibrated/ (online calibration, docs/scheduler.md) into the stored "
        "profiles of the same device fingerprint (each cell's samples rescaled)",
    )
    parser.add_argument(
        "--import",
        dest="import_table",
        type=Path,
        metavar="TABLE.json",
        help="measure nothing: store this profile table, measured on another box, for the one --model "
        "NAME (its exit names must be the model's, its batches within what the model runs); a table "
        "measured for other graphs (another export, width or model name) is stored all the same, said "
        'and recorded in it. Serve with it through `[backend] name = "emulated"`',
    )
    parser.add_argument(
        "--json", action="store_true", help="print a machine-readable summary instead of tables"
    )
    parser.set_defaults(func=profile_command)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="edgeserve-profile",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    parser.add_argument(
        "--debug",
        action="store_true",
        help=f"show the Python traceback of an error instead of one line (also {DEBUG_ENV}=1)",
    )
    return parser


def add_parser(subparsers: Any) -> None:
    """Register as `edgeserve profile` (the same options as `edgeserve-profile`)."""
    parser = subparsers.add_parser(
        "profile",
        help="measure the latency profile table (same as edgeserve-profile)",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)


@dataclass
class ModelResult:
    manifest: Manifest
    table: ProfileTable
    profile_path: Path
    cached: bool
    accuracies: list[float] | None = None
    manifest_path: Path | None = None


def _note(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _cached_profile(
    repository: ModelRepository, manifest: Manifest, fingerprint: Fingerprint, settings: MeasureSettings
) -> ProfileTable | None:
    """The stored profile if it was measured here, for this export, with these settings."""
    path = repository.profile_path(manifest.name, fingerprint)
    if not path.exists():
        return None
    try:
        table = repository.load_profile(manifest, fingerprint)
    except ProfileError as exc:
        _note(f"{manifest.name}: not reusing the stored profile: {exc}")
        return None
    if not settings.matches(table.settings) or table.max_batch != batch_limit(manifest, settings):
        _note(
            f"{manifest.name}: the stored profile was measured with other settings "
            f"({table.settings}); measuring again"
        )
        return None
    return table


def _measure(
    backend: Backend, manifest: Manifest, settings: MeasureSettings, npz: Path | None = None
) -> ProfileTable:
    from edgeserve.onnx_graph import sample_batch
    from edgeserve.profiler.measure import npz_inputs
    from edgeserve.profiler.progress import Progress, estimate

    largest = batch_limit(manifest, settings)
    cells = len(manifest.exits) * largest
    _note(
        f"profiling {manifest.name}: {len(manifest.exits)} exits x batch 1..{largest} "
        f"= {cells} cells, "
        f"{settings.warmup} warm-up + {settings.repeats} timed runs each"
    )
    start = time.perf_counter()
    # --npz: representative samples (a model whose latency depends on its input), else random ones
    inputs = (
        sample_batch(manifest, largest, settings.seed) if npz is None else npz_inputs(npz, manifest, largest)
    )
    _note(estimate(backend, manifest, inputs, largest, settings.warmup, settings.repeats).line(manifest.name))
    progress = Progress(manifest.name, cells)  # profiler/progress.py: a bar, or plain lines in a log
    try:
        table = measure_model(backend, manifest, settings, on_cell=progress.update, inputs=inputs)
    finally:
        progress.close()
    _note(f"profiled {manifest.name} in {time.perf_counter() - start:.1f} s")
    return table


def profile_command(args: argparse.Namespace) -> int:
    from edgeserve.runtime.backends.select import create_backend

    if args.plot is not None:  # before anything is measured or written
        require_module("matplotlib", "--plot")
    repository = ModelRepository(args.repository if args.repository is not None else default_root())
    if not repository.root.is_dir():
        raise RepositoryError(
            f"model repository {repository.root} does not exist (--repository or $EDGESERVE_REPOSITORY): "
            f"export a model into it with `edgeserve export --demo --repository {repository.root}`, "
            "or point --repository at the right folder"
        )
    names = list(dict.fromkeys(args.model or repository.models()))
    if getattr(args, "write_calibrated", False):
        return write_calibrated(repository, names)
    if getattr(args, "import_table", None) is not None:
        return import_command(repository, args.import_table, args.model or [])
    if args.backend == "emulated":
        raise ProfileError(
            "--backend emulated runs no model, it waits the latencies of a stored profile: there is "
            "nothing to measure; store a table measured on another box with `edgeserve-profile "
            "--import TABLE.json --model NAME`, or measure this one with another --backend"
        )
    if not names:
        raise RepositoryError(
            f"{repository.root}: no models in this repository; export one with "
            f"`edgeserve export --demo --repository {repository.root}` or point --repository at the "
            "right folder"
        )
    for name in names:
        check_model_name(repository, name, option="--model")
    manifests = [repository.load_manifest(name) for name in names]  # verifies every stage file first
    eval_data: EvalData | None = None
    if args.eval is not None:
        eval_data = load_eval_data(args.eval)
        for manifest in manifests:
            check_fits(eval_data, manifest, str(args.eval))
    settings = MeasureSettings(max_batch=args.max_batch, repeats=args.repeats, warmup=args.warmup)
    if getattr(args, "npz", None) is not None:  # representative inputs: recorded, never mixed up
        from dataclasses import replace

        from edgeserve.profiler.measure import npz_marker

        if not args.npz.is_file():
            raise ProfileError(f"--npz {args.npz}: no such file; check the path")
        settings = replace(settings, inputs=npz_marker(args.npz))
    providers = args.providers.split(",") if args.providers else None
    # Per-cell warm-up replaces the backend's own warm-up at load.
    backend = create_backend(
        args.backend,
        repository,
        threads=args.threads,
        providers=providers,
        warmup=0,
        precision=args.precision,
        device=args.device,
        report=_note,
    )
    fingerprint = backend.fingerprint()
    results: list[ModelResult] = []
    try:
        for manifest in manifests:
            table = None if args.force else _cached_profile(repository, manifest, fingerprint, settings)
            cached = table is not None
            if table is None:
                backend.load(manifest)
                table = _measure(backend, manifest, settings, getattr(args, "npz", None))
                repository.save_profile(table)
            else:
                _note(
                    f"{manifest.name}: using the stored profile from {table.created} (--force to re-measure)"
                )
            result = ModelResult(manifest, table, repository.profile_path(manifest.name, fingerprint), cached)
            if eval_data is not None:
                if manifest.name not in backend.models:
                    backend.load(manifest)
                _note(f"evaluating {manifest.name} on {eval_data.name}")
                result.accuracies = exit_accuracies(
                    backend, manifest, eval_data, batch_size=batch_limit(manifest, settings)
                )
                result.manifest, result.manifest_path = write_accuracies(
                    repository, manifest, result.accuracies, eval_data.name
                )
                repository.load_profile(result.manifest, fingerprint)  # accuracies must not invalidate it
            results.append(result)
            backend.close()  # one model's sessions at a time: an 8 GB board profiles them all
    finally:
        backend.close()
    plot_path = None
    if args.plot is not None:
        from edgeserve.profiler.plot import plot_profiles

        plot_path = plot_profiles([r.table for r in results], args.plot)
    if args.json:
        print(json.dumps(_summary(results, fingerprint, args, plot_path), indent=1))
    else:
        _print_report(results, args, plot_path)
    return 0


def import_command(repository: ModelRepository, table: Path, models: list[str]) -> int:
    """`--import TABLE.json --model NAME`: store a table measured elsewhere (profiler/importing.py)."""
    from edgeserve.profiler.importing import import_profile

    if len(models) != 1:
        raise ProfileError(
            f"--import stores one table for one model: give exactly one --model NAME (got {len(models)})"
        )
    done = import_profile(repository, table, models[0], note=_note)
    t = done.table
    how = "replaced" if done.replaced else "stored"
    print(
        f"{models[0]}: {how} the profile of {t.fingerprint.backend} on {t.fingerprint.device} "
        f"({len(t.exit_names)} exits x batch 1..{t.max_batch}) -> {done.path}"
    )
    print(
        f'serve with it: [backend] name = "emulated", fingerprint = "{t.fingerprint.key()}" '
        "(the key may be left out while it is the model's only profile)"
    )
    return 0


def write_calibrated(repository: ModelRepository, names: list[str]) -> int:
    """Rescale each stored profile's cells to what the server measured (its calibrated/ tables)."""
    from edgeserve.runtime.calibration_store import load_calibrated

    written = 0
    for name in names:
        for path in sorted((repository.model_dir(name) / "calibrated").glob("*.json")):
            data = load_calibrated(path)
            profile_path = repository.model_dir(name) / "profiles" / f"{data['fingerprint_key']}.json"
            if not profile_path.exists():
                _note(f"{path}: no stored profile {profile_path.name} for it; skipped")
                continue
            table = ProfileTable.load(profile_path)
            exits = [table.exit_names.index(e) for e in data["exit_names"]]
            changed = 0
            for row, exit_id in zip(data["latency_ms"], exits, strict=True):
                for b, (new, old) in enumerate(
                    zip(row, data["profile_ms"][exits.index(exit_id)], strict=False)
                ):
                    cell = table.cells.get((exit_id, b + 1))
                    if cell is None or abs(new / old - 1.0) < 1e-6:
                        continue
                    table.add(
                        ProfileCell.from_samples(exit_id, b + 1, [s * new / old for s in cell.samples_ms])
                    )
                    changed += 1
            table.settings = {**table.settings, "calibrated": {"from": path.name, "scale": data["scale"]}}
            table.save(profile_path)
            written += 1
            print(f"{name}: {changed} cells rescaled (model at {data['scale']:.2f}x) -> {profile_path}")
    if not written:
        print("no calibrated tables found (a server writes them on shutdown with [scheduler] calibration on)")
    return 0


def _print_report(results: list[ModelResult], args: argparse.Namespace, plot_path: Path | None) -> None:
    for r in results:
        print(format_table(r.table, args.quantile, args.cv_threshold))
        if r.accuracies is not None:
            accs = ", ".join(f"{e.name} {a:.2%}" for e, a in zip(r.manifest.exits, r.accuracies, strict=True))
            print(f"top-1 accuracy on {r.manifest.accuracy_dataset}: {accs}")
        print()
    noisy = format_noisy([r.table for r in results], args.cv_threshold, args.quantile)
    if noisy:
        print(noisy + "\n")
    if plot_path is not None:
        print(f"plot written to {plot_path}")
    for r in results:
        how = f"cached, measured {r.table.created}" if r.cached else "written"
        print(f"profile of {r.manifest.name} ({how}): {r.profile_path}")
        if r.manifest_path is not None:
            print(f"accuracies of {r.manifest.name} written to {r.manifest_path}")


def _summary(
    results: list[ModelResult], fingerprint: Fingerprint, args: argparse.Namespace, plot_path: Path | None
) -> dict[str, Any]:
    models = []
    for r in results:
        t = r.table
        batches = range(1, t.max_batch + 1)
        models.append(
            {
                "model": t.model,
                "profile": str(r.profile_path),
                "cached": r.cached,
                "created": t.created,
                "settings": t.settings,
                "latency_ms": {
                    name: [round(t.latency_ms(e, b, args.quantile), 4) for b in batches]
                    for e, name in enumerate(t.exit_names)
                },
                "cv": {
                    name: [round(t.cell(e, b).stats.cv, 5) for b in batches]
                    for e, name in enumerate(t.exit_names)
                },
                "noisy": [
                    {"exit": c.exit_name, "batch": c.batch, "cv": round(c.cv, 5)}
                    for c in noisy_cells([t], args.cv_threshold)
                ],
                "accuracy": (
                    dict(zip(t.exit_names, r.accuracies, strict=True)) if r.accuracies is not None else None
                ),
                "manifest": str(r.manifest_path) if r.manifest_path is not None else None,
            }
        )
    return {
        "fingerprint": fingerprint.to_dict(),
        "fingerprint_key": fingerprint.key(),
        "quantile": args.quantile,
        "cv_threshold": args.cv_threshold,
        "models": models,
        "plot": str(plot_path) if plot_path is not None else None,
    }


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return guarded("edgeserve-profile", lambda: args.func(args), debug=args.debug)


if __name__ == "__main__":
    sys.exit(main())
