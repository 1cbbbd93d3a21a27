"""`edgeserve import`: serve an ONNX file from anywhere (a detector, an OCR model, another framework's).

Imported whenever the `edgeserve` parser is built: onnx is imported only inside the handler.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from edgeserve.errors import RepositoryError
from edgeserve.manifest import TensorSpec
from edgeserve.repository import ModelRepository, default_root

EPILOG = """\
shapes:
  The first dimension of an input is its batch dimension when it is dynamic; a model whose inputs
  all have the same fixed first dimension N is served at batch N. Every other dynamic dimension
  needs a size: --shape INPUT=D0,D1,... gives the FULL shape, the batch entry written -1, N or a
  number (it stays dynamic either way). An input with a fixed first dimension beside dynamic ones,
  or a scalar, is unbatched: the model is then served one sample at a time. Output dimensions the
  graph declares dynamic are recorded as -1 (they vary). docs/bring-your-own-model.md has the rules.

examples:
  edgeserve import classifier.onnx --name orient --repository engines
  edgeserve import det.onnx --name textdet --shape x=N,3,640,640
  edgeserve import vad.onnx --name vad --shape input=N,512 --shape state=2,1,128 --value sr=16000
  edgeserve import classifier.onnx --list-tensors                # where to split
  edgeserve import classifier.onnx --name orient-ee --split-at t1,t2   # 3 stages, checked against the whole

--split-at cuts the graph into consecutive stages at the named intermediate tensors (in graph order)
and checks that the chained stages reproduce the whole graph's outputs on random inputs (max |diff|
within 1e-4 x max(1, max |output|) per output). Only the last stage has an exit ("output").
"""


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "import",
        help="import an ONNX file from anywhere into the model repository (any inputs and outputs)",
        description=(
            "Check an ONNX file (it loads and runs once in ONNX Runtime on random inputs), read its\n"
            "inputs and outputs, copy it (with external data) into the repository and write its manifest.\n"
            "Needs the onnx package: pip install 'edgeserve[export]'."
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("file", type=Path, metavar="FILE.onnx", help="the ONNX graph")
    parser.add_argument("--name", help="the model's name in the repository (its folder)")
    parser.add_argument(
        "--repository",
        type=Path,
        help="model repository root (default: $EDGESERVE_REPOSITORY, else ./engines)",
    )
    parser.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="INPUT=D0,D1,...",
        help="the full shape of an input with dynamic dimensions (repeatable); batch entry -1 or N",
    )
    parser.add_argument(
        "--value",
        action="append",
        default=[],
        metavar="INPUT=V",
        help="fill an input with V in the check runs instead of random values (e.g. sr=16000)",
    )
    parser.add_argument(
        "--split-at",
        metavar="TENSOR[,TENSOR...]",
        help="cut the graph into consecutive stages at these intermediate tensors",
    )
    parser.add_argument(
        "--list-tensors",
        action="store_true",
        help="list the tensors the graph computes (candidate split points) and exit",
    )
    parser.add_argument("--force", action="store_true", help="replace a model of that name")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from edgeserve import onnx_graph
    from edgeserve.importer import core

    shapes = core.parse_shapes(args.shape)
    if args.list_tensors:
        return _list(args.file, shapes)
    if not args.name:
        raise RepositoryError(
            f"edgeserve import {args.file}: give the model a name with --name NAME "
            "(its folder in the repository)"
        )
    values = dict(onnx_graph.parse_value_option(v) for v in args.value)
    split_at = [t.strip() for t in (args.split_at or "").split(",") if t.strip()]
    repository = ModelRepository(args.repository if args.repository is not None else default_root())
    done = core.import_model(args.file, args.name, repository, shapes, split_at, values, force=args.force)
    manifest = done.manifest
    batch = {None: "at any batch size", 1: "one sample at a time"}.get(
        manifest.max_batch, f"at batch {manifest.max_batch}"
    )
    count = len(manifest.stages)
    stages = f"{count} stage{'s' * (count > 1)}"
    print(f"imported {args.file} as {manifest.name!r} into {done.model_dir} ({stages}, served {batch})")
    rows = [("input", t) for t in manifest.inputs] + [("output", t) for t in manifest.stages[-1].outputs]
    width = max(len(t.name) for _, t in rows)
    for kind, t in rows:
        print(f"  {kind:<7}{t.name:<{width}}  {t.dtype:<8} {_shape(t, manifest.batch)}")
    if count > 1:
        for stage in manifest.stages:
            takes = ", ".join(t.name for t in stage.inputs)
            gives = ", ".join(stage.passes) or "the outputs (exit 'output')"
            print(f"  stage {stage.index}  {Path(stage.path).name}: {takes} -> {gives}")
        for name, diff, tol, _ in done.differences:
            print(f"  chained stages vs whole graph: {name} max |diff| {diff:.3g} (tolerance {tol:.3g})")
    for note in done.notes:
        print(f"  note: {note}")
    root = shlex.quote(str(repository.root))
    print("next:")
    print(f"  edgeserve-profile --model {shlex.quote(manifest.name)} --repository {root}")
    print(f"  edgeserve serve --config serve.toml   # repository = {root}, [models.{manifest.name}] slo_ms")
    return 0


def _shape(t: TensorSpec, batch: int | None) -> str:
    """The graph's shape: N for a dynamic batch, the fixed batch size, ? for a size that varies."""
    dims = ["?" if d == -1 else str(d) for d in t.shape]
    first = ["N" if batch is None else str(batch)] if t.batched else []
    return "[" + ", ".join(first + dims) + "]" + ("" if t.batched else "  (unbatched)")


def _list(path: Path, shapes: dict[str, tuple[int | None, ...]]) -> int:
    from edgeserve.importer import core

    rows = core.list_tensors(path, shapes)
    width = max((len(r[2]) for r in rows), default=6)
    ops = max((len(r[1]) for r in rows), default=2)
    print(f"tensors of {path} in graph order ('*': a clean cut, only that tensor crosses it)")
    print(f"  {'node':>5}  {'op':<{ops}}  {'tensor':<{width}}  shape")
    for index, op, name, shape, clean in rows:
        print(f"{'*' if clean else ' '} {index:>5}  {op:<{ops}}  {name:<{width}}  {shape}")
    clean = sum(1 for r in rows if r[4])
    print(f"{clean} clean cut points; split with --split-at NAME[,NAME...] in graph order")
    return 0
