"""The CUDA runtime calls the TensorRT backend makes (cuda-python), on a real GPU.

TensorRT itself is not installable here, but everything the backend does around it is plain CUDA:
a non-blocking stream, device buffers with pinned host twins, async copies, graph capture and
replay. Skipped where cuda-python or a GPU is missing (CI); docs/accelerators.md says where it ran.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from edgeserve.errors import BackendUnavailableError
from edgeserve.runtime.backends.cuda_runtime import (
    CudaGraph,
    DeviceBuffer,
    check,
    device_info,
    import_cudart,
    new_stream,
)


def _cudart_with_a_gpu() -> Any:
    try:
        cudart = import_cudart()
    except BackendUnavailableError:
        return None
    err, count = cudart.cudaGetDeviceCount()
    return cudart if int(err) == 0 and count > 0 else None


CUDART = _cudart_with_a_gpu()
pytestmark = pytest.mark.skipif(CUDART is None, reason="no cuda-python or no CUDA GPU here")


@pytest.fixture
def stream() -> Iterator[Any]:
    check(CUDART.cudaSetDevice(0), "cudaSetDevice")
    stream = new_stream(CUDART)
    yield stream
    check(CUDART.cudaStreamDestroy(stream), "cudaStreamDestroy")


def test_device_info_reads_the_name_and_compute_capability() -> None:
    info = device_info(CUDART, 0)
    major, minor = (int(part) for part in info.compute_capability.split("."))
    assert info.name and "\x00" not in info.name
    assert major >= 5 and minor >= 0
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        assert info.name == torch.cuda.get_device_name(0)
        assert (major, minor) == torch.cuda.get_device_capability(0)


@pytest.mark.parametrize("dtype", ["float32", "float16", "int64", "uint8", "bool"])
def test_a_buffer_round_trips_through_the_device(stream: Any, dtype: str) -> None:
    count = 1000
    nbytes = count * np.dtype(dtype).itemsize
    there, back = (
        DeviceBuffer(CUDART, nbytes, dtype, host=True),
        DeviceBuffer(CUDART, nbytes, dtype, host=True),
    )
    assert there.host is not None and back.host is not None and there.host.shape == (count,)
    values = (np.arange(count) % 2 == 0) if dtype == "bool" else np.arange(count).astype(dtype)
    there.host[:] = values
    back.host[:] = np.zeros(count, dtype)
    there.upload(nbytes, stream)
    kind = CUDART.cudaMemcpyKind.cudaMemcpyDeviceToDevice
    check(CUDART.cudaMemcpyAsync(back.device, there.device, nbytes, kind, stream), "D2D copy")
    back.download(nbytes, stream)
    check(CUDART.cudaStreamSynchronize(stream), "cudaStreamSynchronize")
    assert np.array_equal(back.host, values)
    there.free()
    back.free()
    assert there.device == 0 and there.host is None
    there.free()  # twice is harmless


def test_a_captured_graph_replays_the_copies_with_new_host_data(stream: Any) -> None:
    """What the backend captures per (exit, batch): the pinned input up, the work, the output down;
    a call then writes the pinned input, launches once and synchronizes."""
    nbytes = 256 * 4
    source, sink = (DeviceBuffer(CUDART, nbytes, "float32", host=True) for _ in range(2))
    assert source.host is not None and sink.host is not None
    kind = CUDART.cudaMemcpyKind.cudaMemcpyDeviceToDevice

    def work() -> None:
        source.upload(nbytes, stream)
        check(CUDART.cudaMemcpyAsync(sink.device, source.device, nbytes, kind, stream), "D2D copy")
        sink.download(nbytes, stream)

    graph = CudaGraph.capture(CUDART, stream, work)
    for value in (1.5, -2.0, 7.0):
        source.host[:] = value
        graph.launch(stream)
        check(CUDART.cudaStreamSynchronize(stream), "cudaStreamSynchronize")
        assert np.all(sink.host == value)
    graph.free()
    source.free()
    sink.free()


def test_an_error_names_the_call() -> None:
    with pytest.raises(RuntimeError, match="CUDA error in cudaSetDevice"):
        check(CUDART.cudaSetDevice(10_000), "cudaSetDevice")
