"""Helpers for the runtime tests: a profiled tiny repository and a backend wrapper with test hooks.

The wrapper delegates to the real OnnxRuntimeBackend (real sessions, real numbers) and only adds
what a real session cannot express on demand: a fixed extra delay, a failure on one model, and a
record of when each batch ran and on which thread.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tiny_onnx import TinyModel, write_tiny_repository

from edgeserve.config.server import BackendConfig
from edgeserve.fingerprint import Fingerprint
from edgeserve.manifest import Manifest
from edgeserve.profiler.measure import MeasureSettings, measure_model
from edgeserve.repository import ModelRepository
from edgeserve.runtime.backends.onnxruntime import OnnxRuntimeBackend

MAX_BATCH = 4


def export_digits(repository: ModelRepository, model: str = "digits-s") -> Manifest:
    """A digits model exported for real (torch, checked at batch 1) into `repository`."""
    from edgeserve.export.models import ModelRequest, build_model
    from edgeserve.export.onnx_export import export_model

    request = ModelRequest(model=model)
    module = build_model(request).module
    return export_model(module, model, repository, verify_batches=(1,), source_info=request.spec(), log=None)


def profiled_tiny_repository(root: Path) -> dict[str, TinyModel]:
    """The two tiny models, each with a (short) profile for this machine at threads=1."""
    models = write_tiny_repository(root)
    repository = ModelRepository(root)
    backend = OnnxRuntimeBackend(repository, threads=1, warmup=0)
    settings = MeasureSettings(max_batch=MAX_BATCH, repeats=5, warmup=1)
    for tiny in models.values():
        backend.load(tiny.manifest)
        repository.save_profile(measure_model(backend, tiny.manifest, settings))
    backend.close()
    return models


def config_dict(root: Path, **scheduler: Any) -> dict[str, Any]:
    """A server config over the tiny repository with generous SLOs (1 s) and no warm-up."""
    return {
        "repository": str(root),
        "shutdown_timeout_s": 5.0,
        "backend": {"name": "onnxruntime", "threads": 1, "warmup": 0},
        "scheduler": dict(scheduler),
        "models": {"tiny_a": {"slo_ms": 1000, "max_queue": 64}, "tiny_b": {"slo_ms": 1000, "max_queue": 64}},
    }


@dataclass
class HookedBackend:
    """The real ONNX Runtime backend plus a delay, an injected failure and a log of batch spans."""

    inner: OnnxRuntimeBackend
    delay_s: float = 0.0
    fail_model: str | None = None
    inline_safe: bool = False  # True: the loop may run short batches itself, as with the inner backend
    spans: list[tuple[float, float, int]] = field(default_factory=list)  # (enter, exit, batch size)
    threads: dict[str, set[int]] = field(default_factory=dict)
    entered: threading.Event = field(default_factory=threading.Event)
    max_active: int = 0
    closed: bool = False
    _active: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def name(self) -> str:
        return self.inner.name

    def _on_thread(self, what: str) -> None:
        self.threads.setdefault(what, set()).add(threading.get_ident())

    def load(self, manifest: Manifest) -> None:
        self._on_thread("load")
        self.inner.load(manifest)

    def run(self, model: str, exit: int, batch: np.ndarray) -> np.ndarray:
        return next(iter(self.run_outputs(model, exit, batch).values()))

    def run_outputs(self, model: str, exit: int, batch: np.ndarray) -> dict[str, np.ndarray]:
        self._on_thread("run")
        with self._lock:
            self._active += 1
            self.max_active = max(self.max_active, self._active)
        enter = time.monotonic()
        self.entered.set()
        try:
            if model == self.fail_model:
                raise RuntimeError(f"injected failure on {model}")
            out = self.inner.run_outputs(model, exit, batch)
            if self.delay_s:
                time.sleep(self.delay_s)
            return out
        finally:
            leave = time.monotonic()
            with self._lock:
                self._active -= 1
                self.spans.append((enter, leave, batch.shape[0]))

    def fingerprint(self) -> Fingerprint:
        return self.inner.fingerprint()

    def close(self) -> None:
        self._on_thread("close")
        self.closed = True
        self.inner.close()


@dataclass
class HookedFactory:
    """A Server backend_factory that builds a HookedBackend and keeps it for the test to inspect."""

    delay_s: float = 0.0
    fail_model: str | None = None
    inline_safe: bool = False
    backend: HookedBackend | None = None

    def __call__(self, repository: ModelRepository, config: BackendConfig) -> HookedBackend:
        inner = OnnxRuntimeBackend(repository, threads=config.threads, warmup=config.warmup)
        self.backend = HookedBackend(inner, self.delay_s, self.fail_model, self.inline_safe)
        return self.backend
