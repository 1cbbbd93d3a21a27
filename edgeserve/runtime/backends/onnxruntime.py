"""The ONNX Runtime backend: one session per stage graph, stages chained at run time, or composed.

Per-stage sessions keep one copy of the weights for all exits (docs/architecture.md). A model small
enough (exit_graphs.COMPOSE_MAX_BYTES, `[backend] compose_exits`) also gets one session per exit
whose graph is stages 0..k composed: a batch is then one ONNX Runtime call and one GIL hand-off
instead of one per stage (exit_graphs.py). Stages are chained
with IO binding: on CUDA/TensorRT the features between stages stay in device memory and only
the logits come back to the host. On the CPU the same path costs 3-6 us per stage over plain
`session.run` (Python wrapper overhead; 0.2-2% of a CIFAR-ResNet-sized stage, measured with
`benchmarks/iobinding_vs_run.py`), so one code path serves every provider and the CPU tests
exercise the one the GPU runs.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from edgeserve.errors import BackendUnavailableError, InputError, RepositoryError
from edgeserve.fingerprint import Fingerprint, cpu_name, jetson_power_state
from edgeserve.manifest import Manifest, StageSpec, TensorSpec
from edgeserve.onnx_graph import sample_batch
from edgeserve.repository import ModelRepository
from edgeserve.runtime.backends.exit_graphs import COMPOSE_MAX_BYTES, compose_exits, worth_composing
from edgeserve.runtime.validation import Feeds, loaded_model, validate_exit, validate_feeds

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
_ORT_TYPES = {
    "float32": "tensor(float)",
    "float16": "tensor(float16)",
    "float64": "tensor(double)",
    "uint8": "tensor(uint8)",
    "uint16": "tensor(uint16)",
    "int8": "tensor(int8)",
    "int16": "tensor(int16)",
    "int32": "tensor(int32)",
    "int64": "tensor(int64)",
    "bool": "tensor(bool)",
}
WARMUP_BATCHES = (1, 8)
_log = logging.getLogger(__name__)


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


@dataclass(frozen=True)
class ExitSession:
    """An open composed graph (stages 0..k): the graph inputs it takes and the outputs it gives."""

    session: ort.InferenceSession
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        values = self.session.run(list(self.outputs), {name: feeds[name] for name in self.inputs})
        return dict(zip(self.outputs, values, strict=True))


@dataclass
class _Loaded:
    manifest: Manifest
    stages: list[StageSession]
    composed: dict[int, ExitSession]  # by exit stage; stages absent here run as a chain


def run_chain(
    stages: Sequence[StageSession], feeds: Mapping[str, np.ndarray], device: str = "cpu", device_id: int = 0
) -> dict[str, np.ndarray]:
    """Run `stages` in order on validated graph inputs; the last one's exit outputs, on the host.
    On the CPU with plain `run` (fewer Python calls, each one a GIL hand-off on a busy server:
    benchmarks/iobinding_vs_run.py), elsewhere with IO binding (`run_chain_bound`)."""
    if device == "cpu":
        return run_chain_plain(stages, feeds)
    return run_chain_bound(stages, feeds, device, device_id)


def run_chain_plain(stages: Sequence[StageSession], feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """numpy in, numpy out of every stage; each later stage takes what it needs by name."""
    values = dict(feeds)
    last = len(stages) - 1
    for i, stage in enumerate(stages):
        names = [t.name for t in stage.spec.exit_outputs] if i == last else list(stage.spec.passes)
        outputs = stage.session.run(names, {name: values[source] for name, source in stage.spec.feeds})
        if i == last:
            return dict(zip(names, outputs, strict=True))
        values.update(zip(names, outputs, strict=True))
    raise ValueError("run_chain needs at least one stage")


def run_chain_bound(
    stages: Sequence[StageSession], feeds: Mapping[str, np.ndarray], device: str, device_id: int = 0
) -> dict[str, np.ndarray]:
    """Tensors a stage passes on are bound to `device` ("cuda" keeps them in GPU memory) and fed by
    name to the later stages that take them; only outputs someone needs are bound, so no unused
    head result is copied anywhere."""
    values: dict[str, np.ndarray | ort.OrtValue] = dict(feeds)
    for i, stage in enumerate(stages):
        binding = stage.session.io_binding()
        for name, source in stage.spec.feeds:
            value = values[source]
            if isinstance(value, np.ndarray):
                binding.bind_cpu_input(name, value)
            else:
                binding.bind_ortvalue_input(name, value)
        if i == len(stages) - 1:
            names = [t.name for t in stage.spec.exit_outputs]
            for name in names:
                binding.bind_output(name, "cpu")
            stage.session.run_with_iobinding(binding)
            return dict(zip(names, binding.copy_outputs_to_cpu(), strict=True))
        names = list(stage.spec.passes)
        for name in names:
            binding.bind_output(name, device, device_id)
        stage.session.run_with_iobinding(binding)
        values.update(zip(names, binding.get_outputs(), strict=True))
    raise ValueError("run_chain needs at least one stage")


def graph_feeds(manifest: Manifest, feeds: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], int]:
    """The batch as the graphs take it, and its size: an unbatched input loses its batch of 1;
    a graph with a fixed batch gets its batch padded with zeros to that size."""
    size = next(iter(feeds.values())).shape[0]
    fixed = manifest.batch
    out = {}
    for spec in manifest.inputs:
        array = feeds[spec.name]
        if not spec.batched:
            if size != 1:
                raise InputError(
                    f"model {manifest.name!r} takes {spec.name!r} without a batch dimension, so it runs "
                    f"one sample at a time, not {size}"
                )
            array = array[0, ...]  # a 0-d array, not a numpy scalar, for a scalar input
        elif fixed is not None and size != fixed:
            if size > fixed:
                raise InputError(f"model {manifest.name!r} runs batches of exactly {fixed}, not {size}")
            pad = np.zeros((fixed - size, *array.shape[1:]), dtype=array.dtype)
            array = np.concatenate([array, pad])
        out[spec.name] = array
    return out, size


def batch_outputs(
    specs: Sequence[TensorSpec], outputs: dict[str, np.ndarray], size: int
) -> dict[str, np.ndarray]:
    """Outputs with the batch first, as the runtime splits them: an unbatched output gets a batch of
    1, a padded batch loses its padding."""
    batched = {spec.name: spec.batched for spec in specs}
    return {
        name: (value[:size] if batched.get(name, True) else value[None]) for name, value in outputs.items()
    }


class OnnxRuntimeBackend:
    """Runs models of one repository with ONNX Runtime. Owned by one thread (the executor's), but
    its sessions may run from any thread: the loop runs short batches itself (`inline_safe`)."""

    name = "onnxruntime"
    inline_safe = True

    def __init__(
        self,
        repository: ModelRepository,
        *,
        threads: int | None = None,
        providers: Sequence[str] | None = None,
        warmup: int = 3,
        device_id: int = 0,
        compose: bool | None = None,
    ) -> None:
        """`compose`: one session per exit (True), per stage only (False), or None: per exit for
        models whose stages total at most exit_graphs.COMPOSE_MAX_BYTES."""
        if threads is not None and threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self.repository = repository
        self.threads = threads if threads is not None else default_threads()
        self.providers = resolve_providers(providers)
        self.warmup = warmup
        self.device_id = device_id
        self.compose = compose
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
        loaded = _Loaded(manifest, stages, {})
        limit = None if self.compose else COMPOSE_MAX_BYTES
        if self.compose is not False and worth_composing(manifest, limit):
            loaded.composed = self._composed(manifest, stages, options)
        self._models[manifest.name] = loaded
        self._warm_up(manifest)

    def _composed(
        self, manifest: Manifest, stages: list[StageSession], options: ort.SessionOptions
    ) -> dict[int, ExitSession]:
        """One session per multi-stage exit, each checked against the chain on a sample batch; {} (the
        chain serves) with a warning when the model's stages cannot be composed or disagree."""
        paths = [self.repository.stage_path(manifest, spec.index) for spec in manifest.stages]
        try:
            graphs = compose_exits(manifest, paths)
            composed = {}
            for stage, graph in graphs.items():
                session = ort.InferenceSession(graph, options, providers=self._provider_list())
                inputs = tuple(i.name for i in session.get_inputs())
                outputs = tuple(t.name for t in manifest.stages[stage].exit_outputs)
                composed[stage] = ExitSession(session, inputs, outputs)
            feeds, _ = graph_feeds(
                manifest, validate_feeds(manifest, sample_batch(manifest, manifest.max_batch or 2))
            )
            for stage, exit_session in composed.items():
                _check_same(
                    exit_session.run(feeds),
                    run_chain(stages[: stage + 1], feeds, self._device, self.device_id),
                )
        except Exception as exc:  # ImportError (no onnx), ValueError, ORT's own errors
            _log.warning(
                "%s: serving each exit as a chain of stage sessions (composing them into one graph "
                "per exit failed: %s)",
                manifest.name,
                exc,
            )
            return {}
        return composed

    def _warm_up(self, manifest: Manifest) -> None:
        """First runs allocate arenas and pick kernels; do that before the first real request."""
        if self.warmup <= 0:
            return
        largest = manifest.max_batch
        for batch in WARMUP_BATCHES if largest is None else (largest,):
            feeds = sample_batch(manifest, batch)
            for exit in range(len(manifest.exits)):
                for _ in range(self.warmup):
                    self.run_outputs(manifest.name, exit, feeds)

    @property
    def models(self) -> list[str]:
        return list(self._models)

    def manifest(self, model: str) -> Manifest:
        return self._loaded(model).manifest

    def stage_sessions(self, model: str) -> list[StageSession]:
        """The open sessions of a loaded model, for tools that inspect or benchmark them."""
        return list(self._loaded(model).stages)

    def composed_stages(self, model: str) -> tuple[int, ...]:
        """The exit stages of a loaded model that run as one composed graph (the rest: chained)."""
        return tuple(sorted(self._loaded(model).composed))

    def _loaded(self, model: str) -> _Loaded:
        return loaded_model(self._models, model)

    # -- inference ---------------------------------------------------------------------------------

    def run(self, model: str, exit: int, batch: Feeds) -> np.ndarray:
        """The first exit output (a classifier's logits, (batch, num_classes)) at exit `exit`."""
        return next(iter(self.run_outputs(model, exit, batch).values()))

    def run_outputs(self, model: str, exit: int, batch: Feeds) -> dict[str, np.ndarray]:
        """Every output of exit `exit` by name, batch first, running stages 0..exit's stage."""
        loaded = self._loaded(model)
        manifest = loaded.manifest
        exit = validate_exit(manifest, exit)
        feeds, size = graph_feeds(manifest, validate_feeds(manifest, batch))
        last = manifest.exits[exit].stage
        composed = loaded.composed.get(last)
        if composed is not None:
            outputs = composed.run(feeds)
        else:
            outputs = run_chain(loaded.stages[: last + 1], feeds, self._device, self.device_id)
        return batch_outputs(manifest.stages[last].outputs, outputs, size)

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


def _check_same(composed: Mapping[str, np.ndarray], chained: Mapping[str, np.ndarray]) -> None:
    for name, want in chained.items():
        got = composed[name]
        same = got.shape == want.shape and (
            np.allclose(got, want, rtol=1e-4, atol=1e-5, equal_nan=True)
            if np.issubdtype(want.dtype, np.floating)
            else np.array_equal(got, want)
        )
        if not same:
            raise ValueError(f"the composed graph's {name!r} differs from the chain's")


def _check_session(
    session: ort.InferenceSession, spec: StageSpec, manifest: Manifest, path: Path, root: Path
) -> None:
    """The graph must take and give exactly what the manifest says, or chaining would go wrong."""
    fix = f"re-export it with `edgeserve export --model {manifest.name} --repository {root}`"
    if "imported_from" in manifest.source:
        fix = (
            f"re-import it with `edgeserve import FILE.onnx --name {manifest.name} "
            f"--repository {root} --force`"
        )
    inputs = {i.name: i for i in session.get_inputs()}
    wanted_inputs = [t.name for t in spec.inputs]
    if sorted(inputs) != sorted(wanted_inputs):
        raise RepositoryError(
            f"{path}: graph inputs are {sorted(inputs)}, the manifest says {sorted(wanted_inputs)}; {fix}"
        )
    for tensor in spec.inputs:
        _check_shape(path, "input", inputs[tensor.name], tensor, fix)
    wanted = {t.name: t for t in spec.outputs}
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
    if not arg.shape and (spec.batched or spec.shape):
        return  # rank not recorded in the graph: nothing to compare until it runs
    dims = list(arg.shape)[1:] if spec.batched else list(arg.shape)
    if len(dims) != len(spec.shape) or any(
        isinstance(d, int) and s >= 0 and d != s for d, s in zip(dims, spec.shape, strict=True)
    ):
        what = "per-sample shape" if spec.batched else "shape"
        raise RepositoryError(
            f"{path}: {kind} {arg.name!r} has {what} {dims}, the manifest says {list(spec.shape)}; {fix}"
        )
