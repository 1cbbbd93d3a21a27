"""Measure every (exit, batch) cell of one model, the way the executor will run it.

Time division means one batch runs at a time with nothing else on the accelerator, so each cell
is measured alone: warm-up runs first (arenas, kernel choice, clocks), then `repeats` timed runs
of `backend.run` on a fixed random input with the garbage collector off, so a collection pause is
not mistaken for inference time.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from edgeserve.errors import ProfileError
from edgeserve.manifest import Manifest
from edgeserve.onnx_graph import sample_batch
from edgeserve.profile import ProfileCell, ProfileTable
from edgeserve.runtime.backends.base import Backend
from edgeserve.runtime.validation import Feeds


@dataclass(frozen=True)
class MeasureSettings:
    """What a profile's numbers depend on besides the device; a cached profile must match these."""

    max_batch: int = 10
    repeats: int = 100
    warmup: int = 10
    seed: int = 0
    # "random": cells timed on random inputs; "npz:<sha256 prefix>": on the samples of a file
    # (`edgeserve-profile --npz`), for a model whose latency depends on what it is given
    inputs: str = "random"

    def __post_init__(self) -> None:
        if self.max_batch < 1 or self.repeats < 1 or self.warmup < 0:
            raise ValueError(f"need max_batch >= 1, repeats >= 1 and warmup >= 0, got {self}")

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if self.inputs == "random":  # profiles on random inputs read as they did before --npz
            del data["inputs"]
        return data

    def matches(self, recorded: dict[str, Any]) -> bool:
        same_inputs = recorded.get("inputs", "random") == self.inputs
        return same_inputs and all(recorded.get(k) == v for k, v in self.to_dict().items())


def time_cell(backend: Backend, model: str, exit: int, x: Feeds, repeats: int, warmup: int) -> list[float]:
    """Latencies in milliseconds of `repeats` back-to-back runs, after `warmup` untimed ones.

    The garbage collector is off while timing, so no collection lands inside a sample; a full
    collection beforehand is the caller's (once per model: it costs ~50 ms in a big process).
    """
    for _ in range(warmup):
        backend.run(model, exit, x)
    samples = [0] * repeats
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for i in range(repeats):
            start = time.perf_counter_ns()
            backend.run(model, exit, x)
            samples[i] = time.perf_counter_ns() - start
    finally:
        if was_enabled:
            gc.enable()
    return [s / 1e6 for s in samples]


def batch_limit(manifest: Manifest, settings: MeasureSettings) -> int:
    """The largest batch to measure: --max-batch, or less where the graphs take less (a fixed
    batch dimension; tensors without one: one sample at a time)."""
    return min(settings.max_batch, manifest.max_batch or settings.max_batch)


def npz_inputs(path: Path, manifest: Manifest, largest: int) -> dict[str, np.ndarray]:
    """`--npz FILE`: representative samples, one array per input name shaped (N, *input shape), as
    a batch of `largest` (the N samples repeated in turn when fewer). ProfileError in one sentence."""
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {name: data[name] for name in data.files}
    except (OSError, ValueError) as exc:
        raise ProfileError(
            f"--npz {path}: not a readable .npz file ({exc}); write one with numpy.savez"
        ) from None
    names = [t.name for t in manifest.inputs]
    if sorted(arrays) != sorted(names):
        raise ProfileError(
            f"--npz {path}: holds {sorted(arrays)}, {manifest.name!r} takes {names}; name the arrays as its "
            f"inputs, each (N, ...) samples: numpy.savez(path, {', '.join(f'{n}=...' for n in names)})"
        )
    out = {}
    for spec in manifest.inputs:
        array = arrays[spec.name]
        if tuple(array.shape[1:]) != tuple(spec.shape) or array.ndim != len(spec.shape) + 1 or not len(array):
            raise ProfileError(
                f"--npz {path}: {spec.name!r} is shaped {list(array.shape)}, {manifest.name!r} takes "
                f"(N, {', '.join(map(str, spec.shape))}) with N >= 1 samples"
            )
        if not spec.batched:
            raise ProfileError(
                f"--npz {path}: {manifest.name!r}'s input {spec.name!r} has no batch dimension"
            )
        out[spec.name] = np.resize(array.astype(spec.dtype, copy=False), (largest, *spec.shape))
    return out


def npz_marker(path: Path) -> str:
    """What MeasureSettings.inputs records for `--npz path`: the file's checksum, so that a profile
    taken on other samples (or on random ones) is measured again."""
    from edgeserve.files import sha256_file

    return f"npz:{sha256_file(path)[:16]}"


def measure_model(
    backend: Backend,
    manifest: Manifest,
    settings: MeasureSettings,
    on_cell: Callable[[int, int], None] | None = None,
    inputs: dict[str, np.ndarray] | None = None,
) -> ProfileTable:
    """The full profile table of a model already loaded into `backend`.

    `on_cell(exit, batch)` is called after each cell (the CLI's progress bar). `inputs`: a batch of
    the largest size to time on (npz_inputs), else random samples of the model's shapes.
    """
    fingerprint = backend.fingerprint()
    largest = batch_limit(manifest, settings)
    inputs = sample_batch(manifest, largest, settings.seed) if inputs is None else inputs
    table = ProfileTable(
        model=manifest.name,
        exit_names=tuple(manifest.exit_names),
        max_batch=largest,
        fingerprint=fingerprint,
        graphs_sha256=manifest.graphs_sha256(),
        settings={**settings.to_dict(), "threads": fingerprint.threads},
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )
    gc.collect()
    for exit in range(len(manifest.exits)):
        for batch in range(1, largest + 1):
            rows = {name: value[:batch] for name, value in inputs.items()}
            x = rows if len(rows) > 1 else next(iter(rows.values()))  # one input: the bare array
            samples = time_cell(backend, manifest.name, exit, x, settings.repeats, settings.warmup)
            table.add(ProfileCell.from_samples(exit, batch, samples))
            if on_cell is not None:
                on_cell(exit, batch)
    return table
