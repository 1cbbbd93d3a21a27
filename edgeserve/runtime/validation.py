"""Request checks every backend shares, so a bad tensor gets the same clear error whichever one runs;
the Server's checks of a request's sample (`SampleCheck`) and of a backend's outputs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from edgeserve.errors import InputError
from edgeserve.manifest import Manifest, TensorSpec

T = TypeVar("T")
# A batch as the executor hands it to a backend: one array for a single-input model, else a map
# from input name to array; every array has the batch as its first dimension.
Feeds = np.ndarray | Mapping[str, np.ndarray]
# One request's input: an array for a single-input model, else a map from input name to array.
Sample = np.ndarray | dict[str, np.ndarray]


def validate_exit(manifest: Manifest, exit: int) -> int:
    """`exit` as a plain int index into the manifest's exits, or an InputError listing the valid ones."""
    if isinstance(exit, bool) or not isinstance(exit, (int, np.integer)):
        raise InputError(f"exit must be an int index into {manifest.exit_names}, got {exit!r}")
    if not 0 <= exit < len(manifest.exits):
        raise InputError(
            f"model {manifest.name!r} has exits 0..{len(manifest.exits) - 1} ({manifest.exit_names}), "
            f"not {exit}"
        )
    return int(exit)


def validate_batch(manifest: Manifest, batch: np.ndarray) -> np.ndarray:
    """The batch as a C-contiguous array of the manifest's input dtype and shape, or an InputError."""
    spec, model = manifest.input, manifest.name
    if not isinstance(batch, np.ndarray):
        raise InputError(f"model {model!r} takes a numpy array, got {type(batch).__name__}")
    if batch.dtype != np.dtype(spec.dtype):
        raise InputError(
            f"model {model!r} takes {spec.dtype} input, got {batch.dtype}; convert it before sending "
            f"(e.g. x.astype(np.{spec.dtype}), scaled as the model was trained)"
        )
    expected = ("batch", *spec.shape)
    if batch.ndim != len(expected):
        raise InputError(
            f"model {model!r} takes {len(expected)}-d input shaped {expected}, "
            f"got {batch.ndim}-d {batch.shape}"
        )
    if tuple(batch.shape[1:]) != spec.shape:
        raise InputError(f"model {model!r} takes samples shaped {spec.shape}, got {tuple(batch.shape[1:])}")
    if batch.shape[0] < 1:
        raise InputError(f"model {model!r} got an empty batch; send at least one sample")
    return np.ascontiguousarray(batch)


def validate_feeds(manifest: Manifest, batch: Feeds) -> dict[str, np.ndarray]:
    """Every input of the model by name, each checked like `validate_batch`, with one batch size.

    A single-input model also takes the bare array. An input the graph takes without a batch
    dimension (TensorSpec.batched False) comes with a leading batch of 1 here, like any other.
    """
    model = manifest.name
    if len(manifest.inputs) == 1 and not isinstance(batch, Mapping):
        return {manifest.inputs[0].name: validate_batch(manifest, batch)}
    if not isinstance(batch, Mapping):
        raise InputError(
            f"model {model!r} takes {len(manifest.inputs)} inputs ({', '.join(manifest.input_names)}): "
            f"give a map from input name to array, not {type(batch).__name__}"
        )
    names = manifest.input_names
    if set(batch) != set(names):
        raise InputError(f"model {model!r} takes the inputs {names}, got {sorted(map(str, batch))}")
    feeds: dict[str, np.ndarray] = {}
    sizes = set()
    for spec in manifest.inputs:
        array = _checked(model, spec.name, spec.dtype, spec.shape, batch[spec.name])
        sizes.add(array.shape[0])
        feeds[spec.name] = array
    if len(sizes) != 1:
        raise InputError(f"model {model!r} got inputs with different batch sizes {sorted(sizes)}")
    return feeds


def _checked(model: str, name: str, dtype: str, shape: tuple[int, ...], batch: object) -> np.ndarray:
    if not isinstance(batch, np.ndarray):
        raise InputError(
            f"input {name!r} of model {model!r} must be a numpy array, got {type(batch).__name__}"
        )
    if batch.dtype != np.dtype(dtype):
        raise InputError(
            f"input {name!r} of model {model!r} is {dtype}, got {batch.dtype}; convert it before sending"
        )
    if batch.ndim != len(shape) + 1 or tuple(batch.shape[1:]) != shape:
        raise InputError(
            f"input {name!r} of model {model!r} takes samples shaped {shape}, got a batch shaped "
            f"{batch.shape} (the batch is the first dimension)"
        )
    if batch.shape[0] < 1:
        raise InputError(f"model {model!r} got an empty batch; send at least one sample")
    return np.ascontiguousarray(batch)


def is_chain(manifest: Manifest) -> bool:
    """Whether `manifest` is a single-input classifier chain (what `edgeserve export` writes): one
    batched input, one tensor passed from stage to stage, one exit output per exit stage."""
    single = len(manifest.inputs) == 1 and manifest.inputs[0].batched
    heads = all(manifest.stages[e.stage].logits is not None for e in manifest.exits)
    return single and heads and all(len(s.passes) <= 1 and len(s.inputs) == 1 for s in manifest.stages)


ONNXRUNTIME_FIX = 'serve it with the onnxruntime backend (`[backend] name = "onnxruntime"` in the config)'


def require_chain(manifest: Manifest, backend: str) -> None:
    """Refuse what a classifier-chain backend cannot run: several inputs, several exit outputs."""
    if is_chain(manifest):
        return
    raise InputError(
        f"model {manifest.name!r} is not a single-input classifier chain, which is all the {backend} "
        f"backend runs; {ONNXRUNTIME_FIX}"
    )


def loaded_model(models: Mapping[str, T], model: str) -> T:
    """What a backend loaded for `model`, or an InputError naming the loaded ones and the fix."""
    try:
        return models[model]
    except KeyError:
        raise InputError(
            f"model {model!r} is not loaded (loaded: {', '.join(models) or 'none'}); "
            f"load its manifest first: backend.load(repository.load_manifest({model!r}))"
        ) from None


@dataclass(frozen=True, slots=True)
class SampleCheck:
    """One served model's check of a request's sample, made once as the Server starts."""

    model: str  # its name in the config (the messages name it)
    inputs: tuple[TensorSpec, ...]
    single: tuple[np.dtype[Any], tuple[int, ...]] | None  # (dtype, sample shape) of its one input

    @classmethod
    def of(cls, model: str, manifest: Manifest) -> SampleCheck:
        inputs = tuple(manifest.inputs)
        single = (np.dtype(inputs[0].dtype), tuple(inputs[0].shape)) if len(inputs) == 1 else None
        return cls(model, inputs, single)

    def check(self, x: Any) -> tuple[Any, str | None]:
        """(the sample as the executor stacks it, None) or (x, what is wrong with it).

        A single-input model takes the bare array, or a one-entry map naming its input; a model
        with several inputs takes a map from each input's name to its array.
        """
        single = self.single
        if single is not None:
            dtype, shape = single
            if type(x) is np.ndarray and x.dtype == dtype and x.shape == shape:
                return x, None  # the common case, in well under a microsecond
            if isinstance(x, dict) and len(x) == 1:
                name = self.inputs[0].name
                if name in x:
                    x = x[name]
        name = self.model
        inputs = self.inputs
        if single is None or isinstance(x, dict):
            if not isinstance(x, dict) or set(x) != {t.name for t in inputs}:
                given = sorted(map(str, x)) if isinstance(x, dict) else type(x).__name__
                names = ", ".join(t.name for t in inputs)
                return x, f"model {name!r} takes the inputs {names} (a map from name to array), got {given}"
            for spec in inputs:
                who = f"input {spec.name!r} of model {name!r}"
                problem = tensor_problem(who, np.dtype(spec.dtype), spec.shape, x[spec.name])
                if problem is not None:
                    return x, problem
            return x, None
        return x, tensor_problem(f"model {name!r}", *single, x)


def tensor_problem(who: str, dtype: np.dtype[Any], shape: tuple[int, ...], x: object) -> str | None:
    """`who` names the model, or the input and its model: "model 'm'", "input 'i' of model 'm'"."""
    if not isinstance(x, np.ndarray):
        return f"{who} takes a numpy array, got {type(x).__name__}"
    if x.dtype != dtype:
        return f"{who} takes {dtype} input, got {x.dtype}; convert it before sending"
    if tuple(x.shape) != shape:
        return f"{who} takes one sample shaped {shape}, got {tuple(x.shape)}"
    return None


def output_names(manifest: Manifest) -> list[tuple[str, ...]]:
    """Per exit, the names its outputs are answered under: the final exit's names when the exit
    gives as many outputs (a head trained for an imported classifier answers as its final output
    does, so a client reads one name whichever exit ran), else the exit's own."""
    final = [t.name for t in manifest.exit_outputs(len(manifest.exits) - 1)]
    names = []
    for i in range(len(manifest.exits)):
        own = [t.name for t in manifest.exit_outputs(i)]
        names.append(tuple(final if len(own) == len(final) else own))
    return names


def outputs_problem(outputs: dict[str, np.ndarray] | None, size: int) -> str | None:
    """What is wrong with a backend's outputs for a batch of `size`, or None."""
    if not outputs:
        return f"backend returned no outputs for a batch of {size}"
    for name, value in outputs.items():
        if not isinstance(value, np.ndarray) or value.ndim < 1 or value.shape[0] != size:
            shape = getattr(value, "shape", type(value).__name__)
            return f"backend returned {shape} for output {name!r} of a batch of {size}"
    return None
