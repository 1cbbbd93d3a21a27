"""Read any ONNX graph's inputs and outputs and infer the manifest that serves it as it is.

`edgeserve import` and the repository's auto-complete (a model folder holding one `.onnx` file and no
manifest) share this code, so both infer the same manifest. It needs only ONNX Runtime (always
installed), not the `onnx` package: the graph is read through an `InferenceSession`, which also proves
that ONNX Runtime can run it.

The rules (docs/bring-your-own-model.md):

- The first dimension of an input is its batch dimension when it is dynamic (symbolic or unknown). When
  every input has one, the model takes any batch (`batch` None); when every input has the same fixed
  first dimension N, it takes batch N. An input with a fixed first dimension beside dynamic ones, or a
  rank-0 input, is unbatched (its whole shape per request), and the model is served one sample at a time.
- Every other dynamic input dimension must be fixed (`--shape INPUT=D0,D1,...`, the full shape; the
  batch entry may be -1, N or a number).
- An output is batched when the model is batched and its first dimension is dynamic (or N); its other
  dimensions that the graph declares dynamic are recorded as -1 (they vary). One run at batch 2 (or N)
  checks that batched outputs do follow the batch; when one does not, the model is served at batch 1.
"""

from __future__ import annotations

import difflib
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgeserve.errors import RepositoryError
from edgeserve.files import sha256_file
from edgeserve.manifest import ExitSpec, Manifest, StageSpec, TensorSpec

# ONNX Runtime's type strings -> numpy dtype names.
ORT_DTYPES = {
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
    "tensor(double)": "float64",
    "tensor(int8)": "int8",
    "tensor(int16)": "int16",
    "tensor(int32)": "int32",
    "tensor(int64)": "int64",
    "tensor(uint8)": "uint8",
    "tensor(uint16)": "uint16",
    "tensor(bool)": "bool",
}
EXIT_NAME = "output"
BATCH_WORDS = ("-1", "N", "n", "batch")
CHECK_BATCH = 2  # the batch the check run uses when the batch is dynamic

Dim = int | None  # None: dynamic (symbolic or unknown)


@dataclass(frozen=True)
class GraphTensor:
    """A graph input or output as the graph declares it: `dims` keeps symbolic names as str."""

    name: str
    dtype: str
    dims: tuple[int | str | None, ...]

    @property
    def fixed(self) -> tuple[Dim, ...]:
        return tuple(d if isinstance(d, int) and d >= 0 else None for d in self.dims)

    def show(self) -> str:
        return "[" + ", ".join("?" if d is None else str(d) for d in self.dims) + "]"


@dataclass
class Inference:
    """What was inferred: the manifest, the full input shapes of the check run and notes to print."""

    manifest: Manifest
    graph_inputs: tuple[GraphTensor, ...]
    graph_outputs: tuple[GraphTensor, ...]
    input_shapes: dict[str, tuple[int, ...]]  # full shapes, batch entry -1 where dynamic
    check_batch: int | None
    notes: list[str] = field(default_factory=list)


def ort_failure(path: Path, exc: Exception, provider: str = "CPUExecutionProvider") -> RepositoryError:
    """One sentence for ONNX Runtime refusing a graph: the operator and opset when it names one."""
    text = " ".join(str(exc).split())
    missing = re.search(r"Could not find an implementation for (\w+)\((\d+)\)", text)
    if missing is None:
        missing = re.search(r"(?:[\w.]+:)?(\w+)\((-?\d+)\) is not a registered function/op", text)
    if missing is not None or "NOT_IMPLEMENTED" in text:
        what = f"operator {missing.group(1)} (opset {missing.group(2)})" if missing else "an operator"
        return RepositoryError(
            f"{path}: ONNX Runtime ({provider}) has no implementation of {what}: re-export the model with "
            "a lower opset (or without that operator), or serve it with a provider that has it"
        )
    brief = text if len(text) <= 300 else text[:297] + "..."
    return RepositoryError(
        f"{path}: ONNX Runtime cannot load this graph ({brief}): check that it is a complete ONNX model "
        "(re-export it, or copy it again)"
    )


def session(path: Path, threads: int = 1) -> Any:
    """A CPU InferenceSession of `path`, or RepositoryError naming what ONNX Runtime refused."""
    import onnxruntime as ort

    if not path.is_file():
        raise RepositoryError(f"{path}: no such file: check the path")
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    try:
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # ORT raises its own Fail/InvalidGraph/NotImplemented/InvalidProtobuf
        text = str(exc)
        if "INVALID_PROTOBUF" in text or "Protobuf parsing failed" in text:
            raise RepositoryError(
                f"{path}: not an ONNX model (the file does not parse as one): give the .onnx file itself "
                "(not a folder, archive or another framework's checkpoint)"
            ) from None
        if "external" in text.lower() and ("not exist" in text or "No such file" in text or "open" in text):
            raise RepositoryError(
                f"{path}: the graph's weights are in an external data file that is missing "
                f"({' '.join(text.split())[-200:]}): copy the .data file(s) next to the .onnx file"
            ) from None
        raise ort_failure(path, exc) from None


def graph_tensors(sess: Any, path: Path) -> tuple[tuple[GraphTensor, ...], tuple[GraphTensor, ...]]:
    """The declared inputs and outputs of a session; RepositoryError for a type edgeserve cannot carry."""

    def one(arg: Any, kind: str) -> GraphTensor:
        dtype = ORT_DTYPES.get(arg.type)
        if dtype is None:
            hint = " (skl2onnx: options={id(model): {'zipmap': False}})" if "map(" in arg.type else ""
            raise RepositoryError(
                f"{path}: {kind} {arg.name!r} is of type {arg.type}, not a tensor of "
                f"{', '.join(ORT_DTYPES.values())}, which is what edgeserve carries: re-export the model "
                f"so that every {kind} is such a tensor{hint}"
            )
        dims = tuple(d if isinstance(d, (int, str)) or d is None else None for d in (arg.shape or ()))
        return GraphTensor(arg.name, dtype, dims)

    return (
        tuple(one(a, "input") for a in sess.get_inputs()),
        tuple(one(a, "output") for a in sess.get_outputs()),
    )


VALUES_KEY = "values"  # manifest.source entry: the --value constants, "sr=16000; ..."


def recorded_values(manifest: Manifest) -> dict[str, float]:
    """The --value constants the model was imported with: inputs that random values would break
    (a sample rate, a class id), so profiling and warm-up feed them too."""
    text = manifest.source.get(VALUES_KEY, "")
    return dict(parse_value_option(part.strip()) for part in text.split(";") if part.strip())


def parse_value_option(text: str) -> tuple[str, float]:
    """`INPUT=V` -> (name, V): the constant an input is filled with in the check runs."""
    name, sep, word = text.rpartition("=")
    try:
        if not sep or not name:
            raise ValueError
        return name, float(word) if any(c in word for c in ".eE") else int(word)
    except ValueError:
        raise RepositoryError(f"--value {text!r}: write INPUT=NUMBER, e.g. --value sr=16000") from None


def parse_shape_option(text: str) -> tuple[str, tuple[int | None, ...]]:
    """`INPUT=D0,D1,...` -> (name, dims); a batch entry -1/N/batch reads as None (dynamic)."""
    name, sep, dims = text.rpartition("=")
    if not sep or not name or not dims:
        raise RepositoryError(
            f"--shape {text!r}: write INPUT=D0,D1,... with the full shape, e.g. --shape x=N,3,224,224"
        )
    out: list[int | None] = []
    for word in dims.split(","):
        word = word.strip()
        if word in BATCH_WORDS:
            out.append(None)
        elif word.isdigit() and int(word) > 0:
            out.append(int(word))
        else:
            raise RepositoryError(
                f"--shape {text!r}: {word!r} is not a size: write positive integers (the batch entry "
                "may be -1 or N), e.g. --shape x=N,3,224,224"
            )
    return name, tuple(out)


def _suggest(tensor: GraphTensor, batched: bool) -> str:
    """A full `--shape` value with every dynamic dimension filled by a plausible size."""
    fixed = tensor.fixed
    words: list[str] = []
    for i, d in enumerate(fixed):
        if i == 0 and batched and d is None:
            words.append("N")
        elif d is not None:
            words.append(str(d))
        elif len(fixed) == 4 and i in (2, 3):
            other = fixed[5 - i]
            words.append(str(other) if other is not None else "224")
        else:
            words.append("1")
    return f"{tensor.name}={','.join(words)}"


def _check_names(option: str, given: Mapping[str, Any], names: Sequence[str]) -> None:
    for name in given:
        if name not in names:
            close = difflib.get_close_matches(name, names, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise RepositoryError(
                f"{option} {name}=...: the model has no input {name!r}; {hint}"
                f"its inputs are {', '.join(names)}"
            )


def quiet_run() -> Any:
    """RunOptions that keep ONNX Runtime from logging a failing node on stderr (the error says it)."""
    import onnxruntime as ort

    options = ort.RunOptions()
    options.log_severity_level = 4
    return options


def _fix_shapes(
    inputs: Sequence[GraphTensor], shapes: Mapping[str, Sequence[int | None]], path: Path
) -> list[tuple[Dim, ...]]:
    """Each input's dims with the `--shape` values applied (None stays dynamic)."""
    _check_names("--shape", shapes, [t.name for t in inputs])
    out = []
    for t in inputs:
        dims = t.fixed
        given = shapes.get(t.name)
        if given is not None:
            if len(given) != len(dims):
                raise RepositoryError(
                    f"--shape {t.name}=...: input {t.name!r} has rank {len(dims)} ({t.show()}), the option "
                    f"gives {len(given)} sizes: write its full shape, e.g. --shape {_suggest(t, True)}"
                )
            merged: list[Dim] = []
            for i, (d, g) in enumerate(zip(dims, given, strict=True)):
                if d is not None and g is not None and d != g:
                    raise RepositoryError(
                        f"--shape {t.name}=...: dimension {i} of input {t.name!r} is fixed at {d} in "
                        f"{path.name}, the option says {g}: write {d} there"
                    )
                merged.append(d if d is not None else g)
            dims = tuple(merged)
        out.append(dims)
    return out


def infer(
    path: Path,
    name: str,
    shapes: Mapping[str, Sequence[int | None]] | None = None,
    *,
    stage_path: str | None = None,
    fix: str | None = None,
    check: bool = True,
    source: Mapping[str, str] | None = None,
    seed: int = 0,
    values: Mapping[str, float] | None = None,
) -> Inference:
    """The manifest that serves `path` as one stage with one exit named "output".

    `fix` is the fix the message for an unfixed dynamic dimension gives, `{shape}` standing for the
    suggested `INPUT=D0,D1,...` (default: "add --shape {shape}").
    `check` runs the graph once on random inputs to confirm batched outputs follow the batch;
    `values` fills named inputs with a constant instead (an audio model's sample rate, say).
    """
    shapes = dict(shapes or {})
    sess = session(path)
    inputs, outputs = graph_tensors(sess, path)
    if not inputs:
        raise RepositoryError(f"{path}: the graph has no inputs; edgeserve serves graphs that take a tensor")
    dims = _fix_shapes(inputs, shapes, path)
    _check_names("--value", values or {}, [t.name for t in inputs])
    # The batch rule reads the graph's own first dimensions, before --shape.
    declared = [t.fixed for t in inputs]
    dynamic_first = [len(d) > 0 and d[0] is None for d in declared]
    firsts = {d[0] for d in declared if d}
    batch: int | None = None
    if any(dynamic_first):
        batched_in = dynamic_first
    elif all(len(d) > 0 for d in declared) and len(firsts) == 1:
        batch = firsts.pop()
        batched_in = [True] * len(inputs)
    else:
        batched_in = [False] * len(inputs)
    fix = fix if fix is not None else "add --shape {shape}"
    specs: list[TensorSpec] = []
    full: dict[str, tuple[int, ...]] = {}
    for t, d, b in zip(inputs, dims, batched_in, strict=True):
        rest = d[1:] if b else d
        for i, size in enumerate(rest):
            if size is None:
                index = i + 1 if b else i
                label = t.dims[index]
                label = f" ({label!r})" if isinstance(label, str) else ""
                raise RepositoryError(
                    f"{path}: dimension {index}{label} of input {t.name!r} {t.show()} is dynamic and is not "
                    f"the batch dimension, so edgeserve needs its size: "
                    + fix.format(shape=_suggest(t, b))
                    + (
                        " (with the size you will send; the batch entry stays N)"
                        if b and batch is None
                        else " (with the size you will send)"
                    )
                )
        per_sample = tuple(int(s) for s in rest)  # type: ignore[arg-type]
        specs.append(TensorSpec(t.name, per_sample, t.dtype, batched=b))
        full[t.name] = ((-1 if batch is None else batch), *per_sample) if b else per_sample
    model_batched = all(batched_in)
    outs: list[TensorSpec] = []
    for t in outputs:
        d = t.fixed
        b = model_batched and len(d) > 0 and (d[0] is None or d[0] == batch)
        rest = d[1:] if b else d
        outs.append(TensorSpec(t.name, tuple(-1 if s is None else s for s in rest), t.dtype, batched=b))
    notes: list[str] = []
    fixed_outs = [f"{t.name} {t.show()}" for t, o in zip(outputs, outs, strict=True) if not o.batched]
    if model_batched and fixed_outs:
        notes.append(
            f"output(s) {', '.join(fixed_outs)} have no batch dimension: served one sample at a time"
        )
    check_batch = (CHECK_BATCH if batch is None else batch) if model_batched else None
    invariant = True
    if check:
        feeds = random_inputs(specs, full, check_batch or 1, seed, values)
        try:
            results = sess.run(None, feeds, quiet_run())
        except Exception as exc:
            raise _run_failure(path, exc, feeds, values) from None
        outs = _check_outputs(outs, outputs, results, check_batch, notes)
        if model_batched and batch is None and check_batch and all(o.batched for o in outs):
            dependence = batch_dependence(sess, feeds, results, [o.name for o in outs])
            if dependence is not None:
                invariant = False
                notes.append(
                    f"answers depend on the batch: {dependence}; served one sample at a time (as "
                    f"`max_batch = 1`), so that a client's answer never depends on who else sent"
                )
    if not model_batched:
        notes.append("served one sample at a time: " + _unbatched_reason(inputs, batched_in))
    elif batch is not None:
        notes.append(f"the graph's batch dimension is fixed at {batch}: served at batch {batch}")
    stage = StageSpec(
        index=0,
        path=stage_path if stage_path is not None else path.name,
        sha256=sha256_file(path),
        size_bytes=path.stat().st_size,
        inputs=tuple(specs),
        outputs=tuple(outs),
        passes=(),
    )
    manifest = Manifest(
        name=name,
        inputs=tuple(specs),
        stages=(stage,),
        exits=(ExitSpec(EXIT_NAME, 0),),
        num_classes=None,
        batch=batch,
        source=dict(source or {}),
        batch_invariant=invariant,
    )
    manifest.validate(str(path))
    return Inference(manifest, inputs, outputs, full, check_batch, notes)


# Answers alone and in a batch that differ by more: the model is not batch-invariant. float32
# kernels that pick another algorithm per batch size differ by ~1e-6 relative; a batch-mixing
# graph (normalising over the batch, padding to the longest) by 1e-2 or more: 1e-4 lies between.
BATCH_ATOL = 1e-4
BATCH_RTOL = 1e-4


def batch_dependence(
    sess: Any, feeds: Mapping[str, np.ndarray], together: Sequence[Any], names: Sequence[str]
) -> str | None:
    """Run each sample of the batch `feeds` alone and compare with its row of `together` (the
    batch's outputs): None when every answer is the same (within BATCH_ATOL/RTOL), else what differs.
    Catches a graph that normalises over the batch axis, pads every sample to the longest of the batch
    or runs NMS over the whole batch."""
    count = len(next(iter(feeds.values())))
    for i in range(count):
        alone = sess.run(None, {k: v[i : i + 1] for k, v in feeds.items()}, quiet_run())
        for name, row, single in zip(names, together, alone, strict=True):
            mine, theirs = np.asarray(single)[0], np.asarray(row)[i]
            if mine.shape != theirs.shape:
                return (
                    f"output {name!r} of sample {i} is shaped {list(mine.shape)} alone and "
                    f"{list(theirs.shape)} beside {count - 1} other sample(s)"
                )
            if mine.dtype.kind in "fc":
                if not np.allclose(mine, theirs, atol=BATCH_ATOL, rtol=BATCH_RTOL, equal_nan=True):
                    worst = float(np.nanmax(np.abs(mine.astype(np.float64) - theirs.astype(np.float64))))
                    return (
                        f"output {name!r} of sample {i} differs by up to {worst:.3g} between alone and "
                        f"beside {count - 1} other sample(s)"
                    )
            elif not np.array_equal(mine, theirs):
                return f"output {name!r} of sample {i} differs between alone and beside {count - 1} other(s)"
    return None


def _unbatched_reason(inputs: Sequence[GraphTensor], batched: Sequence[bool]) -> str:
    names = [f"{t.name} {t.show()}" for t, b in zip(inputs, batched, strict=True) if not b]
    return f"input(s) {', '.join(names)} have no dynamic batch dimension"


def _check_outputs(
    outs: list[TensorSpec],
    declared: Sequence[GraphTensor],
    results: Sequence[Any],
    batch: int | None,
    notes: list[str],
) -> list[TensorSpec]:
    """Outputs with the rank the run showed; all unbatched when a batched one did not follow the batch."""
    full: list[tuple[int, ...]] = []
    stray: list[str] = []
    for i, (spec, value) in enumerate(zip(outs, results, strict=True)):
        shape = tuple(np.shape(value))
        dims = tuple(-1 if d is None else d for d in declared[i].fixed)
        if len(dims) != len(shape):  # the graph did not declare the rank: take the run's, sizes varying
            dims = (-1,) * len(shape)
            rest = dims[1:] if spec.batched and shape else dims
            outs[i] = spec = TensorSpec(spec.name, rest, spec.dtype, batched=spec.batched and len(shape) > 0)
        full.append(dims)
        if spec.batched and batch is not None and shape[0] != batch:
            stray.append(f"{spec.name} {list(shape)}")
    if not stray:
        return outs
    notes.append(
        f"output(s) {', '.join(stray)} do not follow the batch ({batch} samples in): served at batch 1"
    )
    return [TensorSpec(s.name, d, s.dtype, batched=False) for s, d in zip(outs, full, strict=True)]


def sample_batch(manifest: Manifest, batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs as the runtime hands a batch to a backend: every input with the batch first
    (an unbatched input with a batch of 1), --value constants applied."""
    specs = manifest.inputs
    size = batch if all(t.batched for t in specs) else 1
    full = {t.name: t.shape for t in specs}
    feeds = random_inputs(specs, full, size, seed=seed, values=recorded_values(manifest))
    return {t.name: feeds[t.name] if t.batched else feeds[t.name][None] for t in specs}


def random_inputs(
    specs: Sequence[TensorSpec],
    full: Mapping[str, Sequence[int]],
    batch: int,
    seed: int = 0,
    values: Mapping[str, float] | None = None,
) -> dict[str, np.ndarray]:
    """Random feeds of the fixed shapes at `batch` (normal floats, small non-negative ints, bools);
    `values` fills named inputs with a constant."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for spec in specs:
        shape = (batch, *spec.shape) if spec.batched else tuple(full[spec.name])
        dtype = np.dtype(spec.dtype)
        if values and spec.name in values:
            value = np.full(shape, values[spec.name], dtype=dtype)
        elif dtype.kind == "f":
            value = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind == "b":
            value = rng.integers(0, 2, shape).astype(bool)
        else:
            value = rng.integers(0, 2, shape).astype(dtype)
        feeds[spec.name] = value
    return feeds


def _run_failure(
    path: Path, exc: Exception, feeds: Mapping[str, np.ndarray], values: Mapping[str, float] | None
) -> RepositoryError:
    text = " ".join(str(exc).split())
    if "NOT_IMPLEMENTED" in text or "Could not find an implementation" in text:
        return ort_failure(path, exc)
    shown = ", ".join(f"{k} {list(v.shape)} {v.dtype}" for k, v in feeds.items())
    brief = text if len(text) <= 240 else text[:237] + "..."
    ints = [k for k, v in feeds.items() if v.dtype.kind in "iu" and k not in (values or {})]
    fix = "check the --shape sizes"
    if ints:
        fix += (
            f"; the integer input(s) {', '.join(ints)} got random 0/1 values: give each the value the model "
            f"expects with --value {ints[0]}=V (e.g. a sample rate or a token id)"
        )
    return RepositoryError(
        f"{path}: ONNX Runtime could not run the graph on random inputs ({shown}): {brief}: {fix}"
    )


def import_command(path: Path, name: str, root: Path) -> str:
    """The `edgeserve import` command that writes a manifest for a lone ONNX file."""
    return shlex.join(["edgeserve", "import", str(path), "--name", name, "--repository", str(root)])
