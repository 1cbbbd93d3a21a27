"""Per-stage ONNX export: graphs, verification, manifest, atomic install, weights stored once."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch import nn

from edgeserve.errors import RepositoryError
from edgeserve.export import onnx_export
from edgeserve.export.digits import load_digits_model
from edgeserve.export.early_exit import forward_exit
from edgeserve.export.errors import ExportError
from edgeserve.export.onnx_export import current_export, export_model, export_monolithic_exits
from edgeserve.export.resnet import early_exit_resnet
from edgeserve.export.state_npz import state_sha256
from edgeserve.files import sha256_file
from edgeserve.repository import ModelRepository

BATCHES = (1, 3, 10)


def _sessions(repository: ModelRepository, name: str) -> list[ort.InferenceSession]:
    manifest = repository.load_manifest(name)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return [
        ort.InferenceSession(
            str(repository.stage_path(manifest, s.index)), options, providers=["CPUExecutionProvider"]
        )
        for s in manifest.stages
    ]


def _chain(sessions: list[ort.InferenceSession], x: np.ndarray) -> list[np.ndarray]:
    logits = []
    for session in sessions:
        outputs = dict(zip([o.name for o in session.get_outputs()], session.run(None, {"x": x}), strict=True))
        logits.append(outputs["logits"])
        x = outputs.get("features", x)
    return logits


@pytest.fixture(scope="module")
def digits_export(tmp_path_factory):
    repository = ModelRepository(tmp_path_factory.mktemp("repo"))
    model = load_digits_model("digits-s")
    manifest = export_model(
        model, "digits-s", repository, accuracy=[0.1, 0.2, 0.3, 0.9], accuracy_dataset="test-set"
    )
    return model, repository, manifest


@pytest.mark.slow
def test_every_exit_and_batch_size_matches_torch_within_1e_4(digits_export) -> None:
    model, repository, _ = digits_export
    sessions = _sessions(repository, "digits-s")
    rng = np.random.default_rng(7)
    for batch in BATCHES:
        x = rng.uniform(0, 1, (batch, 1, 16, 16)).astype(np.float32)
        logits = _chain(sessions, x)
        for exit_index in range(4):
            with torch.no_grad():
                expected = forward_exit(model, torch.from_numpy(x), exit_index).numpy()
            assert logits[exit_index].shape == (batch, 10)
            np.testing.assert_allclose(logits[exit_index], expected, atol=1e-4, rtol=0)


@pytest.mark.slow
def test_chained_stages_equal_the_plain_torch_forward(digits_export) -> None:
    model, repository, _ = digits_export
    x = np.random.default_rng(8).uniform(0, 1, (4, 1, 16, 16)).astype(np.float32)
    with torch.no_grad():
        expected = model(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(_chain(_sessions(repository, "digits-s"), x)[-1], expected, atol=1e-4, rtol=0)


@pytest.mark.slow
def test_stage_graphs_pass_the_checker_keep_weights_inside_and_name_the_batch_dim(digits_export) -> None:
    _, repository, manifest = digits_export
    onnx_dir = repository.model_dir("digits-s") / "onnx"
    assert sorted(p.name for p in onnx_dir.iterdir()) == [f"stage{k}.onnx" for k in range(4)]
    assert not list(repository.model_dir("digits-s").glob(".export-*")), "staging folder left behind"
    for stage in manifest.stages:
        path = repository.stage_path(manifest, stage.index)
        onnx.checker.check_model(str(path), full_check=True)
        proto = onnx.load(str(path))
        assert [i.name for i in proto.graph.input] == ["x"]
        expected_outputs = ["logits"] if stage.index == 3 else ["features", "logits"]
        assert [o.name for o in proto.graph.output] == expected_outputs
        for value in [*proto.graph.input, *proto.graph.output]:
            assert value.type.tensor_type.shape.dim[0].dim_param == "batch"
        assert all(t.data_location != onnx.TensorProto.EXTERNAL for t in proto.graph.initializer)
        assert "BatchNormalization" not in {n.op_type for n in proto.graph.node}, (
            "BN must be in inference form"
        )


@pytest.mark.slow
def test_manifest_records_shapes_checksums_accuracy_and_provenance(digits_export) -> None:
    model, repository, manifest = digits_export
    loaded = repository.load_manifest("digits-s")  # verifies sizes and checksums
    assert loaded == manifest
    assert manifest.input.shape == (1, 16, 16) and manifest.num_classes == 10
    assert [s.input.shape for s in manifest.stages] == [(1, 16, 16), (8, 16, 16), (16, 16, 16), (16, 16, 16)]
    assert [e.accuracy for e in manifest.exits] == [0.1, 0.2, 0.3, 0.9]
    assert manifest.accuracy_dataset == "test-set"
    for stage in manifest.stages:
        assert stage.sha256 == sha256_file(repository.stage_path(manifest, stage.index))
    source = manifest.source
    assert (
        source["opset"] == "18"
        and source["torch"] == torch.__version__
        and source["onnx"] == onnx.__version__
    )
    assert source["weights_sha256"] == state_sha256(model)
    assert "max |onnxruntime - torch|" in source["verified"]
    json.loads(repository.manifest_path("digits-s").read_text())


@pytest.mark.slow
def test_current_export_is_reused_until_weights_or_graphs_change(digits_export) -> None:
    model, repository, _ = digits_export
    expected = {"weights_sha256": state_sha256(model), "opset": "18"}
    manifest, reason = current_export(repository, "digits-s", expected)
    assert manifest is not None and "up to date" in reason
    manifest, reason = current_export(repository, "digits-s", {**expected, "weights_sha256": "0" * 64})
    assert manifest is None and "weights_sha256 changed" in reason
    manifest, reason = current_export(repository, "other", expected)
    assert manifest is None and reason == "not exported yet"


class _Chain(nn.Module):
    """A tiny model under the contract: quick to export, for the install and rollback behaviour."""

    def __init__(self, stages: int = 2) -> None:
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            self.stages = nn.ModuleList([nn.Sequential(nn.Linear(5, 5), nn.ReLU()) for _ in range(stages)])
            self.heads = nn.ModuleList([nn.Linear(5, 3) for _ in range(stages)])
        self.exit_names = [f"exit{k}" for k in range(stages)]
        self.input_shape = (5,)
        self.num_classes = 3


class _DiffersWhenExported(nn.Module):
    """Computes something else while being exported, so the graph and torch disagree."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1.0 if torch.onnx.is_in_onnx_export() else x


def test_a_truncated_stage_makes_the_export_stale_and_reexport_repairs_it(tmp_path) -> None:
    repository = ModelRepository(tmp_path)
    model = _Chain()
    first = export_model(model, "two", repository, verify_batches=(2,), log=None)
    stage = repository.stage_path(first, 1)
    stage.write_bytes(stage.read_bytes()[:100])
    with pytest.raises(RepositoryError, match="truncated or replaced"):
        repository.load_manifest("two")
    manifest, reason = current_export(repository, "two", {})
    assert manifest is None and "unusable" in reason
    export_model(model, "two", repository, verify_batches=(2,), log=None)
    assert repository.load_manifest("two").stages[1].size_bytes == first.stages[1].size_bytes


def test_verification_failure_writes_nothing_and_keeps_the_previous_export(tmp_path) -> None:
    repository = ModelRepository(tmp_path)
    model = _Chain()
    export_model(model, "two", repository, verify_batches=(1,), log=None)
    before = repository.manifest_path("two").read_bytes()
    model.stages[1].append(_DiffersWhenExported())
    with pytest.raises(ExportError, match=r"differs from torch by .* exit 'exit1'.* nothing was written"):
        export_model(model, "two", repository, verify_batches=(1,), log=None)
    assert repository.manifest_path("two").read_bytes() == before
    repository.load_manifest("two")  # the previous graphs still verify
    with pytest.raises(ExportError):
        export_model(model, "fresh", repository, verify_batches=(1,), log=None)
    assert not repository.model_dir("fresh").exists()


def test_a_name_that_is_not_one_folder_is_refused(tmp_path) -> None:
    with pytest.raises(ExportError, match="not a valid folder name"):
        export_model(_Chain(), "../outside", ModelRepository(tmp_path / "repo"), log=None)
    assert not (tmp_path / "outside").exists()


def test_reexport_with_fewer_stages_removes_the_stale_graphs(tmp_path) -> None:
    repository = ModelRepository(tmp_path)
    export_model(_Chain(3), "toy", repository, log=None)
    export_model(_Chain(), "toy", repository, log=None)
    assert sorted(p.name for p in (tmp_path / "toy" / "onnx").iterdir()) == ["stage0.onnx", "stage1.onnx"]
    assert len(repository.load_manifest("toy").stages) == 2


@pytest.mark.slow
def test_stage_export_stores_weights_once_unlike_per_exit_graphs(tmp_path) -> None:
    model = early_exit_resnet("resnet50", width=0.125)
    manifest = export_model(model, "r50", ModelRepository(tmp_path / "repo"), verify_batches=(1, 3), log=None)
    staged = sum(s.size_bytes for s in manifest.stages)
    monolithic = export_monolithic_exits(model, tmp_path / "mono")
    assert list(monolithic) == ["layer1", "layer2", "layer3", "final"]
    # The per-stage files hold each weight once (+ the small early heads): about one final-exit graph.
    assert staged < 1.1 * monolithic["final"]
    # Per-exit graphs repeat every shallow stage in every deeper exit's file.
    assert sum(monolithic.values()) > 1.4 * staged


def test_cli_default_opset_matches_the_exporter() -> None:
    from edgeserve.export import cli

    assert cli.DEFAULT_OPSET == onnx_export.DEFAULT_OPSET


def test_the_serving_backend_runs_an_exported_model_like_torch_at_every_exit(digits_export) -> None:
    from edgeserve.runtime.backends.onnxruntime import OnnxRuntimeBackend

    model, repository, manifest = digits_export
    backend = OnnxRuntimeBackend(repository, threads=1, warmup=1)
    backend.load(manifest)
    x = np.random.default_rng(3).random((4, *manifest.input.shape), dtype=np.float32)
    try:
        for exit_index in range(len(manifest.exits)):
            with torch.no_grad():
                expected = forward_exit(model, torch.from_numpy(x), exit_index).numpy()
            got = backend.run("digits-s", exit_index, x)
            assert got.shape == (4, manifest.num_classes)
            assert np.abs(got - expected).max() <= 1e-4
    finally:
        backend.close()
