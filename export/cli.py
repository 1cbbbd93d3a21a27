"""`edgeserve export`: torch early-exit models -> verified ONNX stages + manifest in the repository.

Imported whenever the `edgeserve` parser is built, so torch is imported only inside the handler.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
from pathlib import Path

from edgeserve.errors import EdgeServeError
from edgeserve.export.models import DIGITS, KNOWN_MODELS, ModelRequest
from edgeserve.repository import ModelRepository, default_root

DEFAULT_OPSET = 18  # keep equal to onnx_export.DEFAULT_OPSET (not imported: it pulls in torch)
DEMO_MODELS = DIGITS

EPILOG = f"""\
models: {", ".join(KNOWN_MODELS)}
  resnet50/101/152  early-exit ResNets (exits layer1, layer2, layer3, final) with seeded random
                    weights: for latency, not accuracy. --stem cifar (3x32x32, default) or imagenet
                    (3x224x224), --width scales every channel count (min 8), --num-classes.
  digits-s/m/l      small CNNs trained on scikit-learn's digits (exits stage1, stage2, stage3, final);
                    input (1, 16, 16): pixels/16, upsampled 2x. Their measured per-exit accuracy
                    goes into the manifest.

examples:
  edgeserve export --demo                                # digits-s/m/l into ./engines (skips up-to-date ones)
  edgeserve export --model resnet50 --width 0.25         # -> engines/resnet50-cifar-w0.25
  edgeserve export --model resnet152 --stem imagenet     # -> engines/resnet152-imagenet
  edgeserve export --model digits-m --eval-data-out digits-test.npz   # + eval set for --eval
  edgeserve export --module mymodels:build --name toy    # your own module (see edgeserve.export.early_exit)
  edgeserve export --demo --force --repository /data/engines

Each stage is exported separately (weights stored once), checked with onnx.checker and run in
ONNX Runtime against torch at every exit and batch size before anything is written.
"""


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "export",
        help="export early-exit torch models to ONNX stages in the model repository",
        description=(
            "Export early-exit torch models into the model repository: one ONNX graph per stage plus\n"
            "a manifest (input, exits, per-exit accuracy, checksums), verified against torch.\n"
            "An export that is already current is skipped unless --force.\n"
            "Needs the export extra: pip install 'edgeserve[export]'."
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    what = parser.add_argument_group("what to export")
    what.add_argument("--model", action="append", metavar="NAME", help="a model name (repeatable); see below")
    what.add_argument("--demo", action="store_true", help=f"the demo's models: {', '.join(DEMO_MODELS)}")
    what.add_argument(
        "--module", metavar="PKG.MOD:FACTORY", help="a callable returning a module that follows the contract"
    )
    what.add_argument("--name", help="repository name (one model only); default e.g. resnet50-cifar-w0.25")
    options = parser.add_argument_group("ResNet options")
    options.add_argument("--stem", choices=("cifar", "imagenet"), help="input stem (default: cifar)")
    options.add_argument("--width", type=float, help="channel width multiplier (default: 1.0)")
    options.add_argument("--num-classes", type=int, help="classes (default: 100 cifar, 1000 imagenet)")
    out = parser.add_argument_group("output and checks")
    out.add_argument(
        "--repository",
        type=Path,
        help="model repository root (default: $EDGESERVE_REPOSITORY, else ./engines)",
    )
    out.add_argument("--opset", type=int, default=DEFAULT_OPSET, help="ONNX opset (default: %(default)s)")
    out.add_argument(
        "--verify-batches",
        type=_batches,
        default=(1, 3, 10),
        metavar="B,B,...",
        help="batch sizes checked against torch (default: 1,3,10)",
    )
    out.add_argument(
        "--tolerance", type=float, default=1e-4, help="max |ORT - torch| logit error (default: 1e-4)"
    )
    out.add_argument("--force", action="store_true", help="re-export even if the existing export is current")
    out.add_argument(
        "--eval-data-out",
        type=Path,
        metavar="PATH",
        help="also write the digits test split as an eval .npz (x, y) for edgeserve-profile --eval",
    )
    parser.set_defaults(func=run)
    return parser


def _batches(text: str) -> tuple[int, ...]:
    try:
        batches = tuple(int(b) for b in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated batch sizes like 1,3,10, got {text!r}"
        ) from None
    if not batches or min(batches) < 1:
        raise argparse.ArgumentTypeError(f"batch sizes must be >= 1, got {text!r}")
    return batches


def requests_from_args(args: argparse.Namespace) -> list[ModelRequest]:
    """Validated requests (no torch needed): --model, --demo and --module combined, in order."""
    names = list(args.model or []) + (list(DEMO_MODELS) if args.demo else [])
    requests = [
        ModelRequest(model=n, stem=args.stem, width=args.width, num_classes=args.num_classes)
        for n in dict.fromkeys(names)
    ]
    if args.module:
        requests.append(ModelRequest(module=args.module))
    if args.name:
        if len(requests) != 1:
            raise EdgeServeError(f"--name names one model, but {len(requests)} are requested")
        requests = [dataclasses.replace(requests[0], name=args.name)]
    for request in requests:
        request.validate()
    return requests


def _require(packages: tuple[str, ...]) -> None:
    missing = []
    for package in packages:
        try:
            importlib.import_module(package)
        except ImportError:
            missing.append(package)
    if missing:
        raise EdgeServeError(
            f"`edgeserve export` needs {', '.join(missing)}, which is not installed here; "
            "install the export extra: pip install 'edgeserve[export]'"
        )


def run(args: argparse.Namespace) -> int:
    requests = requests_from_args(args)
    if not requests and args.eval_data_out is None:
        raise EdgeServeError(
            "nothing to export: give --model NAME, --demo or --module PKG.MOD:FACTORY (see --help)"
        )
    if args.eval_data_out is not None and any(r.model not in DIGITS for r in requests):
        raise EdgeServeError("--eval-data-out writes the digits test split: use it with digits models only")
    _require(("torch", "onnx", "onnxscript", "sklearn") if requests else ("sklearn",))
    repository = ModelRepository(args.repository or default_root())
    for request in requests:
        _export_one(request, repository, args)
    if args.eval_data_out is not None:
        from edgeserve.export.digits_data import write_eval_data

        path = write_eval_data(args.eval_data_out)
        print(f"wrote the digits test split to {path} (x float32 (N, 1, 16, 16), y int64)")
    return 0


def _export_one(request: ModelRequest, repository: ModelRepository, args: argparse.Namespace) -> None:
    from edgeserve.export.models import build_model
    from edgeserve.export.onnx_export import current_export, export_model
    from edgeserve.export.state_npz import state_sha256

    name = request.repository_name()
    built = build_model(request)
    spec = request.spec()
    expected = {**spec, "opset": str(args.opset), "weights_sha256": state_sha256(built.module)}
    if not args.force:
        manifest, reason = current_export(repository, name, expected)
        if manifest is not None:
            print(f"{name}: {reason}; skipped ({repository.model_dir(name)}; --force re-exports)")
            return
        print(f"{name}: exporting ({reason})")
    manifest = export_model(
        built.module,
        name,
        repository,
        opset=args.opset,
        verify_batches=args.verify_batches,
        tolerance=args.tolerance,
        accuracy=built.accuracy,
        accuracy_dataset=built.accuracy_dataset,
        source_info=spec,
    )
    sizes = ", ".join(f"{s.size_bytes / 1024:.0f}" for s in manifest.stages)
    exits = ", ".join(e.name if e.accuracy is None else f"{e.name} {e.accuracy:.1%}" for e in manifest.exits)
    where = f" on {manifest.accuracy_dataset}" if manifest.accuracy_dataset else ""
    where_to = repository.model_dir(name)
    print(f"{name}: wrote {where_to} ({len(manifest.stages)} stages, KiB {sizes}); exits {exits}{where}")
