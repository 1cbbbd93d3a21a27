"""The few CUDA runtime calls the TensorRT backend makes, through NVIDIA's cuda-python.

cuda-python (not pycuda): NVIDIA's TensorRT samples use it, it is a thin generated binding of the
CUDA runtime with no context-management layer of its own (pycuda's autoinit would create a second
primary context on Jetson), and it ships wheels for aarch64. Imported lazily: a CPU box never
loads this module. GPU-only code: tests/runtime/backends/test_cuda_runtime.py runs it where there
is a GPU (not in CI).
"""

from __future__ import annotations

import ctypes
import importlib.metadata
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgeserve.errors import BackendUnavailableError

CUDA_PYTHON_FIX = (
    "install NVIDIA's CUDA Python bindings: `pip install cuda-python` (pick the major version of the "
    "installed CUDA driver, e.g. `pip install 'cuda-python>=12.6,<13'` for a CUDA 12 driver: JetPack 6)"
)


def import_cudart() -> Any:
    """The cuda-python runtime module (`cuda.bindings.runtime` since 12.6, `cuda.cudart` before)."""
    try:
        from cuda.bindings import runtime as cudart  # type: ignore[import-not-found]
    except ImportError:
        try:
            from cuda import cudart  # type: ignore[import-not-found,no-redef]
        except ImportError as exc:
            raise BackendUnavailableError(
                f"the TensorRT backend needs cuda-python, which is not importable ({exc}); {CUDA_PYTHON_FIX}"
            ) from exc
    return cudart


CUDA_ERROR_INSUFFICIENT_DRIVER = 35  # cudaErrorInsufficientDriver


class CudaDriverTooOldError(BackendUnavailableError):
    """The installed cuda-python needs a newer CUDA driver than this machine has."""


def _cuda_python_version() -> str:
    try:
        return importlib.metadata.version("cuda-python")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def insufficient_driver_message(what: str, err: Any) -> str:
    """What to do when a CUDA call says the driver is older than the bindings want."""
    return (
        f"CUDA error in {what}: {err}: the CUDA driver is older than cuda-python "
        f"{_cuda_python_version()} needs (cuda-python 13.x needs driver >= 580; JetPack 6 has a CUDA 12 "
        "driver). Install bindings for the driver's CUDA major: `pip install 'cuda-python>=12.6,<13'` "
        "for a CUDA 12 driver (`nvidia-smi` shows it; on a Jetson, JetPack 6 is CUDA 12.6), or upgrade "
        "the driver (JetPack on a Jetson)"
    )


def check(result: Any, what: str) -> Any:
    """Unpack a cuda-python `(err, *values)` tuple, raising with the call's name on an error."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        name = f"{getattr(err, 'name', '')} ({int(err)})" if hasattr(err, "name") else str(err)
        if int(err) == CUDA_ERROR_INSUFFICIENT_DRIVER or "InsufficientDriver" in name:
            raise CudaDriverTooOldError(insufficient_driver_message(what, name))
        raise RuntimeError(f"CUDA error in {what}: {name}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


@dataclass(frozen=True)
class DeviceInfo:
    name: str
    compute_capability: str
    sm_count: int = 0  # multiprocessors: tells Orin modules apart that share a name ("Orin")
    memory_gib: int = 0  # total memory rounded to GiB (an 8 GB Orin reports about 7.4)


def device_info(cudart: Any, device: int = 0) -> DeviceInfo:
    props = check(cudart.cudaGetDeviceProperties(device), "cudaGetDeviceProperties")
    name = props.name.decode(errors="replace") if isinstance(props.name, bytes) else str(props.name)
    sm_count = int(getattr(props, "multiProcessorCount", 0) or 0)
    memory_gib = round(int(getattr(props, "totalGlobalMem", 0) or 0) / (1 << 30))
    return DeviceInfo(name.rstrip("\x00").strip(), f"{props.major}.{props.minor}", sm_count, memory_gib)


def new_stream(cudart: Any) -> Any:
    """A stream that does not synchronize with the legacy default stream (other libraries' work)."""
    return check(cudart.cudaStreamCreateWithFlags(cudart.cudaStreamNonBlocking), "cudaStreamCreateWithFlags")


def host_view(address: int, nbytes: int, dtype: str) -> np.ndarray:
    """A flat numpy array of `dtype` over `nbytes` of host memory at `address` (not copied).

    Viewed through bytes, so float16 (which ctypes has no type for) and bool work like the rest.
    """
    np_dtype = np.dtype(dtype)
    raw = np.ctypeslib.as_array(ctypes.cast(address, ctypes.POINTER(ctypes.c_uint8)), (max(nbytes, 1),))
    return raw[: nbytes - nbytes % np_dtype.itemsize].view(np_dtype)


class DeviceBuffer:
    """A device allocation, optionally with a pinned host twin viewed as a flat numpy array."""

    def __init__(self, cudart: Any, nbytes: int, dtype: str, host: bool) -> None:
        self._cudart = cudart
        self.nbytes = nbytes
        self.device = int(check(cudart.cudaMalloc(max(nbytes, 1)), "cudaMalloc"))
        self.host: np.ndarray | None = None
        self._host_ptr = 0
        if host:
            self._host_ptr = int(check(cudart.cudaMallocHost(max(nbytes, 1)), "cudaMallocHost"))
            ctypes.memset(self._host_ptr, 0, max(nbytes, 1))  # warm-up copies it up before any request
            self.host = host_view(self._host_ptr, nbytes, dtype)

    def upload(self, nbytes: int, stream: Any) -> None:
        kind = self._cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
        check(self._cudart.cudaMemcpyAsync(self.device, self._host_ptr, nbytes, kind, stream), "H2D copy")

    def download(self, nbytes: int, stream: Any) -> None:
        kind = self._cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
        check(self._cudart.cudaMemcpyAsync(self._host_ptr, self.device, nbytes, kind, stream), "D2H copy")

    def free(self) -> None:
        if self.device:
            check(self._cudart.cudaFree(self.device), "cudaFree")
            self.device = 0
        if self._host_ptr:
            self.host = None
            check(self._cudart.cudaFreeHost(self._host_ptr), "cudaFreeHost")
            self._host_ptr = 0


class CudaGraph:
    """A captured sequence of work on one stream, replayed with a single launch."""

    def __init__(self, cudart: Any, graph: Any, graph_exec: Any) -> None:
        self._cudart = cudart
        self._graph = graph
        self._exec = graph_exec

    @classmethod
    def capture(cls, cudart: Any, stream: Any, work: Any) -> CudaGraph:
        """Record `work()` (which enqueues on `stream`) into an instantiated graph.

        If `work()` fails while capturing (TensorRT refuses to enqueue an engine it cannot capture),
        do as trtexec: end the capture, destroy whatever partial graph it returned, clear the sticky
        `cudaGetLastError()`, and raise GraphCaptureError carrying `work`'s own reason, so the caller
        can run that work without a graph.
        """
        mode = cudart.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal
        check(cudart.cudaStreamBeginCapture(stream, mode), "cudaStreamBeginCapture")
        try:
            work()
        except Exception as exc:
            _abandon_capture(cudart, stream)
            raise GraphCaptureError(str(exc) or type(exc).__name__) from exc
        except BaseException:
            _abandon_capture(cudart, stream)
            raise
        graph = check(cudart.cudaStreamEndCapture(stream), "cudaStreamEndCapture")
        try:
            graph_exec = check(cudart.cudaGraphInstantiate(graph, 0), "cudaGraphInstantiate")
        except RuntimeError as exc:
            cudart.cudaGraphDestroy(graph)
            cudart.cudaGetLastError()
            raise GraphCaptureError(str(exc)) from exc
        return cls(cudart, graph, graph_exec)

    def launch(self, stream: Any) -> None:
        check(self._cudart.cudaGraphLaunch(self._exec, stream), "cudaGraphLaunch")

    def free(self) -> None:
        check(self._cudart.cudaGraphExecDestroy(self._exec), "cudaGraphExecDestroy")
        check(self._cudart.cudaGraphDestroy(self._graph), "cudaGraphDestroy")


class GraphCaptureError(RuntimeError):
    """Work could not be captured into a CUDA graph; the stream is out of capture and usable."""


def _abandon_capture(cudart: Any, stream: Any) -> None:
    """End a failed capture without raising: free any partial graph, clear the sticky error."""
    result = cudart.cudaStreamEndCapture(stream)
    err, *values = result if isinstance(result, tuple) else (result,)
    graph = values[0] if values else None
    if graph is not None and int(err) == 0:
        cudart.cudaGraphDestroy(graph)
    cudart.cudaGetLastError()
