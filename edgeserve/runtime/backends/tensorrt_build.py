"""Build one TensorRT engine per stage, with a shared timing cache.

Export's classifier chains get an optimization profile per batch size (min = opt = max); any other
model (imported: several inputs, fixed or no batch dimension) gets one profile per engine whose
min/opt/max shapes come from buffer_plan.profile_shapes (engine_cache.batch_plan decides the batch
range). The one-profile path is written against TensorRT 10's documented Python API
(Builder.create_optimization_profile, IOptimizationProfile.set_shape, add_optimization_profile,
build_serialized_network) and has never been executed: this project's machines have no GPU.

The thin layer over TensorRT's builder; what to build and whether an engine is stale is decided in
edgeserve.runtime.backends.engine_cache (pure, tested everywhere). TensorRT is imported lazily and this module
is GPU-only code: it is not executed by the test suite (no TensorRT there).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeserve.errors import BackendUnavailableError, RepositoryError
from edgeserve.manifest import Manifest
from edgeserve.runtime.backends.buffer_plan import profile_shapes
from edgeserve.runtime.backends.cuda_runtime import check, device_info, import_cudart
from edgeserve.runtime.backends.engine_cache import (
    BuildTarget,
    EngineRecord,
    graph_float_dtype,
    new_record,
    precision_plan,
)

if TYPE_CHECKING:  # tensorrt-stubs: mypy checks every TensorRT call here against its signatures
    import tensorrt

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
    return BuildTarget(
        info.name, info.compute_capability, str(trt.__version__), precision, info.sm_count, info.memory_gib
    )


class EngineBuilder:
    """Builds stage engines for one target; the timing cache is loaded once and saved after each build."""

    def __init__(
        self, target: BuildTarget, workspace_mib: int, timing_cache: Path | None, device_id: int = 0
    ) -> None:
        self.trt = import_tensorrt()
        self.target = target
        self.workspace_bytes = workspace_mib << 20
        self.timing_cache_path = timing_cache
        self.logger: tensorrt.Logger = self.trt.Logger(self.trt.Logger.WARNING)
        # The builder builds (and times tactics) on the current CUDA device: make it the one asked for,
        # or --device-id N would build on GPU 0 and file the engine under GPU N's key.
        check(import_cudart().cudaSetDevice(device_id), "cudaSetDevice")
        self.builder: tensorrt.Builder = self.trt.Builder(self.logger)
        self._cache_blob = b""
        if timing_cache is not None and timing_cache.exists():
            self._cache_blob = timing_cache.read_bytes()

    def build(
        self,
        manifest: Manifest,
        stage: int,
        onnx_path: Path,
        sizes: tuple[int, ...],
        engine_path: Path,
        profile: tuple[int, int, int] | None = None,
    ) -> EngineRecord:
        """Build, write `engine_path` atomically and return its record (the caller saves it).

        `profile` None: one optimization profile per batch size in `sizes` (export's chains). Else
        the graph batch (min, opt, max) of the engine's one profile (engine_cache.batch_plan).
        """
        trt = self.trt
        plan = precision_plan(self.target.precision, self.target.trt_major, graph_float_dtype(manifest))
        started = time.perf_counter()
        flags = 0
        if plan.strongly_typed:
            flags |= 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
        network = self.builder.create_network(flags)
        parser: tensorrt.OnnxParser = trt.OnnxParser(network, self.logger)
        if not parser.parse_from_file(str(onnx_path)):
            errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
            fix = (
                f"re-export the model with a lower opset (`edgeserve export --model {manifest.name} "
                "--opset 17`)"
            )
            if "imported_from" in manifest.source:
                fix = "convert the model to a lower opset before `edgeserve import`"
            raise RepositoryError(
                f"{onnx_path}: TensorRT's ONNX parser refused this stage ({errors}); {fix} or serve it "
                "with `--backend onnxruntime`"
            )
        graph_inputs = sorted(network.get_input(i).name for i in range(network.num_inputs))
        wanted = sorted(t.name for t in manifest.stages[stage].inputs)
        if graph_inputs != wanted:
            raise RepositoryError(
                f"{onnx_path}: TensorRT parsed the inputs {graph_inputs}, the manifest says {wanted}"
            )
        config = self.builder.create_builder_config()
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, self.workspace_bytes)
        for flag in plan.builder_flags:
            config.set_flag(getattr(trt.BuilderFlag, flag))
        if self.target.precision == "fp32" and hasattr(trt.BuilderFlag, "TF32"):
            config.clear_flag(trt.BuilderFlag.TF32)  # on by default: "fp32" would run TF32 matmuls/convs
        cache = config.create_timing_cache(self._cache_blob)
        if cache is None or not config.set_timing_cache(cache, ignore_mismatch=False):
            raise RepositoryError(
                f"TensorRT set_timing_cache refused the timing cache {self.timing_cache_path} (from another "
                "TensorRT version or GPU?); delete it or pass another --timing-cache"
            )
        if profile is None:
            spec = manifest.stages[stage].input
            for batch in sizes:  # profile i serves batch sizes[i] exactly
                per_batch = self.builder.create_optimization_profile()
                shape = (batch, *spec.shape)
                per_batch.set_shape(spec.name, shape, shape, shape)
                _add_profile(config, per_batch, onnx_path, f"{spec.name!r} batch {batch}")
        else:  # one profile for every input of the stage (never executed here: no TensorRT)
            one = self.builder.create_optimization_profile()
            for shapes in profile_shapes(manifest, stage, profile):
                one.set_shape(shapes.name, shapes.min, shapes.opt, shapes.max)
            _add_profile(config, one, onnx_path, f"batch (min, opt, max) {profile}")
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
        seconds = time.perf_counter() - started
        return new_record(manifest, stage, self.target, sizes, engine_path, seconds, profile)


def _add_profile(
    config: tensorrt.IBuilderConfig, profile: tensorrt.IOptimizationProfile, onnx_path: Path, what: str
) -> None:
    """add_optimization_profile returns the profile's index, or -1 when TensorRT finds it invalid."""
    if config.add_optimization_profile(profile) < 0:
        raise RepositoryError(
            f"{onnx_path}: TensorRT add_optimization_profile refused the profile for {what} (see its log)"
        )
