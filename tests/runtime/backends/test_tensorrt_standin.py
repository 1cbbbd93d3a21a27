"""The TensorRT backend end to end on the CPU, against stand-in `tensorrt` and `cuda-python` modules.

The stand-ins (tests/standins) are written from tensorrt-stubs 10.13 and cuda-python's runtime API;
they do not replace running on real TensorRT and a GPU. What they do catch: a misspelt call, a wrong
keyword, an ignored failure return, a pointer outside its buffer, a result read before the stream
was synchronized, work captured into a CUDA graph that never replays. Engines are built with the
project's own `edgeserve build-engines` code, loaded by TensorRTBackend and run at two batch sizes;
every output is compared with ONNX Runtime on the same graphs. Both cuda-python layouts are run.

The stand-ins are on sys.path only inside the `standins` fixture: elsewhere `tensorrt` must stay
unimportable, or `--backend auto` would pick TensorRT in every other test.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from importer_support import skip_graph
from tiny_onnx import TinyRepository

from edgeserve.errors import InputError, RepositoryError
from edgeserve.files import sha256_file
from edgeserve.importer.core import import_model
from edgeserve.onnx_graph import sample_batch
from edgeserve.repository import ModelRepository
from edgeserve.runtime.backends.cuda_runtime import import_cudart
from edgeserve.runtime.backends.engine_cache import EngineRecord, engine_path, record_path
from edgeserve.runtime.backends.onnxruntime import OnnxRuntimeBackend
from edgeserve.runtime.backends.tensorrt import TensorRTBackend
from edgeserve.tools.build_engines import add_parser

STANDINS = Path(__file__).resolve().parents[2] / "standins"
MAX_BATCH = 3
BATCHES = (1, MAX_BATCH)
LAYOUTS = ("cuda.bindings.runtime", "cuda.cudart")


def _forget_standins() -> None:
    for name in list(sys.modules):
        if name in ("tensorrt", "cuda", "_standin_gpu") or name.startswith(("tensorrt.", "cuda.")):
            del sys.modules[name]


@pytest.fixture(params=LAYOUTS)
def standins(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The stand-in tensorrt module, with cuda-python's 13.x layout or (cuda.bindings hidden) 12.x's."""
    monkeypatch.syspath_prepend(str(STANDINS))
    _forget_standins()
    if request.param == "cuda.cudart":
        sys.modules["cuda.bindings"] = None  # type: ignore[assignment]  # import raises ImportError
    trt = importlib.import_module("tensorrt")
    assert import_cudart().__name__ == request.param
    try:
        yield trt
    finally:
        sys.modules["_standin_gpu"].reset()
        monkeypatch.undo()  # the stand-ins' folder leaves sys.path
        _forget_standins()
    assert importlib.util.find_spec("tensorrt") is None, "the stand-ins must not outlive the test"


def build_engines(root: Path, *argv: str) -> int:
    """`edgeserve build-engines --repository ROOT --max-batch 3 ARGV`, in process."""
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(
        ["build-engines", "--repository", str(root), "--max-batch", str(MAX_BATCH), *argv]
    )
    return int(args.func(args))


def reference(repository: ModelRepository) -> OnnxRuntimeBackend:
    return OnnxRuntimeBackend(repository, threads=1, warmup=0)


def assert_same_outputs(
    backend: TensorRTBackend, expected: OnnxRuntimeBackend, repository: ModelRepository, model: str
) -> None:
    manifest = repository.load_manifest(model)
    for exit in range(len(manifest.exits)):
        for batch in BATCHES:
            feeds = sample_batch(manifest, batch)
            got = backend.run_outputs(model, exit, feeds)
            want = expected.run_outputs(model, exit, feeds)
            assert sorted(got) == sorted(want)
            for name, value in want.items():
                assert got[name].shape == value.shape, (model, exit, batch, name)
                assert got[name].dtype == value.dtype, (model, exit, batch, name)
                np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cuda_graphs", [True, False], ids=["graphs", "no-graphs"])
def test_exported_chains_build_load_and_match_onnxruntime(
    standins: ModuleType,
    tiny_repository: TinyRepository,
    cuda_graphs: bool,
    capsys: pytest.CaptureFixture[str],
) -> None:
    root, repository = tiny_repository.root, tiny_repository.repository
    assert build_engines(root) == 0
    assert "6 to build" in capsys.readouterr().out
    expected = reference(repository)
    backend = TensorRTBackend(repository, warmup=1, cuda_graphs=cuda_graphs)
    try:
        for name, tiny in tiny_repository.models.items():
            expected.load(tiny.manifest)
            backend.load(tiny.manifest)
            assert_same_outputs(backend, expected, repository, name)
            x = tiny.random_input(2, seed=3)
            for exit in range(len(tiny.manifest.exits)):
                np.testing.assert_allclose(
                    backend.run(name, exit, x), tiny.forward(x, exit), rtol=1e-4, atol=1e-5
                )
        loaded = backend._models["tiny_a"]
        graphs = getattr(loaded, "graphs", {})
        assert len(graphs) == (3 * MAX_BATCH if cuda_graphs else 0)
        with pytest.raises(InputError, match="exceeds the engines' largest batch 3"):
            backend.run("tiny_a", 0, tiny_repository.models["tiny_a"].random_input(MAX_BATCH + 1))
        assert sorted(backend.models) == ["tiny_a", "tiny_b"]
        fingerprint = backend.fingerprint()
        assert fingerprint.versions == {"tensorrt": standins.__version__}
        assert fingerprint.device == "Stand-in GPU (not a GPU)"
        backend.load(tiny_repository.models["tiny_a"].manifest)  # a reload frees the old engines first
        assert_same_outputs(backend, expected, repository, "tiny_a")
    finally:
        backend.close()
        expected.close()
    assert sys.modules["_standin_gpu"].live_allocations() == 0, "close() must free every buffer"


def test_a_second_build_skips_current_engines(
    standins: ModuleType, tiny_repository: TinyRepository, capsys: pytest.CaptureFixture[str]
) -> None:
    assert build_engines(tiny_repository.root, "--model", "tiny_a") == 0
    capsys.readouterr()
    assert build_engines(tiny_repository.root, "--model", "tiny_a") == 0
    assert "all engines are current" in capsys.readouterr().out
    assert build_engines(tiny_repository.root, "--model", "tiny_a", "--dry-run") == 0
    assert "3 current" in capsys.readouterr().out
    assert build_engines(tiny_repository.root, "--model", "tiny_a", "--force") == 0
    (cache,) = tiny_repository.root.glob("trt-timing-cache/*.cache")
    assert cache.read_bytes().count(b'"layer') == 6, "a rebuild starts from the saved timing cache"


def test_precision_sets_the_builder_flags(standins: ModuleType, tiny_repository: TinyRepository) -> None:
    """fp16 sets BuilderFlag.FP16; fp32 clears TF32, which TensorRT sets by default."""
    assert build_engines(tiny_repository.root, "--model", "tiny_a", "--precision", "fp16") == 0
    assert build_engines(tiny_repository.root, "--model", "tiny_a", "--precision", "fp32") == 0
    fp16 = next(tiny_repository.root.glob("tiny_a/trt/*fp16/stage0.engine")).read_bytes()
    fp32 = next(tiny_repository.root.glob("tiny_a/trt/*fp32/stage0.engine")).read_bytes()
    assert b'"FP16"' in fp16
    assert b'"flags": []' in fp32, "an fp32 engine must not run TF32 kernels"


def imported_repository(tmp_path: Path) -> ModelRepository:
    """`edgeserve import` of a graph whose second stage takes two tensors of the first (a skip)."""
    repository = ModelRepository(tmp_path / "repo")
    import_model(skip_graph(tmp_path / "skip.onnx"), "skip", repository, split_at=["c"])
    return repository


def test_imported_model_builds_loads_and_matches_onnxruntime(
    standins: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repository = imported_repository(tmp_path)
    assert build_engines(repository.root) == 0
    assert "one profile, batch min 1 opt 3 max 3" in capsys.readouterr().out
    manifest = repository.load_manifest("skip")
    expected = reference(repository)
    expected.load(manifest)
    backend = TensorRTBackend(repository, warmup=1)
    try:
        backend.load(manifest)
        assert_same_outputs(backend, expected, repository, "skip")
        assert_same_outputs(backend, expected, repository, "skip")  # shapes set again per batch
        feeds = sample_batch(manifest, 2)
        np.testing.assert_allclose(backend.run("skip", 0, feeds), expected.run("skip", 0, feeds), rtol=1e-5)
        with pytest.raises(InputError, match="exceeds the engines' largest batch 3"):
            backend.run_outputs("skip", 0, sample_batch(manifest, MAX_BATCH + 1))
    finally:
        backend.close()
        expected.close()
    assert sys.modules["_standin_gpu"].live_allocations() == 0


def test_a_context_tensorrt_cannot_create_fails_the_load_and_frees_its_buffers(
    standins: ModuleType, tiny_repository: TinyRepository
) -> None:
    assert build_engines(tiny_repository.root, "--model", "tiny_a") == 0
    backend = TensorRTBackend(tiny_repository.repository, warmup=1)
    standins.KNOBS.fail_create_execution_context = True
    with pytest.raises(RuntimeError, match="create_execution_context"):
        backend.load(tiny_repository.models["tiny_a"].manifest)
    backend.close()
    assert sys.modules["_standin_gpu"].live_allocations() == 0


def test_an_imported_model_whose_context_tensorrt_cannot_create_fails_the_load(
    standins: ModuleType, tmp_path: Path
) -> None:
    repository = imported_repository(tmp_path)
    assert build_engines(repository.root) == 0
    backend = TensorRTBackend(repository, warmup=1)
    standins.KNOBS.fail_create_execution_context = True
    with pytest.raises(RuntimeError, match="create_execution_context"):
        backend.load(repository.load_manifest("skip"))
    backend.close()
    assert sys.modules["_standin_gpu"].live_allocations() == 0


def test_work_tensorrt_cannot_capture_runs_without_a_graph(
    standins: ModuleType, tiny_repository: TinyRepository
) -> None:
    assert build_engines(tiny_repository.root, "--model", "tiny_a") == 0
    repository = tiny_repository.repository
    standins.KNOBS.fail_capture = True
    expected = reference(repository)
    expected.load(tiny_repository.models["tiny_a"].manifest)
    backend = TensorRTBackend(repository, warmup=1, cuda_graphs=True)
    try:
        backend.load(tiny_repository.models["tiny_a"].manifest)
        assert not backend._models["tiny_a"].graphs  # type: ignore[union-attr]
        assert_same_outputs(backend, expected, repository, "tiny_a")
    finally:
        backend.close()
        expected.close()


def test_standin_refuses_what_tensorrt_refuses(standins: ModuleType) -> None:
    """The stand-in's own contract, from the stubs: failure values where TensorRT returns them."""
    trt = standins
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    config = builder.create_builder_config()
    bad = builder.create_optimization_profile()
    bad.set_shape("x", (4, 1), (2, 1), (1, 1))  # min > max
    assert config.add_optimization_profile(bad) == -1
    assert trt.Runtime(logger).deserialize_cuda_engine(b"not an engine") is None
    assert config.set_timing_cache(config.create_timing_cache(b""), ignore_mismatch=False) is True
    with pytest.raises(TypeError):
        config.set_flag("FP16")
    assert trt.BuilderFlag.TF32 in config.flags  # TensorRT's default: fp32 builds must clear it
    assert int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED) == 1


def test_an_engine_tensorrt_cannot_deserialize_is_refused_naming_the_file(
    standins: ModuleType, tiny_repository: TinyRepository
) -> None:
    """Bytes that match their record but are no engine (written by another tool): RepositoryError."""
    assert build_engines(tiny_repository.root, "--model", "tiny_a") == 0
    repository = tiny_repository.repository
    manifest = tiny_repository.models["tiny_a"].manifest
    backend = TensorRTBackend(repository, warmup=1)
    path = engine_path(repository, "tiny_a", backend.target, 1)
    path.write_bytes(b"not a TensorRT engine")
    record = EngineRecord.load(record_path(repository, "tiny_a", backend.target, 1))
    replace(record, engine_sha256=sha256_file(path), engine_bytes=path.stat().st_size).save(
        record_path(repository, "tiny_a", backend.target, 1)
    )
    with pytest.raises(RepositoryError, match="cannot deserialize"):
        backend.load(manifest)
    backend.close()
    assert sys.modules["_standin_gpu"].live_allocations() == 0


def test_a_stage_the_onnx_parser_refuses_fails_the_build_naming_it(
    standins: ModuleType, tiny_repository: TinyRepository
) -> None:
    repository = tiny_repository.repository
    manifest = repository.load_manifest("tiny_a")
    stage = repository.stage_path(manifest, 1)
    stage.write_bytes(b"not an ONNX model")  # checksummed in the manifest: only the parser can object
    stages = list(manifest.stages)
    stages[1] = replace(stages[1], sha256=sha256_file(stage), size_bytes=stage.stat().st_size)
    repository.save_manifest(replace(manifest, stages=tuple(stages)))
    with pytest.raises(RepositoryError, match=r"stage1\.onnx: TensorRT's ONNX parser refused this stage"):
        build_engines(tiny_repository.root, "--model", "tiny_a")


def test_an_engine_tensorrt_cannot_build_fails_with_the_stage(
    standins: ModuleType, tiny_repository: TinyRepository
) -> None:
    standins.KNOBS.fail_build = True
    with pytest.raises(RepositoryError, match="could not build an engine for stage 0 of 'tiny_a'"):
        build_engines(tiny_repository.root, "--model", "tiny_a")
