"""Issue 63's desk-check defects in the TensorRT backend, each against small local fakes.

No TensorRT or GPU here: the fakes stand for the few TensorRT and cuda-python calls each defect is
about (a context whose execute_async_v3 fails under capture, a cudart recording its calls), so each
test pins the backend's behaviour, not TensorRT's.
"""

from __future__ import annotations

import argparse
import configparser
import ctypes
import enum
import json
import logging
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from packaging.requirements import Requirement
from tiny_onnx import TinyRepository

from edgeserve.errors import InputError, RepositoryError
from edgeserve.runtime.backends import tensorrt_build
from edgeserve.runtime.backends.buffer_plan import plan_buffers
from edgeserve.runtime.backends.cuda_runtime import (
    CudaDriverTooOldError,
    CudaGraph,
    DeviceBuffer,
    GraphCaptureError,
    check,
)
from edgeserve.runtime.backends.engine_cache import BuildTarget, EngineRecord, engine_path
from edgeserve.runtime.backends.select import choose_backend, tensorrt_unready
from edgeserve.runtime.backends.tensorrt import TensorRTBackend, _check_engine_io, _LoadedModel
from edgeserve.runtime.backends.tensorrt_imported import open_imported
from edgeserve.tools.build_engines import add_parser

ROOT = Path(__file__).resolve().parents[3]
ORIN = BuildTarget("Orin", "8.7", "10.3.0", "fp32")


class CudaError(enum.IntEnum):  # as cuda-python's cudaError_t prints: "cudaError_t.cudaErrorX"
    cudaSuccess = 0
    cudaErrorInsufficientDriver = 35
    cudaErrorStreamCaptureInvalidated = 901


class FakeCudart:
    """Records every call; a capture is invalidated when something fails inside it (as CUDA does)."""

    cudaStreamCaptureMode = types.SimpleNamespace(cudaStreamCaptureModeThreadLocal=2)

    def __init__(self, partial_graph: bool = False) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.capturing = False
        self.invalidated = False
        self.partial_graph = partial_graph

    def cudaSetDevice(self, device: int) -> tuple[CudaError]:
        self.calls.append(("cudaSetDevice", device))
        return (CudaError.cudaSuccess,)

    def cudaStreamBeginCapture(self, stream: Any, mode: int) -> tuple[CudaError]:
        self.calls.append(("cudaStreamBeginCapture",))
        self.capturing, self.invalidated = True, False
        return (CudaError.cudaSuccess,)

    def cudaStreamEndCapture(self, stream: Any) -> tuple[CudaError, Any]:
        self.calls.append(("cudaStreamEndCapture",))
        self.capturing = False
        if self.invalidated and not self.partial_graph:
            return (CudaError.cudaErrorStreamCaptureInvalidated, None)
        return (CudaError.cudaSuccess, "partial graph" if self.invalidated else "graph")

    def cudaGraphInstantiate(self, graph: Any, flags: int) -> tuple[CudaError, Any]:
        self.calls.append(("cudaGraphInstantiate", graph))
        return (CudaError.cudaSuccess, f"exec of {graph}")

    def cudaGraphDestroy(self, graph: Any) -> tuple[CudaError]:
        self.calls.append(("cudaGraphDestroy", graph))
        return (CudaError.cudaSuccess,)

    def cudaGetLastError(self) -> tuple[CudaError]:
        self.calls.append(("cudaGetLastError",))
        return (CudaError.cudaSuccess,)

    def cudaStreamSynchronize(self, stream: Any) -> tuple[CudaError]:
        return (CudaError.cudaSuccess,)

    def names(self) -> list[str]:
        return [c[0] for c in self.calls]


# -- 1. cuda-python 13 on a CUDA 12 driver -------------------------------------------------------


def test_insufficient_driver_error_says_which_cuda_python_to_install_or_to_upgrade_the_driver() -> None:
    with pytest.raises(CudaDriverTooOldError) as caught:
        check((CudaError.cudaErrorInsufficientDriver,), "cudaSetDevice")
    message = str(caught.value)
    assert "cudaSetDevice" in message and "cudaErrorInsufficientDriver" in message
    assert "pip install 'cuda-python>=12.6,<13'" in message
    assert "upgrade the driver" in message
    with pytest.raises(RuntimeError, match="cudaErrorStreamCaptureInvalidated"):  # others: as before
        check((CudaError.cudaErrorStreamCaptureInvalidated,), "cudaStreamEndCapture")


def test_tensorrt_extra_keeps_jetsons_on_cuda_python_12() -> None:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    lines = config["options.extras_require"]["tensorrt"].strip().splitlines()
    requirements = [Requirement(line) for line in lines if not line.startswith("#")]

    def allowed(machine: str) -> list[str]:
        env = {"platform_machine": machine, "python_version": "3.10"}
        chosen = [r for r in requirements if r.name == "cuda-python" and r.marker and r.marker.evaluate(env)]
        assert len(chosen) == 1, f"one cuda-python pin for {machine}"
        return [v for v in ("12.5.0", "12.6.0", "12.9.0", "13.0.0") if chosen[0].specifier.contains(v)]

    assert allowed("aarch64") == ["12.6.0", "12.9.0"]  # JetPack 6: CUDA 12.6 driver
    assert "12.9.0" in allowed("x86_64")


# -- 2. an engine TensorRT cannot capture ----------------------------------------------------------


@pytest.mark.parametrize("partial_graph", [False, True])
def test_failed_capture_ends_it_frees_the_partial_graph_and_keeps_tensorrts_reason(
    partial_graph: bool,
) -> None:
    cudart = FakeCudart(partial_graph)

    def work() -> None:
        cudart.invalidated = True
        raise RuntimeError("TensorRT execute_async_v3 failed on stage 1")

    with pytest.raises(GraphCaptureError, match="execute_async_v3 failed on stage 1"):
        CudaGraph.capture(cudart, "stream", work)
    assert not cudart.capturing
    assert "cudaGraphInstantiate" not in cudart.names()
    destroyed = [c for c in cudart.calls if c[0] == "cudaGraphDestroy"]
    assert destroyed == ([("cudaGraphDestroy", "partial graph")] if partial_graph else [])
    assert cudart.names()[-1] == "cudaGetLastError"


class FakeContext:
    def __init__(self, cudart: FakeCudart, stage: int, capturable: bool) -> None:
        self.cudart, self.stage, self.capturable = cudart, stage, capturable
        self.handles: list[int] = []

    def execute_async_v3(self, stream: int) -> bool:
        self.handles.append(stream)
        if self.cudart.capturing and not self.capturable:
            self.cudart.invalidated = True
            return False
        return True


class FakeBuffer:
    def upload(self, nbytes: int, stream: Any) -> None: ...

    def download(self, nbytes: int, stream: Any) -> None: ...


class CountingStream:
    def __init__(self) -> None:
        self.conversions = 0

    def __int__(self) -> int:
        self.conversions += 1
        return 1234


def _backend(cudart: Any, trt: Any = None) -> TensorRTBackend:
    backend = object.__new__(TensorRTBackend)
    backend.cudart, backend.trt = cudart, trt
    backend.cuda_graphs, backend.warmup = True, 1
    backend._stream = CountingStream()
    backend._stream_handle = 1234
    backend._models = {}
    return backend


def _loaded(tiny: TinyRepository, cudart: FakeCudart, uncapturable_stage: int) -> _LoadedModel:
    manifest = tiny.repository.load_manifest("tiny_b")  # exits on stages 0 and 2
    plan = plan_buffers(manifest, 2)
    contexts = [
        [FakeContext(cudart, k, k != uncapturable_stage) for _ in range(2)]
        for k in range(len(manifest.stages))
    ]
    buffers: dict[str, Any] = {a.name: FakeBuffer() for a in plan.allocations}
    return _LoadedModel(manifest, plan, [], buffers, FakeBuffer(), contexts)  # type: ignore[arg-type]


def test_an_uncapturable_engine_runs_without_a_graph_and_the_rest_keep_theirs(
    tiny_repository: TinyRepository, caplog: pytest.LogCaptureFixture
) -> None:
    cudart = FakeCudart()
    backend = _backend(cudart)
    loaded = _loaded(tiny_repository, cudart, uncapturable_stage=1)
    with caplog.at_level(logging.WARNING):
        backend._warm_up_and_capture(loaded)
    assert sorted(loaded.graphs) == [(0, 1), (0, 2)]  # exit on stage 2 runs stage 1: no graph
    lines = [r.getMessage() for r in caplog.records if "capture" in r.getMessage()]
    assert len(lines) == 1
    assert "tiny_b" in lines[0] and "execute_async_v3 failed on stage 1" in lines[0]
    assert not cudart.capturing


def test_enqueue_uses_the_stream_handle_taken_once(tiny_repository: TinyRepository) -> None:
    cudart = FakeCudart()
    backend = _backend(cudart)
    loaded = _loaded(tiny_repository, cudart, uncapturable_stage=-1)
    for _ in range(3):
        backend._enqueue(loaded, 2, 1)
    assert backend._stream.conversions == 0
    assert loaded.contexts[2][0].handles == [1234, 1234, 1234]


# -- 3. build-engines --device-id N ---------------------------------------------------------------


class FakeTensorRT(types.ModuleType):
    """Just enough of the tensorrt module for EngineBuilder: it records what the build asked for."""

    def __init__(self, calls: list[tuple[Any, ...]], timing_cache_ok: bool = True, profile_index: int = 0):
        super().__init__("tensorrt")
        self.__version__ = "10.3.0"
        outer = self

        class Logger:
            WARNING = 2

            def __init__(self, severity: int) -> None: ...

        class Config:
            def set_memory_pool_limit(self, pool: Any, size: int) -> None: ...

            def set_flag(self, flag: str) -> None:
                calls.append(("set_flag", flag))

            def clear_flag(self, flag: str) -> None:
                calls.append(("clear_flag", flag))

            def create_timing_cache(self, blob: bytes) -> object:
                return object()

            def set_timing_cache(self, cache: Any, ignore_mismatch: bool) -> bool:
                return timing_cache_ok

            def add_optimization_profile(self, profile: Any) -> int:
                calls.append(("add_optimization_profile",))
                return profile_index

        class Network:
            def __init__(self, inputs: list[str]) -> None:
                self.inputs = inputs
                self.num_inputs = len(inputs)

            def get_input(self, i: int) -> Any:
                return types.SimpleNamespace(name=self.inputs[i])

        class Profile:
            def set_shape(self, *args: Any) -> None: ...

        class Builder:
            def __init__(self, logger: Any) -> None:
                calls.append(("Builder",))

            def create_network(self, flags: int) -> Network:
                return Network(outer.network_inputs)

            def create_builder_config(self) -> Config:
                return Config()

            def create_optimization_profile(self) -> Profile:
                return Profile()

            def build_serialized_network(self, network: Any, config: Any) -> None:
                calls.append(("build_serialized_network",))
                return None

        class OnnxParser:
            def __init__(self, network: Any, logger: Any) -> None: ...

            def parse_from_file(self, path: str) -> bool:
                return True

        self.Logger, self.Builder, self.OnnxParser = Logger, Builder, OnnxParser
        self.network_inputs = ["x"]
        self.NetworkDefinitionCreationFlag = types.SimpleNamespace(STRONGLY_TYPED=0)
        self.MemoryPoolType = types.SimpleNamespace(WORKSPACE="WORKSPACE")
        self.BuilderFlag = types.SimpleNamespace(FP16="FP16", TF32="TF32")


@pytest.fixture
def fake_trt(monkeypatch: pytest.MonkeyPatch) -> tuple[list[tuple[Any, ...]], FakeCudart]:
    calls: list[tuple[Any, ...]] = []
    cudart = FakeCudart()
    cudart.calls = calls
    monkeypatch.setitem(sys.modules, "tensorrt", FakeTensorRT(calls))
    monkeypatch.setattr(tensorrt_build, "import_cudart", lambda: cudart)
    return calls, cudart


def test_builder_is_created_on_the_requested_device(fake_trt: tuple[list[tuple[Any, ...]], Any]) -> None:
    calls, _ = fake_trt
    tensorrt_build.EngineBuilder(ORIN, 64, None, device_id=3)
    assert calls[:2] == [("cudaSetDevice", 3), ("Builder",)]


def test_build_engines_passes_device_id_to_the_builder(
    tiny_repository: TinyRepository, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[int] = []

    class Recorder:
        def __init__(self, target: BuildTarget, workspace_mib: int, cache: Any, device_id: int = 0) -> None:
            seen.append(device_id)
            raise RepositoryError("stop here")

    monkeypatch.setattr(tensorrt_build, "detect_target", lambda precision, device_id=0: ORIN)
    monkeypatch.setattr(tensorrt_build, "EngineBuilder", Recorder)
    parser = argparse.ArgumentParser(prog="edgeserve")
    add_parser(parser.add_subparsers())
    args = parser.parse_args(
        ["build-engines", "--repository", str(tiny_repository.root), "--model", "tiny_b", "--device-id", "1"]
    )
    with pytest.raises(RepositoryError, match="stop here"):
        args.func(args)
    assert seen == [1]


def _build(repo: TinyRepository, stage: int = 0) -> None:
    builder = tensorrt_build.EngineBuilder(ORIN, 64, None)
    manifest = repo.repository.load_manifest("tiny_b")
    builder.build(manifest, stage, repo.root / "x.onnx", (1, 2), repo.root / "out.engine")


def test_fp32_builds_clear_tf32_and_a_refused_timing_cache_or_profile_is_an_error(
    tiny_repository: TinyRepository,
    fake_trt: tuple[list[tuple[Any, ...]], Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls, _ = fake_trt
    with pytest.raises(RepositoryError, match="could not build"):  # the fake builds nothing
        _build(tiny_repository)
    assert ("clear_flag", "TF32") in calls
    monkeypatch.setitem(sys.modules, "tensorrt", FakeTensorRT(calls, timing_cache_ok=False))
    with pytest.raises(RepositoryError, match="set_timing_cache"):
        _build(tiny_repository)
    monkeypatch.setitem(sys.modules, "tensorrt", FakeTensorRT(calls, profile_index=-1))
    with pytest.raises(RepositoryError, match=r"add_optimization_profile.*'x' batch 1"):
        _build(tiny_repository)


# -- 4. what the engines and TensorRT's calls say is checked ------------------------------------

FAKE_TRT_TYPES = types.SimpleNamespace(
    TensorIOMode=types.SimpleNamespace(INPUT="INPUT", OUTPUT="OUTPUT"),
    TensorLocation=types.SimpleNamespace(DEVICE="DEVICE", HOST="HOST"),
    ExecutionContextAllocationStrategy=types.SimpleNamespace(USER_MANAGED="USER_MANAGED"),
    nptype=np.dtype,
)


class FakeEngine:
    """One stage engine: `io` maps a tensor to (is input, numpy type, shape with -1 for the batch)."""

    def __init__(
        self,
        io: dict[str, tuple[bool, str, tuple[int, ...]]],
        profiles: int = 2,
        shape_io: tuple[str, ...] = (),
        host_io: tuple[str, ...] = (),
        profile_batch_offset: int = 0,
        context: Any = "context",
    ) -> None:
        self.io, self.num_optimization_profiles = io, profiles
        self.shape_io, self.host_io, self.offset, self.context = (
            shape_io,
            host_io,
            profile_batch_offset,
            context,
        )
        self.num_io_tensors = len(io)

    def get_tensor_name(self, i: int) -> str:
        return list(self.io)[i]

    def get_tensor_mode(self, name: str) -> str:
        return "INPUT" if self.io[name][0] else "OUTPUT"

    def get_tensor_dtype(self, name: str) -> str:
        return self.io[name][1]

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        return self.io[name][2]

    def get_tensor_profile_shape(self, name: str, profile: int) -> list[tuple[int, ...]]:
        shape = (profile + 1 + self.offset, *self.io[name][2][1:])
        return [shape, shape, shape]

    def is_shape_inference_io(self, name: str) -> bool:
        return name in self.shape_io

    def get_tensor_location(self, name: str) -> str:
        return "HOST" if name in self.host_io else "DEVICE"

    def create_execution_context(self, *strategy: Any) -> Any:
        return self.context


def _stage1(**kwargs: Any) -> FakeEngine:  # tiny_b stage 1: x (B,16,16,16) -> features (B,32,8,8)
    io = {"x": (True, "float32", (-1, 16, 16, 16)), "features": (False, "float32", (-1, 32, 8, 8))}
    io |= kwargs.pop("io", {})
    return FakeEngine(io, **kwargs)


def test_chain_engine_io_types_and_profile_shapes_are_checked_against_the_buffers(
    tiny_repository: TinyRepository,
) -> None:
    plan = plan_buffers(tiny_repository.repository.load_manifest("tiny_b"), 2)
    _check_engine_io(FAKE_TRT_TYPES, _stage1(), plan, 1, "stage1.engine", "rebuild")  # matches
    with pytest.raises(RepositoryError, match="'x' is float16, its buffer is float32"):
        _check_engine_io(
            FAKE_TRT_TYPES, _stage1(io={"x": (True, "float16", (-1, 16, 16, 16))}), plan, 1, "e", "rebuild"
        )
    with pytest.raises(
        RepositoryError, match=r"profile 0 of engine input 'x'.*batch 1 needs \[1, 16, 16, 16\]"
    ):
        _check_engine_io(FAKE_TRT_TYPES, _stage1(profile_batch_offset=1), plan, 1, "e", "rebuild")
    with pytest.raises(RepositoryError, match=r"1 optimization profiles, batches 1\.\.2"):
        _check_engine_io(FAKE_TRT_TYPES, _stage1(profiles=1), plan, 1, "e", "rebuild")
    with pytest.raises(RepositoryError, match="output 'features' is shaped"):
        _check_engine_io(
            FAKE_TRT_TYPES,
            _stage1(io={"features": (False, "float32", (-1, 32, 4, 4))}),
            plan,
            1,
            "e",
            "rebuild",
        )


class RefusingContext:
    def __init__(self, refuse: str) -> None:
        self.refuse = refuse

    def set_device_memory(self, address: int, nbytes: int) -> None: ...

    def set_optimization_profile_async(self, profile: int, stream: int) -> bool:
        return self.refuse != "profile"

    def set_input_shape(self, name: str, shape: tuple[int, ...]) -> bool:
        return self.refuse != "shape"

    def set_tensor_address(self, name: str, address: int) -> bool:
        return self.refuse != "address"


@pytest.mark.parametrize(
    ("refuse", "message"),
    [
        ("none", r"create_execution_context returned None"),
        ("profile", r"set_optimization_profile_async\(0\) failed"),
        ("shape", r"set_input_shape\('x', \[1, 16, 16, 16\]\) failed on profile 0"),
        ("address", r"set_tensor_address\('x'\) failed"),
    ],
)
def test_a_false_or_none_from_tensorrt_while_binding_raises_naming_the_call(
    tiny_repository: TinyRepository, refuse: str, message: str
) -> None:
    plan = plan_buffers(tiny_repository.repository.load_manifest("tiny_b"), 2)
    engine = _stage1(context=None if refuse == "none" else RefusingContext(refuse))
    buffers: dict[str, Any] = {a.name: types.SimpleNamespace(device=1) for a in plan.allocations}
    scratch: Any = types.SimpleNamespace(device=2, nbytes=16)
    with pytest.raises(RuntimeError, match=message):
        _backend(FakeCudart(), FAKE_TRT_TYPES)._bind_contexts(engine, plan, 1, buffers, scratch)


@pytest.mark.parametrize(("kind", "message"), [("shape", "shape tensor"), ("host", "host memory")])
def test_imported_engines_with_shape_tensors_or_host_io_are_refused(
    tiny_repository: TinyRepository, kind: str, message: str
) -> None:
    manifest = tiny_repository.repository.load_manifest("tiny_b")
    engine = FakeEngine(
        {"x": (True, "float32", (-1, 3, 16, 16)), "features": (False, "float32", (-1, 16, 16, 16))},
        shape_io=("x",) if kind == "shape" else (),
        host_io=("x",) if kind == "host" else (),
    )
    with pytest.raises(InputError, match=f"'x'.*{message}.*onnxruntime backend"):
        open_imported(FAKE_TRT_TYPES, FakeCudart(), 1, manifest, [engine] * 3, [Path("e")] * 3, 2, "rebuild")


# -- 5. the smaller ones ---------------------------------------------------------------------------


def test_auto_falls_back_to_onnxruntime_when_tensorrt_cannot_serve_the_repository() -> None:
    choice = choose_backend(
        "auto",
        find_spec=lambda name: object(),
        has_gpu=lambda: True,
        ort_providers=lambda: ["CUDAExecutionProvider"],
        tensorrt_ready=lambda: "tensorrt: no TensorRT engines built for tiny_b",
    )
    assert (choice.name, choice.providers) == ("onnxruntime", ("cuda",))
    assert choice.skipped == ("tensorrt: no TensorRT engines built for tiny_b",)


@pytest.mark.parametrize(
    ("version", "reason"),
    [
        ("9.2.0", "TensorRT 9.2.0 is installed; edgeserve builds for TensorRT 10 or 11"),
        ("10.3.0", "no TensorRT engines built for tiny_a, tiny_b"),
    ],
)
def test_tensorrt_unready_names_an_unsupported_major_or_missing_engines(
    tiny_repository: TinyRepository, monkeypatch: pytest.MonkeyPatch, version: str, reason: str
) -> None:
    monkeypatch.setitem(sys.modules, "tensorrt", types.SimpleNamespace(__version__=version))
    assert reason in (tensorrt_unready(tiny_repository.repository) or "")


def test_engine_keys_tell_orin_modules_apart_and_old_records_stay_readable(
    tiny_repository: TinyRepository,
) -> None:
    agx = BuildTarget("Orin", "8.7", "10.3.0", "fp32", sm_count=16, memory_gib=30)
    nano = BuildTarget("Orin", "8.7", "10.3.0", "fp32", sm_count=8, memory_gib=7)
    assert agx.key() != nano.key()
    assert agx.key() == "orin-sm87-16sm-30g-trt10.3.0-fp32"
    assert ORIN.key() == "orin-sm87-trt10.3.0-fp32"  # unknown size (a --target plan): the old key
    manifest = tiny_repository.repository.load_manifest("tiny_b")
    path = engine_path(tiny_repository.repository, "tiny_b", ORIN, 0)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"engine")
    from edgeserve.runtime.backends.engine_cache import new_record, stale_reasons

    data = json.loads(new_record(manifest, 0, ORIN, (1, 2), path, 1.0).to_json())
    del data["sm_count"], data["memory_gib"]  # a record written before the fields existed
    old = tiny_repository.root / "old.json"
    old.write_text(json.dumps(data))
    record = EngineRecord.load(old)
    assert record.sm_count == 0
    assert "sm_count 0 != 16" in "; ".join(stale_reasons(record, manifest, 0, agx, (1, 2)))


def test_reload_frees_the_old_engines_before_deserializing_the_new(
    tiny_repository: TinyRepository,
) -> None:
    events: list[str] = []
    backend = _backend(FakeCudart())
    backend.repository, backend.target = tiny_repository.repository, ORIN
    backend._models = {"tiny_b": "old model"}  # type: ignore[dict-item]
    backend._release = lambda loaded: events.append(f"release {loaded}")  # type: ignore[method-assign]

    class Runtime:
        def deserialize_cuda_engine(self, blob: bytes) -> None:
            events.append("deserialize")
            return None

    backend._runtime = Runtime()
    manifest = tiny_repository.repository.load_manifest("tiny_b")
    for k in range(3):
        path = engine_path(tiny_repository.repository, "tiny_b", ORIN, k)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"engine")
    records: Any = [types.SimpleNamespace(batch_profile=None, batch_sizes=(1, 2))] * 3
    with pytest.raises(RepositoryError, match="cannot deserialize"):
        backend._load_chain(manifest, records)
    assert events == ["release old model", "deserialize"]
    assert "tiny_b" not in backend._models


def test_pinned_host_buffers_start_zeroed() -> None:
    garbage = np.full(64, 0xAB, dtype=np.uint8)

    class Cudart:
        def cudaMalloc(self, nbytes: int) -> tuple[int, int]:
            return (0, 1)

        def cudaMallocHost(self, nbytes: int) -> tuple[int, int]:
            return (0, garbage.ctypes.data_as(ctypes.c_void_p).value or 0)

    buffer = DeviceBuffer(Cudart(), 64, "float32", host=True)
    assert buffer.host is not None and not buffer.host.any()
    assert not garbage.any()
