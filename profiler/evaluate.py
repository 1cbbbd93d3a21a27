"""Per-exit top-1 accuracy through the serving backend, written into the manifest.

Measuring through the backend (not torch) checks what will actually be served. The manifest's
`graphs_sha256` ignores accuracies, so profiles measured before stay valid.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgeserve.errors import InputError
from edgeserve.manifest import Manifest
from edgeserve.repository import ModelRepository
from edgeserve.runtime.backends.base import Backend

_FORMAT = "an .npz with x (N, *input_shape) float32 and y (N,) int64 labels"


@dataclass(frozen=True)
class EvalData:
    """Labelled samples and a name that identifies the file they came from."""

    x: np.ndarray
    y: np.ndarray
    name: str


def load_eval_data(path: Path) -> EvalData:
    """Read an eval file without unpickling anything, or say what is wrong with it."""
    try:
        with np.load(path, allow_pickle=False) as data:
            if "x" not in data or "y" not in data:
                raise InputError(
                    f"{path}: eval data needs arrays 'x' and 'y', found {sorted(data.files)}; {_FORMAT}"
                )
            x, y = data["x"], data["y"]
    except FileNotFoundError:
        raise InputError(f"{path}: eval data file not found; pass {_FORMAT} with --eval") from None
    except (ValueError, OSError) as exc:
        raise InputError(f"{path}: cannot read eval data ({exc}); {_FORMAT}") from None
    if x.dtype != np.float32:
        raise InputError(f"{path}: x is {x.dtype}, not float32; save it with x.astype(np.float32)")
    if not np.issubdtype(y.dtype, np.integer) or y.ndim != 1:
        raise InputError(f"{path}: y must be 1-d integer labels, got {y.dtype} shaped {y.shape}")
    if x.ndim < 2 or len(x) != len(y) or len(y) == 0:
        raise InputError(f"{path}: x {x.shape} and y {y.shape} must hold the same number (> 0) of samples")
    digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()[:12]
    return EvalData(x=x, y=y.astype(np.int64), name=f"{Path(path).name} ({len(y)} samples, sha256 {digest})")


def class_count(manifest: Manifest) -> int | None:
    """The classes a model tells apart: num_classes, else the width of a final output shaped (C,)."""
    if manifest.num_classes is not None:
        return manifest.num_classes
    final = manifest.exit_outputs(len(manifest.exits) - 1)
    return final[0].shape[0] if len(final[0].shape) == 1 and final[0].shape[0] > 0 else None


def check_fits(data: EvalData, manifest: Manifest, origin: str) -> None:
    """Fail before any measuring if the eval data cannot be fed to this model."""
    classes = class_count(manifest)
    if len(manifest.inputs) != 1 or classes is None:
        raise InputError(
            f"{origin}: --eval measures top-1 accuracy of single-input classifiers (one output of class "
            f"scores per exit); model {manifest.name!r} is not one: profile it without --eval"
        )
    if tuple(data.x.shape[1:]) != manifest.input.shape:
        raise InputError(
            f"{origin}: samples are shaped {tuple(data.x.shape[1:])}, model {manifest.name!r} takes "
            f"{manifest.input.shape}; pass eval data preprocessed for this model"
        )
    if data.y.min() < 0 or data.y.max() >= classes:
        raise InputError(
            f"{origin}: labels span {data.y.min()}..{data.y.max()}, model {manifest.name!r} has "
            f"{classes} classes (0..{classes - 1})"
        )


def exit_accuracies(
    backend: Backend, manifest: Manifest, data: EvalData, batch_size: int = 10
) -> list[float]:
    """Top-1 accuracy (a fraction) of every exit of a model loaded into `backend`."""
    correct = np.zeros(len(manifest.exits), dtype=np.int64)
    for start in range(0, len(data.y), batch_size):
        x = np.ascontiguousarray(data.x[start : start + batch_size])
        y = data.y[start : start + batch_size]
        for exit in range(len(manifest.exits)):
            logits = backend.run(manifest.name, exit, x)
            correct[exit] += int((logits.argmax(axis=1) == y).sum())
    return [float(c) / len(data.y) for c in correct]


def write_accuracies(
    repository: ModelRepository, manifest: Manifest, accuracies: list[float], dataset: str
) -> tuple[Manifest, Path]:
    """Save the manifest with accuracies; returns the new manifest and where it was written."""
    updated = manifest.with_accuracies(list(accuracies), dataset)
    return updated, repository.save_manifest(updated)
