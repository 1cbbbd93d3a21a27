"""A stand-in for TensorRT's Python package, tests only: the API edgeserve calls, run on the CPU.

A stand-in written from tensorrt-stubs 10.13; it does not replace running on real TensorRT. Names,
keyword names and return types are the stubs' (tensorrt_bindings/tensorrt.pyi), and where TensorRT
answers a mistake with a return value rather than an exception, so does this: set_input_shape,
set_tensor_address, set_timing_cache and execute_async_v3 return False, add_optimization_profile
returns -1 for an invalid profile, deserialize_cuda_engine returns None for bytes it did not build,
create_execution_context returns None when KNOBS asks it to. Where it can be real, it is: the
OnnxParser reads the real ONNX file (I/O names, types, shapes), build_serialized_network returns
bytes that hold the ONNX model and the profiles, and an execution context runs the graph with ONNX
Runtime on the bytes at its tensor addresses, as work on the stand-in CUDA stream (_standin_gpu), so
CUDA graph capture records and replays it.

Not modelled: precision (FP16 engines compute in float32), tactics and timing, plugins, DLA.
"""

from __future__ import annotations

import enum
import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import _standin_gpu as gpu
import numpy as np

__version__ = "10.13.0.35"

_ENGINE_MAGIC = b"STANDIN-TRT-ENGINE\x00"
_CACHE_MAGIC = b"STANDIN-TRT-TIMING-CACHE\x00"


@dataclass
class Knobs:
    """Failures a test turns on: what real TensorRT does when it runs out of memory, and so on."""

    fail_create_execution_context: bool = False
    fail_build: bool = False
    fail_capture: bool = False  # execute_async_v3 under CUDA graph capture returns False


KNOBS = Knobs()


# -- enums, values as in the stubs -------------------------------------------------------------------


class DataType(enum.IntEnum):
    FLOAT = 0
    HALF = 1
    INT8 = 2
    INT32 = 3
    BOOL = 4
    UINT8 = 5
    FP8 = 6
    BF16 = 7
    INT64 = 8
    INT4 = 9


_NUMPY = {
    DataType.FLOAT: np.float32,
    DataType.HALF: np.float16,
    DataType.INT8: np.int8,
    DataType.INT32: np.int32,
    DataType.BOOL: np.bool_,
    DataType.UINT8: np.uint8,
    DataType.INT64: np.int64,
}


def nptype(trt_type: DataType) -> type:
    """The numpy type of a TensorRT DataType (TypeError for one numpy has none for, as TensorRT)."""
    if trt_type not in _NUMPY:
        raise TypeError(f"Could not resolve TensorRT datatype to an equivalent numpy datatype: {trt_type}")
    return _NUMPY[trt_type]


class TensorIOMode(enum.IntEnum):
    NONE = 0
    INPUT = 1
    OUTPUT = 2


class TensorLocation(enum.IntEnum):
    DEVICE = 0
    HOST = 1


class MemoryPoolType(enum.IntEnum):
    WORKSPACE = 0
    DLA_MANAGED_SRAM = 1
    DLA_LOCAL_DRAM = 2
    DLA_GLOBAL_DRAM = 3
    TACTIC_DRAM = 4
    TACTIC_SHARED_MEMORY = 5


class ExecutionContextAllocationStrategy(enum.IntEnum):
    STATIC = 0
    ON_PROFILE_CHANGE = 1
    USER_MANAGED = 2


class NetworkDefinitionCreationFlag(enum.IntEnum):
    EXPLICIT_BATCH = 0
    STRONGLY_TYPED = 1
    PREFER_JIT_PYTHON_PLUGINS = 2
    PREFER_AOT_PYTHON_PLUGINS = 3


class BuilderFlag(enum.IntEnum):
    FP16 = 0
    INT8 = 1
    DEBUG = 2
    GPU_FALLBACK = 3
    REFIT = 4
    DISABLE_TIMING_CACHE = 5
    TF32 = 6
    SPARSE_WEIGHTS = 7
    SAFETY_SCOPE = 8
    OBEY_PRECISION_CONSTRAINTS = 9
    PREFER_PRECISION_CONSTRAINTS = 10
    DIRECT_IO = 11
    REJECT_EMPTY_ALGORITHMS = 12
    VERSION_COMPATIBLE = 13
    EXCLUDE_LEAN_RUNTIME = 14
    FP8 = 15
    ERROR_ON_TIMING_CACHE_MISS = 16
    BF16 = 17
    DISABLE_COMPILATION_CACHE = 18
    WEIGHTLESS = 19
    REFIT_IDENTICAL = 20
    WEIGHT_STREAMING = 21
    INT4 = 22
    REFIT_INDIVIDUAL = 23
    STRICT_NANS = 24
    MONITOR_MEMORY = 25
    FP4 = 26
    EDITABLE_TIMING_CACHE = 27
    DISTRIBUTIVE_INDEPENDENCE = 28


class ILogger:
    class Severity(enum.IntEnum):
        INTERNAL_ERROR = 0
        ERROR = 1
        WARNING = 2
        INFO = 3
        VERBOSE = 4

    INTERNAL_ERROR = Severity.INTERNAL_ERROR
    ERROR = Severity.ERROR
    WARNING = Severity.WARNING
    INFO = Severity.INFO
    VERBOSE = Severity.VERBOSE

    def log(self, severity: ILogger.Severity, msg: str) -> None:
        raise NotImplementedError


class Logger(ILogger):
    """Keeps what TensorRT logs at or above `min_severity`, so a test can read why a call failed."""

    def __init__(self, min_severity: ILogger.Severity = ILogger.Severity.WARNING) -> None:
        if not isinstance(min_severity, ILogger.Severity):
            raise TypeError(f"Logger(min_severity): expected ILogger.Severity, got {min_severity!r}")
        self.min_severity = min_severity
        self.messages: list[tuple[ILogger.Severity, str]] = []

    def log(self, severity: ILogger.Severity, msg: str) -> None:
        if severity <= self.min_severity:
            self.messages.append((severity, msg))


class Dims(tuple):
    """A shape; -1 for a dimension known only at run time."""


def _dims(shape: Any, what: str) -> Dims:
    """A tuple, list or Dims of ints (TensorRT converts Python iterables implicitly); TypeError else."""
    if not isinstance(shape, (tuple, list)) or not all(
        isinstance(d, (int, np.integer)) and not isinstance(d, bool) for d in shape
    ):
        raise TypeError(f"{what}: incompatible function arguments: expected Dims, got {shape!r}")
    return Dims(int(d) for d in shape)


def _check_type(value: object, kind: type | tuple[type, ...], what: str) -> None:
    """pybind11 refuses an argument of the wrong type with TypeError; so does the stand-in."""
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise TypeError(f"{what}: incompatible function arguments: got {type(value).__name__} {value!r}")


@dataclass(frozen=True)
class _IO:
    name: str
    mode: TensorIOMode
    dtype: DataType
    shape: Dims  # -1 for a dimension known only at run time


class IHostMemory(bytes):
    """Serialized data TensorRT hands out (an engine, a timing cache): supports the buffer protocol."""

    @property
    def nbytes(self) -> int:
        return len(self)

    @property
    def dtype(self) -> DataType:
        return DataType.UINT8


# -- network and parser: the real ONNX file ---------------------------------------------------------


@dataclass
class ITensor:
    name: str
    dtype: DataType
    shape: Dims

    def is_network_input(self) -> bool:
        return True


_ONNX_TYPES = {1: DataType.FLOAT, 10: DataType.HALF, 3: DataType.INT8, 6: DataType.INT32, 9: DataType.BOOL}
_ONNX_TYPES |= {2: DataType.UINT8, 7: DataType.INT64}


class INetworkDefinition:
    def __init__(self, flags: int) -> None:
        self.flags = flags
        self._inputs: list[ITensor] = []
        self._outputs: list[ITensor] = []
        self.onnx_model: bytes | None = None

    @property
    def num_inputs(self) -> int:
        return len(self._inputs)

    @property
    def num_outputs(self) -> int:
        return len(self._outputs)

    def get_input(self, index: int) -> ITensor:
        _check_type(index, int, "INetworkDefinition.get_input(index)")
        return self._inputs[index]

    def get_output(self, index: int) -> ITensor:
        _check_type(index, int, "INetworkDefinition.get_output(index)")
        return self._outputs[index]

    @property
    def strongly_typed(self) -> bool:
        return bool(self.flags & (1 << NetworkDefinitionCreationFlag.STRONGLY_TYPED))


class ParserError:
    def __init__(self, desc: str) -> None:
        self._desc = desc

    def desc(self) -> str:
        return self._desc

    def __str__(self) -> str:
        return self._desc


class OnnxParser:
    """Reads the ONNX model for real: the network gets its inputs and outputs, and keeps the model."""

    def __init__(self, network: INetworkDefinition, logger: ILogger) -> None:
        _check_type(network, INetworkDefinition, "OnnxParser(network)")
        _check_type(logger, ILogger, "OnnxParser(logger)")
        self._network = network
        self._errors: list[ParserError] = []

    @property
    def num_errors(self) -> int:
        return len(self._errors)

    def get_error(self, index: int) -> ParserError:
        _check_type(index, int, "OnnxParser.get_error(index)")
        return self._errors[index]

    def clear_errors(self) -> None:
        self._errors.clear()

    def parse_from_file(self, model: str) -> bool:
        _check_type(model, str, "OnnxParser.parse_from_file(model)")
        try:
            with open(model, "rb") as f:
                data = f.read()
        except OSError as exc:
            self._errors.append(ParserError(f"cannot read {model}: {exc}"))
            return False
        return self.parse(data, model)

    def parse(self, model: bytes, path: str | None = None) -> bool:
        import onnx

        try:
            proto = onnx.load_from_string(bytes(model))
            if path is not None:
                from onnx.external_data_helper import load_external_data_for_model

                load_external_data_for_model(proto, str(__import__("pathlib").Path(path).parent))
        except Exception as exc:
            self._errors.append(ParserError(f"ModelImporter: failed to parse the model: {exc}"))
            return False
        initializers = {t.name for t in proto.graph.initializer}
        network = self._network
        for values, target in ((proto.graph.input, network._inputs), (proto.graph.output, network._outputs)):
            for value in values:
                if value.name in initializers:
                    continue
                tensor = value.type.tensor_type
                if tensor.elem_type not in _ONNX_TYPES:
                    self._errors.append(
                        ParserError(f"{value.name}: unsupported data type {tensor.elem_type}")
                    )
                    return False
                dims = Dims(d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim)
                target.append(ITensor(value.name, _ONNX_TYPES[tensor.elem_type], dims))
        network.onnx_model = proto.SerializeToString()
        return True


# -- builder ------------------------------------------------------------------------------------------


class IOptimizationProfile:
    def __init__(self) -> None:
        self.shapes: dict[str, tuple[Dims, Dims, Dims]] = {}
        self.valid = True

    def set_shape(self, input: str, min: Any, opt: Any, max: Any) -> None:
        _check_type(input, str, "IOptimizationProfile.set_shape(input)")
        low, mid, high = (_dims(s, "IOptimizationProfile.set_shape") for s in (min, opt, max))
        ordered = all(a <= b <= c for a, b, c in zip(low, mid, high, strict=False))
        if not (len(low) == len(mid) == len(high)) or not ordered or any(d < 0 for d in low):
            self.valid = False  # TensorRT logs an error; add_optimization_profile then returns -1
            return
        self.shapes[input] = (low, mid, high)

    def get_shape(self, input: str) -> list[Dims]:
        return list(self.shapes.get(input, ()))


@dataclass
class ITimingCache:
    entries: dict[str, float] = field(default_factory=dict)

    def serialize(self) -> IHostMemory:
        return IHostMemory(_CACHE_MAGIC + json.dumps(self.entries).encode())

    def combine(self, input_cache: ITimingCache, ignore_mismatch: bool) -> bool:
        self.entries |= input_cache.entries
        return True

    def reset(self) -> bool:
        self.entries.clear()
        return True


class IBuilderConfig:
    def __init__(self) -> None:
        self.flags: set[BuilderFlag] = {BuilderFlag.TF32}  # TensorRT's default, as documented
        self.pools: dict[MemoryPoolType, int] = {}
        self.profiles: list[IOptimizationProfile] = []
        self._timing_cache: ITimingCache | None = None

    def set_flag(self, flag: BuilderFlag) -> None:
        _check_type(flag, BuilderFlag, "IBuilderConfig.set_flag(flag)")
        self.flags.add(flag)

    def clear_flag(self, flag: BuilderFlag) -> None:
        _check_type(flag, BuilderFlag, "IBuilderConfig.clear_flag(flag)")
        self.flags.discard(flag)

    def get_flag(self, flag: BuilderFlag) -> bool:
        _check_type(flag, BuilderFlag, "IBuilderConfig.get_flag(flag)")
        return flag in self.flags

    def set_memory_pool_limit(self, pool: MemoryPoolType, pool_size: int) -> None:
        _check_type(pool, MemoryPoolType, "IBuilderConfig.set_memory_pool_limit(pool)")
        _check_type(pool_size, int, "IBuilderConfig.set_memory_pool_limit(pool_size)")
        self.pools[pool] = pool_size

    def get_memory_pool_limit(self, pool: MemoryPoolType) -> int:
        return self.pools.get(pool, 1 << 40)

    def create_timing_cache(self, serialized_timing_cache: bytes) -> ITimingCache:
        blob = bytes(serialized_timing_cache)
        if blob.startswith(_CACHE_MAGIC):
            return ITimingCache(json.loads(blob[len(_CACHE_MAGIC) :]))
        return ITimingCache()  # TensorRT: an empty (or unreadable, with an error logged) cache

    def set_timing_cache(self, cache: ITimingCache, ignore_mismatch: bool) -> bool:
        _check_type(cache, ITimingCache, "IBuilderConfig.set_timing_cache(cache)")
        _check_type(ignore_mismatch, bool, "IBuilderConfig.set_timing_cache(ignore_mismatch)")
        self._timing_cache = cache
        return True

    def get_timing_cache(self) -> ITimingCache:
        if self._timing_cache is None:
            self._timing_cache = ITimingCache()
        return self._timing_cache

    def add_optimization_profile(self, profile: IOptimizationProfile) -> int:
        _check_type(profile, IOptimizationProfile, "IBuilderConfig.add_optimization_profile(profile)")
        if not profile.valid or not profile.shapes:
            return -1
        self.profiles.append(profile)
        return len(self.profiles) - 1

    @property
    def num_optimization_profiles(self) -> int:
        return len(self.profiles)


class Builder:
    def __init__(self, logger: ILogger) -> None:
        _check_type(logger, ILogger, "Builder(logger)")
        self.logger = logger

    def create_network(self, flags: int = 0) -> INetworkDefinition:
        _check_type(flags, int, "Builder.create_network(flags)")
        return INetworkDefinition(flags)

    def create_builder_config(self) -> IBuilderConfig:
        return IBuilderConfig()

    def create_optimization_profile(self) -> IOptimizationProfile:
        return IOptimizationProfile()

    @property
    def platform_has_fast_fp16(self) -> bool:
        return True

    def _error(self, msg: str) -> None:
        self.logger.log(ILogger.Severity.ERROR, msg)

    def build_serialized_network(
        self, network: INetworkDefinition, config: IBuilderConfig
    ) -> IHostMemory | None:
        """The engine: the ONNX model plus its I/O and profiles. None (and an error logged) for what
        TensorRT refuses to build: a dynamic input no profile covers, a profile outside the graph's
        fixed dimensions, precision flags on a strongly typed network."""
        _check_type(network, INetworkDefinition, "Builder.build_serialized_network(network)")
        _check_type(config, IBuilderConfig, "Builder.build_serialized_network(config)")
        if KNOBS.fail_build or network.onnx_model is None:
            self._error("build failed (stand-in knob, or a network the ONNX parser never filled)")
            return None
        if network.strongly_typed and config.flags & {BuilderFlag.FP16, BuilderFlag.BF16, BuilderFlag.INT8}:
            self._error("precision flags are not allowed on a strongly typed network")
            return None
        dynamic = [t for t in network._inputs if any(d < 0 for d in t.shape)]
        if dynamic and not config.profiles:
            self._error(f"network has dynamic inputs ({dynamic[0].name}) but no optimization profile")
            return None
        profiles = []
        for index, profile in enumerate(config.profiles):
            shapes = {}
            for tensor in network._inputs:
                if tensor.name not in profile.shapes:
                    if tensor in dynamic:
                        self._error(f"profile {index} has no shapes for dynamic input {tensor.name}")
                        return None
                    shapes[tensor.name] = [list(tensor.shape)] * 3
                    continue
                for shape in profile.shapes[tensor.name]:
                    if len(shape) != len(tensor.shape) or any(
                        d >= 0 and d != s for d, s in zip(tensor.shape, shape, strict=True)
                    ):
                        self._error(
                            f"profile {index}: {tensor.name} {list(shape)} vs network {list(tensor.shape)}"
                        )
                        return None
                shapes[tensor.name] = [list(s) for s in profile.shapes[tensor.name]]
            unknown = set(profile.shapes) - {t.name for t in network._inputs}
            if unknown:
                self._error(f"profile {index} names tensors that are not network inputs: {sorted(unknown)}")
                return None
            profiles.append(shapes)
        config.get_timing_cache().entries[f"layer{len(config.get_timing_cache().entries)}"] = 1.0
        io = [(t, TensorIOMode.INPUT) for t in network._inputs] + [
            (t, TensorIOMode.OUTPUT) for t in network._outputs
        ]
        header = {
            "version": __version__,
            "io": [[t.name, int(mode), int(t.dtype), list(t.shape)] for t, mode in io],
            "profiles": profiles,
            "flags": sorted(f.name for f in config.flags),
        }
        head = json.dumps(header).encode()
        return IHostMemory(_ENGINE_MAGIC + struct.pack("<Q", len(head)) + head + network.onnx_model)


# -- runtime, engine, execution context: ONNX Runtime on the stand-in GPU's memory ------------------


class Runtime:
    def __init__(self, logger: ILogger) -> None:
        _check_type(logger, ILogger, "Runtime(logger)")
        self.logger = logger

    def deserialize_cuda_engine(self, serialized_engine: bytes) -> ICudaEngine | None:
        data = bytes(serialized_engine)
        if not data.startswith(_ENGINE_MAGIC):
            self.logger.log(ILogger.Severity.ERROR, "deserializeCudaEngine: not an engine (magic tag)")
            return None
        start = len(_ENGINE_MAGIC)
        try:
            (length,) = struct.unpack("<Q", data[start : start + 8])
            header = json.loads(data[start + 8 : start + 8 + length])
        except (struct.error, ValueError):
            self.logger.log(ILogger.Severity.ERROR, "deserializeCudaEngine: corrupt engine")
            return None
        if header.get("version") != __version__:
            self.logger.log(ILogger.Severity.ERROR, f"engine built by TensorRT {header.get('version')}")
            return None
        return ICudaEngine(header, data[start + 8 + length :], self.logger)


class ICudaEngine:
    def __init__(self, header: dict[str, Any], onnx_model: bytes, logger: ILogger) -> None:
        self._io = [_IO(n, TensorIOMode(m), DataType(d), Dims(s)) for n, m, d, s in header["io"]]
        self._by_name = {t.name: t for t in self._io}
        self._profiles: list[dict[str, list[list[int]]]] = header["profiles"]
        self._onnx = onnx_model
        self._session: Any = None
        self._inferred: dict[tuple[tuple[str, Dims], ...], dict[str, Dims]] = {}
        self.logger = logger

    def session(self) -> Any:
        if self._session is None:
            import onnxruntime as ort

            options = ort.SessionOptions()
            options.intra_op_num_threads = 1
            self._session = ort.InferenceSession(self._onnx, options, providers=["CPUExecutionProvider"])
        return self._session

    def _tensor(self, name: str, what: str) -> _IO | None:
        _check_type(name, str, what)
        tensor = self._by_name.get(name)
        if tensor is None:
            self.logger.log(ILogger.Severity.ERROR, f"{what}: no tensor named {name!r}")
        return tensor

    @property
    def num_io_tensors(self) -> int:
        return len(self._io)

    @property
    def num_optimization_profiles(self) -> int:
        return max(len(self._profiles), 1)

    @property
    def device_memory_size(self) -> int:
        return max(
            self.get_device_memory_size_for_profile_v2(p) for p in range(self.num_optimization_profiles)
        )

    @property
    def device_memory_size_v2(self) -> int:
        return self.device_memory_size

    def get_device_memory_size_for_profile_v2(self, profile_index: int) -> int:
        _check_type(profile_index, int, "ICudaEngine.get_device_memory_size_for_profile_v2(profile_index)")
        return 256 * (profile_index + 1)  # scratch the stand-in checks is bound, never uses

    def get_tensor_name(self, index: int) -> str:
        _check_type(index, int, "ICudaEngine.get_tensor_name(index)")
        return self._io[index].name

    def get_tensor_mode(self, name: str) -> TensorIOMode:
        tensor = self._tensor(name, "ICudaEngine.get_tensor_mode")
        return TensorIOMode.NONE if tensor is None else tensor.mode

    def get_tensor_dtype(self, name: str) -> DataType:
        tensor = self._tensor(name, "ICudaEngine.get_tensor_dtype")
        return DataType.FLOAT if tensor is None else tensor.dtype  # TensorRT logs and returns FLOAT

    def get_tensor_shape(self, name: str) -> Dims:
        tensor = self._tensor(name, "ICudaEngine.get_tensor_shape")
        return Dims() if tensor is None else tensor.shape

    def get_tensor_location(self, name: str) -> TensorLocation:
        self._tensor(name, "ICudaEngine.get_tensor_location")
        return TensorLocation.DEVICE

    def is_shape_inference_io(self, name: str) -> bool:
        self._tensor(name, "ICudaEngine.is_shape_inference_io")
        return False

    def get_tensor_profile_shape(self, name: str, profile_index: int) -> list[Dims]:
        tensor = self._tensor(name, "ICudaEngine.get_tensor_profile_shape")
        if (
            tensor is None
            or tensor.mode != TensorIOMode.INPUT
            or not 0 <= profile_index < len(self._profiles)
        ):
            return []
        return [Dims(s) for s in self._profiles[profile_index][name]]

    def create_execution_context(
        self, strategy: ExecutionContextAllocationStrategy = ExecutionContextAllocationStrategy.STATIC
    ) -> IExecutionContext | None:
        _check_type(strategy, ExecutionContextAllocationStrategy, "ICudaEngine.create_execution_context")
        if KNOBS.fail_create_execution_context:
            self.logger.log(ILogger.Severity.ERROR, "createExecutionContext: out of device memory (knob)")
            return None
        return IExecutionContext(self, strategy)


class IExecutionContext:
    """Binds shapes and addresses; execute_async_v3 enqueues the ONNX graph on the stand-in stream."""

    def __init__(self, engine: ICudaEngine, strategy: ExecutionContextAllocationStrategy) -> None:
        self.engine = engine
        self._strategy = strategy
        self._profile = 0
        self._shapes: dict[str, Dims] = {}
        self._addresses: dict[str, int] = {}
        self._device_memory: tuple[int, int] | None = None
        self._ran_uncaptured: set[tuple[tuple[str, Dims], ...]] = set()

    @property
    def active_optimization_profile(self) -> int:
        return self._profile

    def set_device_memory(self, memory: int, size: int) -> None:
        _check_type(memory, int, "IExecutionContext.set_device_memory(memory)")
        _check_type(size, int, "IExecutionContext.set_device_memory(size)")
        if size < self.engine.get_device_memory_size_for_profile_v2(self._profile):
            raise RuntimeError(f"set_device_memory: {size} bytes is less than the engine needs")
        gpu.region(memory, size, "device")
        self._device_memory = (memory, size)

    def set_optimization_profile_async(self, profile_index: int, stream_handle: int) -> bool:
        _check_type(profile_index, int, "IExecutionContext.set_optimization_profile_async(profile_index)")
        _check_type(stream_handle, int, "IExecutionContext.set_optimization_profile_async(stream_handle)")
        if not 0 <= profile_index < self.engine.num_optimization_profiles:
            raise RuntimeError(
                f"set_optimization_profile_async: profile {profile_index} is not in "
                f"0..{self.engine.num_optimization_profiles - 1}"
            )
        gpu.stream_of(stream_handle)
        self._profile = profile_index
        self._shapes.clear()  # input shapes are set per profile
        return True

    def _profile_shapes(self, name: str) -> list[Dims] | None:
        if not self.engine._profiles:
            return None
        return [Dims(s) for s in self.engine._profiles[self._profile][name]]

    def set_input_shape(self, name: str, shape: Any) -> bool:
        tensor = self.engine._tensor(name, "IExecutionContext.set_input_shape")
        dims = _dims(shape, "IExecutionContext.set_input_shape(shape)")
        if tensor is None or tensor.mode != TensorIOMode.INPUT or len(dims) != len(tensor.shape):
            return False
        if any(d >= 0 and d != s for d, s in zip(tensor.shape, dims, strict=True)):
            return False
        bounds = self._profile_shapes(name)
        if bounds is not None:
            low, _, high = bounds
            if not all(a <= s <= b for a, s, b in zip(low, dims, high, strict=True)):
                self.engine.logger.log(
                    ILogger.Severity.ERROR, f"{name} {list(dims)} outside profile {self._profile}"
                )
                return False
        self._shapes[name] = dims
        return True

    def set_tensor_address(self, name: str, memory: int) -> bool:
        tensor = self.engine._tensor(name, "IExecutionContext.set_tensor_address")
        _check_type(memory, int, "IExecutionContext.set_tensor_address(memory)")
        if tensor is None:
            return False
        self._addresses[name] = memory
        return True

    def get_tensor_address(self, name: str) -> int:
        return self._addresses.get(name, 0)

    def get_tensor_shape(self, name: str) -> Dims:
        """An input's set shape; an output's shape as ONNX shape inference gives it for the set input
        shapes (-1 where it depends on the data, as TensorRT)."""
        tensor = self.engine._tensor(name, "IExecutionContext.get_tensor_shape")
        if tensor is None:
            return Dims()
        if tensor.mode == TensorIOMode.INPUT:
            return self._shapes.get(name, tensor.shape)
        return self._output_shapes().get(name, tensor.shape)

    def _output_shapes(self) -> dict[str, Dims]:
        key = tuple(sorted(self._shapes.items()))
        if key not in self.engine._inferred:
            self.engine._inferred[key] = self._infer_output_shapes()
        return self.engine._inferred[key]

    def _infer_output_shapes(self) -> dict[str, Dims]:
        import onnx

        model = onnx.load_from_string(self.engine._onnx)
        for value in model.graph.input:
            if value.name in self._shapes:
                dims = value.type.tensor_type.shape.dim
                for d, size in zip(dims, self._shapes[value.name], strict=True):
                    d.Clear()
                    d.dim_value = size
        for value in model.graph.output:
            value.type.tensor_type.ClearField("shape")
        inferred = onnx.shape_inference.infer_shapes(model)
        out = {}
        for value in inferred.graph.output:
            shape = value.type.tensor_type.shape
            out[value.name] = (
                Dims(d.dim_value if d.HasField("dim_value") else -1 for d in shape.dim)
                if value.type.tensor_type.HasField("shape")
                else self.engine._by_name[value.name].shape
            )
        return out

    def all_input_shapes_specified(self) -> bool:
        inputs = [t for t in self.engine._io if t.mode == TensorIOMode.INPUT]
        return all(t.name in self._shapes or min(t.shape, default=0) >= 0 for t in inputs)

    def execute_async_v3(self, stream_handle: int) -> bool:
        """Enqueue the graph on the stream; False (error logged) for what TensorRT refuses."""
        _check_type(stream_handle, int, "IExecutionContext.execute_async_v3(stream_handle)")
        log = self.engine.logger
        missing = [t.name for t in self.engine._io if t.name not in self._addresses]
        if missing:
            log.log(ILogger.Severity.ERROR, f"execute_async_v3: no address for {missing}")
            return False
        if not self.all_input_shapes_specified():
            log.log(ILogger.Severity.ERROR, "execute_async_v3: not every input shape is set")
            return False
        if self._strategy == ExecutionContextAllocationStrategy.USER_MANAGED and self._device_memory is None:
            log.log(ILogger.Severity.ERROR, "execute_async_v3: USER_MANAGED context without device memory")
            return False
        inputs = {
            t.name: (self._addresses[t.name], self.get_tensor_shape(t.name), nptype(t.dtype))
            for t in self.engine._io
            if t.mode == TensorIOMode.INPUT
        }
        outputs = {
            t.name: (self._addresses[t.name], self.get_tensor_shape(t.name), nptype(t.dtype))
            for t in self.engine._io
            if t.mode == TensorIOMode.OUTPUT
        }
        key = tuple(sorted((n, s) for n, (_, s, _) in inputs.items()))
        if gpu.capturing(stream_handle):
            if KNOBS.fail_capture or key not in self._ran_uncaptured:
                # TensorRT: "call enqueue once before capturing" (lazy initialisation is not capturable)
                log.log(
                    ILogger.Severity.ERROR, "execute_async_v3: not capturable (no enqueue before capture)"
                )
                return False
        else:
            self._ran_uncaptured.add(key)
        for name, (address, shape, dtype) in {**inputs, **outputs}.items():
            if any(d < 0 for d in shape):
                log.log(ILogger.Severity.ERROR, f"execute_async_v3: {name} has unknown shape {list(shape)}")
                return False
            gpu.region(address, _nbytes(shape, dtype), "device")
        session = self.engine.session()

        def run() -> None:
            feeds = {
                name: np.frombuffer(gpu.read(address, _nbytes(shape, dtype)), dtype).reshape(shape)
                for name, (address, shape, dtype) in inputs.items()
            }
            results = session.run(list(outputs), feeds)
            for (name, (address, shape, dtype)), value in zip(outputs.items(), results, strict=True):
                if tuple(value.shape) != tuple(shape):
                    raise gpu.CudaFault(f"{name}: computed {value.shape}, bound as {list(shape)}")
                gpu.write(address, np.ascontiguousarray(value, dtype).tobytes())

        gpu.enqueue(stream_handle, run)
        return True


def _nbytes(shape: Sequence[int], dtype: type) -> int:
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
