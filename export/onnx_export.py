"""Export an early-exit model as one ONNX graph per stage, verified, into the model repository.

Per-stage graphs keep a single copy of the weights (per-exit graphs would repeat every shallow
stage once per deeper exit); the runtime chains them. Stages are written to a staging folder,
checked with onnx.checker, run in ONNX Runtime against torch at every exit and batch size, and
only then renamed into `<root>/<name>/onnx/` and described by a fresh manifest. A failed export
leaves the previous one untouched.

Exporter: torch.onnx.export(dynamo=True), torch 2.13's default and maintained path. It gives the
batch dimension the symbolic name "batch" from `dynamic_shapes`, folds BatchNorm into the
convolutions (inference form) and, with external_data=False, keeps the weights inside each file.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import onnx
import torch
from onnx.external_data_helper import uses_external_data
from torch import nn

from edgeserve.errors import RepositoryError
from edgeserve.export.early_exit import EarlyExitModel, exit_stages, forward_exit, stage_graphs
from edgeserve.export.errors import ExportError
from edgeserve.export.models import MODEL_NAME
from edgeserve.export.state_npz import state_sha256
from edgeserve.export.verify import compare_with_torch, format_checks
from edgeserve.files import sha256_file
from edgeserve.manifest import ExitSpec, Manifest, StageSpec, TensorSpec
from edgeserve.repository import ModelRepository

DEFAULT_OPSET = 18
DEFAULT_VERIFY_BATCHES = (1, 3, 10)
DEFAULT_TOLERANCE = 1e-4
ONNX_DIR = "onnx"
EXPORTER = "torch.onnx.export(dynamo=True)"

Log = Callable[[str], None]


@dataclass(frozen=True)
class _StageShapes:
    input: tuple[int, ...]
    features: tuple[int, ...] | None
    logits: tuple[int, ...] | None


def export_model(
    model: EarlyExitModel,
    name: str,
    repository: ModelRepository,
    *,
    opset: int = DEFAULT_OPSET,
    verify_batches: Sequence[int] = DEFAULT_VERIFY_BATCHES,
    tolerance: float = DEFAULT_TOLERANCE,
    accuracy: Sequence[float] | None = None,
    accuracy_dataset: str | None = None,
    source_info: Mapping[str, str] | None = None,
    log: Log | None = print,
) -> Manifest:
    """Export, check and verify every stage, then write `<root>/<name>/` and return its manifest.

    `accuracy`: measured top-1 per exit (fractions 0..1), written into the manifest with
    `accuracy_dataset`. `source_info`: extra provenance (e.g. the model spec) for the manifest.
    Raises ExportError if the contract is broken or ONNX Runtime differs from torch by more than
    `tolerance` (max abs logit difference) at any exit and batch size.
    """
    stages = exit_stages(model)
    if not MODEL_NAME.match(name):
        raise ExportError(
            f"model name {name!r} is not a valid folder name (use letters, digits, '.', '_', '-')"
        )
    if accuracy is not None and len(accuracy) != len(stages):
        raise ExportError(f"{len(accuracy)} accuracies given for the {len(stages)} exits {model.exit_names}")
    if not verify_batches or min(verify_batches) < 1:
        raise ExportError(f"verify_batches must be positive batch sizes, got {list(verify_batches)}")
    model.eval()
    shapes = _stage_shapes(model)
    model_dir = repository.model_dir(name)
    created = not model_dir.exists()
    model_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".export-", dir=model_dir))
    try:
        paths = [staging / f"stage{k}.onnx" for k in range(len(shapes))]
        for k, (graph, path) in enumerate(zip(stage_graphs(model), paths, strict=True)):
            _export_graph(graph, shapes[k].input, path, graph.output_names, opset, where=f"{name} stage {k}")
        checks = compare_with_torch(model, paths, verify_batches)
        if log:
            log(f"{name}: max |onnxruntime - torch| of the logits, per exit and batch size")
            log(format_checks(checks))
        worst = max(checks, key=lambda c: c.max_abs_diff)
        if not worst.max_abs_diff <= tolerance:
            raise ExportError(
                f"{name}: ONNX Runtime differs from torch by {worst.max_abs_diff:.2e} at exit "
                f"{worst.exit_name!r}, batch {worst.batch} (tolerance {tolerance:.0e}); "
                f"nothing was written to {model_dir}. "
                "Check the model for train-mode layers or ops the exporter does not support."
            )
        final_paths = _install(paths, repository, name)
    except BaseException:
        shutil.rmtree(model_dir if created else staging, ignore_errors=True)
        raise
    shutil.rmtree(staging, ignore_errors=True)
    source = {
        "exporter": EXPORTER,
        "torch": torch.__version__,
        "onnx": onnx.__version__,
        "onnxscript": _version("onnxscript"),
        "onnxruntime": _version("onnxruntime"),
        "opset": str(opset),
        "weights_sha256": state_sha256(model),
        "verified": (
            f"max |onnxruntime - torch| {worst.max_abs_diff:.1e} over every exit at batches "
            f"{','.join(map(str, verify_batches))} (tolerance {tolerance:.0e})"
        ),
        **{str(k): str(v) for k, v in (source_info or {}).items()},
    }
    exits = tuple(
        ExitSpec(name=n, stage=s, accuracy=None if accuracy is None else float(accuracy[i]))
        for i, (n, s) in enumerate(zip(model.exit_names, stages, strict=True))
    )
    manifest = Manifest(
        name=name,
        inputs=(TensorSpec("x", tuple(model.input_shape)),),
        num_classes=model.num_classes,
        stages=tuple(_stage_spec(k, s, p) for k, (s, p) in enumerate(zip(shapes, final_paths, strict=True))),
        exits=exits,
        accuracy_dataset=accuracy_dataset if accuracy is not None else None,
        source=source,
    )
    repository.save_manifest(manifest)
    return manifest


def _stage_spec(index: int, shapes: _StageShapes, path: Path) -> StageSpec:
    return StageSpec.chain(
        index=index,
        path=f"{ONNX_DIR}/{path.name}",
        sha256=sha256_file(path),
        size_bytes=path.stat().st_size,
        input=TensorSpec("x", shapes.input),
        logits=TensorSpec("logits", shapes.logits) if shapes.logits else None,
        features=TensorSpec("features", shapes.features) if shapes.features else None,
    )


def current_export(
    repository: ModelRepository, name: str, expected_source: Mapping[str, str]
) -> tuple[Manifest | None, str]:
    """The existing manifest if it is still current, else None; with the reason either way.

    Current means: the manifest loads, every stage file matches its size and checksum, and each
    `expected_source` entry (weights checksum, opset, model spec) equals what the manifest records.
    """
    if not repository.manifest_path(name).exists():
        return None, "not exported yet"
    try:
        manifest = repository.load_manifest(name, verify=True)
    except RepositoryError as exc:
        return None, f"existing export is unusable ({exc})"
    for key, value in expected_source.items():
        if manifest.source.get(key) != value:
            return None, f"{key} changed ({manifest.source.get(key)!r} -> {value!r})"
    return manifest, "up to date: graphs verify and the weights are unchanged"


def export_monolithic_exits(
    model: EarlyExitModel, out_dir: Path, *, opset: int = DEFAULT_OPSET
) -> dict[str, int]:
    """The wasteful scheme, for comparison: one self-contained graph per exit.

    Writes `<out_dir>/exit-<name>.onnx` (stages 0..k and head k in one file) and returns each
    file's size in bytes; every shallow stage's weights are repeated in every deeper exit's file.
    """
    exit_stages(model)
    model.eval()
    out_dir.mkdir(parents=True, exist_ok=True)
    sizes = {}
    for index, name in enumerate(model.exit_names):
        path = out_dir / f"exit-{name}.onnx"
        _export_graph(
            _ExitGraph(model, index), tuple(model.input_shape), path, ["logits"], opset, f"exit {name}"
        )
        sizes[name] = path.stat().st_size
    return sizes


class _ExitGraph(nn.Module):
    def __init__(self, model: EarlyExitModel, exit_index: int) -> None:
        super().__init__()
        self.model = model
        self.exit_index = exit_index

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return forward_exit(self.model, x, self.exit_index)


@torch.no_grad()
def _stage_shapes(model: EarlyExitModel) -> list[_StageShapes]:
    """Per-sample input/features/logits shapes of every stage, from one torch pass at batch 2."""
    x = torch.zeros(2, *model.input_shape)
    shapes = []
    for k, graph in enumerate(stage_graphs(model)):
        out = graph(x)
        outputs = dict(zip(graph.output_names, out if isinstance(out, tuple) else (out,), strict=True))
        features, logits = outputs.get("features"), outputs.get("logits")
        if logits is not None and tuple(logits.shape) != (2, model.num_classes):
            raise ExportError(
                f"{type(model).__name__}: head {k} gives logits of shape {tuple(logits.shape[1:])} "
                f"per sample, expected ({model.num_classes},) (num_classes)"
            )
        shapes.append(
            _StageShapes(
                input=tuple(x.shape[1:]),
                features=None if features is None else tuple(features.shape[1:]),
                logits=None if logits is None else (model.num_classes,),
            )
        )
        if features is not None:
            x = features
    return shapes


def _export_graph(
    module: nn.Module,
    input_shape: tuple[int, ...],
    path: Path,
    output_names: list[str],
    opset: int,
    where: str,
) -> None:
    """torch.onnx.export with a dynamic batch dim named "batch", weights inside, then onnx.checker."""
    example = torch.zeros(2, *input_shape)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with _quiet_exporter():
            program = torch.onnx.export(
                module,
                (example,),
                dynamo=True,
                input_names=["x"],
                output_names=output_names,
                dynamic_shapes={"x": {0: torch.export.Dim("batch", min=1)}},
                opset_version=opset,
                verbose=False,
            )
            assert program is not None
            program.save(tmp, external_data=False)
    except Exception as exc:  # the exporter raises many types; name the stage and keep the cause
        raise ExportError(f"{where}: torch.onnx.export failed: {type(exc).__name__}: {exc}") from exc
    tmp.replace(path)
    _check_graph(path, output_names, where)


def _check_graph(path: Path, output_names: list[str], where: str) -> None:
    try:
        onnx.checker.check_model(str(path), full_check=True)
    except onnx.checker.ValidationError as exc:
        raise ExportError(f"{where}: {path.name} fails onnx.checker: {exc}") from exc
    proto = onnx.load(str(path), load_external_data=False)
    if any(uses_external_data(t) for t in proto.graph.initializer):
        raise ExportError(
            f"{where}: {path.name} keeps weights in an external file; they must be inside the .onnx"
        )
    inputs = [i.name for i in proto.graph.input]
    outputs = [o.name for o in proto.graph.output]
    batch = [d.dim_param for d in proto.graph.input[0].type.tensor_type.shape.dim][:1]
    if inputs != ["x"] or outputs != output_names or batch != ["batch"]:
        raise ExportError(
            f"{where}: {path.name} has inputs {inputs}, outputs {outputs}, batch dim {batch}; "
            f"expected ['x'], {output_names}, ['batch']"
        )


def _install(paths: list[Path], repository: ModelRepository, name: str) -> list[Path]:
    """Move verified stages into place. The old manifest goes first, so an interrupted install reads
    as 'not exported' rather than as a manifest that lies about its graphs."""
    repository.manifest_path(name).unlink(missing_ok=True)
    onnx_dir = repository.model_dir(name) / ONNX_DIR
    onnx_dir.mkdir(exist_ok=True)
    keep = {p.name for p in paths}
    for stale in onnx_dir.glob("stage*.onnx*"):
        if stale.name not in keep:
            stale.unlink()
    final = []
    for path in paths:
        target = onnx_dir / path.name
        path.replace(target)
        final.append(target)
    return final


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """The dynamo exporter logs progress and warnings (e.g. torchvision not installed): silence them."""
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "unknown"
