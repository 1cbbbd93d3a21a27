"""A stand-in GPU for the stand-in cuda-python and TensorRT modules next to this file, tests only.

A stand-in written from cuda-python's runtime API (cuda.bindings.runtime 12.x/13.x); it does not
replace running on a real GPU. "Device" memory is host memory (a ctypes buffer per allocation, its
address is the pointer), so a kernel can be numpy code. What it keeps strict, because the backend
can get these wrong on a real GPU without any test noticing: every pointer must lie inside a live
allocation of the right kind (device or pinned host) for the copy direction, work enqueued on a
stream runs only when the stream is synchronized (reading a result early reads stale bytes), a
capturing stream records work instead of running it and refuses synchronous calls, and freed or
unknown handles are errors.

The state below is process-wide because the CUDA runtime's is: allocations and streams belong to
the process, not to a Python object.
"""

from __future__ import annotations

import ctypes
import enum
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field


class cudaError_t(enum.IntEnum):
    """The error codes the stand-in returns; 0 is success, as in CUDA."""

    cudaSuccess = 0
    cudaErrorInvalidValue = 1
    cudaErrorMemoryAllocation = 2
    cudaErrorInvalidDevice = 101
    cudaErrorInvalidResourceHandle = 400
    cudaErrorIllegalAddress = 700
    cudaErrorStreamCaptureUnsupported = 900
    cudaErrorStreamCaptureInvalidated = 901
    cudaErrorStreamCaptureUnmatched = 903


class cudaMemcpyKind(enum.IntEnum):
    cudaMemcpyHostToHost = 0
    cudaMemcpyHostToDevice = 1
    cudaMemcpyDeviceToHost = 2
    cudaMemcpyDeviceToDevice = 3
    cudaMemcpyDefault = 4


class cudaStreamCaptureMode(enum.IntEnum):
    cudaStreamCaptureModeGlobal = 0
    cudaStreamCaptureModeThreadLocal = 1
    cudaStreamCaptureModeRelaxed = 2


cudaStreamDefault = 0
cudaStreamNonBlocking = 1

OK = cudaError_t.cudaSuccess


class CudaFault(RuntimeError):
    """What a real GPU would do as an illegal memory access: the stand-in raises instead."""


@dataclass
class _Allocation:
    buffer: ctypes.Array[ctypes.c_char]
    kind: str  # "device" or "host"

    @property
    def address(self) -> int:
        return ctypes.addressof(self.buffer)

    @property
    def nbytes(self) -> int:
        return len(self.buffer)


@dataclass
class cudaStream_t:
    """A stream handle; int() gives the raw handle TensorRT's execute_async_v3 takes."""

    handle: int

    def __int__(self) -> int:
        return self.handle

    def getPtr(self) -> int:
        return self.handle


@dataclass
class cudaGraph_t:
    ops: list[Callable[[], None]]
    alive: bool = True


@dataclass
class cudaGraphExec_t:
    ops: list[Callable[[], None]]
    alive: bool = True


@dataclass
class _Stream:
    pending: list[Callable[[], None]] = field(default_factory=list)
    captured: list[Callable[[], None]] | None = None  # recording, when a capture is open


@dataclass
class cudaDeviceProp:
    name: bytes = b"Stand-in GPU (not a GPU)"
    major: int = 8
    minor: int = 7
    multiProcessorCount: int = 16
    totalGlobalMem: int = 16 << 30


_allocations: dict[int, _Allocation] = {}
_streams: dict[int, _Stream] = {}
_handles = itertools.count(0x5000)
DEVICE_COUNT = 1


def reset() -> None:
    """Forget every allocation and stream (a test's teardown; a process exit on a real GPU)."""
    _allocations.clear()
    _streams.clear()


def live_allocations() -> int:
    return len(_allocations)


def _allocate(size: int, kind: str) -> tuple[cudaError_t, int]:
    if not isinstance(size, int) or size <= 0:
        return cudaError_t.cudaErrorInvalidValue, 0
    allocation = _Allocation(ctypes.create_string_buffer(size), kind)
    _allocations[allocation.address] = allocation
    return OK, allocation.address


def _free(address: int, kind: str) -> tuple[cudaError_t]:
    allocation = _allocations.get(int(address))
    if allocation is None or allocation.kind != kind:
        return (cudaError_t.cudaErrorInvalidValue,)
    del _allocations[int(address)]
    return (OK,)


def region(address: int, nbytes: int, kind: str | None = None) -> int:
    """Check that [address, address + nbytes) lies in one live allocation (of `kind`); the address."""
    for allocation in _allocations.values():
        start = allocation.address
        if start <= address and address + nbytes <= start + allocation.nbytes:
            if kind is not None and allocation.kind != kind:
                raise CudaFault(f"{address:#x}: {allocation.kind} memory where {kind} memory was expected")
            return address
    raise CudaFault(f"illegal address: {nbytes} bytes at {address:#x} are not inside one live allocation")


def read(address: int, nbytes: int) -> bytes:
    """Bytes of device memory (a kernel's input)."""
    region(address, nbytes, "device")
    return ctypes.string_at(address, nbytes)


def write(address: int, data: bytes) -> None:
    """Store a kernel's output in device memory."""
    region(address, len(data), "device")
    ctypes.memmove(address, data, len(data))


def stream_of(stream: object) -> _Stream:
    handle = int(stream)  # type: ignore[call-overload]
    if handle not in _streams:
        raise CudaFault(f"stream {handle:#x} is not a live stream")
    return _streams[handle]


def enqueue(stream: object, op: Callable[[], None]) -> None:
    """Put work on `stream`: recorded while a capture is open, else run at the next synchronize."""
    s = stream_of(stream)
    if s.captured is not None:
        s.captured.append(op)
    else:
        s.pending.append(op)


def capturing(stream: object) -> bool:
    return stream_of(stream).captured is not None


# -- the cuda-python runtime API the backend calls, as (cudaError_t, *values) tuples -------------------


def cudaGetDeviceCount() -> tuple[cudaError_t, int]:
    return OK, DEVICE_COUNT


def cudaSetDevice(device: int) -> tuple[cudaError_t]:
    return (OK,) if 0 <= device < DEVICE_COUNT else (cudaError_t.cudaErrorInvalidDevice,)


def cudaGetDeviceProperties(device: int) -> tuple[cudaError_t, cudaDeviceProp | None]:
    if not 0 <= device < DEVICE_COUNT:
        return cudaError_t.cudaErrorInvalidDevice, None
    return OK, cudaDeviceProp()


def cudaGetLastError() -> tuple[cudaError_t]:
    return (OK,)


def cudaMalloc(size: int) -> tuple[cudaError_t, int]:
    return _allocate(size, "device")


def cudaMallocHost(size: int) -> tuple[cudaError_t, int]:
    return _allocate(size, "host")


def cudaFree(address: int) -> tuple[cudaError_t]:
    return _free(address, "device")


def cudaFreeHost(address: int) -> tuple[cudaError_t]:
    return _free(address, "host")


def cudaStreamCreateWithFlags(flags: int) -> tuple[cudaError_t, cudaStream_t | None]:
    if flags not in (cudaStreamDefault, cudaStreamNonBlocking):
        return cudaError_t.cudaErrorInvalidValue, None
    handle = next(_handles)
    _streams[handle] = _Stream()
    return OK, cudaStream_t(handle)


def cudaStreamDestroy(stream: object) -> tuple[cudaError_t]:
    handle = int(stream)  # type: ignore[call-overload]
    if handle not in _streams:
        return (cudaError_t.cudaErrorInvalidResourceHandle,)
    del _streams[handle]
    return (OK,)


def cudaStreamSynchronize(stream: object) -> tuple[cudaError_t]:
    s = stream_of(stream)
    if s.captured is not None:
        return (cudaError_t.cudaErrorStreamCaptureUnsupported,)
    while s.pending:
        s.pending.pop(0)()
    return (OK,)


_COPY_KINDS = {
    cudaMemcpyKind.cudaMemcpyHostToDevice: ("host", "device"),
    cudaMemcpyKind.cudaMemcpyDeviceToHost: ("device", "host"),
    cudaMemcpyKind.cudaMemcpyDeviceToDevice: ("device", "device"),
    cudaMemcpyKind.cudaMemcpyHostToHost: ("host", "host"),
}


def cudaMemcpyAsync(
    dst: int, src: int, count: int, kind: cudaMemcpyKind, stream: object
) -> tuple[cudaError_t]:
    if kind not in _COPY_KINDS:
        return (cudaError_t.cudaErrorInvalidValue,)
    src_kind, dst_kind = _COPY_KINDS[cudaMemcpyKind(kind)]
    try:
        region(int(src), count, src_kind)
        region(int(dst), count, dst_kind)
    except CudaFault:
        return (cudaError_t.cudaErrorInvalidValue,)

    def copy() -> None:
        ctypes.memmove(int(dst), int(src), count)

    enqueue(stream, copy)
    return (OK,)


def cudaStreamBeginCapture(stream: object, mode: cudaStreamCaptureMode) -> tuple[cudaError_t]:
    s = stream_of(stream)
    if s.captured is not None or mode not in tuple(cudaStreamCaptureMode):
        return (cudaError_t.cudaErrorInvalidValue,)
    if s.pending:  # legal in CUDA, but work queued before a capture is a backend bug worth seeing
        cudaStreamSynchronize(stream)
    s.captured = []
    return (OK,)


def cudaStreamEndCapture(stream: object) -> tuple[cudaError_t, cudaGraph_t | None]:
    s = stream_of(stream)
    if s.captured is None:
        return cudaError_t.cudaErrorStreamCaptureUnmatched, None
    graph = cudaGraph_t(s.captured)
    s.captured = None
    return OK, graph


def cudaGraphInstantiate(graph: cudaGraph_t, flags: int = 0) -> tuple[cudaError_t, cudaGraphExec_t | None]:
    if not isinstance(graph, cudaGraph_t) or not graph.alive:
        return cudaError_t.cudaErrorInvalidValue, None
    return OK, cudaGraphExec_t(list(graph.ops))


def cudaGraphLaunch(graph_exec: cudaGraphExec_t, stream: object) -> tuple[cudaError_t]:
    if not isinstance(graph_exec, cudaGraphExec_t) or not graph_exec.alive:
        return (cudaError_t.cudaErrorInvalidValue,)
    for op in graph_exec.ops:
        enqueue(stream, op)
    return (OK,)


def cudaGraphExecDestroy(graph_exec: cudaGraphExec_t) -> tuple[cudaError_t]:
    if not isinstance(graph_exec, cudaGraphExec_t) or not graph_exec.alive:
        return (cudaError_t.cudaErrorInvalidValue,)
    graph_exec.alive = False
    return (OK,)


def cudaGraphDestroy(graph: cudaGraph_t) -> tuple[cudaError_t]:
    if not isinstance(graph, cudaGraph_t) or not graph.alive:
        return (cudaError_t.cudaErrorInvalidValue,)
    graph.alive = False
    return (OK,)
