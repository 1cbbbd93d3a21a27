"""The backend protocol: what the executor needs from ONNX Runtime, TensorRT or torch."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from edgeserve.fingerprint import Fingerprint
from edgeserve.manifest import Manifest
from edgeserve.runtime.validation import Feeds


class Backend(Protocol):
    """Runs one model up to one exit on one batch. Owned by a single thread: not thread-safe.

    A backend whose `run_outputs` may be called from another thread than the one that loads and
    closes it (never at the same time as another batch) sets `inline_safe = True`: the event loop
    then runs short batches itself (runtime/executor.py).
    """

    name: str

    def load(self, manifest: Manifest) -> None:
        """Open the model's stages (and warm them up) so the first real request is not slow."""

    def run(self, model: str, exit: int, batch: Feeds) -> np.ndarray:
        """The first output of exit `exit` (0 = shallowest): a classifier's logits (batch, num_classes)."""

    def run_outputs(self, model: str, exit: int, batch: Feeds) -> dict[str, np.ndarray]:
        """Every output of exit `exit` by name, each with the batch as its first dimension.

        `batch` is one array for a single-input model or a map from input name to array.
        """

    def fingerprint(self) -> Fingerprint:
        """The device fingerprint profiles measured with this backend are keyed by."""

    def close(self) -> None:
        """Release sessions and device memory."""
