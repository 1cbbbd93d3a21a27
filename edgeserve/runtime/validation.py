"""Request checks every backend shares, so a bad tensor gets the same clear error whichever one runs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

import numpy as np

from edgeserve.errors import InputError
from edgeserve.manifest import Manifest

T = TypeVar("T")


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


def loaded_model(models: Mapping[str, T], model: str) -> T:
    """What a backend loaded for `model`, or an InputError naming the loaded ones and the fix."""
    try:
        return models[model]
    except KeyError:
        raise InputError(
            f"model {model!r} is not loaded (loaded: {', '.join(models) or 'none'}); "
            f"load its manifest first: backend.load(repository.load_manifest({model!r}))"
        ) from None
