"""Build one TensorRT engine per stage: an optimization profile per batch size, a shared timing cache.

The thin layer over TensorRT's builder; what to build and whether an engine is stale is decided in
edgeserve.runtime.backends.engine_cache (pure, tested everywhere). TensorRT is imported lazily and this module
is GPU-only code: it is not executed by the test suite (no TensorRT there).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from edgeserve.errors import BackendUnavailableError, RepositoryError
from edgeserve.manifest import Manifest
from edgeserve.runtime.backends.cuda_runtime import device_info, import_cudart
from edgeserve.runtime.backends.engine_cache import BuildTarget, EngineRecord, new_record, precision_plan

TENSORRT_FIX = (
    "on a Jetson TensorRT comes with JetPack (`sudo apt install nvidia-jetpack`, or python3-libnvinfer; "
    "create the venv with --system-site-packages so it can see it); on an x86 box with an NVIDIA GPU "
    "`pip install tensorrt cuda-python`. Without a GPU, serve with `--backend onnxruntime`"
)


def import_tensorrt() -> Any:
    """The tensorrt module, or BackendUnavailableError saying where to get it."""
    try:
        import tensorrt  # type: ignore[import-not-found]
    except ImportError as exc:
        raise BackendUnavailableError(
            f"TensorRT's Python package is not importable here ({exc}); {TENSORRT_FIX}"
        ) from exc
    return tensorrt


def detect_target(precision: str, device_id: int = 0) -> BuildTarget:
    """The target this machine builds for: its GPU, compute capability and TensorRT version."""
    trt = import_tensorrt()
    info = device_info(import_cudart(), device_id)
    return BuildTarget(info.name, info.compute_capability, str(trt.__version__), precision)


class EngineBuilder:
    """Builds stage engines for one target; the timing cache is loaded once and saved after each build."""

    def __init__(self, target: BuildTarget, workspace_mib: int, timing_cache: Path | None) -> None:
        self.trt = import_tensorrt()
        self.target = target
        self.workspace_bytes = workspace_mib << 20
        self.timing_cache_path = timing_cache
        self.logger = self.trt.Logger(self.trt.Logger.WARNING)
        self.builder = self.trt.Builder(self.logger)
        self._cache_blob = b""
        if timing_cache is not None and timing_cache.exists():
            self._cache_blob = timing_cache.read_bytes()

    def build(
        self, manifest: Manifest, stage: int, onnx_path: Path, sizes: tuple[int, ...], engine_path: Path
    ) -> EngineRecord:
        """Build, write `engine_path` atomically and return its record (the caller saves it)."""
        trt = self.trt
        plan = precision_plan(self.target.precision, self.target.trt_major, manifest.input.dtype)
        started = time.perf_counter()
        flags = 0
        if plan.strongly_typed:
            flags |= 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
        network = self.builder.create_network(flags)
        parser = trt.OnnxParser(network, self.logger)
        if not parser.parse_from_file(str(onnx_path)):
            errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
            raise RepositoryError(
                f"{onnx_path}: TensorRT's ONNX parser refused this stage ({errors}); re-export the model "
                f"with a lower opset (`edgeserve export --model {manifest.name} --opset 17`) or serve it "
                "with `--backend onnxruntime`"
            )
        config = self.builder.create_builder_config()
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, self.workspace_bytes)
        for flag in plan.builder_flags:
            config.set_flag(getattr(trt.BuilderFlag, flag))
        cache = config.create_timing_cache(self._cache_blob)
        config.set_timing_cache(cache, ignore_mismatch=False)
        spec = manifest.stages[stage].input
        for batch in sizes:  # profile i serves batch sizes[i] exactly
            profile = self.builder.create_optimization_profile()
            shape = (batch, *spec.shape)
            profile.set_shape(spec.name, shape, shape, shape)
            config.add_optimization_profile(profile)
        serialized = self.builder.build_serialized_network(network, config)
        if serialized is None:
            raise RepositoryError(
                f"{onnx_path}: TensorRT could not build an engine for stage {stage} of {manifest.name!r} "
                "(see its log above); try a larger --workspace-mib or --precision fp32"
            )
        engine_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = engine_path.with_name(f".{engine_path.name}.tmp")
        with tmp.open("wb") as f:
            f.write(memoryview(serialized))
        tmp.replace(engine_path)
        self._cache_blob = bytes(memoryview(config.get_timing_cache().serialize()))
        if self.timing_cache_path is not None:
            self.timing_cache_path.parent.mkdir(parents=True, exist_ok=True)
            self.timing_cache_path.write_bytes(self._cache_blob)
        return new_record(manifest, stage, self.target, sizes, engine_path, time.perf_counter() - started)
