"""Model weights as .npz (one array per state_dict key): no pickle crosses a file boundary."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import torch
from torch import nn

from edgeserve.export.errors import ExportError


def save_state_npz(module: nn.Module, path: Path) -> Path:
    """Write every state_dict tensor (keys unchanged) to `path`, atomically."""
    arrays = {key: value.detach().cpu().numpy() for key, value in module.state_dict().items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("wb") as f:
        np.savez_compressed(f, **arrays)
    tmp.replace(path)
    return path


def load_state_npz(module: nn.Module, path: Path, fix: str) -> nn.Module:
    """Load weights saved by save_state_npz; any missing, extra or reshaped key is an ExportError.

    `fix` is the command that regenerates the file, quoted in every error.
    """
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {key: data[key] for key in data.files}
    except FileNotFoundError:
        raise ExportError(f"{path}: weights file is missing; {fix}") from None
    except (OSError, ValueError) as exc:
        raise ExportError(f"{path}: not a readable .npz ({exc}); {fix}") from None
    expected = module.state_dict()
    missing = sorted(set(expected) - set(arrays))
    extra = sorted(set(arrays) - set(expected))
    if missing or extra:
        raise ExportError(
            f"{path}: weights do not fit {type(module).__name__} "
            f"(missing {missing[:3]}, unexpected {extra[:3]}); {fix}"
        )
    state = {}
    for key, tensor in expected.items():
        if tuple(arrays[key].shape) != tuple(tensor.shape):
            raise ExportError(
                f"{path}: {key} has shape {arrays[key].shape}, the model expects {tuple(tensor.shape)}; {fix}"
            )
        state[key] = torch.from_numpy(arrays[key]).to(tensor.dtype)
    module.load_state_dict(state)
    return module


def state_sha256(module: nn.Module) -> str:
    """A checksum of the weights (names, dtypes, shapes, bytes): the export cache key's model half."""
    digest = hashlib.sha256()
    for key, value in sorted(module.state_dict().items()):
        array = np.ascontiguousarray(value.detach().cpu().numpy())
        digest.update(f"{key}:{array.dtype.str}:{array.shape}\n".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()
