"""The torch backend: runs the exported early-exit modules themselves, on CUDA or the CPU.

For GPUs without TensorRT, and to check the runtime against real GPU timings. The module is
rebuilt from the spec the manifest records (`source`: registry model and options, or a factory)
and its weights are checked against the exported `weights_sha256`, so it runs exactly what the
ONNX stages were exported from. torch is imported lazily (serving code never needs it).

On CUDA every (exit, batch) up to `max_batch` is captured once as a CUDA graph (warm-up on a side
stream first, as torch.cuda.graphs asks) that also holds the copies from a pinned input buffer and to
a pinned output buffer: a call writes the batch into the pinned input with numpy, replays the graph
and synchronizes. Two calls that let go of the GIL (replay, synchronize) instead of one per torch op:
on a server whose event loop wants the GIL, each one is a wait to get it back. The CUDA path runs in
tests/runtime/backends/test_torch_cuda.py where there is a GPU (not in CI); the CPU path runs in CI.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgeserve.errors import BackendUnavailableError, RepositoryError
from edgeserve.fingerprint import Fingerprint, cpu_name, jetson_power_state
from edgeserve.manifest import Manifest
from edgeserve.repository import ModelRepository
from edgeserve.runtime.validation import Feeds, loaded_model, require_chain, validate_exit, validate_feeds

TORCH_FIX = "install the export extra (`pip install 'edgeserve[export]'`, which brings torch)"


def import_torch() -> Any:
    try:
        import torch
    except ImportError as exc:
        raise BackendUnavailableError(
            f"the torch backend needs torch, which is not importable ({exc}); {TORCH_FIX}, "
            "or serve with `--backend onnxruntime`"
        ) from exc
    return torch


def model_request_from_source(manifest: Manifest) -> Any:
    """The edgeserve.export ModelRequest that rebuilds the module the manifest was exported from."""
    from edgeserve.export.models import ModelRequest

    source = manifest.source
    fix = f"re-export it with `edgeserve export --model ... --name {manifest.name}`"
    if "model_factory" in source:
        return ModelRequest(module=source["model_factory"], name=manifest.name)
    model = source.get("model")
    if model is None:
        raise RepositoryError(
            f"{manifest.name}: the manifest's source records neither `model` nor `model_factory`, "
            f"so the torch backend cannot rebuild the module; {fix}"
        )
    if "stem" not in source:
        return ModelRequest(model=model, name=manifest.name)
    seed = re.search(r"seed (\d+)", source.get("weights", ""))
    return ModelRequest(
        model=model,
        stem=source["stem"],
        width=float(source.get("width", "1")),
        num_classes=int(source["num_classes"]) if "num_classes" in source else None,
        seed=int(seed.group(1)) if seed else 0,
        name=manifest.name,
    )


@dataclass
class _Graph:
    graph: Any  # torch.cuda.CUDAGraph: pinned input -> device -> the exit's logits -> pinned output
    host_in: np.ndarray  # numpy views of the pinned buffers (written and read without torch)
    host_out: np.ndarray
    keep: tuple[Any, ...]  # the tensors the graph reads and writes, alive as long as it is


@dataclass
class _Loaded:
    manifest: Manifest
    module: Any
    graphs: dict[tuple[int, int], _Graph] = field(default_factory=dict)


class TorchBackend:
    """Runs a repository's models with torch. Owned by one thread (the executor's)."""

    name = "torch"

    def __init__(
        self,
        repository: ModelRepository,
        *,
        device: str | None = None,
        threads: int | None = None,
        cuda_graphs: bool = True,
        max_batch: int = 10,
        warmup: int = 3,
    ) -> None:
        self.torch = import_torch()
        if threads is not None and threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        if device is None:
            device = "cuda" if self.torch.cuda.is_available() else "cpu"
        if device.startswith("cuda") and not self.torch.cuda.is_available():
            raise BackendUnavailableError(
                f"torch backend: device {device!r} asked for, but this torch {self.torch.__version__} sees "
                "no CUDA GPU; use --device cpu or install a CUDA build of torch"
            )
        self.device = self.torch.device(device)
        self.repository = repository
        self.threads = threads
        if threads is not None:  # the executor thread builds the backend, so this is its setting
            self.torch.set_num_threads(threads)
        self.cuda_graphs = cuda_graphs and self.device.type == "cuda"
        self.max_batch = max_batch
        self.warmup = warmup
        self._pool: Any = None  # the CUDA graphs' one memory pool (see _capture)
        self._models: dict[str, _Loaded] = {}

    def load(self, manifest: Manifest) -> None:
        """Rebuild the module, check its weights against the export, move it to the device."""
        from edgeserve.export.errors import ExportError
        from edgeserve.export.models import build_model
        from edgeserve.export.state_npz import state_sha256

        require_chain(manifest, self.name)
        fix = f"re-export it with `edgeserve export` into {self.repository.root}"
        try:
            module = build_model(model_request_from_source(manifest)).module
        except ExportError as exc:
            raise RepositoryError(
                f"{manifest.name}: cannot rebuild the exported module ({exc}); {fix}"
            ) from exc
        expected = manifest.source.get("weights_sha256")
        actual = state_sha256(module)
        if expected != actual:
            raise RepositoryError(
                f"{self.repository.manifest_path(manifest.name)}: the rebuilt module's weights "
                f"(sha256 {actual[:12]}) are not the exported ones ({str(expected)[:12]}); the package's "
                f"weights or the model code changed since the export: {fix}"
            )
        loaded = _Loaded(manifest, module.to(self.device).eval())
        self._models[manifest.name] = loaded
        if self.cuda_graphs:
            self._capture(loaded)

    def _forward(self, module: Any, x: Any, exit: int) -> Any:
        from edgeserve.export.early_exit import forward_exit

        return forward_exit(module, x, exit)

    def _capture(self, loaded: _Loaded) -> None:
        """One CUDA graph per (exit, batch), after warm-up iterations on a side stream.

        Memory is shared, since graphs never run concurrently (one executor thread, one stream):
        every graph of a model reads a leading slice of one pinned and one device input at the
        largest batch and writes a slice of one pinned output per exit, and every graph of the
        backend takes its intermediates from one memory pool (each would otherwise keep its own:
        gigabytes for 40 graphs of a ResNet-50 at 224x224, on a Jetson whose GPU shares the RAM).
        Sharing the pool is safe here because what a graph reads or returns (inputs, weights,
        outputs) is kept alive, so only scratch memory is reused between graphs.
        """
        torch = self.torch
        manifest, top = loaded.manifest, self.max_batch
        shape, dtype = manifest.input.shape, getattr(torch, manifest.input.dtype)
        pinned_in = torch.zeros((top, *shape), dtype=dtype).pin_memory()
        static_in = torch.zeros((top, *shape), dtype=dtype, device=self.device)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        with torch.inference_mode():
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                outputs = [
                    self._forward(loaded.module, static_in, exit) for exit in range(len(manifest.exits))
                ]
                for _ in range(max(self.warmup, 1)):
                    for exit in range(len(manifest.exits)):
                        for batch in range(1, top + 1):
                            self._forward(loaded.module, static_in[:batch], exit)
            torch.cuda.current_stream(self.device).wait_stream(side)
            for exit, out in enumerate(outputs):
                pinned_out = torch.zeros(tuple(out.shape), dtype=torch.float32).pin_memory()
                for batch in range(1, top + 1):
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=self._pool):
                        static_in[:batch].copy_(pinned_in[:batch], non_blocking=True)
                        static_out = self._forward(loaded.module, static_in[:batch], exit).float()
                        pinned_out[:batch].copy_(static_out, non_blocking=True)
                    host_in, host_out = pinned_in[:batch].numpy(), pinned_out[:batch].numpy()
                    keep = (pinned_in, static_in, static_out, pinned_out)
                    loaded.graphs[(exit, batch)] = _Graph(graph, host_in, host_out, keep)

    @property
    def models(self) -> list[str]:
        return list(self._models)

    def run(self, model: str, exit: int, batch: Feeds) -> np.ndarray:
        """Logits (batch, num_classes) float32 at exit `exit`."""
        loaded = self._loaded(model)
        exit = validate_exit(loaded.manifest, exit)
        batch = validate_feeds(loaded.manifest, batch)[loaded.manifest.input.name]
        torch = self.torch
        captured = loaded.graphs.get((exit, batch.shape[0]))
        if captured is not None:
            captured.host_in[...] = batch
            captured.graph.replay()
            torch.cuda.current_stream(self.device).synchronize()
            return captured.host_out.copy()
        with torch.inference_mode():
            out = self._forward(loaded.module, torch.from_numpy(batch).to(self.device), exit)
            return out.float().cpu().numpy()

    def run_outputs(self, model: str, exit: int, batch: Feeds) -> dict[str, np.ndarray]:
        """The exit's logits by name: this backend serves the classifier chains `edgeserve export` writes."""
        manifest = self._loaded(model).manifest
        logits = manifest.stages[manifest.exits[validate_exit(manifest, exit)].stage].logits
        assert logits is not None  # load() took only single-input classifier chains
        return {logits.name: self.run(model, exit, batch)}

    def _loaded(self, model: str) -> _Loaded:
        return loaded_model(self._models, model)

    def fingerprint(self) -> Fingerprint:
        torch = self.torch
        if self.device.type == "cuda":
            device = torch.cuda.get_device_name(self.device)
            extra = {"cuda_graphs": str(self.cuda_graphs).lower()}
        else:
            device = cpu_name()
            extra = {}
        return Fingerprint(
            backend=self.name,
            device=device,
            threads=self.threads if self.threads is not None else torch.get_num_threads(),
            versions={"torch": torch.__version__},
            extra={**extra, **jetson_power_state()},
        )

    def close(self) -> None:
        self._models.clear()
        self._pool = None
        if self.device.type == "cuda":
            self.torch.cuda.empty_cache()
