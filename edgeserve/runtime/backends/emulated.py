"""The emulated accelerator: runs no model, takes as long as a stored profile says the device did.

`[backend] name = "emulated"` serves a repository's models on any box as the device a stored profile
was measured on would: each batch holds the executor thread for a latency drawn from that (model,
exit, batch) cell's measured samples, times `[backend] slowdown`, and answers with outputs of the
manifest's names, shapes and dtypes (zeros, deterministic; a dynamic dimension is 1). The
profile is one measured here or one measured elsewhere and stored with `edgeserve-profile --import
TABLE.json --model NAME` (a Jetson's, the H200 tables in benchmarks/data/gpu-h200/); `[backend]
fingerprint` names its key when the models have several. The backend's fingerprint is that
profile's, so the Server plans with the same table (scaled by `profile_scale`, the slowdown).

The wait spins no CPU and releases the GIL: the compiled nap of runtime/_nap.c (one nanosleep with
a 1 us timer slack; `time.sleep` where it was not built). A sleeping thread wakes late (on the
2-core VM this was written on, shared with four other busy processes: 34 us at the median, 76 us
at P99 after a 0.14 ms nap), so the nap ends early by a running mean of how late the last ones
woke (`EmulatedBackend.early_s`, at most EARLY_MAX_S). Measured there through `run_outputs`, 500
batches each of a constant 0.14, 0.5 and 2 ms, the batch's time minus the drawn latency: median
+1 / +4 / +10 us, P10 -5 / -12 / -11 us, P90 +12 / +26 / +40 us, P99 +22 / +203 / +525 us (the
VM not running the thread), mean +12 / +9 / +25 us, never below -48 us. A batch can end at most
EARLY_MAX_S before its drawn latency. Its CPU time: ~8 us of Python (checks, outputs, the draw)
plus the kernel's cost of one sleep and wake-up (~30 us on that VM).

The outputs are made for every batch (np.zeros: a calloc, ~1 us, inside the batch's time): a
result's output is a view of its batch's array that the Server hands to the caller, who may write
to it, so no buffer is reused.
"""

from __future__ import annotations

import array
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgeserve.errors import InputError, ProfileError
from edgeserve.fingerprint import Fingerprint
from edgeserve.manifest import Manifest, TensorSpec
from edgeserve.profile import ProfileTable
from edgeserve.repository import ModelRepository
from edgeserve.runtime.validation import Feeds, loaded_model, validate_exit, validate_feeds

try:
    from edgeserve.runtime._nap import nap
except ImportError:  # no compiler at install: time.sleep, whose timer slack is 50 us
    nap = None

# The first naps end this early, until their own lateness is known: the kernel's default timer
# slack (50 us) less the wake-up's own ~10 us.
EARLY_START_S = 40e-6
# A nap never ends earlier than this before the drawn latency: four timer slacks, the P99 of a
# nap's lateness measured here; an emulated batch is never shorter than its cell by more.
EARLY_MAX_S = 200e-6
EARLY_WEIGHT = 0.1  # EWMA weight of the latest nap's lateness: about the last ten naps
# Uniform draws taken from the Generator at a time: one call (~2 us) per 4096 batches, 32 KiB.
UNIFORM_BLOCK = 4096


def stored_keys(repository: ModelRepository, model: str) -> list[str]:
    """The fingerprint keys of the profiles stored for `model` (file names in its profiles/)."""
    folder = repository.model_dir(model) / "profiles"
    return sorted(p.stem for p in folder.glob("*.json")) if folder.is_dir() else []


def import_command(repository: ModelRepository, model: str) -> str:
    return f"edgeserve-profile --import TABLE.json --model {model} --repository {repository.root}"


@dataclass
class _Emulated:
    """A loaded model: its manifest, each (exit, batch) cell's samples in seconds (times the
    slowdown), and each exit's outputs."""

    manifest: Manifest
    samples_s: dict[tuple[int, int], np.ndarray]
    outputs: list[tuple[TensorSpec, ...]]


class EmulatedBackend:
    """Waits a stored profile's latencies instead of running models. Owned by one thread."""

    name = "emulated"
    inline_safe = False  # a batch holds the executor thread, as a device's would, never the loop

    def __init__(
        self,
        repository: ModelRepository,
        *,
        slowdown: float = 1.0,
        fingerprint: str | None = None,
        seed: int = 0,
    ) -> None:
        """`fingerprint`: the key of the stored profile to emulate (None: the only one the models
        have); `seed` makes the sequence of drawn latencies reproducible."""
        if not slowdown > 0:
            raise ValueError(f"slowdown must be > 0, got {slowdown}")
        self.repository = repository
        self.slowdown = float(slowdown)
        self.key = fingerprint
        self.early_s = EARLY_START_S
        self._rng = np.random.default_rng(seed)
        self._uniform = self._rng.random(UNIFORM_BLOCK)
        self._next = 0
        self._counter = array.array("q", [0])  # never bumped: nap only ever times out
        self._chosen: Fingerprint | None = None
        self._models: dict[str, _Emulated] = {}

    @property
    def profile_scale(self) -> float:
        """How much longer than the stored profile every batch takes: the Server plans with it."""
        return self.slowdown

    # -- which profile -----------------------------------------------------------------------------

    def choose_profile(self, models: Sequence[str]) -> Fingerprint:
        """Pick the stored profile to emulate for these models (the Server's, before it reads their
        profiles): `fingerprint` if given, else the one key they have; ProfileError otherwise."""
        if not models:
            named = f" {self.key!r}" if self.key is not None else ""
            raise ProfileError(
                f"emulated backend: no model in {self.repository.root} has a stored profile{named} to "
                f"emulate; store one measured on that device with `{import_command(self.repository, 'NAME')}`"
            )
        keys = {model: stored_keys(self.repository, model) for model in models}
        if self.key is not None:
            key = self.key
        else:
            found = sorted({k for ks in keys.values() for k in ks})
            if not found:
                raise ProfileError(
                    f"emulated backend: no stored profile to emulate for {', '.join(models)} in "
                    f"{self.repository.root}; store one measured on the device to emulate with "
                    f"`{import_command(self.repository, models[0])}` (or measure one here with "
                    "`edgeserve-profile`)"
                )
            if len(found) > 1:
                listing = "; ".join(
                    f"{k} ({self._device(k, keys)}: {', '.join(m for m, ks in keys.items() if k in ks)})"
                    for k in found
                )
                raise ProfileError(
                    f"emulated backend: the models have profiles of {len(found)} devices, so which one to "
                    f'emulate is not clear: {listing}; set [backend] fingerprint = "KEY" to one of them'
                )
            key = found[0]
        missing = [m for m, ks in keys.items() if key not in ks]
        if missing:
            m = missing[0]
            there = ", ".join(keys[m]) or "none"
            raise ProfileError(
                f"emulated backend: model {m!r} has no stored profile {key!r} (its profiles: {there}); "
                f"store the table measured on that device with `{import_command(self.repository, m)}`"
            )
        self._chosen = ProfileTable.load(self._path(models[0], key)).fingerprint
        return self._chosen

    def _path(self, model: str, key: str) -> Path:
        return self.repository.model_dir(model) / "profiles" / f"{key}.json"

    def _device(self, key: str, keys: dict[str, list[str]]) -> str:
        model = next(m for m, ks in keys.items() if key in ks)
        fingerprint = ProfileTable.load(self._path(model, key)).fingerprint
        return f"{fingerprint.backend} on {fingerprint.device}"

    # -- loading -----------------------------------------------------------------------------------

    def load(self, manifest: Manifest) -> None:
        """Read the model's stored profile for the emulated device (checked against the manifest)."""
        if self._chosen is None:
            self.choose_profile([manifest.name])
        fingerprint = self.fingerprint()
        if not self.repository.profile_path(manifest.name, fingerprint).exists():
            there = ", ".join(stored_keys(self.repository, manifest.name)) or "none"
            raise ProfileError(
                f"emulated backend: model {manifest.name!r} has no stored profile {fingerprint.key()!r}, "
                f"the one emulated (its profiles: {there}); store the table measured on that device "
                f"with `{import_command(self.repository, manifest.name)}`"
            )
        table = self.repository.load_profile(manifest, fingerprint)
        samples = {
            key: np.asarray(cell.samples_ms, dtype=np.float64) * (self.slowdown / 1000.0)
            for key, cell in table.cells.items()
        }
        outputs = [manifest.exit_outputs(e) for e in range(len(manifest.exits))]
        self._models[manifest.name] = _Emulated(manifest, samples, outputs)

    @property
    def models(self) -> list[str]:
        return list(self._models)

    def manifest(self, model: str) -> Manifest:
        return loaded_model(self._models, model).manifest

    # -- inference ---------------------------------------------------------------------------------

    def run(self, model: str, exit: int, batch: Feeds) -> np.ndarray:
        """The first exit output (a classifier's logits, (batch, num_classes)) at exit `exit`."""
        return next(iter(self.run_outputs(model, exit, batch).values()))

    def run_outputs(self, model: str, exit: int, batch: Feeds) -> dict[str, np.ndarray]:
        """Zeros shaped like exit `exit`'s outputs, returned once the drawn latency has passed."""
        start = time.monotonic()
        loaded = loaded_model(self._models, model)
        manifest = loaded.manifest
        exit = validate_exit(manifest, exit)
        feeds = validate_feeds(manifest, batch)
        size = next(iter(feeds.values())).shape[0]
        largest = manifest.max_batch
        if largest is not None and size > largest:
            raise InputError(f"model {model!r} runs batches of at most {largest}, not {size}")
        latency = self._latency_s(loaded, exit, size)
        outputs = {
            spec.name: np.zeros(
                (size if spec.batched else 1, *(d if d >= 0 else 1 for d in spec.shape)), dtype=spec.dtype
            )
            for spec in loaded.outputs[exit]
        }
        self._wait_until(start + latency)
        return outputs

    def latency_s(self, model: str, exit: int, size: int) -> float:
        """The next latency drawn for a batch of `size` at exit `exit`: one of the cell's samples
        (equally likely) times the slowdown, in seconds. The draws follow the seed."""
        return self._latency_s(loaded_model(self._models, model), exit, size)

    def _latency_s(self, loaded: _Emulated, exit: int, size: int) -> float:
        samples = loaded.samples_s.get((exit, size))
        if samples is None:
            raise ProfileError(
                f"emulated backend: the profile of {loaded.manifest.name!r} has no cell for exit {exit} "
                f"at batch {size}"
            )
        return float(samples[int(self._draw() * samples.size)])

    def _draw(self) -> float:
        """The next uniform number in [0, 1) of the seeded Generator (drawn in blocks: cheap)."""
        if self._next == UNIFORM_BLOCK:
            self._uniform = self._rng.random(UNIFORM_BLOCK)
            self._next = 0
        value = self._uniform[self._next]
        self._next += 1
        return float(value)

    def _wait_until(self, until: float) -> None:
        """Sleep, the GIL released, to about `until`: early by how late the last naps woke."""
        target = until - self.early_s
        left = target - time.monotonic()
        if left <= 0.0:
            return
        if nap is not None:
            nap(self._counter, 0, target, left)
        else:
            time.sleep(left)
        late = min(max(time.monotonic() - target, 0.0), EARLY_MAX_S)
        self.early_s += EARLY_WEIGHT * (late - self.early_s)

    # -- identity ----------------------------------------------------------------------------------

    def fingerprint(self) -> Fingerprint:
        """The fingerprint of the stored profile emulated, so the Server plans with that profile.
        Before `choose_profile` or a load, chosen among the repository's models that have profiles."""
        if self._chosen is None:
            models = [m for m in self.repository.models() if stored_keys(self.repository, m)]
            if self.key is not None:
                models = [m for m in models if self.key in stored_keys(self.repository, m)] or models
            self.choose_profile(models)
        assert self._chosen is not None
        return self._chosen

    def close(self) -> None:
        """Forget the loaded models (the emulated profile stays chosen)."""
        self._models.clear()
