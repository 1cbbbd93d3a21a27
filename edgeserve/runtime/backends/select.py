"""Pick a backend by name, so command lines can say `--backend tensorrt` and nothing more.

Backends are imported only when chosen: TensorRT and torch need libraries a CPU box does not have.
`auto` takes the fastest one this machine can run (TensorRT when it is importable and a GPU is
visible, else ONNX Runtime on CUDA where that build is installed, else ONNX Runtime on the CPU)
and records a one-line reason for every one it skipped, for the caller to print. `auto` never picks
`emulated` (runs no model: it waits a stored profile's latencies, emulated.py).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from edgeserve.config.server import BACKEND_NAMES
from edgeserve.errors import BackendUnavailableError
from edgeserve.repository import ModelRepository
from edgeserve.runtime.backends.base import Backend

FindSpec = Callable[[str], object | None]


def gpu_visible() -> bool:
    """An NVIDIA GPU the driver exposes (desktop driver nodes, or a Jetson's integrated GPU)."""
    return (
        any(Path("/proc/driver/nvidia/gpus").glob("*"))
        or Path("/dev/nvidia0").exists()
        or Path("/etc/nv_tegra_release").exists()
    )


def _find(find_spec: FindSpec, name: str) -> bool:
    try:
        return find_spec(name) is not None
    except (ImportError, ValueError):  # find_spec("a.b") imports "a", which may be missing
        return False


def tensorrt_missing(find_spec: FindSpec, has_gpu: bool) -> str | None:
    """Why the TensorRT backend cannot run here (one line with the fix), or None if it can."""
    if not _find(find_spec, "tensorrt"):
        return (
            "tensorrt: TensorRT's Python package is not installed (on a Jetson it comes with JetPack: "
            "`sudo apt install nvidia-jetpack`; on x86 `pip install tensorrt`)"
        )
    if not (_find(find_spec, "cuda.bindings") or _find(find_spec, "cuda.cudart")):
        return "tensorrt: cuda-python is not installed (`pip install cuda-python`)"
    if not has_gpu:
        return "tensorrt: no NVIDIA GPU is visible (no /dev/nvidia0, /proc/driver/nvidia/gpus or Jetson)"
    return None


def tensorrt_unready(repository: ModelRepository) -> str | None:
    """Why `auto` should not pick TensorRT for `repository` although it imports: its major version is
    not one edgeserve builds for, or a model has no engine built (one line with the fix), else None.

    Checks only that some engine folder exists per model: the exact target (GPU, precision) is
    checked at load, which names the command that rebuilds a stale engine.
    """
    from edgeserve.runtime.backends.engine_cache import SUPPORTED_TRT_MAJORS

    try:
        import tensorrt  # type: ignore[import-not-found]

        major = int(str(tensorrt.__version__).split(".", 1)[0])
    except (ImportError, AttributeError, ValueError) as exc:
        return f"tensorrt: TensorRT does not import or has no version here ({exc})"
    if major not in SUPPORTED_TRT_MAJORS:
        return (
            f"tensorrt: TensorRT {tensorrt.__version__} is installed; edgeserve builds for TensorRT "
            f"{' or '.join(map(str, SUPPORTED_TRT_MAJORS))}"
        )
    unbuilt = [
        m for m in repository.models() if not any((repository.model_dir(m) / "trt").glob("*/*.engine"))
    ]
    if unbuilt:
        return (
            f"tensorrt: no TensorRT engines built for {', '.join(unbuilt)} "
            f"(`edgeserve build-engines --repository {repository.root}` builds them)"
        )
    return None


def torch_missing(find_spec: FindSpec) -> str | None:
    if not _find(find_spec, "torch"):
        return "torch: torch is not installed (`pip install 'edgeserve[export]'`)"
    return None


@dataclass(frozen=True)
class BackendChoice:
    """The backend to build, the ONNX Runtime providers to ask for, and why others were skipped."""

    name: str
    providers: tuple[str, ...] | None
    skipped: tuple[str, ...]


def choose_backend(
    name: str,
    providers: Sequence[str] | None = None,
    *,
    find_spec: FindSpec = importlib.util.find_spec,
    has_gpu: Callable[[], bool] = gpu_visible,
    ort_providers: Callable[[], Sequence[str]] | None = None,
    tensorrt_ready: Callable[[], str | None] | None = None,
) -> BackendChoice:
    """Resolve `name` (one of BACKEND_NAMES) on this machine; BackendUnavailableError with the fix if
    an explicitly named backend cannot run. The probes are parameters so tests can simulate absence.
    `tensorrt_ready` (auto only): why TensorRT, although installed, cannot serve the repository
    (tensorrt_unready), or None."""
    if name not in BACKEND_NAMES:
        raise BackendUnavailableError(f"unknown backend {name!r}; available: {', '.join(BACKEND_NAMES)}")
    given = tuple(providers) if providers else None
    if name == "tensorrt":
        reason = tensorrt_missing(find_spec, has_gpu())
        if reason:
            raise BackendUnavailableError(f"backend {reason}; or serve with `--backend onnxruntime`")
        return BackendChoice("tensorrt", None, ())
    if name == "torch":
        reason = torch_missing(find_spec)
        if reason:
            raise BackendUnavailableError(f"backend {reason}; or serve with `--backend onnxruntime`")
        return BackendChoice("torch", None, ())
    if name == "onnxruntime":
        return BackendChoice("onnxruntime", given, ())
    if name == "emulated":
        return BackendChoice("emulated", None, ())
    skipped = []
    gpu = has_gpu()
    reason = tensorrt_missing(find_spec, gpu)
    if reason is None and tensorrt_ready is not None:
        reason = tensorrt_ready()
    if reason is None:
        return BackendChoice("tensorrt", None, ())
    skipped.append(reason)
    if ort_providers is None:
        import onnxruntime as ort

        ort_providers = ort.get_available_providers
    if "CUDAExecutionProvider" in ort_providers():
        return BackendChoice("onnxruntime", ("cuda",), tuple(skipped))
    reason = "onnxruntime CUDA: this onnxruntime has no CUDAExecutionProvider (onnxruntime-gpu has)"
    if gpu and torch_missing(find_spec) is None:  # not chosen by auto: it serves export's models only
        reason += (
            "; torch is installed: `--backend torch --device cuda` runs the models `edgeserve export` "
            "wrote on this GPU"
        )
    skipped.append(reason)
    return BackendChoice("onnxruntime", ("cpu",), tuple(skipped))


def create_backend(
    name: str,
    repository: ModelRepository,
    *,
    threads: int | None = None,
    providers: Sequence[str] | None = None,
    warmup: int = 3,
    precision: str = "fp32",
    device: str | None = None,
    cuda_graphs: bool = True,
    compose_exits: bool | None = None,
    report: Callable[[str], None] | None = None,
    choice: BackendChoice | None = None,
    slowdown: float = 1.0,
    fingerprint: str | None = None,
) -> Backend:
    """A backend over `repository`. With name "auto", each skipped backend is passed to `report`.

    `precision` picks the TensorRT engines; `device` ("cpu", "cuda", "cuda:1") the torch device;
    `providers` the ONNX Runtime execution providers, `compose_exits` whether ONNX Runtime runs an exit
    as one composed graph (None: for small models). `choice` overrides the probing (tests).
    `slowdown` and `fingerprint` (a stored profile's key) are the emulated backend's.
    """
    choice = choice or choose_backend(name, providers, tensorrt_ready=lambda: tensorrt_unready(repository))
    if report is not None:
        for reason in choice.skipped:
            report(f"backend auto: skipped {reason}")
    if choice.name == "tensorrt":
        from edgeserve.runtime.backends.tensorrt import TensorRTBackend

        device_id = int(device.split(":", 1)[1]) if device and ":" in device else 0
        return TensorRTBackend(
            repository, precision=precision, device_id=device_id, cuda_graphs=cuda_graphs, warmup=warmup
        )
    if choice.name == "emulated":
        from edgeserve.runtime.backends.emulated import EmulatedBackend

        return EmulatedBackend(repository, slowdown=slowdown, fingerprint=fingerprint)
    if choice.name == "torch":
        from edgeserve.runtime.backends.torch import TorchBackend

        return TorchBackend(
            repository, device=device, threads=threads, cuda_graphs=cuda_graphs, warmup=warmup
        )
    from edgeserve.runtime.backends.onnxruntime import OnnxRuntimeBackend

    return OnnxRuntimeBackend(
        repository, threads=threads, providers=choice.providers, warmup=warmup, compose=compose_exits
    )
