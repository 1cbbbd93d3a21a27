"""`edgeserve import`: any ONNX file -> a checked, served model in the repository.

The manifest comes from `edgeserve.onnx_graph.infer` (the same code the repository's auto-complete runs);
this module adds what writes: fixing `--shape` sizes into the copied graph, copying external data,
cutting the graph into stages (`--split-at`, edgeserve.importer.split) and checking that the chained
stages reproduce the whole graph.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from edgeserve import onnx_graph
from edgeserve.errors import RepositoryError, require_module
from edgeserve.files import sha256_file
from edgeserve.importer import split as splitting
from edgeserve.manifest import ExitSpec, Manifest, StageSpec, TensorSpec
from edgeserve.repository import ModelRepository

IMPORTER = "edgeserve import"
EXTERNAL_DATA_ABOVE = 1 << 30  # a graph bigger than this is saved with its weights in a .data file


@dataclass
class Imported:
    manifest: Manifest
    model_dir: Path
    notes: list[str] = field(default_factory=list)
    differences: list[tuple[str, float, float, bool]] = field(default_factory=list)


def load_proto(path: Path, external: bool = True) -> Any:
    """The ModelProto of `path` (with its external data when `external`), or one sentence saying why not."""
    require_module("onnx", IMPORTER)
    import onnx

    if not path.is_file():
        what = "a directory" if path.is_dir() else "no such file"
        raise RepositoryError(f"{path}: {what}: give the path of the .onnx file")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:
        model = None
    if model is None or not model.HasField("graph") or len(model.graph.node) == 0 or model.ir_version <= 0:
        raise RepositoryError(
            f"{path}: not an ONNX model (it does not parse as one, or holds no graph): give the .onnx file "
            "itself (not a folder, archive, or another framework's checkpoint; convert those to ONNX first)"
        )
    missing = missing_external_data(model, path.parent)
    if missing:
        raise RepositoryError(
            f"{path}: the graph keeps its weights in external data file(s) {', '.join(missing)}, which are "
            f"not next to it in {path.parent}: copy them there (the names are relative to the .onnx file)"
        )
    if external and external_files(model):
        from onnx.external_data_helper import load_external_data_for_model

        load_external_data_for_model(model, str(path.parent))
    return model


def _tensors(model: Any) -> list[Any]:
    from onnx.external_data_helper import _get_all_tensors

    return list(_get_all_tensors(model))


def external_files(model: Any) -> list[str]:
    import onnx

    names = []
    for tensor in _tensors(model):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            location = next((e.value for e in tensor.external_data if e.key == "location"), None)
            if location and location not in names:
                names.append(location)
    return names


def missing_external_data(model: Any, base: Path) -> list[str]:
    return [name for name in external_files(model) if not (base / name).is_file()]


def parse_shapes(texts: Sequence[str]) -> dict[str, tuple[int | None, ...]]:
    shapes: dict[str, tuple[int | None, ...]] = {}
    for text in texts:
        name, dims = onnx_graph.parse_shape_option(text)
        if name in shapes:
            raise RepositoryError(f"--shape {name}=... is given twice: give each input's shape once")
        shapes[name] = dims
    return shapes


def bake_shapes(model: Any, manifest: Manifest) -> None:
    """Write the fixed per-sample sizes into the graph's inputs; a dynamic batch dimension stays dynamic."""
    specs = {t.name: t for t in manifest.inputs}
    for value in model.graph.input:
        spec = specs.get(value.name)
        if spec is None:
            continue
        dims = value.type.tensor_type.shape.dim
        offset = 1 if spec.batched else 0
        for i, size in enumerate(spec.shape):
            dim = dims[i + offset]
            if not dim.HasField("dim_value"):
                dim.Clear()
                dim.dim_value = int(size)
        if spec.batched and manifest.batch is not None and not dims[0].HasField("dim_value"):
            dims[0].Clear()
            dims[0].dim_value = manifest.batch


def save_graph(model: Any, path: Path, external: bool) -> None:
    import onnx

    path.parent.mkdir(parents=True, exist_ok=True)
    if external or model.ByteSize() > EXTERNAL_DATA_ABOVE:
        onnx.save_model(model, str(path), save_as_external_data=True, location=f"{path.name}.data")
    else:
        onnx.save_model(model, str(path))


def copy_graph(source: Path, target: Path, locations: Sequence[str]) -> None:
    """Copy the file as it is, with its external data files (same relative names)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
    for name in locations:
        (target.parent / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source.parent / name, target.parent / name)


def stage_spec(
    path: Path,
    model_dir: Path,
    index: int,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    passes: Sequence[str],
) -> StageSpec:
    return StageSpec(
        index=index,
        path=path.relative_to(model_dir).as_posix(),
        sha256=sha256_file(path),
        size_bytes=path.stat().st_size,
        inputs=tuple(inputs),
        outputs=tuple(outputs),
        passes=tuple(passes),
    )


def import_model(
    source: Path,
    name: str,
    repository: ModelRepository,
    shapes: Mapping[str, Sequence[int | None]] | None = None,
    split_at: Sequence[str] = (),
    values: Mapping[str, float] | None = None,
    force: bool = False,
) -> Imported:
    """Check, copy and describe `source` as model `name`; nothing is written until every check passed."""
    shapes = dict(shapes or {})
    if not name or "/" in name or name.startswith("."):
        raise RepositoryError(f"--name {name!r}: a model name is a folder name: letters, digits, - _ .")
    model_dir = repository.model_dir(name)
    if repository.manifest_path(name).exists() and not force:
        raise RepositoryError(
            f"{model_dir}: a model named {name!r} is already there: add --force to replace it, or choose "
            "another --name"
        )
    source = Path(source)
    model = load_proto(source, external=False)
    locations = external_files(model)
    external = bool(locations)  # before loading the data: loading clears the locations
    if external and (shapes or split_at):
        from onnx.external_data_helper import load_external_data_for_model

        load_external_data_for_model(model, str(source.parent))
    notes: list[str] = []
    import onnx

    try:
        onnx.checker.check_model(str(source))
    except Exception as exc:  # ONNX Runtime decides below; the checker is stricter than it needs to be
        notes.append(f"onnx.checker complains ({' '.join(str(exc).split())[:160]}); ONNX Runtime runs it")
    info = {
        "imported_from": str(source.resolve()),
        "importer": IMPORTER,
        "sha256_original": sha256_file(source),
    }
    if shapes:
        info["shapes"] = "; ".join(f"{k}={','.join('N' if d is None else str(d) for d in v)}"
                                   for k, v in shapes.items())  # fmt: skip
    if values:
        info[onnx_graph.VALUES_KEY] = "; ".join(f"{k}={v}" for k, v in values.items())
    inference = onnx_graph.infer(source, name, shapes, values=values, source=info)
    manifest = inference.manifest
    notes += inference.notes
    repository.root.mkdir(parents=True, exist_ok=True)
    differences: list[tuple[str, float, float, bool]] = []
    with tempfile.TemporaryDirectory(prefix=f".{name}.", dir=repository.root) as tmp:
        staged = Path(tmp)
        if split_at:
            bake_shapes(model, manifest)
            manifest, differences = _split(model, manifest, inference, split_at, staged, external, values)
            bad = [row for row in differences if not row[3]]
            if bad:
                shown = "; ".join(f"{n}: max |diff| {d:.3g} > {t:.3g}" for n, d, t, _ in bad)
                raise RepositoryError(
                    f"--split-at {','.join(split_at)}: the chained stages do not reproduce the whole graph "
                    f"({shown}): choose other split tensors (`--list-tensors`) or report the graph"
                )
        else:
            target = staged / "onnx" / "stage0.onnx"
            if shapes:
                bake_shapes(model, manifest)
                save_graph(model, target, external)
                refusal = _runs(target, manifest, inference, values)
                if refusal is not None:
                    shutil.rmtree(target.parent)
                    copy_graph(source, target, locations)
                    notes.append(
                        "the --shape sizes are not written into the copied graph (ONNX Runtime refuses the "
                        f"graph with them: {refusal}); they are in the manifest"
                    )
            else:
                copy_graph(source, target, locations)
            stage = manifest.stages[0]
            manifest = replace(
                manifest, stages=(stage_spec(target, staged, 0, stage.inputs, stage.outputs, ()),)
            )
        manifest.validate(str(repository.manifest_path(name)))
        if model_dir.exists():
            shutil.rmtree(model_dir / "onnx", ignore_errors=True)
            repository.manifest_path(name).unlink(missing_ok=True)
        model_dir.mkdir(parents=True, exist_ok=True)
        shutil.move(str(staged / "onnx"), str(model_dir / "onnx"))
    repository.save_manifest(manifest)
    repository.verify(manifest)
    return Imported(manifest, model_dir, notes, differences)


def _runs(
    path: Path, manifest: Manifest, inference: onnx_graph.Inference, values: Mapping[str, float] | None
) -> str | None:
    """None when ONNX Runtime loads and runs `path` on the check inputs, else why not (briefly)."""
    feeds = onnx_graph.random_inputs(
        manifest.inputs, inference.input_shapes, inference.check_batch or 1, values=values
    )
    try:
        onnx_graph.session(path).run(None, feeds, onnx_graph.quiet_run())
    except Exception as exc:
        return " ".join(str(exc).split())[:200]
    return None


def _boundary_specs(
    model: Any, names: Sequence[str], values: Mapping[str, np.ndarray], manifest: Manifest, batch: int | None
) -> dict[str, TensorSpec]:
    """TensorSpecs of intermediate tensors, and their value_info written into `model` for the cut."""
    from onnx import helper

    inferred = {v.name: v for v in model.graph.value_info}
    specs: dict[str, TensorSpec] = {}
    model_batched = all(t.batched for t in [*manifest.inputs, *manifest.stages[0].outputs])
    for name in names:
        value = values[name]
        batched = model_batched and value.ndim > 0 and batch is not None and value.shape[0] == batch
        known: list[int | None] = [None] * value.ndim
        if name in inferred and inferred[name].type.tensor_type.HasField("shape"):
            dims = inferred[name].type.tensor_type.shape.dim
            if len(dims) == value.ndim:
                known = [d.dim_value if d.HasField("dim_value") else None for d in dims]
        shape: list[int | str] = []
        for i, size in enumerate(known):
            if i == 0 and batched:
                shape.append("batch" if manifest.batch is None else manifest.batch)
            else:
                shape.append(size if size is not None else f"{name}_dim{i}")
        elem = helper.np_dtype_to_tensor_dtype(value.dtype)
        info = helper.make_tensor_value_info(name, elem, shape)
        if name in inferred:
            inferred[name].CopyFrom(info)
        else:
            model.graph.value_info.append(info)
        rest = shape[1:] if batched else shape
        specs[name] = TensorSpec(
            name, tuple(s if isinstance(s, int) else -1 for s in rest), str(value.dtype), batched=batched
        )
    return specs


def _session(model_bytes: bytes) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])


def _split(
    model: Any,
    manifest: Manifest,
    inference: onnx_graph.Inference,
    split_at: Sequence[str],
    staged: Path,
    external: bool,
    values: Mapping[str, float] | None,
) -> tuple[Manifest, list[tuple[str, float, float, bool]]]:
    import onnx
    from onnx import helper, shape_inference
    from onnx.utils import Extractor

    with contextlib.suppress(Exception):  # the run below gives the dtypes; unknown sizes stay symbolic
        model = shape_inference.infer_shapes(model)
    plans = splitting.plan(model.graph, split_at)
    boundary = list(dict.fromkeys(n for p in plans[:-1] for n in p.outputs))
    # One run of the whole graph, the crossing tensors exposed as outputs: their dtypes and sizes, and the
    # reference outputs the chained stages must reproduce.
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    inferred = {v.name: v for v in probe.graph.value_info}
    for name in boundary:
        probe.graph.output.append(
            inferred[name] if name in inferred else helper.make_empty_tensor_value_info(name)
        )
    batch = inference.check_batch or 1
    feeds = onnx_graph.random_inputs(manifest.inputs, inference.input_shapes, batch, seed=1, values=values)
    try:
        names = [o.name for o in probe.graph.output]
        results = dict(zip(names, _session(probe.SerializeToString()).run(None, feeds), strict=True))
    except Exception as exc:
        raise onnx_graph.ort_failure(Path(manifest.source.get("imported_from", "graph")), exc) from None
    specs = _boundary_specs(model, boundary, results, manifest, inference.check_batch)
    for spec in manifest.inputs:
        specs[spec.name] = spec
    for spec in manifest.stages[0].outputs:
        specs[spec.name] = spec
    extractor = Extractor(model)
    stages: list[StageSpec] = []
    env: dict[str, np.ndarray] = dict(feeds)
    for p in plans:
        part = extractor.extract_model(list(p.inputs), list(p.outputs))
        if len(part.graph.node) != len(p.nodes):
            raise RepositoryError(
                f"--split-at {','.join(split_at)}: onnx's extractor cut stage {p.index} into "
                f"{len(part.graph.node)} nodes where {len(p.nodes)} were planned (a subgraph reads an outer "
                "tensor?): choose other split tensors"
            )
        path = staged / "onnx" / f"stage{p.index}.onnx"
        save_graph(part, path, external)
        last = p.index == len(plans) - 1
        passes = () if last else p.outputs
        stages.append(stage_spec(path, staged, p.index, [specs[n] for n in p.inputs],
                                 [specs[n] for n in p.outputs], passes))  # fmt: skip
        session = onnx_graph.session(path)
        out = session.run(list(p.outputs), {n: env[n] for n in p.inputs}, onnx_graph.quiet_run())
        env.update(zip(p.outputs, out, strict=True))
    whole = {name: results[name] for name in plans[-1].outputs}
    differences = splitting.compare(whole, env)
    exits = (ExitSpec(onnx_graph.EXIT_NAME, len(stages) - 1),)
    return replace(manifest, stages=tuple(stages), exits=exits), differences


def list_tensors(
    source: Path, shapes: Mapping[str, Sequence[int | None]]
) -> list[tuple[int, str, str, str, bool]]:
    """(node index, op type, tensor, shape, clean cut) of every tensor a node computes, in graph order.

    A clean cut: only that tensor crosses from the nodes up to it to the nodes after it.
    """
    from onnx import shape_inference

    model = load_proto(source, external=False)
    if shapes:
        for value in model.graph.input:
            given = shapes.get(value.name)
            if given is None:
                continue
            for dim, size in zip(value.type.tensor_type.shape.dim, given, strict=False):
                if size is not None and not dim.HasField("dim_value"):
                    dim.Clear()
                    dim.dim_value = int(size)
    with contextlib.suppress(Exception):  # shapes stay "?" where inference fails
        model = shape_inference.infer_shapes(model)
    g = splitting.Graph(model.graph)
    last_use: dict[str, int] = {}
    for index, reads in enumerate(g.reads):
        for name in reads:
            last_use[name] = index
    outputs = set(g.outputs)
    types = {v.name: v for v in [*model.graph.value_info, *model.graph.output]}
    live: set[str] = set()
    rows = []
    for index, node in enumerate(model.graph.node):
        for name in node.output:
            if name and (last_use.get(name, -1) > index or name in outputs):
                live.add(name)
        live = {n for n in live if last_use.get(n, -1) > index or n in outputs}
        for name in node.output:
            if not name:
                continue
            clean = live == {name} and name not in outputs
            rows.append((index, node.op_type, name, _show(types.get(name)), clean))
    return rows


def _show(value: Any) -> str:
    if value is None or not value.type.tensor_type.HasField("shape"):
        return "?"
    dims = [str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?")
            for d in value.type.tensor_type.shape.dim]  # fmt: skip
    return "[" + ", ".join(dims) + "]"
