"""The TensorRT backend: one engine per stage, one execution context per (stage, batch size).

Built by `edgeserve build-engines`; an engine that does not match this GPU, TensorRT version,
precision or the manifest's ONNX is refused with the command that rebuilds it. At load, every
buffer is allocated once at the largest batch (edgeserve.runtime.backends.buffer_plan), and each context
gets its optimization profile, input shape and tensor addresses once; a call then only copies the
batch into pinned memory, enqueues the stages back to back on the executor's one stream (features
never leave the device) and copies the logits back. With `cuda_graphs`, each (exit, batch) is one
captured CUDA graph holding all of that (the copy in, stages 0..exit, the copy out), so a call lets
go of the GIL twice (launch, synchronize) instead of once per CUDA call: on a server whose event
loop wants the GIL, each release is a wait to get it back (docs/accelerators.md, torch backend).
Execution contexts share one activation scratch buffer per model (they never run concurrently:
one stream, one thread).

Imported models (anything but export's single-input classifier chains: several inputs and
outputs, tensors passed by name, a fixed batch, unbatched tensors) take the generic path in
edgeserve.runtime.backends.tensorrt_imported: one profile per engine, buffers wired by name, no
CUDA graphs. That path was written against TensorRT 10's documented API and has never been
executed (see that module).

GPU-only code: not executed by the test suite (no GPU or TensorRT there); its pure parts are.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from edgeserve.errors import InputError, RepositoryError
from edgeserve.fingerprint import Fingerprint, jetson_power_state
from edgeserve.manifest import Manifest
from edgeserve.onnx_graph import sample_batch
from edgeserve.repository import ModelRepository
from edgeserve.runtime.backends.buffer_plan import BufferPlan, plan_buffers
from edgeserve.runtime.backends.cuda_runtime import (
    CudaGraph,
    DeviceBuffer,
    GraphCaptureError,
    check,
    import_cudart,
    new_stream,
)
from edgeserve.runtime.backends.engine_cache import (
    BuildTarget,
    EngineRecord,
    batch_sizes,
    engine_path,
    load_current_record,
    per_batch_chain,
)
from edgeserve.runtime.backends.tensorrt_build import detect_target, import_tensorrt
from edgeserve.runtime.backends.tensorrt_imported import (
    ImportedModel,
    check_profiles,
    open_imported,
    refuse_unservable,
    run_imported,
)
from edgeserve.runtime.validation import Feeds, loaded_model, validate_exit, validate_feeds

if TYPE_CHECKING:  # tensorrt-stubs: mypy checks every TensorRT call here against its signatures
    import tensorrt as trt

_log = logging.getLogger(__name__)


@dataclass
class _LoadedModel:
    manifest: Manifest
    plan: BufferPlan
    engines: list[trt.ICudaEngine]
    buffers: dict[str, DeviceBuffer]
    scratch: DeviceBuffer
    contexts: list[list[trt.IExecutionContext]]  # [stage][batch - 1]
    graphs: dict[tuple[int, int], CudaGraph] = field(default_factory=dict)  # (last stage, batch)


class TensorRTBackend:
    """Runs a repository's prebuilt engines on one GPU. Owned by one thread (the executor's)."""

    name = "tensorrt"

    def __init__(
        self,
        repository: ModelRepository,
        *,
        precision: str = "fp32",
        device_id: int = 0,
        cuda_graphs: bool = True,
        warmup: int = 3,
    ) -> None:
        self.trt = import_tensorrt()
        self.cudart = import_cudart()
        self.repository = repository
        self.device_id = device_id
        self.cuda_graphs = cuda_graphs
        self.warmup = warmup
        check(self.cudart.cudaSetDevice(device_id), "cudaSetDevice")
        self.target: BuildTarget = detect_target(precision, device_id)
        self._logger: trt.Logger = self.trt.Logger(self.trt.Logger.WARNING)
        self._runtime: trt.Runtime = self.trt.Runtime(self._logger)
        self._stream: Any = None  # created by the first load, on the thread that owns the backend
        self._stream_handle = 0  # int(self._stream), kept: execute_async_v3 takes the raw handle
        self._models: dict[str, _LoadedModel | ImportedModel] = {}

    # -- loading -----------------------------------------------------------------------------------

    def load(self, manifest: Manifest) -> None:
        """Deserialize the stage engines, allocate buffers, bind contexts, warm up (and capture graphs
        for export's chains). A model TensorRT cannot serve is refused naming the tensor."""
        chain = per_batch_chain(manifest)
        if not chain:
            refuse_unservable(manifest)
        if self._stream is None:
            self._stream = new_stream(self.cudart)
            self._stream_handle = int(self._stream)
        records = [
            load_current_record(self.repository, manifest, k, self.target)
            for k in range(len(manifest.stages))
        ]
        if chain:
            self._load_chain(manifest, records)
        else:
            self._load_imported(manifest, records)

    def _load_imported(self, manifest: Manifest, records: list[EngineRecord]) -> None:
        """The generic path (never executed here: no GPU or TensorRT in this project's sessions)."""
        fix = f"rebuild with `edgeserve build-engines --model {manifest.name} --force`"
        max_batch = check_profiles(manifest, records, fix)
        paths = [engine_path(self.repository, manifest.name, self.target, k) for k in range(len(records))]
        self._unload(manifest.name)
        engines = []
        for path in paths:
            engine = self._runtime.deserialize_cuda_engine(path.read_bytes())
            if engine is None:
                raise RepositoryError(f"{path}: TensorRT cannot deserialize this engine; {fix}")
            engines.append(engine)
        loaded = open_imported(self.trt, self.cudart, self._stream, manifest, engines, paths, max_batch, fix)
        try:
            sizes = sorted({1, loaded.plan.max_batch})
            for _ in range(self.warmup):
                for size in sizes:
                    feeds = sample_batch(manifest, size)
                    for exit in range(len(manifest.exits)):
                        run_imported(self.cudart, self._stream, loaded, exit, feeds)
        except BaseException:
            self._release(loaded)
            raise
        self._models[manifest.name] = loaded

    def _load_chain(self, manifest: Manifest, records: list[EngineRecord]) -> None:
        """Export's classifier chains: a profile and a context per batch size, CUDA graphs."""
        max_batch = min(max(r.batch_sizes) for r in records)
        fix = f"rebuild with `edgeserve build-engines --model {manifest.name} --force`"
        if any(r.batch_profile is not None for r in records):
            raise RepositoryError(f"{manifest.name}: engines were built with one batch profile; {fix}")
        if any(r.batch_sizes[:max_batch] != batch_sizes(max_batch) for r in records):
            raise RepositoryError(f"{manifest.name}: engines must have profiles for batches 1..N; {fix}")
        plan = plan_buffers(manifest, max_batch)
        self._unload(manifest.name)
        engines = []
        for k in range(len(manifest.stages)):
            path = engine_path(self.repository, manifest.name, self.target, k)
            engine = self._runtime.deserialize_cuda_engine(path.read_bytes())
            if engine is None:
                raise RepositoryError(f"{path}: TensorRT cannot deserialize this engine; {fix}")
            _check_engine_io(self.trt, engine, plan, k, path, fix)
            engines.append(engine)
        buffers = {a.name: DeviceBuffer(self.cudart, a.nbytes, a.dtype, a.host) for a in plan.allocations}
        scratch = DeviceBuffer(self.cudart, max(_scratch_bytes(e) for e in engines), "uint8", host=False)
        loaded = _LoadedModel(manifest, plan, engines, buffers, scratch, contexts=[])
        try:
            for k, engine in enumerate(engines):
                loaded.contexts.append(self._bind_contexts(engine, plan, k, buffers, scratch))
            check(self.cudart.cudaStreamSynchronize(self._stream), "cudaStreamSynchronize")
            self._warm_up_and_capture(loaded)
        except BaseException:
            self._release(loaded)
            raise
        self._models[manifest.name] = loaded

    def _unload(self, name: str) -> None:
        """Reloading: free the old engines, contexts and buffers before deserializing the new ones.

        A Jetson's GPU shares the board's DRAM (8 GB on the smaller Orins), so old and new engines of
        a large model may not fit together. The engine records were checked before this (load), so
        what still can fail here (a corrupt engine, out of memory) leaves the model unloaded, and
        the caller's error says why; serving the old engines on was not worth holding both.
        """
        if name in self._models:
            self._release(self._models.pop(name))

    def _bind_contexts(
        self,
        engine: trt.ICudaEngine,
        plan: BufferPlan,
        stage: int,
        buffers: dict[str, DeviceBuffer],
        scratch: DeviceBuffer,
    ) -> list[trt.IExecutionContext]:
        """One context per batch size: profile, input shape and addresses are set here, once."""
        strategy = self.trt.ExecutionContextAllocationStrategy.USER_MANAGED
        contexts = []
        for batch in range(1, plan.max_batch + 1):
            bindings = plan.bindings(stage, batch)
            where = f"{plan.model} stage {stage}, batch {batch}"
            context = engine.create_execution_context(strategy)
            if context is None:
                raise RuntimeError(f"{where}: TensorRT create_execution_context returned None (see its log)")
            if hasattr(context, "set_device_memory"):  # TensorRT >= 10.1: pointer and size
                context.set_device_memory(scratch.device, scratch.nbytes)
            else:
                context.device_memory = scratch.device  # type: ignore[attr-defined]  # TensorRT 10.0
            if not context.set_optimization_profile_async(bindings.profile, self._stream_handle):
                raise RuntimeError(
                    f"{where}: TensorRT set_optimization_profile_async({bindings.profile}) failed"
                )
            for b in bindings.bindings:
                if b.is_input and not context.set_input_shape(b.tensor, b.shape):
                    raise RuntimeError(
                        f"{where}: TensorRT set_input_shape({b.tensor!r}, {list(b.shape)}) failed on "
                        f"profile {bindings.profile}"
                    )
                if not context.set_tensor_address(b.tensor, buffers[b.allocation].device):
                    raise RuntimeError(f"{where}: TensorRT set_tensor_address({b.tensor!r}) failed")
            contexts.append(context)
        return contexts

    def _warm_up_and_capture(self, loaded: _LoadedModel) -> None:
        """TensorRT needs one real enqueue per context before capture; the warm-up provides it."""
        last_stage = len(loaded.manifest.stages) - 1
        for _ in range(max(self.warmup, 1)):
            for batch in range(1, loaded.plan.max_batch + 1):
                self._enqueue(loaded, last_stage, batch)
        check(self.cudart.cudaStreamSynchronize(self._stream), "cudaStreamSynchronize")
        if not self.cuda_graphs:
            return
        refused: dict[int, str] = {}  # last stage -> why TensorRT could not enqueue it under capture
        for last in sorted({e.stage for e in loaded.manifest.exits}):
            for batch in range(1, loaded.plan.max_batch + 1):

                def work(last: int = last, batch: int = batch) -> None:
                    self._enqueue(loaded, last, batch)

                try:
                    loaded.graphs[(last, batch)] = CudaGraph.capture(self.cudart, self._stream, work)
                except GraphCaptureError as exc:  # as trtexec: this work runs without a graph
                    refused.setdefault(last, str(exc))
        if refused:
            _log.warning(
                "%s: CUDA graph capture failed for %s; those exits run without a CUDA graph",
                loaded.manifest.name,
                "; ".join(f"stages 0..{last} ({why})" for last, why in sorted(refused.items())),
            )

    @property
    def models(self) -> list[str]:
        return list(self._models)

    # -- inference ---------------------------------------------------------------------------------

    def _enqueue(self, loaded: _LoadedModel, last_stage: int, batch: int) -> None:
        """A call's work on the stream: the pinned input up, stages 0..last_stage, its logits down."""
        manifest, plan = loaded.manifest, loaded.plan
        loaded.buffers["input"].upload(
            plan.bindings(0, batch).binding(manifest.stages[0].input.name).nbytes, self._stream
        )
        for stage in range(last_stage + 1):
            if not loaded.contexts[stage][batch - 1].execute_async_v3(self._stream_handle):
                raise RuntimeError(f"{manifest.name}: TensorRT execute_async_v3 failed on stage {stage}")
        logits = manifest.stages[last_stage].logits
        assert logits is not None  # an exit's stage: the chain's manifests give it logits
        nbytes = plan.bindings(last_stage, batch).binding(logits.name).nbytes
        loaded.buffers[f"stage{last_stage}.logits"].download(nbytes, self._stream)

    def run(self, model: str, exit: int, batch: Feeds) -> np.ndarray:
        """The first exit output (a classifier's logits), stages chained on the device."""
        loaded = self._loaded(model)
        if isinstance(loaded, ImportedModel):
            return next(iter(run_imported(self.cudart, self._stream, loaded, exit, batch).values()))
        manifest = loaded.manifest
        exit = validate_exit(manifest, exit)
        batch = validate_feeds(manifest, batch)[manifest.input.name]
        n = batch.shape[0]
        if n > loaded.plan.max_batch:
            raise InputError(
                f"model {model!r}: batch of {n} exceeds the engines' largest batch {loaded.plan.max_batch}; "
                f"split it or rebuild with `edgeserve build-engines --model {model} --max-batch {n} --force`"
            )
        last = manifest.exits[exit].stage
        source = loaded.buffers["input"]
        assert source.host is not None
        source.host[: batch.size] = batch.reshape(-1)
        graph = loaded.graphs.get((last, n))
        if graph is not None:
            graph.launch(self._stream)
        else:
            self._enqueue(loaded, last, n)
        check(self.cudart.cudaStreamSynchronize(self._stream), "cudaStreamSynchronize")
        logits_spec = manifest.stages[last].logits
        assert logits_spec is not None
        out = loaded.buffers[f"stage{last}.logits"]
        assert out.host is not None
        count = n * int(np.prod(logits_spec.shape))
        return out.host[:count].reshape(n, *logits_spec.shape).astype(np.float32, copy=True)

    def run_outputs(self, model: str, exit: int, batch: Feeds) -> dict[str, np.ndarray]:
        """Every output of exit `exit` by name, batch first (a chain's exit has one: its logits)."""
        loaded = self._loaded(model)
        if isinstance(loaded, ImportedModel):
            return run_imported(self.cudart, self._stream, loaded, exit, batch)
        manifest = loaded.manifest
        logits = manifest.stages[manifest.exits[validate_exit(manifest, exit)].stage].logits
        assert logits is not None  # per_batch_chain models have one exit output per exit stage
        return {logits.name: self.run(model, exit, batch)}

    def _loaded(self, model: str) -> _LoadedModel | ImportedModel:
        return loaded_model(self._models, model)

    # -- identity ----------------------------------------------------------------------------------

    def _release(self, loaded: _LoadedModel | ImportedModel) -> None:
        """Graphs, then contexts, then engines, then the memory they were bound to."""
        check(self.cudart.cudaStreamSynchronize(self._stream), "cudaStreamSynchronize")
        if isinstance(loaded, ImportedModel):
            loaded.release()
            return
        for graph in loaded.graphs.values():
            graph.free()
        loaded.graphs.clear()
        loaded.contexts.clear()
        loaded.engines.clear()
        for buffer in loaded.buffers.values():
            buffer.free()
        loaded.scratch.free()

    def fingerprint(self) -> Fingerprint:
        extra = {
            "precision": self.target.precision,
            "compute_capability": self.target.compute_capability,
            "cuda_graphs": str(self.cuda_graphs).lower(),
            "tf32": "off" if self.target.precision == "fp32" else "on",  # fp32 builds clear BuilderFlag.TF32
            **jetson_power_state(),
        }
        return Fingerprint(
            backend=self.name,
            device=self.target.device,
            versions={"tensorrt": self.target.trt_version},
            extra=extra,
        )

    def close(self) -> None:
        """Free graphs, contexts, buffers and the stream; a later `load` starts afresh."""
        if self._stream is None:
            return
        for loaded in self._models.values():
            self._release(loaded)
        self._models.clear()
        check(self.cudart.cudaStreamDestroy(self._stream), "cudaStreamDestroy")
        self._stream = None
        self._stream_handle = 0


def _scratch_bytes(engine: trt.ICudaEngine) -> int:
    """Activation memory the largest profile of `engine` needs (per-profile query on TensorRT >= 10.1)."""
    if hasattr(engine, "get_device_memory_size_for_profile_v2"):
        return max(
            engine.get_device_memory_size_for_profile_v2(p) for p in range(engine.num_optimization_profiles)
        )
    return int(engine.device_memory_size)


def _check_engine_io(
    trt: Any, engine: trt.ICudaEngine, plan: BufferPlan, stage: int, path: Any, fix: str
) -> None:
    """The engine must take and give the tensors the manifest (and so the buffer plan) names."""
    names = {engine.get_tensor_name(i) for i in range(engine.num_io_tensors)}
    wanted = plan.bindings(stage, 1).bindings
    if names != {b.tensor for b in wanted}:
        raise RepositoryError(
            f"{path}: engine tensors {sorted(names)} differ from the manifest's "
            f"{sorted(b.tensor for b in wanted)}; {fix}"
        )
    for b in wanted:
        is_input = engine.get_tensor_mode(b.tensor) == trt.TensorIOMode.INPUT
        if is_input != b.is_input:
            raise RepositoryError(f"{path}: tensor {b.tensor!r} has the wrong direction; {fix}")
        dtype = np.dtype(trt.nptype(engine.get_tensor_dtype(b.tensor))).name
        if dtype != b.dtype:
            raise RepositoryError(
                f"{path}: engine tensor {b.tensor!r} is {dtype}, its buffer is {b.dtype}; {fix}"
            )
    if engine.num_optimization_profiles < plan.max_batch:
        raise RepositoryError(
            f"{path}: engine has {engine.num_optimization_profiles} optimization profiles, batches "
            f"1..{plan.max_batch} need one each; {fix}"
        )
    for batch in range(1, plan.max_batch + 1):
        bindings = plan.bindings(stage, batch)
        for b in bindings.bindings:
            if not b.is_input:
                shape = tuple(engine.get_tensor_shape(b.tensor))
                fits = len(shape) == len(b.shape) and all(
                    d in (-1, w) for d, w in zip(shape, b.shape, strict=True)
                )
                if not fits:
                    raise RepositoryError(
                        f"{path}: engine output {b.tensor!r} is shaped {list(shape)}, its buffer at "
                        f"batch {batch} is {list(b.shape)}; {fix}"
                    )
                continue
            shapes = [tuple(s) for s in engine.get_tensor_profile_shape(b.tensor, bindings.profile)]
            if any(s != b.shape for s in shapes):  # min = opt = max = this batch's shape
                raise RepositoryError(
                    f"{path}: profile {bindings.profile} of engine input {b.tensor!r} is (min, opt, max) "
                    f"{[list(s) for s in shapes]}, batch {batch} needs {list(b.shape)}; {fix}"
                )
