"""TensorRT for imported models: any inputs and outputs, stages chained by name, one profile per engine.

NEVER EXECUTED. This module is written against TensorRT 10's documented Python API
(ICudaEngine.num_io_tensors / get_tensor_name / get_tensor_mode / get_tensor_dtype, tensorrt.nptype,
IExecutionContext.set_optimization_profile_async / set_input_shape / get_tensor_shape /
set_tensor_address / execute_async_v3) and cuda-python, but this project's machines have neither a
GPU nor TensorRT, so not one line of it has run. What it relies on is tested on the CPU:
buffer_plan.plan_tensors (buffers, types and wiring), buffer_plan.profile_shapes and
engine_cache.batch_plan (the profiles the engines were built with), and onnxruntime.graph_feeds /
batch_outputs (reused here, so a request means the same on both backends: unbatched inputs lose
their batch of 1, a fixed batch is padded with zeros and the padding dropped from the outputs).

At load every buffer is allocated once at the largest graph batch, in the engine's own type for
its tensor; tensors a stage passes on stay on the device, model inputs and the exit outputs of exit
stages have pinned host twins. Each stage gets one execution context on profile 0 with its tensor
addresses set once; a call sets input shapes only when the graph batch changes, enqueues the stages
on the backend's stream and copies back the exit's outputs. No CUDA graphs here (the batch, and so
the shapes, vary per call). An output whose shape TensorRT only knows after running (a
data-dependent -1 dimension) is refused at load: there is no IOutputAllocator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edgeserve.errors import InputError, RepositoryError
from edgeserve.manifest import Manifest
from edgeserve.runtime.backends.buffer_plan import TensorPlan, plan_tensors, tensorrt_refusal
from edgeserve.runtime.backends.cuda_runtime import DeviceBuffer, check
from edgeserve.runtime.backends.engine_cache import EngineRecord
from edgeserve.runtime.backends.onnxruntime import batch_outputs, graph_feeds
from edgeserve.runtime.validation import ONNXRUNTIME_FIX, Feeds, validate_exit, validate_feeds

if TYPE_CHECKING:  # tensorrt-stubs: mypy checks every TensorRT call here against its signatures
    import tensorrt as trt


def refuse_unservable(manifest: Manifest) -> None:
    """InputError naming the tensor the TensorRT backend cannot serve, and the backend that can."""
    refusal = tensorrt_refusal(manifest)
    if refusal is not None:
        raise InputError(f"model {manifest.name!r}: {refusal}; {ONNXRUNTIME_FIX}")


def check_profiles(manifest: Manifest, records: list[EngineRecord], fix: str) -> int:
    """The largest batch every stage engine serves; the engines must share one batch profile."""
    profiles = {r.batch_profile for r in records}
    if None in profiles or len(profiles) != 1:
        raise RepositoryError(
            f"{manifest.name}: its stage engines were built with different or per-batch profiles "
            f"({sorted(map(str, profiles))}); {fix}"
        )
    return min(max(r.batch_sizes) for r in records)


@dataclass
class ImportedModel:
    """An imported model's engines, contexts and buffers on the device."""

    manifest: Manifest
    plan: TensorPlan
    engines: list[trt.ICudaEngine]
    contexts: list[trt.IExecutionContext] = field(default_factory=list)  # one per stage, on profile 0
    buffers: dict[str, DeviceBuffer] = field(default_factory=dict)
    shaped_for: list[int | None] = field(default_factory=list)  # per stage: graph batch of its input shapes
    stream_handle: int = 0  # int() of the backend's stream, taken once at load

    def release(self) -> None:
        """Contexts, then engines, then the memory they were bound to (the caller synchronized)."""
        self.contexts.clear()
        self.engines.clear()
        for buffer in self.buffers.values():
            buffer.free()
        self.buffers.clear()


def engine_io(trt: Any, engine: trt.ICudaEngine) -> dict[str, tuple[bool, str]]:
    """Every I/O tensor of `engine`: name -> (is input, numpy type name).

    ValueError for a tensor this path cannot bind: a shape tensor (its values are read on the host
    to shape the network) or one TensorRT keeps in host memory; both would need host addresses and
    per-call shape values, which this backend does not give.
    """
    out = {}
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        if engine.is_shape_inference_io(name):
            raise ValueError(f"tensor {name!r} is a shape tensor (TensorRT reads its values on the host)")
        if engine.get_tensor_location(name) == trt.TensorLocation.HOST:
            raise ValueError(f"tensor {name!r} lives in host memory (TensorLocation.HOST)")
        is_input = engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT
        out[name] = (is_input, np.dtype(trt.nptype(engine.get_tensor_dtype(name))).name)
    return out


def open_imported(
    trt: Any,
    cudart: Any,
    stream: Any,
    manifest: Manifest,
    engines: list[trt.ICudaEngine],
    paths: list[Path],
    max_batch: int,
    fix: str,
) -> ImportedModel:
    """Check the deserialized engines against the manifest, allocate buffers, bind one context per stage."""
    dtypes: dict[tuple[int, str], str] = {}
    for stage, engine, path in zip(manifest.stages, engines, paths, strict=True):
        try:
            io = engine_io(trt, engine)
        except ValueError as exc:
            raise InputError(
                f"model {manifest.name!r}: {path}: {exc}; edgeserve's TensorRT backend binds device "
                f"tensors only; {ONNXRUNTIME_FIX}"
            ) from exc
        wanted = {t.name: True for t in stage.inputs} | {t.name: False for t in stage.outputs}
        if {n: d for n, (d, _) in io.items()} != wanted:
            raise RepositoryError(
                f"{path}: engine inputs/outputs {sorted(io)} differ from the manifest's stage "
                f"{stage.index} ({sorted(wanted)}); {fix}"
            )
        dtypes.update({(stage.index, n): t for n, (_, t) in io.items()})
    try:
        plan = plan_tensors(manifest, max_batch, dtypes)
    except ValueError as exc:
        raise RepositoryError(f"{manifest.name}: {exc}; {fix}") from exc
    model = ImportedModel(manifest, plan, engines, stream_handle=int(stream))
    try:
        for buffer in plan.buffers:
            model.buffers[buffer.name] = DeviceBuffer(cudart, buffer.nbytes, buffer.dtype, buffer.host)
        largest = plan.graph_batch(plan.max_batch)
        for wiring, engine, path in zip(plan.stages, engines, paths, strict=True):
            context = engine.create_execution_context()
            if context is None:
                raise RuntimeError(f"{path}: TensorRT create_execution_context returned None (see its log)")
            if not context.set_optimization_profile_async(0, model.stream_handle):
                raise RuntimeError(f"{path}: TensorRT set_optimization_profile_async(0) failed")
            for wire in (*wiring.inputs, *wiring.outputs):
                if not context.set_tensor_address(wire.tensor.name, model.buffers[wire.buffer].device):
                    raise RuntimeError(f"{path}: TensorRT set_tensor_address({wire.tensor.name!r}) failed")
            for wire in wiring.inputs:
                if not context.set_input_shape(wire.tensor.name, wire.shape(largest)):
                    raise RepositoryError(
                        f"{path}: TensorRT set_input_shape: profile 0 does not take {wire.tensor.name!r} "
                        f"shaped {list(wire.shape(largest))}; {fix}"
                    )
            for wire in wiring.outputs:
                shape = tuple(context.get_tensor_shape(wire.tensor.name))
                if any(d < 0 for d in shape):
                    raise InputError(
                        f"model {manifest.name!r}: output {wire.tensor.name!r} of stage {wiring.stage} "
                        f"has a shape TensorRT only knows after running ({list(shape)}); edgeserve's "
                        f"TensorRT backend has no output allocator for it; {ONNXRUNTIME_FIX}"
                    )
                if shape != wire.shape(largest):
                    raise RepositoryError(
                        f"{path}: output {wire.tensor.name!r} is shaped {list(shape)} at batch {largest}, "
                        f"the manifest says {list(wire.shape(largest))}; {fix}"
                    )
            model.contexts.append(context)
            model.shaped_for.append(largest)
        check(cudart.cudaStreamSynchronize(stream), "cudaStreamSynchronize")
    except BaseException:
        model.release()
        raise
    return model


def run_imported(
    cudart: Any, stream: Any, model: ImportedModel, exit: int, batch: Feeds
) -> dict[str, np.ndarray]:
    """Every output of exit `exit` by name, batch first, as OnnxRuntimeBackend.run_outputs gives them."""
    manifest, plan = model.manifest, model.plan
    exit = validate_exit(manifest, exit)
    feeds, size = graph_feeds(manifest, validate_feeds(manifest, batch))
    if size > plan.max_batch:
        raise InputError(
            f"model {manifest.name!r}: batch of {size} exceeds the engines' largest batch {plan.max_batch}; "
            f"split it or rebuild with `edgeserve build-engines --model {manifest.name} --max-batch {size} "
            "--force`"
        )
    graph_batch = plan.graph_batch(size)
    for name, buffer_name in plan.model_inputs:
        buffer = model.buffers[buffer_name]
        array = np.ascontiguousarray(feeds[name], dtype=plan.buffer(buffer_name).dtype)  # engine's type
        assert buffer.host is not None
        buffer.host[: array.size] = array.reshape(-1)
        buffer.upload(array.nbytes, stream)
    last = manifest.exits[exit].stage
    for k in range(last + 1):
        context = model.contexts[k]
        if model.shaped_for[k] != graph_batch:
            for wire in plan.stages[k].inputs:
                if not context.set_input_shape(wire.tensor.name, wire.shape(graph_batch)):
                    raise RuntimeError(
                        f"{manifest.name}: TensorRT set_input_shape({wire.tensor.name!r}, "
                        f"{list(wire.shape(graph_batch))}) failed on stage {k}, profile 0"
                    )
            model.shaped_for[k] = graph_batch
        if not context.execute_async_v3(model.stream_handle):
            raise RuntimeError(f"{manifest.name}: TensorRT execute_async_v3 failed on stage {k}")
    wires = plan.stages[last].exit_outputs
    for wire in wires:
        model.buffers[wire.buffer].download(wire.nbytes(graph_batch), stream)
    check(cudart.cudaStreamSynchronize(stream), "cudaStreamSynchronize")
    outputs = {}
    for wire in wires:
        host = model.buffers[wire.buffer].host
        assert host is not None
        shape = wire.shape(graph_batch)
        value = host[: math.prod(shape)].reshape(shape)
        outputs[wire.tensor.name] = value.astype(wire.tensor.dtype, copy=True)  # the manifest's type
    return batch_outputs(manifest.stages[last].outputs, outputs, size)
