"""`edgeserve build-engines`: compile the repository's ONNX stages into TensorRT engines for this GPU.

Deciding what to build is pure (edgeserve.runtime.backends.engine_cache), so `--dry-run` works on any box;
building imports TensorRT inside the handler, so `edgeserve --help` never needs it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from edgeserve.config.server import PRECISIONS
from edgeserve.errors import EdgeServeError, RepositoryError, positive_int_arg
from edgeserve.manifest import Manifest
from edgeserve.repository import ModelRepository, default_root
from edgeserve.runtime.backends.engine_cache import (
    DEFAULT_MAX_BATCH,
    BuildTarget,
    PlannedEngine,
    default_timing_cache,
    format_plan,
    plan_builds,
)

DESCRIPTION = """\
Build one TensorRT engine per stage of each model for the GPU, TensorRT version and precision of
this machine. Models from `edgeserve export` get an optimization profile per batch size
(1..--max-batch). Imported models (`edgeserve import`: any inputs and outputs) get one profile per
engine: batch 1..--max-batch tuned for --opt-batch, or exactly N for graphs with a fixed batch N,
or 1 when a tensor has no batch dimension; a model TensorRT cannot serve (float64, int16 or uint16
tensors, outputs whose size depends on their content) is listed as refused. Engines are stored
under <repository>/<model>/trt/<target>/ with a record of what they were built from; an engine
whose ONNX, device, TensorRT version, precision or batch range no longer matches is rebuilt (the
reason is printed), a current one is skipped. Layer timings are kept in a timing cache, so
rebuilding after a re-export is much faster than the first build.
"""

EPILOG = """\
examples:
  edgeserve build-engines                                 every model in ./engines, fp32
  edgeserve build-engines --model resnet50-cifar --precision fp16 --max-batch 8
  edgeserve build-engines --dry-run                       what would be built, skipped, and why
  edgeserve build-engines --dry-run --target "Orin:8.7:10.3.0"   plan for a board from a workstation
  edgeserve build-engines --force --workspace-mib 2048
  edgeserve build-engines --model my-detector --max-batch 8 --opt-batch 4   an imported model

On a Jetson: TensorRT comes with JetPack; lock the clocks first (`sudo nvpmodel -m 0` and
`sudo jetson_clocks`) so the builder times tactics at the clocks you will serve at. Then run
`edgeserve-profile --backend tensorrt` to measure the engines. See docs/accelerators.md.
"""


def parse_target(text: str, precision: str) -> BuildTarget:
    """`DEVICE:CC:TRT_VERSION` (e.g. "Orin:8.7:10.3.0") -> a BuildTarget, for planning elsewhere."""
    parts = text.rsplit(":", 2)
    if len(parts) != 3 or not all(p.strip() for p in parts):
        raise argparse.ArgumentTypeError(f"--target must look like DEVICE:CC:TRT_VERSION, got {text!r}")
    device, cc, version = (p.strip() for p in parts)
    if not cc.replace(".", "").isdigit() or not version.split(".")[0].isdigit():
        raise argparse.ArgumentTypeError(f"--target {text!r}: CC like 8.7 and a version like 10.3.0")
    return BuildTarget(device, cc, version, precision)


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "build-engines",
        help="compile ONNX stages into TensorRT engines for this GPU",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--model", action="append", metavar="NAME", help="model to build (repeatable; default: every model)"
    )
    parser.add_argument(
        "--repository",
        type=Path,
        default=None,
        help="model repository (default: $EDGESERVE_REPOSITORY or ./engines)",
    )
    parser.add_argument(
        "--precision",
        choices=PRECISIONS,
        default="fp32",
        help="fp32, or fp16 (TensorRT 10: FP16 builder flag; TensorRT 11: needs an FP16 ONNX export)",
    )
    parser.add_argument(
        "--max-batch",
        type=positive_int_arg,
        default=DEFAULT_MAX_BATCH,
        help=f"largest batch (default {DEFAULT_MAX_BATCH}); export's models get one profile per size "
        "1..N, imported ones one profile for 1..N",
    )
    parser.add_argument(
        "--opt-batch",
        type=positive_int_arg,
        default=None,
        help="imported models: the batch the one profile is tuned for (default: --max-batch)",
    )
    parser.add_argument(
        "--workspace-mib",
        type=positive_int_arg,
        default=1024,
        help="builder workspace limit in MiB (default 1024)",
    )
    parser.add_argument(
        "--timing-cache",
        type=Path,
        default=None,
        help="timing cache file (default: <repository>/trt-timing-cache/<target>.cache)",
    )
    parser.add_argument("--force", action="store_true", help="rebuild engines even when they are current")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print what would be built, rebuilt or skipped, and why; build nothing",
    )
    parser.add_argument(
        "--target",
        metavar="DEVICE:CC:TRT",
        default=None,
        help="with --dry-run: plan for another machine (device name, compute capability, TensorRT version)",
    )
    parser.add_argument("--device-id", type=int, default=0, help="CUDA device to build for (default 0)")
    parser.set_defaults(func=build_engines_command)
    return parser


def build_engines_command(args: argparse.Namespace) -> int:
    repository = ModelRepository(args.repository if args.repository is not None else default_root())
    names = args.model or repository.models()
    if not names:
        raise RepositoryError(
            f"{repository.root}: no models to build; export one first with "
            f"`edgeserve export --model digits-s --repository {repository.root}`"
        )
    manifests = [repository.load_manifest(name) for name in names]
    if args.target is not None and not args.dry_run:
        raise EdgeServeError(
            "--target only plans (add --dry-run): engines are built on, and for, the GPU that runs them"
        )
    target: BuildTarget | None
    if args.target is not None:
        try:
            target = parse_target(args.target, args.precision)
        except argparse.ArgumentTypeError as exc:
            raise EdgeServeError(str(exc)) from None
    elif args.dry_run:
        target = _local_target_or_none(args.precision, args.device_id)
        if target is None:
            width = max(len(m.name) for m in manifests)
            for manifest in manifests:
                for stage in manifest.stages:
                    print(f"  build    {manifest.name:<{width}} stage{stage.index}  target unknown here")
            return 0
    else:
        from edgeserve.runtime.backends.tensorrt_build import detect_target

        target = detect_target(args.precision, args.device_id)
    plan = plan_builds(repository, manifests, target, args.max_batch, args.force, args.opt_batch)
    print(format_plan(plan, target))
    if args.dry_run:
        return 0
    timing_cache = args.timing_cache or default_timing_cache(repository, target)
    todo = [p for p in plan if p.action in ("build", "rebuild")]
    _build(repository, manifests, todo, target, args, timing_cache)
    return 0


def _local_target_or_none(precision: str, device_id: int) -> BuildTarget | None:
    """This machine's target, or None after saying why TensorRT is not usable here."""
    from edgeserve.runtime.backends.tensorrt_build import detect_target

    try:
        return detect_target(precision, device_id)
    except EdgeServeError as exc:
        print(f"no TensorRT target on this machine ({exc})", file=sys.stderr)
        print("every engine would be built; plan for a known machine with --target DEVICE:CC:TRT")
        return None


def _build(
    repository: ModelRepository,
    manifests: list[Manifest],
    todo: list[PlannedEngine],
    target: BuildTarget,
    args: argparse.Namespace,
    timing_cache: Path,
) -> None:
    from tqdm import tqdm

    from edgeserve.runtime.backends.engine_cache import batch_plan
    from edgeserve.runtime.backends.tensorrt_build import EngineBuilder

    if not todo:
        print("all engines are current; nothing to build (--force rebuilds them)")
        return
    builder = EngineBuilder(target, args.workspace_mib, timing_cache, args.device_id)
    by_name = {m.name: m for m in manifests}
    started = time.perf_counter()
    with tqdm(todo, desc="engines", unit="engine", file=sys.stderr) as bar:
        for item in bar:
            bar.set_postfix_str(f"{item.model} stage{item.stage}")
            manifest = by_name[item.model]
            onnx_path = repository.stage_path(manifest, item.stage)
            batches = item.batches or batch_plan(manifest, args.max_batch, args.opt_batch)
            record = builder.build(
                manifest, item.stage, onnx_path, batches.sizes, item.engine, batches.profile
            )
            record.save(item.record)
    print(f"built {len(todo)} engines in {time.perf_counter() - started:.0f} s; timing cache {timing_cache}")
