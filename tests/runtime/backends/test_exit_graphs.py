"""Exits composed into one ONNX graph each: the chain's numbers, one call, and the chain where not."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from tiny_onnx import IR_VERSION, OPSET, TinyRepository

from edgeserve.config.server import BackendConfig
from edgeserve.files import sha256_file
from edgeserve.manifest import ExitSpec, Manifest, StageSpec, TensorSpec
from edgeserve.repository import ModelRepository
from edgeserve.runtime.backends import onnxruntime as ort_backend
from edgeserve.runtime.backends.exit_graphs import compose_exits, worth_composing
from edgeserve.runtime.backends.onnxruntime import OnnxRuntimeBackend
from edgeserve.runtime.server import default_backend


def _open(repository: ModelRepository, compose: bool | None, *models: str) -> OnnxRuntimeBackend:
    backend = OnnxRuntimeBackend(repository, threads=1, warmup=1, compose=compose)
    for name in models:
        backend.load(repository.load_manifest(name))
    return backend


@pytest.mark.parametrize("model", ["tiny_a", "tiny_b"])
def test_every_multi_stage_exit_runs_as_one_graph_with_the_chains_numbers(
    tiny_repository: TinyRepository, model: str
) -> None:
    tiny = tiny_repository.models[model]
    composed = _open(tiny_repository.repository, None, model)
    chained = _open(tiny_repository.repository, False, model)
    later = tuple(sorted({e.stage for e in tiny.manifest.exits if e.stage > 0}))
    assert composed.composed_stages(model) == later
    assert chained.composed_stages(model) == ()
    for batch in (1, 4):
        x = tiny.random_input(batch, seed=batch)
        for exit in range(len(tiny.manifest.exits)):
            got = composed.run_outputs(model, exit, x)
            assert got.keys() == chained.run_outputs(model, exit, x).keys()
            np.testing.assert_array_equal(got["logits"], chained.run(model, exit, x))
            np.testing.assert_allclose(got["logits"], tiny.forward(x, exit), rtol=1e-4, atol=1e-5)


def test_only_models_within_the_size_limit_are_composed_unless_told(tiny_repository: TinyRepository) -> None:
    manifest = tiny_repository.models["tiny_a"].manifest
    assert worth_composing(manifest)
    assert not worth_composing(manifest, limit_bytes=1000)  # a few KB of stages
    assert worth_composing(manifest, limit_bytes=None)
    one_stage = Manifest(
        name="one", inputs=manifest.inputs, stages=manifest.stages[:1], exits=manifest.exits[:1]
    )
    assert not worth_composing(one_stage)  # nothing to compose: its one exit is one session already


def test_a_model_that_cannot_be_composed_is_served_by_its_chain_with_a_warning(
    tiny_repository: TinyRepository, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def refuse(manifest: Manifest, paths: list[Path]) -> dict[int, bytes]:
        raise ValueError("stage 1 imports opset 18 of 'ai.onnx', an earlier stage 17")

    monkeypatch.setattr(ort_backend, "compose_exits", refuse)
    tiny = tiny_repository.models["tiny_a"]
    with caplog.at_level(logging.WARNING):
        backend = _open(tiny_repository.repository, True, "tiny_a")
    assert backend.composed_stages("tiny_a") == ()
    assert "tiny_a: serving each exit as a chain of stage sessions" in caplog.text
    assert "opset 18" in caplog.text
    x = tiny.random_input(3)
    np.testing.assert_allclose(backend.run("tiny_a", 2, x), tiny.forward(x, 2), rtol=1e-4, atol=1e-5)


def test_stages_importing_different_opsets_are_refused(tiny_repository: TinyRepository) -> None:
    repository = tiny_repository.repository
    manifest = tiny_repository.models["tiny_a"].manifest
    paths = [repository.stage_path(manifest, s.index) for s in manifest.stages]
    proto = onnx.load(str(paths[1]))
    proto.opset_import[0].version = OPSET + 1
    onnx.save(proto, str(paths[1]))
    with pytest.raises(ValueError, match=f"stage 1 imports opset {OPSET + 1}"):
        compose_exits(manifest, paths)


def _stage(path: Path, inputs: list[str], nodes: list[onnx.NodeProto], outputs: list[str]) -> None:
    graph = helper.make_graph(
        nodes,
        path.stem,
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", 4]) for n in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", 4]) for n in outputs],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)
    onnx.save(model, str(path))


def test_stages_wired_by_name_to_model_inputs_and_earlier_stages_compose(tmp_path: Path) -> None:
    """Two model inputs; stage 1 takes stage 0's passed tensor and a model input under names of its
    own (`sources`), as an imported multi-stage model may; stage 0's head is not needed by exit 1."""
    repository = ModelRepository(tmp_path)
    folder = repository.model_dir("wired") / "onnx"
    folder.mkdir(parents=True)
    spec = (4,)
    _stage(
        folder / "stage0.onnx",
        ["x", "y"],
        [
            helper.make_node("Mul", ["x", "y"], ["h"]),
            helper.make_node("Relu", ["h"], ["head0"]),
        ],
        ["h", "head0"],
    )
    _stage(
        folder / "stage1.onnx",
        ["a", "b"],
        [helper.make_node("Sub", ["a", "b"], ["out"])],
        ["out"],
    )

    def stage(
        k: int, inputs: tuple[str, ...], outputs: tuple[str, ...], **more: tuple[str, ...]
    ) -> StageSpec:
        path = folder / f"stage{k}.onnx"
        return StageSpec(
            index=k,
            path=f"onnx/stage{k}.onnx",
            sha256=sha256_file(path),
            size_bytes=path.stat().st_size,
            inputs=tuple(TensorSpec(n, spec) for n in inputs),
            outputs=tuple(TensorSpec(n, spec) for n in outputs),
            **more,
        )

    manifest = Manifest(
        name="wired",
        inputs=(TensorSpec("x", spec), TensorSpec("y", spec)),
        stages=(
            stage(0, ("x", "y"), ("h", "head0"), passes=("h",)),
            stage(1, ("a", "b"), ("out",), sources=("h", "y")),
        ),
        exits=(ExitSpec("early", 0), ExitSpec("final", 1)),
    )
    repository.save_manifest(manifest)
    backend = _open(repository, None, "wired")
    assert backend.composed_stages("wired") == (1,)
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal((3, 4)).astype(np.float32) for n in ("x", "y")}
    out = backend.run_outputs("wired", 1, feeds)
    assert list(out) == ["out"]
    np.testing.assert_allclose(out["out"], feeds["x"] * feeds["y"] - feeds["y"], rtol=1e-6)
    early = backend.run_outputs("wired", 0, feeds)
    np.testing.assert_allclose(early["head0"], np.maximum(feeds["x"] * feeds["y"], 0), rtol=1e-6)


def test_the_servers_backend_takes_compose_exits_from_its_config(tiny_repository: TinyRepository) -> None:
    for setting in (None, True, False):
        backend = default_backend(tiny_repository.repository, BackendConfig(threads=1, compose_exits=setting))
        assert isinstance(backend, OnnxRuntimeBackend) and backend.compose is setting
