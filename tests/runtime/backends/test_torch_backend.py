"""The torch backend on the CPU: same logits as ONNX Runtime at every exit, and refusals that say the fix.

digits-s is exported for real into a temporary repository (once per module): the torch backend
rebuilds the module from the manifest's recorded spec and must match the exported graphs.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import pytest
from runtime_support import export_digits

from edgeserve.errors import BackendUnavailableError, InputError, RepositoryError
from edgeserve.manifest import Manifest
from edgeserve.repository import ModelRepository
from edgeserve.runtime.backends.onnxruntime import OnnxRuntimeBackend
from edgeserve.runtime.backends.torch import TorchBackend, model_request_from_source

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def digits_repository(tmp_path_factory: pytest.TempPathFactory) -> ModelRepository:
    repository = ModelRepository(tmp_path_factory.mktemp("engines"))
    export_digits(repository)
    return repository


@pytest.fixture
def torch_backend(digits_repository: ModelRepository) -> Iterator[TorchBackend]:
    backend = TorchBackend(digits_repository, device="cpu", threads=1)
    backend.load(digits_repository.load_manifest("digits-s"))
    yield backend
    backend.close()


def test_torch_on_the_cpu_matches_onnxruntime_at_every_exit(
    digits_repository: ModelRepository, torch_backend: TorchBackend
) -> None:
    manifest = digits_repository.load_manifest("digits-s")
    ort_backend = OnnxRuntimeBackend(digits_repository, threads=1, providers=["cpu"], warmup=0)
    ort_backend.load(manifest)
    rng = np.random.default_rng(0)
    for batch in (1, 5):
        x = rng.random((batch, *manifest.input.shape), dtype=np.float32)
        for exit in range(len(manifest.exits)):
            expected = ort_backend.run("digits-s", exit, x)
            got = torch_backend.run("digits-s", exit, x)
            assert got.shape == (batch, manifest.num_classes) and got.dtype == np.float32
            assert np.max(np.abs(got - expected)) <= 1e-4, (batch, manifest.exits[exit].name)
    ort_backend.close()


def test_bad_input_gets_the_same_error_as_onnxruntime(torch_backend: TorchBackend) -> None:
    with pytest.raises(InputError, match=r"takes float32 input, got float64"):
        torch_backend.run("digits-s", 0, np.zeros((1, 1, 16, 16)))
    with pytest.raises(InputError, match=r"has exits 0\.\.3"):
        torch_backend.run("digits-s", 7, np.zeros((1, 1, 16, 16), np.float32))
    with pytest.raises(InputError, match="not loaded"):
        torch_backend.run("digits-m", 0, np.zeros((1, 1, 16, 16), np.float32))


def test_weights_that_differ_from_the_export_are_refused_with_the_reexport_fix(
    digits_repository: ModelRepository,
) -> None:
    manifest = digits_repository.load_manifest("digits-s")
    changed = replace(manifest, source={**manifest.source, "weights_sha256": "0" * 64})
    backend = TorchBackend(digits_repository, device="cpu", threads=1)
    with pytest.raises(RepositoryError, match=r"not the exported ones.*re-export it with `edgeserve export`"):
        backend.load(changed)


def test_manifest_without_a_model_spec_cannot_be_rebuilt(digits_repository: ModelRepository) -> None:
    manifest = digits_repository.load_manifest("digits-s")
    bare = replace(manifest, source={"weights_sha256": manifest.source["weights_sha256"]})
    with pytest.raises(RepositoryError, match="neither `model` nor `model_factory`"):
        TorchBackend(digits_repository, device="cpu").load(bare)


def test_resnet_and_factory_specs_become_the_export_request(digits_repository: ModelRepository) -> None:
    manifest: Manifest = digits_repository.load_manifest("digits-s")
    resnet = replace(
        manifest,
        name="resnet50-cifar-w0.25-s3",
        source={
            "model": "resnet50",
            "stem": "cifar",
            "width": "0.25",
            "num_classes": "100",
            "weights": "random init, seed 3 (no pretrained weights offline)",
        },
    )
    request = model_request_from_source(resnet)
    assert (request.model, request.stem, request.width, request.num_classes, request.seed) == (
        "resnet50",
        "cifar",
        0.25,
        100,
        3,
    )
    factory = replace(manifest, source={"model_factory": "mymodels:build"})
    assert model_request_from_source(factory).module == "mymodels:build"


def test_fingerprint_names_torch_the_cpu_and_the_threads(torch_backend: TorchBackend) -> None:
    fp = torch_backend.fingerprint()
    assert (fp.backend, fp.threads, fp.versions) == ("torch", 1, {"torch": torch.__version__})
    assert "cuda_graphs" not in fp.extra


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_asking_for_cuda_without_a_gpu_says_what_to_do(digits_repository: ModelRepository) -> None:
    with pytest.raises(BackendUnavailableError, match="sees no CUDA GPU; use --device cpu"):
        TorchBackend(digits_repository, device="cuda")


def test_edgeserve_profile_measures_the_torch_backend_like_any_other(
    digits_repository: ModelRepository, capsys: pytest.CaptureFixture[str]
) -> None:
    from edgeserve.fingerprint import Fingerprint
    from edgeserve.profiler.cli import main

    argv = ["--repository", str(digits_repository.root), "--backend", "torch", "--device", "cpu"]
    argv += ["--threads", "1", "--max-batch", "2", "--repeats", "3", "--warmup", "1"]
    assert main(argv) == 0
    manifest = digits_repository.load_manifest("digits-s")
    backend = TorchBackend(digits_repository, device="cpu", threads=1)
    fingerprint: Fingerprint = backend.fingerprint()
    table = digits_repository.load_profile(manifest, fingerprint)
    assert table.fingerprint.backend == "torch"
    assert table.matrix("p95").shape == (len(manifest.exits), 2)
    assert "digits-s" in capsys.readouterr().out
