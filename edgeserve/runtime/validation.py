"""Request checks every backend shares, so a bad tensor gets the same clear error whichever one runs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

import numpy as np

from edgeserve.errors import InputError
from edgeserve.manifest import Manifest

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
