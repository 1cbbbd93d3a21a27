"""Backend selection: `auto` falls back with one-line reasons; a named backend that cannot run says why.

Absence is simulated through the probes `choose_backend` takes as parameters; the backend that is
then built is the real ONNX Runtime one, run on a tiny repository.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from tiny_onnx import TinyRepository

from edgeserve.errors import BackendUnavailableError
from edgeserve.runtime.backends.onnxruntime import OnnxRuntimeBackend
from edgeserve.runtime.backends.select import BACKEND_NAMES, FindSpec, choose_backend, create_backend


def finder(*installed: str) -> FindSpec:
    """A find_spec stand-in: only `installed` modules exist."""
    return lambda name: object() if name in installed else None


NOTHING = finder()
EVERYTHING = finder("tensorrt", "cuda.bindings", "torch")


def test_auto_without_tensorrt_or_cuda_falls_back_to_onnxruntime_on_the_cpu_and_says_why(
    tiny_repository: TinyRepository,
) -> None:
    choice = choose_backend(
        "auto", find_spec=NOTHING, has_gpu=lambda: False, ort_providers=lambda: ["CPUExecutionProvider"]
    )
    assert (choice.name, choice.providers) == ("onnxruntime", ("cpu",))
    assert len(choice.skipped) == 2
    assert choice.skipped[0].startswith("tensorrt: TensorRT's Python package is not installed")
    assert "JetPack" in choice.skipped[0]
    assert choice.skipped[1].startswith("onnxruntime CUDA: ")
    reported: list[str] = []
    backend = create_backend(
        "auto", tiny_repository.repository, threads=1, warmup=0, choice=choice, report=reported.append
    )
    assert isinstance(backend, OnnxRuntimeBackend)
    assert backend.providers == ("CPUExecutionProvider",)
    assert reported == [f"backend auto: skipped {r}" for r in choice.skipped]
    tiny = tiny_repository.models["tiny_a"]
    backend.load(tiny_repository.repository.load_manifest("tiny_a"))
    x = tiny.random_input(2)
    np.testing.assert_allclose(backend.run("tiny_a", 1, x), tiny.forward(x, 1), atol=1e-4)
    backend.close()


def test_auto_prefers_onnxruntime_cuda_when_tensorrt_is_missing() -> None:
    choice = choose_backend(
        "auto",
        find_spec=NOTHING,
        has_gpu=lambda: True,
        ort_providers=lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"],
    )
    assert (choice.name, choice.providers) == ("onnxruntime", ("cuda",))
    assert len(choice.skipped) == 1


def test_auto_on_a_gpu_with_torch_but_no_gpu_runtime_points_to_the_torch_backend() -> None:
    cpu_only = lambda: ["CPUExecutionProvider"]  # noqa: E731
    choice = choose_backend("auto", find_spec=finder("torch"), has_gpu=lambda: True, ort_providers=cpu_only)
    assert (choice.name, choice.providers) == ("onnxruntime", ("cpu",))
    assert "`--backend torch --device cuda`" in choice.skipped[1]
    for find_spec, gpu in ((finder("torch"), False), (NOTHING, True)):
        choice = choose_backend(
            "auto", find_spec=find_spec, has_gpu=lambda gpu=gpu: gpu, ort_providers=cpu_only
        )
        assert "--backend torch" not in choice.skipped[1]


def test_auto_picks_tensorrt_when_it_and_a_gpu_are_there() -> None:
    choice = choose_backend("auto", find_spec=EVERYTHING, has_gpu=lambda: True, ort_providers=lambda: [])
    assert (choice.name, choice.skipped) == ("tensorrt", ())


@pytest.mark.parametrize(
    ("find_spec", "has_gpu", "message"),
    [
        (NOTHING, True, r"TensorRT's Python package is not installed \(on a Jetson it comes with JetPack"),
        (finder("tensorrt"), True, r"cuda-python is not installed \(`pip install cuda-python`\)"),
        (EVERYTHING, False, "no NVIDIA GPU is visible"),
    ],
)
def test_asking_for_tensorrt_where_it_cannot_run_names_what_is_missing_and_the_alternative(
    find_spec: FindSpec, has_gpu: bool, message: str
) -> None:
    with pytest.raises(BackendUnavailableError, match=message) as info:
        choose_backend("tensorrt", find_spec=find_spec, has_gpu=lambda: has_gpu)
    assert "--backend onnxruntime" in str(info.value)


def test_asking_for_torch_without_torch_says_how_to_install_it() -> None:
    with pytest.raises(BackendUnavailableError, match=r"torch is not installed.*edgeserve\[export\]"):
        choose_backend("torch", find_spec=NOTHING)
    assert choose_backend("torch", find_spec=EVERYTHING).name == "torch"


def test_named_onnxruntime_keeps_the_requested_providers() -> None:
    choice = choose_backend("onnxruntime", ["cpu"], find_spec=NOTHING)
    assert (choice.name, choice.providers, choice.skipped) == ("onnxruntime", ("cpu",), ())


def test_unknown_backend_lists_the_known_ones(tiny_repository: TinyRepository) -> None:
    with pytest.raises(
        BackendUnavailableError, match="available: onnxruntime, tensorrt, torch, emulated, auto"
    ):
        create_backend("tflite", tiny_repository.repository)
    assert BACKEND_NAMES == ("onnxruntime", "tensorrt", "torch", "emulated", "auto")


@pytest.mark.skipif(
    choose_backend("auto").name == "tensorrt", reason="this machine can run TensorRT: nothing to refuse"
)
def test_tensorrt_on_this_machine_is_refused_with_the_fix(tiny_repository: TinyRepository) -> None:
    with pytest.raises(BackendUnavailableError, match="--backend onnxruntime"):
        create_backend("tensorrt", tiny_repository.repository)


def test_selecting_and_planning_never_import_tensorrt_cuda_or_torch() -> None:
    code = (
        "import sys, edgeserve.runtime.backends.select, edgeserve.tools.build_engines, "
        "edgeserve.runtime.backends.engine_cache, edgeserve.runtime.backends.buffer_plan\n"
        "edgeserve.runtime.backends.select.choose_backend('auto')\n"
        "print(sorted(m for m in ('tensorrt', 'cuda', 'torch') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_profiling_with_tensorrt_where_it_is_missing_is_one_clear_line(
    tiny_repository: TinyRepository, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from edgeserve.profiler.cli import main

    monkeypatch.setitem(sys.modules, "tensorrt", None)  # as on a box without TensorRT
    assert main(["--repository", str(tiny_repository.root), "--backend", "tensorrt"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("edgeserve-profile: error: backend tensorrt: ")
    assert "--backend onnxruntime" in err[0]


def test_tensorrt_backend_module_imports_everywhere_and_refuses_to_start_without_tensorrt(
    tiny_repository: TinyRepository, monkeypatch: pytest.MonkeyPatch
) -> None:
    from edgeserve.runtime.backends.tensorrt import TensorRTBackend

    monkeypatch.setitem(sys.modules, "tensorrt", None)
    with pytest.raises(
        BackendUnavailableError, match=r"TensorRT's Python package is not importable.*JetPack"
    ):
        TensorRTBackend(tiny_repository.repository)
