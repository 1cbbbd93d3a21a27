"""The ONNX Runtime backend: one session per stage graph, stages chained at run time.

Per-stage sessions keep one copy of the weights for all exits (docs/architecture.md). Stages are chained
with IO binding: on CUDA/TensorRT the features between stages stay in device memory and only
the logits come back to the host. On the CPU the same path costs 3-6 us per stage over plain
`session.run` (Python wrapper overhead; 0.2-2% of a CIFAR-ResNet-sized stage, measured with
`benchmarks/iobinding_vs_run.py`), so one code path serves every provider and the CPU tests
exercise the one the GPU runs.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from edgeserve.errors import BackendUnavailableError, RepositoryError
from edgeserve.fingerprint import Fingerprint, cpu_name, jetson_power_state
from edgeserve.manifest import Manifest, StageSpec, TensorSpec
from edgeserve.repository import ModelRepository
from edgeserve.runtime.validation import loaded_model, validate_batch, validate_exit

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
TENSORRT = "TensorrtExecutionProvider"
PROVIDER_ALIASES = {"cpu": CPU, "cuda": CUDA, "tensorrt": TENSORRT, "trt": TENSORRT}
_DEVICE_PROVIDERS = (CUDA, TENSORRT)
_INSTALL_HINTS = {
    CUDA: "install onnxruntime-gpu instead of onnxruntime (`pip uninstall onnxruntime && pip install "
    "onnxruntime-gpu`; on a Jetson use the onnxruntime-gpu wheel built for your JetPack)",
    TENSORRT: "install an onnxruntime-gpu build with TensorRT support and the TensorRT libraries "
    "(on a Jetson both come with JetPack's onnxruntime-gpu wheel)",
}
# The onnx element type strings ORT reports for manifest dtypes.
_ORT_TYPES = {"float32": "tensor(float)", "float16": "tensor(float16)", "uint8": "tensor(uint8)"}
WARMUP_BATCHES = (1, 8)


def default_threads() -> int:
    """Leave one core to the event loop: the loop must keep accepting requests during inference."""
    return max(1, (os.cpu_count() or 1) - 1)


def resolve_providers(
    requested: Sequence[str] | None, available: Sequence[str] | None = None
) -> tuple[str, ...]:
    """Full provider names in priority order, with the CPU last as the fallback for unsupported ops.

    Nothing requested: CUDA where the installed onnxruntime has it, else the CPU. TensorRT is used
    only when asked for, because it compiles engines when a session opens (minutes per stage).
    """
    installed = list(ort.get_available_providers() if available is None else available)
    if not requested:
        wanted = [CUDA] if CUDA in installed else []
    else:
        wanted = [PROVIDER_ALIASES.get(p.strip().lower(), p.strip()) for p in requested if p.strip()]
    for provider in wanted:
        if provider not in installed:
            hint = _INSTALL_HINTS.get(
                provider, f"choose one of {sorted(PROVIDER_ALIASES)} or a full name installed"
            )
            raise BackendUnavailableError(
                f"execution provider {provider!r} is not available in this onnxruntime "
                f"{ort.__version__} (installed: {', '.join(installed)}); {hint}"
            )
    chosen = list(dict.fromkeys(wanted))
    if CPU not in chosen:
        chosen.append(CPU)
    return tuple(chosen)


def session_options(threads: int) -> ort.SessionOptions:
    """Steady latencies first: fixed intra-op threads, no inter-op parallelism, full graph optimisation."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3  # warnings about CPU fallbacks would drown the serving logs
    return options


def gpu_name(device_id: int = 0) -> str:
    """The NVIDIA GPU's model name from the driver's /proc entry, or the Jetson board name."""
    gpus = sorted(Path("/proc/driver/nvidia/gpus").glob("*/information"))
    if device_id < len(gpus):
        for line in gpus[device_id].read_text(errors="replace").splitlines():
            if line.startswith("Model:"):
                return line.split(":", 1)[1].strip()
    board = jetson_power_state().get("board")
    return board or f"cuda:{device_id}"


@dataclass(frozen=True)
class StageSession:
    """An open stage graph and what the manifest says it takes and gives."""

    session: ort.InferenceSession
    spec: StageSpec


@dataclass
class _Loaded:
    manifest: Manifest
    stages: list[StageSession]


def run_chain(
    stages: Sequence[StageSession], batch: np.ndarray, device: str = "cpu", device_id: int = 0
) -> np.ndarray:
    """Run `stages` in order on a validated batch and return the last one's logits on the host.

    Features between stages are bound to `device` ("cuda" keeps them in GPU memory); only the
    output the next step needs is bound, so no unused head result is copied anywhere.
    """
    value: ort.OrtValue | None = None
    for i, stage in enumerate(stages):
        binding = stage.session.io_binding()
        if value is None:
            binding.bind_cpu_input(stage.spec.input.name, batch)
        else:
            binding.bind_ortvalue_input(stage.spec.input.name, value)
        if i == len(stages) - 1:
            assert stage.spec.logits is not None  # Manifest.validate guarantees an exit's stage has logits
            binding.bind_output(stage.spec.logits.name, "cpu")
            stage.session.run_with_iobinding(binding)
            return binding.copy_outputs_to_cpu()[0]
        assert stage.spec.features is not None  # and that every stage before the last has features
        binding.bind_output(stage.spec.features.name, device, device_id)
        stage.session.run_with_iobinding(binding)
        value = binding.get_outputs()[0]
    raise ValueError("run_chain needs at least one stage")


class OnnxRuntimeBackend:
    """Runs models of one repository with ONNX Runtime. Owned by one thread (the executor's)."""

    name = "onnxruntime"

    def __init__(
        self,
        repository: ModelRepository,
        *,
        threads: int | None = None,
        providers: Sequence[str] | None = None,
        warmup: int = 3,
        device_id: int = 0,
    ) -> None:
        if threads is not None and threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self.repository = repository
        self.threads = threads if threads is not None else default_threads()
        self.providers = resolve_providers(providers)
        self.warmup = warmup
        self.device_id = device_id
        self._device = "cuda" if self.providers[0] in _DEVICE_PROVIDERS else "cpu"
        self._models: dict[str, _Loaded] = {}

    # -- loading -----------------------------------------------------------------------------------

    def _provider_list(self) -> list[str | tuple[str, dict[str, str]]]:
        out: list[str | tuple[str, dict[str, str]]] = []
        for p in self.providers:
            out.append((p, {"device_id": str(self.device_id)}) if p in _DEVICE_PROVIDERS else p)
        return out

    def load(self, manifest: Manifest) -> None:
        """Verify the stage files, open one session per stage, check them against the manifest, warm up."""
        self.repository.verify(manifest)
        options = session_options(self.threads)
        stages = []
        for spec in manifest.stages:
            path = self.repository.stage_path(manifest, spec.index)
            try:
                session = ort.InferenceSession(str(path), options, providers=self._provider_list())
            except Exception as exc:  # ORT raises its own exception types for unreadable graphs
                raise RepositoryError(
                    f"{path}: ONNX Runtime cannot open this stage graph ({exc}); re-export it with "
                    f"`edgeserve export --model {manifest.name} --repository {self.repository.root}`"
                ) from exc
            _check_session(session, spec, manifest, path, self.repository.root)
            stages.append(StageSession(session, spec))
        self._models[manifest.name] = _Loaded(manifest, stages)
        self._warm_up(manifest)

    def _warm_up(self, manifest: Manifest) -> None:
        """First runs allocate arenas and pick kernels; do that before the first real request."""
        if self.warmup <= 0:
            return
        for batch in WARMUP_BATCHES:
            x = np.zeros((batch, *manifest.input.shape), dtype=np.dtype(manifest.input.dtype))
            for exit in range(len(manifest.exits)):
                for _ in range(self.warmup):
                    self.run(manifest.name, exit, x)

    @property
    def models(self) -> list[str]:
        return list(self._models)

    def manifest(self, model: str) -> Manifest:
        return self._loaded(model).manifest

    def stage_sessions(self, model: str) -> list[StageSession]:
        """The open sessions of a loaded model, for tools that inspect or benchmark them."""
        return list(self._loaded(model).stages)

    def _loaded(self, model: str) -> _Loaded:
        return loaded_model(self._models, model)

    # -- inference ---------------------------------------------------------------------------------

    def run(self, model: str, exit: int, batch: np.ndarray) -> np.ndarray:
        """Logits (batch, num_classes) float32 at exit `exit`, running stages 0..exit's stage."""
        loaded = self._loaded(model)
        manifest = loaded.manifest
        exit = validate_exit(manifest, exit)
        batch = validate_batch(manifest, batch)
        last = manifest.exits[exit].stage
        return run_chain(loaded.stages[: last + 1], batch, self._device, self.device_id)

    # -- identity ----------------------------------------------------------------------------------

    def fingerprint(self) -> Fingerprint:
        device = gpu_name(self.device_id) if self._device == "cuda" else cpu_name()
        return Fingerprint(
            backend=self.name,
            device=device,
            threads=self.threads,
            providers=self.providers,
            versions={"onnxruntime": ort.__version__},
            extra=jetson_power_state(),
        )

    def close(self) -> None:
        """Drop the sessions; ONNX Runtime frees their memory when the last reference goes."""
        self._models.clear()


def _check_session(
    session: ort.InferenceSession, spec: StageSpec, manifest: Manifest, path: Path, root: Path
) -> None:
    """The graph must take and give exactly what the manifest says, or chaining would go wrong."""
    fix = f"re-export it with `edgeserve export --model {manifest.name} --repository {root}`"
    inputs = session.get_inputs()
    if [i.name for i in inputs] != [spec.input.name]:
        raise RepositoryError(
            f"{path}: graph inputs are {[i.name for i in inputs]}, "
            f"the manifest says [{spec.input.name!r}]; {fix}"
        )
    _check_shape(path, "input", inputs[0], spec.input, fix)
    wanted = {t.name: t for t in (spec.features, spec.logits) if t is not None}
    outputs = {o.name: o for o in session.get_outputs()}
    if set(outputs) != set(wanted):
        raise RepositoryError(
            f"{path}: graph outputs are {sorted(outputs)}, the manifest says {sorted(wanted)}; {fix}"
        )
    for name, tensor in wanted.items():
        _check_shape(path, "output", outputs[name], tensor, fix)


def _check_shape(path: Path, kind: str, arg: ort.NodeArg, spec: TensorSpec, fix: str) -> None:
    expected_type = _ORT_TYPES.get(spec.dtype)
    if expected_type is not None and arg.type != expected_type:
        raise RepositoryError(
            f"{path}: {kind} {arg.name!r} is {arg.type}, the manifest says {spec.dtype}; {fix}"
        )
    if not arg.shape:
        return  # rank not recorded in the graph: nothing to compare until it runs
    dims = list(arg.shape)[1:]
    if len(dims) != len(spec.shape) or any(
        isinstance(d, int) and d != s for d, s in zip(dims, spec.shape, strict=True)
    ):
        raise RepositoryError(
            f"{path}: {kind} {arg.name!r} has per-sample shape {dims}, "
            f"the manifest says {list(spec.shape)}; {fix}"
        )
