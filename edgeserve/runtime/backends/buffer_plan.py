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
