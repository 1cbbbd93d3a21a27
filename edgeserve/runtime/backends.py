"""Pick a backend by name, so command lines can say `--backend onnxruntime` and nothing more.

Backends are imported only when chosen: the TensorRT one needs libraries a CPU box does not have.
"""

from __future__ import annotations

from collections.abc import Sequence

from edgeserve.errors import BackendUnavailableError
from edgeserve.repository import ModelRepository
from edgeserve.runtime.backend import Backend

BACKEND_NAMES = ("onnxruntime",)


def create_backend(
    name: str,
    repository: ModelRepository,
    *,
    threads: int | None = None,
    providers: Sequence[str] | None = None,
    warmup: int = 3,
) -> Backend:
    """A backend over `repository`; raises BackendUnavailableError for a name it does not know."""
    if name == "onnxruntime":
        from edgeserve.runtime.onnxruntime_backend import OnnxRuntimeBackend

        return OnnxRuntimeBackend(repository, threads=threads, providers=providers, warmup=warmup)
    raise BackendUnavailableError(f"unknown backend {name!r}; available: {', '.join(BACKEND_NAMES)}")
