"""The ONNX Runtime backend on real sessions over tiny graphs: right numbers, clear refusals."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import onnxruntime as ort
import pytest
from tiny_onnx import TinyRepository

from edgeserve.errors import BackendUnavailableError, InputError, RepositoryError
from edgeserve.manifest import TensorSpec
from edgeserve.runtime.backends.onnxruntime import (
    CPU,
    CUDA,
    TENSORRT,
    OnnxRuntimeBackend,
    default_threads,
    resolve_providers,
)
from edgeserve.runtime.backends.select import create_backend


@pytest.fixture
def backend(tiny_repository: TinyRepository) -> Iterator[OnnxRuntimeBackend]:
    backend = OnnxRuntimeBackend(tiny_repository.repository, threads=1, warmup=1)
    for name in tiny_repository.models:
        backend.load(tiny_repository.repository.load_manifest(name))
    yield backend
    backend.close()


@pytest.mark.parametrize("model", ["tiny_a", "tiny_b"])
@pytest.mark.parametrize("batch", [1, 3, 10])
def test_logits_match_the_numpy_reference_at_every_exit(
    tiny_repository: TinyRepository, backend: OnnxRuntimeBackend, model: str, batch: int
) -> None:
    tiny = tiny_repository.models[model]
    x = tiny.random_input(batch, seed=batch)
    for exit in range(len(tiny.manifest.exits)):
        logits = backend.run(model, exit, x)
        assert logits.dtype == np.float32
        assert logits.shape == (batch, tiny.manifest.num_classes)
        np.testing.assert_allclose(logits, tiny.forward(x, exit), rtol=1e-4, atol=1e-5)


def test_deeper_exits_give_different_logits(
    tiny_repository: TinyRepository, backend: OnnxRuntimeBackend
) -> None:
    x = tiny_repository.models["tiny_a"].random_input(2)
    outs = [backend.run("tiny_a", e, x) for e in range(3)]
    assert not np.allclose(outs[0], outs[1]) and not np.allclose(outs[1], outs[2])


def test_non_contiguous_input_is_made_contiguous(
    tiny_repository: TinyRepository, backend: OnnxRuntimeBackend
) -> None:
    tiny = tiny_repository.models["tiny_a"]
    x = tiny.random_input(6)
    strided = x[::2]
    fortran = np.asfortranarray(x)
    assert not strided.flags.c_contiguous and not fortran.flags.c_contiguous
    np.testing.assert_allclose(
        backend.run("tiny_a", 2, strided), tiny.forward(x[::2], 2), rtol=1e-4, atol=1e-5
    )
    np.testing.assert_allclose(backend.run("tiny_a", 1, fortran), tiny.forward(x, 1), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float64, np.uint8, np.float16])
def test_wrong_dtype_is_refused_without_casting(backend: OnnxRuntimeBackend, dtype: type) -> None:
    x = np.zeros((2, 1, 8, 8), dtype=dtype)
    with pytest.raises(InputError) as err:
        backend.run("tiny_a", 0, x)
    assert np.dtype(dtype).name in str(err.value) and "float32" in str(err.value)


def test_wrong_per_sample_shape_is_refused_with_the_expected_shape(backend: OnnxRuntimeBackend) -> None:
    with pytest.raises(InputError, match=r"\(3, 16, 16\), got \(3, 8, 8\)"):
        backend.run("tiny_b", 0, np.zeros((2, 3, 8, 8), dtype=np.float32))


def test_wrong_ndim_is_refused(backend: OnnxRuntimeBackend) -> None:
    with pytest.raises(InputError, match=r"4-d input.*got 3-d"):
        backend.run("tiny_a", 0, np.zeros((1, 8, 8), dtype=np.float32))


def test_empty_batch_is_refused(backend: OnnxRuntimeBackend) -> None:
    with pytest.raises(InputError, match="empty batch"):
        backend.run("tiny_a", 0, np.zeros((0, 1, 8, 8), dtype=np.float32))


def test_non_array_input_is_refused(backend: OnnxRuntimeBackend) -> None:
    with pytest.raises(InputError, match="numpy array, got list"):
        backend.run("tiny_a", 0, [[0.0]])  # type: ignore[arg-type]


def test_unknown_model_names_the_loaded_ones(backend: OnnxRuntimeBackend) -> None:
    with pytest.raises(InputError, match=r"'resnet50' is not loaded \(loaded: tiny_a, tiny_b\)"):
        backend.run("resnet50", 0, np.zeros((1, 1, 8, 8), dtype=np.float32))


@pytest.mark.parametrize("exit", [-1, 3, "final", 1.0, True])
def test_bad_exit_lists_the_valid_exits(backend: OnnxRuntimeBackend, exit: object) -> None:
    with pytest.raises(InputError, match=r"layer1.*layer2.*final"):
        backend.run("tiny_a", exit, np.zeros((1, 1, 8, 8), dtype=np.float32))  # type: ignore[arg-type]


def test_closed_backend_has_no_models(tiny_repository: TinyRepository, backend: OnnxRuntimeBackend) -> None:
    backend.close()
    assert backend.models == []
    with pytest.raises(InputError, match="not loaded"):
        backend.run("tiny_a", 0, np.zeros((1, 1, 8, 8), dtype=np.float32))


def test_load_refuses_a_truncated_stage_file(tiny_repository: TinyRepository) -> None:
    manifest = tiny_repository.models["tiny_a"].manifest
    path = tiny_repository.root / "tiny_a" / manifest.stages[2].path
    path.write_bytes(path.read_bytes()[:-5])
    backend = OnnxRuntimeBackend(tiny_repository.repository, threads=1)
    with pytest.raises(RepositoryError, match="truncated") as err:
        backend.load(manifest)
    assert str(path) in str(err.value) and "edgeserve export" in str(err.value)


def test_graph_whose_outputs_differ_from_the_manifest_is_refused(tiny_repository: TinyRepository) -> None:
    manifest = tiny_repository.models["tiny_a"].manifest
    stage = replace(
        manifest.stages[0],
        outputs=(TensorSpec("feat", (4, 8, 8)), manifest.stages[0].outputs[1]),
        passes=("feat",),
    )
    wrong = replace(manifest, stages=(stage, *manifest.stages[1:]))
    backend = OnnxRuntimeBackend(tiny_repository.repository, threads=1)
    with pytest.raises(
        RepositoryError, match=r"outputs are \['features', 'logits'\].*\['feat', 'logits'\]"
    ) as err:
        backend.load(wrong)
    assert "stage0.onnx" in str(err.value) and "edgeserve export" in str(err.value)


def test_graph_whose_shape_differs_from_the_manifest_is_refused(tiny_repository: TinyRepository) -> None:
    manifest = tiny_repository.models["tiny_a"].manifest
    stage = replace(manifest.stages[2], outputs=(TensorSpec("logits", (6,)),))
    wrong = replace(manifest, stages=(*manifest.stages[:2], stage))
    backend = OnnxRuntimeBackend(tiny_repository.repository, threads=1)
    with pytest.raises(RepositoryError, match="per-sample shape") as err:
        backend.load(wrong)
    assert "stage2.onnx" in str(err.value)


def test_missing_provider_says_what_is_installed_and_what_to_install(tiny_repository: TinyRepository) -> None:
    if CUDA in ort.get_available_providers():
        pytest.skip("this onnxruntime has CUDA")
    with pytest.raises(BackendUnavailableError) as err:
        OnnxRuntimeBackend(tiny_repository.repository, providers=["cuda"])
    message = str(err.value)
    assert CUDA in message and "CPUExecutionProvider" in message and "onnxruntime-gpu" in message


def test_unknown_provider_name_lists_the_aliases() -> None:
    with pytest.raises(BackendUnavailableError, match="'cpu', 'cuda'"):
        resolve_providers(["tpu"], available=[CPU])


def test_providers_default_to_cuda_where_installed_and_always_keep_the_cpu_fallback() -> None:
    assert resolve_providers(None, available=[CPU]) == (CPU,)
    assert resolve_providers(None, available=[TENSORRT, CUDA, CPU]) == (CUDA, CPU)
    assert resolve_providers(["trt", "cuda"], available=[TENSORRT, CUDA, CPU]) == (TENSORRT, CUDA, CPU)
    assert resolve_providers(["cpu"], available=[CUDA, CPU]) == (CPU,)


def test_fingerprint_names_backend_device_threads_and_versions(tiny_repository: TinyRepository) -> None:
    fp = OnnxRuntimeBackend(tiny_repository.repository, threads=1, providers=["cpu"]).fingerprint()
    assert fp.backend == "onnxruntime" and fp.threads == 1 and fp.providers == (CPU,)
    assert fp.versions == {"onnxruntime": ort.__version__}
    assert fp.device and fp.device != "cuda:0"
    other = OnnxRuntimeBackend(tiny_repository.repository, threads=2, providers=["cpu"]).fingerprint()
    assert other.key() != fp.key()
    json.dumps(fp.to_dict())  # profiles store it as JSON


def test_default_threads_leave_one_core_to_the_event_loop(tiny_repository: TinyRepository) -> None:
    assert default_threads() == max(1, (os.cpu_count() or 1) - 1)
    assert OnnxRuntimeBackend(tiny_repository.repository).threads == default_threads()
    with pytest.raises(ValueError, match="threads"):
        OnnxRuntimeBackend(tiny_repository.repository, threads=0)


def test_factory_builds_the_onnxruntime_backend_and_refuses_unknown_names(
    tiny_repository: TinyRepository,
) -> None:
    backend = create_backend("onnxruntime", tiny_repository.repository, threads=1)
    assert isinstance(backend, OnnxRuntimeBackend) and backend.threads == 1
    with pytest.raises(BackendUnavailableError, match="available: onnxruntime"):
        create_backend("tflite", tiny_repository.repository)
