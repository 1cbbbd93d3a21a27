"""The Backend protocol's contract, checked the same way on every implementation.

One suite, parametrized over the backends `create_backend` can build: each case is a backend name
plus a real repository that backend can serve and the models to load from it. ONNX Runtime and
TensorRT run the tiny ONNX graphs (TensorRT after `edgeserve build-engines`); the torch backend
rebuilds the exported module from the manifest's source, so its case exports digits-s for real.
A case whose library is not importable here (TensorRT never is on the CPU box) is skipped, saying why.

Only what every backend guarantees is asserted: the fingerprint names the backend; logits are
float32 (batch, num_classes) at every exit for batches 1 and the largest (DEFAULT_MAX_BATCH: the
largest batch build-engines profiles and the torch backend captures by default); a sample's logits
do not depend on the batch it rides in; bad input and unloaded models are InputErrors (shared
edgeserve.runtime.validation); close() unloads, is idempotent, and a later load serves again.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from runtime_support import export_digits
from tiny_onnx import write_tiny_repository

from edgeserve.errors import BackendUnavailableError, InputError
from edgeserve.fingerprint import Fingerprint
from edgeserve.manifest import Manifest
from edgeserve.repository import ModelRepository
from edgeserve.runtime.backends.base import Backend
from edgeserve.runtime.backends.engine_cache import DEFAULT_MAX_BATCH
from edgeserve.runtime.backends.select import choose_backend, create_backend

MAX_BATCH = DEFAULT_MAX_BATCH
BACKENDS = ("onnxruntime", "torch", "tensorrt")


@dataclass(frozen=True)
class Case:
    """A backend name, a repository it can serve, and the models the contract loads from it."""

    name: str
    repository: ModelRepository
    models: tuple[str, ...]

    def manifest(self, model: str) -> Manifest:
        return self.repository.load_manifest(model)

    def create(self) -> Backend:
        return create_backend(self.name, self.repository, threads=1, warmup=1)

    def inputs(self, model: str, batch: int, seed: int = 0) -> np.ndarray:
        spec = self.manifest(model).input
        x = np.random.default_rng(seed).standard_normal((batch, *spec.shape))
        return x.astype(np.dtype(spec.dtype))


# -- one repository per kind of case, built once per module ----------------------------------------


@pytest.fixture(scope="module")
def tiny_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny_a (3 exits) and tiny_b (2 exits around a stage without a head), as real ONNX stages."""
    root = tmp_path_factory.mktemp("contract-tiny") / "engines"
    write_tiny_repository(root)
    return root


@pytest.fixture(scope="module")
def exported_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """digits-s exported for real, as in test_torch_backend.py: the torch backend needs its source."""
    repository = ModelRepository(tmp_path_factory.mktemp("contract-digits") / "engines")
    export_digits(repository)
    return repository.root


def _onnxruntime_case(request: pytest.FixtureRequest) -> Case:
    pytest.importorskip("onnxruntime", reason="the onnxruntime backend needs onnxruntime")
    root = request.getfixturevalue("tiny_root")
    return Case("onnxruntime", ModelRepository(root), ("tiny_a", "tiny_b"))


def _torch_case(request: pytest.FixtureRequest) -> Case:
    torch = pytest.importorskip(
        "torch", reason="the torch backend needs torch, which is not installed (edgeserve[export])"
    )
    threads = torch.get_num_threads()  # the backend's threads=1 is process-wide: give it back after
    request.addfinalizer(lambda: torch.set_num_threads(threads))
    root = request.getfixturevalue("exported_root")
    return Case("torch", ModelRepository(root), ("digits-s",))


def _tensorrt_case(request: pytest.FixtureRequest) -> Case:
    pytest.importorskip("tensorrt", reason="the tensorrt backend needs TensorRT, which is not installed")
    try:
        choose_backend("tensorrt")  # cuda-python and a visible GPU too
    except BackendUnavailableError as exc:
        pytest.skip(str(exc))
    from edgeserve.cli import main

    root = request.getfixturevalue("tiny_root")
    assert main(["build-engines", "--repository", str(root), "--max-batch", str(MAX_BATCH)]) == 0
    return Case("tensorrt", ModelRepository(root), ("tiny_a", "tiny_b"))


CASES: dict[str, Callable[[pytest.FixtureRequest], Case]] = {
    "onnxruntime": _onnxruntime_case,
    "torch": _torch_case,
    "tensorrt": _tensorrt_case,
}


def test_the_contract_covers_every_backend_the_factory_knows() -> None:
    from edgeserve.config.server import BACKEND_NAMES

    # emulated runs no model and carries another device's fingerprint: test_emulated_backend.py
    assert set(CASES) == set(BACKENDS) == set(BACKEND_NAMES) - {"auto", "emulated"}


@pytest.fixture(params=BACKENDS)
def case(request: pytest.FixtureRequest) -> Case:
    return CASES[request.param](request)


@pytest.fixture
def backend(case: Case) -> Iterator[Backend]:
    """A fresh backend from the factory, nothing loaded yet."""
    backend = case.create()
    yield backend
    backend.close()


@pytest.fixture
def loaded(case: Case, backend: Backend) -> Backend:
    for model in case.models:
        backend.load(case.manifest(model))
    return backend


# -- identity -------------------------------------------------------------------------------------


def test_fingerprint_names_the_backend_and_does_not_change_with_what_is_loaded(
    case: Case, backend: Backend
) -> None:
    before = backend.fingerprint()
    assert isinstance(before, Fingerprint)
    assert backend.name == before.backend == case.name
    assert isinstance(before.device, str) and before.device
    assert case.name in before.versions  # the library's version ("onnxruntime", "torch", "tensorrt")
    assert Fingerprint.from_dict(json.loads(json.dumps(before.to_dict()))) == before  # profiles store it
    for model in case.models:
        backend.load(case.manifest(model))
    assert backend.fingerprint() == before  # so a profile measured on one backend finds it again


# -- inference ------------------------------------------------------------------------------------


@pytest.mark.parametrize("batch", [1, MAX_BATCH])
def test_run_gives_float32_logits_shaped_batch_by_classes_at_every_exit(
    case: Case, loaded: Backend, batch: int
) -> None:
    for model in case.models:
        manifest = case.manifest(model)
        x = case.inputs(model, batch, seed=batch)
        for exit in range(len(manifest.exits)):
            logits = loaded.run(model, exit, x)
            assert isinstance(logits, np.ndarray), (model, exit)
            assert logits.dtype == np.float32, (model, exit)
            assert logits.shape == (batch, manifest.num_classes), (model, exit)
            assert np.isfinite(logits).all(), (model, exit)


def test_a_samples_logits_do_not_depend_on_the_batch_it_rides_in(case: Case, loaded: Backend) -> None:
    for model in case.models:
        x = case.inputs(model, MAX_BATCH, seed=3)
        for exit in range(len(case.manifest(model).exits)):
            together = loaded.run(model, exit, x)
            # loose enough for GPU kernels that differ by batch size (TF32), far below a row mix-up
            atol = 1e-3 * max(1.0, float(np.abs(together).max()))
            for i in (0, MAX_BATCH - 1):
                alone = loaded.run(model, exit, x[i : i + 1])
                np.testing.assert_allclose(alone[0], together[i], rtol=1e-3, atol=atol)


def test_loading_a_loaded_model_again_keeps_it_serving(case: Case, loaded: Backend) -> None:
    model = case.models[0]
    x = case.inputs(model, 2)
    first = loaded.run(model, 0, x)
    loaded.load(case.manifest(model))
    np.testing.assert_allclose(loaded.run(model, 0, x), first, rtol=1e-4, atol=1e-5)


# -- refusals -------------------------------------------------------------------------------------


def _wrong_dtype(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float64 if x.dtype != np.float64 else np.float32)


BAD_INPUTS: list[tuple[str, Callable[[np.ndarray], object], str]] = [
    ("dtype", _wrong_dtype, r"input, got float(64|32); convert it"),
    ("sample-shape", lambda x: np.zeros((*x.shape[:-1], x.shape[-1] + 1), x.dtype), "takes samples shaped"),
    ("ndim", lambda x: x[0], r"-d input shaped"),
    ("empty", lambda x: x[:0], "empty batch"),
    ("not-an-array", lambda x: x.tolist(), "takes a numpy array, got list"),
]


@pytest.mark.parametrize(("make", "message"), [b[1:] for b in BAD_INPUTS], ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_is_an_input_error(
    case: Case, loaded: Backend, make: Callable[[np.ndarray], object], message: str
) -> None:
    model = case.models[0]
    with pytest.raises(InputError, match=message):
        loaded.run(model, 0, make(case.inputs(model, 2)))  # type: ignore[arg-type]


@pytest.mark.parametrize("bad_exit", ["past-the-last", -1, True, "final"])
def test_an_exit_that_is_not_an_index_of_the_model_is_an_input_error(
    case: Case, loaded: Backend, bad_exit: object
) -> None:
    model = case.models[0]
    manifest = case.manifest(model)
    exit = len(manifest.exits) if bad_exit == "past-the-last" else bad_exit
    with pytest.raises(InputError, match=re.escape(str(manifest.exit_names))):  # lists the valid exits
        loaded.run(model, exit, case.inputs(model, 1))  # type: ignore[arg-type]


def test_an_unknown_model_is_not_loaded_and_the_error_names_the_loaded_ones(
    case: Case, loaded: Backend
) -> None:
    x = case.inputs(case.models[0], 1)
    loaded_names = ", ".join(case.models)
    with pytest.raises(InputError, match=rf"'no-such-model' is not loaded \(loaded: {loaded_names}\)"):
        loaded.run("no-such-model", 0, x)


def test_a_model_never_loaded_is_not_loaded(case: Case, backend: Backend) -> None:
    model = case.models[0]
    with pytest.raises(InputError, match=rf"'{model}' is not loaded \(loaded: none\)"):
        backend.run(model, 0, case.inputs(model, 1))


# -- lifecycle ------------------------------------------------------------------------------------


def test_close_unloads_is_idempotent_and_a_later_load_serves_again(case: Case, loaded: Backend) -> None:
    model = case.models[0]
    x = case.inputs(model, 2)
    before = loaded.run(model, 0, x)
    loaded.close()
    with pytest.raises(InputError, match="not loaded"):
        loaded.run(model, 0, x)
    loaded.close()  # a second close is a no-op
    loaded.load(case.manifest(model))
    np.testing.assert_allclose(loaded.run(model, 0, x), before, rtol=1e-4, atol=1e-5)


def test_close_before_any_load_is_harmless(case: Case) -> None:
    backend = case.create()
    backend.close()
    backend.close()
