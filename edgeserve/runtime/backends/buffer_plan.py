"""Which device and pinned host buffers a chained TensorRT model needs, derived from its manifest.

Buffers are allocated once, at the largest batch, and reused by every call: stage k's features
buffer *is* stage k+1's input buffer (stages chain on the device, nothing goes back to the host
between them), the model input has a pinned host twin for the upload and every logits buffer a
pinned host twin for the download. Per (stage, batch) the plan says which buffer each tensor name
is bound to and how many bytes move, so the backend sets tensor addresses once and only copies.
Pure numpy: tested without a GPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from edgeserve.manifest import Manifest, TensorSpec


@dataclass(frozen=True)
class Allocation:
    """One device buffer (and a pinned host twin when `host` is set), sized for `max_batch`."""

    name: str  # "input", "stage0.features", "stage1.logits"
    dtype: str
    sample_shape: tuple[int, ...]
    max_batch: int
    host: bool

    @property
    def sample_bytes(self) -> int:
        return math.prod(self.sample_shape) * np.dtype(self.dtype).itemsize

    @property
    def nbytes(self) -> int:
        return self.sample_bytes * self.max_batch


@dataclass(frozen=True)
class Binding:
    """A tensor of one stage engine at one batch size, and the allocation it is bound to."""

    tensor: str  # the engine's I/O tensor name ("x", "features", "logits")
    is_input: bool
    allocation: str
    shape: tuple[int, ...]  # with the batch dimension
    dtype: str
    nbytes: int


@dataclass(frozen=True)
class StageBindings:
    """Everything one (stage, batch) execution context is bound to."""

    stage: int
    batch: int
    profile: int  # optimization profile index: batch sizes 1..max_batch -> profiles 0..max_batch-1
    bindings: tuple[Binding, ...]

    def binding(self, tensor: str) -> Binding:
        for b in self.bindings:
            if b.tensor == tensor:
                return b
        raise KeyError(f"stage {self.stage} has no tensor {tensor!r}")


@dataclass(frozen=True)
class BufferPlan:
    """Allocations of one model plus the bindings of every (stage, batch)."""

    model: str
    max_batch: int
    allocations: tuple[Allocation, ...]
    stages: tuple[tuple[StageBindings, ...], ...]  # [stage][batch - 1]

    def allocation(self, name: str) -> Allocation:
        for a in self.allocations:
            if a.name == name:
                return a
        raise KeyError(name)

    def bindings(self, stage: int, batch: int) -> StageBindings:
        if not 1 <= batch <= self.max_batch:
            raise ValueError(f"batch {batch} is outside the engines' range 1..{self.max_batch}")
        return self.stages[stage][batch - 1]

    @property
    def device_bytes(self) -> int:
        return sum(a.nbytes for a in self.allocations)

    @property
    def host_bytes(self) -> int:
        return sum(a.nbytes for a in self.allocations if a.host)


def plan_buffers(manifest: Manifest, max_batch: int) -> BufferPlan:
    """The allocations and per-(stage, batch) bindings for serving `manifest` up to `max_batch`."""
    if max_batch < 1:
        raise ValueError(f"max batch must be >= 1, got {max_batch}")
    allocations = [_alloc("input", manifest.input, max_batch, host=True)]
    feeding = "input"  # the allocation the next stage reads
    stages = []
    for spec in manifest.stages:
        names = {spec.input.name: (feeding, spec.input, True)}
        if spec.features is not None:
            alloc = f"stage{spec.index}.features"
            allocations.append(_alloc(alloc, spec.features, max_batch, host=False))
            names[spec.features.name] = (alloc, spec.features, False)
        if spec.logits is not None:
            alloc = f"stage{spec.index}.logits"
            allocations.append(_alloc(alloc, spec.logits, max_batch, host=True))
            names[spec.logits.name] = (alloc, spec.logits, False)
        per_batch = []
        for batch in range(1, max_batch + 1):
            bindings = tuple(
                Binding(
                    tensor=tensor,
                    is_input=is_input,
                    allocation=alloc,
                    shape=(batch, *t.shape),
                    dtype=t.dtype,
                    nbytes=batch * math.prod(t.shape) * np.dtype(t.dtype).itemsize,
                )
                for tensor, (alloc, t, is_input) in names.items()
            )
            per_batch.append(StageBindings(spec.index, batch, batch - 1, bindings))
        stages.append(tuple(per_batch))
        if spec.features is not None:
            feeding = f"stage{spec.index}.features"
    return BufferPlan(manifest.name, max_batch, tuple(allocations), tuple(stages))


def _alloc(name: str, spec: TensorSpec, max_batch: int, host: bool) -> Allocation:
    return Allocation(name, spec.dtype, tuple(spec.shape), max_batch, host)


# -- imported models: any inputs, tensors passed by name, one optimization profile per engine -------
#
# What follows plans the generic TensorRT path (edgeserve.runtime.backends.tensorrt_imported) for
# any schema-2 manifest: the optimization profile's min/opt/max shape of every engine input, one
# buffer per model input and per stage output, and which buffer feeds which engine input. It is
# pure and tested here; the TensorRT calls that use it have never been executed in this project.

# TensorRT 10's I/O types (tensorrt.DataType) as numpy names: no float64, int16 or uint16.
TRT_IO_DTYPES = ("float32", "float16", "int8", "int32", "int64", "uint8", "bool")


@dataclass(frozen=True)
class InputProfile:
    """One engine input's shapes in the optimization profile (IOptimizationProfile.set_shape)."""

    name: str
    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]


def graph_shape(spec: TensorSpec, batch: int) -> tuple[int, ...]:
    """The shape a graph takes or gives for `spec` at graph batch `batch`: the batch first, or the
    tensor's full shape when it has no batch dimension."""
    return (batch, *spec.shape) if spec.batched else tuple(spec.shape)


def profile_shapes(manifest: Manifest, stage: int, batches: tuple[int, int, int]) -> tuple[InputProfile, ...]:
    """min/opt/max shapes of every input of stage `stage` for graph batches (min, opt, max).

    A batched input gets (min, *shape), (opt, *shape), (max, *shape); an unbatched one its full
    static shape three times. `batches` comes from engine_cache.batch_plan: (1, opt, N) for a
    dynamic batch, (N, N, N) for graphs with a fixed batch N.
    """
    low, opt, high = batches
    if not 1 <= low <= opt <= high:
        raise ValueError(f"profile batches must satisfy 1 <= min <= opt <= max, got {batches}")
    return tuple(
        InputProfile(t.name, graph_shape(t, low), graph_shape(t, opt), graph_shape(t, high))
        for t in manifest.stages[stage].inputs
    )


def tensorrt_refusal(manifest: Manifest) -> str | None:
    """Why the TensorRT backend cannot serve `manifest`, or None: a tensor type TensorRT has no I/O
    type for, or an output whose dimensions vary with its content (edgeserve binds every output to a
    buffer sized at load and does not implement TensorRT's IOutputAllocator)."""
    tensors = [("input", t) for t in manifest.inputs]
    for stage in manifest.stages:
        tensors += [(f"stage {stage.index} output", t) for t in stage.outputs]
    for where, t in tensors:
        if t.dtype not in TRT_IO_DTYPES:
            return (
                f"{where} {t.name!r} is {t.dtype}, which TensorRT engines cannot take or give "
                f"(their I/O types are {', '.join(TRT_IO_DTYPES)})"
            )
        if any(d < 0 for d in t.shape):
            return (
                f"{where} {t.name!r} has dimensions that vary with its content ({list(t.shape)}); "
                "edgeserve's TensorRT backend sizes every output at load and does not size outputs "
                "at run time (no IOutputAllocator)"
            )
    return None


@dataclass(frozen=True)
class TensorBuffer:
    """One device buffer of an imported model (and a pinned host twin when `host` is set), sized for
    the largest graph batch in the engine's own type for the tensor."""

    name: str  # "input.<model input>" or "stage<k>.<output>"
    dtype: str  # numpy name of the engine's type (trt.nptype(engine.get_tensor_dtype(name)))
    shape: tuple[int, ...]  # at the largest graph batch
    host: bool  # model inputs (uploaded) and exit outputs of stages an exit is on (downloaded)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class Wire:
    """An engine input or output of one stage and the buffer it is bound to."""

    tensor: TensorSpec  # as the manifest declares it (its dtype is what clients send or get)
    buffer: str
    dtype: str  # the engine's type for it

    def shape(self, graph_batch: int) -> tuple[int, ...]:
        return graph_shape(self.tensor, graph_batch)

    def nbytes(self, graph_batch: int) -> int:
        return math.prod(self.shape(graph_batch)) * np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class StageWiring:
    """What one stage engine's inputs read and its outputs write."""

    stage: int
    inputs: tuple[Wire, ...]
    outputs: tuple[Wire, ...]
    exit_outputs: tuple[Wire, ...]  # the outputs copied back when an exit is on this stage

    def wire(self, tensor: str) -> Wire:
        for w in (*self.inputs, *self.outputs):
            if w.tensor.name == tensor:
                return w
        raise KeyError(f"stage {self.stage} has no tensor {tensor!r}")


@dataclass(frozen=True)
class TensorPlan:
    """Buffers and wiring of an imported model on TensorRT: stages chained by name on the device."""

    model: str
    max_batch: int  # the largest batch served
    fixed_batch: int | None  # graphs take exactly this batch; smaller ones are padded with zeros
    buffers: tuple[TensorBuffer, ...]
    stages: tuple[StageWiring, ...]
    model_inputs: tuple[tuple[str, str], ...]  # (model input, buffer) for inputs some stage takes

    def buffer(self, name: str) -> TensorBuffer:
        for b in self.buffers:
            if b.name == name:
                return b
        raise KeyError(name)

    def graph_batch(self, size: int) -> int:
        """The batch the graphs run for a request batch of `size` (the fixed batch when there is one)."""
        if not 1 <= size <= self.max_batch:
            raise ValueError(f"batch {size} is outside the engines' range 1..{self.max_batch}")
        return self.fixed_batch if self.fixed_batch is not None else size

    @property
    def device_bytes(self) -> int:
        return sum(b.nbytes for b in self.buffers)

    @property
    def host_bytes(self) -> int:
        return sum(b.nbytes for b in self.buffers if b.host)


def plan_tensors(
    manifest: Manifest, max_batch: int, dtypes: dict[tuple[int, str], str] | None = None
) -> TensorPlan:
    """Buffers and wiring for serving `manifest` on TensorRT up to `max_batch` (capped by the model).

    `dtypes` maps (stage, tensor name) to the engine's type for it (read from the engines at load);
    a tensor not in it keeps the manifest's type. A tensor passed between stages must have one type
    on both sides, and a model input every stage that takes it must agree on; otherwise ValueError.
    """
    if max_batch < 1:
        raise ValueError(f"max batch must be >= 1, got {max_batch}")
    refusal = tensorrt_refusal(manifest)
    if refusal is not None:
        raise ValueError(refusal)
    largest = manifest.max_batch if manifest.max_batch is not None else max_batch
    graph_max = manifest.batch if manifest.batch is not None else largest
    types = dtypes or {}
    exit_stages = {e.stage for e in manifest.exits}
    model_inputs = {t.name: t for t in manifest.inputs}
    buffers: dict[str, TensorBuffer] = {}
    producer = {name: f"input.{name}" for name in model_inputs}  # tensor name -> buffer holding it
    taken: list[tuple[str, str]] = []
    stages = []
    for stage in manifest.stages:
        k = stage.index
        inputs = []
        for spec, (name, source) in zip(stage.inputs, stage.feeds, strict=True):
            buf = producer[source]
            dtype = types.get((k, name), spec.dtype)
            shape = graph_shape(spec, graph_max)
            if buf not in buffers:  # a model input, first taken here
                buffers[buf] = TensorBuffer(buf, dtype, graph_shape(model_inputs[source], graph_max), True)
                taken.append((source, buf))
            have = buffers[buf]
            if have.dtype != dtype:
                raise ValueError(
                    f"{manifest.name}: stage {k} takes {name!r} as {dtype}, but {source!r} is {have.dtype}"
                )
            if have.shape != shape:
                raise ValueError(
                    f"{manifest.name}: stage {k} takes {name!r} shaped {list(shape)}, but {source!r} is "
                    f"{list(have.shape)}"
                )
            inputs.append(Wire(spec, buf, dtype))
        outputs = []
        for spec in stage.outputs:
            buf = f"stage{k}.{spec.name}"
            dtype = types.get((k, spec.name), spec.dtype)
            host = spec.name not in stage.passes and k in exit_stages
            buffers[buf] = TensorBuffer(buf, dtype, graph_shape(spec, graph_max), host)
            outputs.append(Wire(spec, buf, dtype))
        exits = tuple(w for w in outputs if w.tensor.name not in stage.passes)
        stages.append(StageWiring(k, tuple(inputs), tuple(outputs), exits))
        producer.update({name: f"stage{k}.{name}" for name in stage.passes})
    return TensorPlan(
        manifest.name, largest, manifest.batch, tuple(buffers.values()), tuple(stages), tuple(taken)
    )
