"""`edgeserve export` end to end: real subprocesses, real files, caching and errors."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from edgeserve.cli import main

EDGESERVE = Path(sys.executable).with_name("edgeserve")


def _edgeserve(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    command = [str(EDGESERVE)] if EDGESERVE.exists() else [sys.executable, "-m", "edgeserve.cli"]
    return subprocess.run([*command, *args], capture_output=True, text=True, cwd=cwd, timeout=300)


@pytest.mark.slow
def test_export_writes_the_model_then_skips_it_until_forced(tmp_path) -> None:
    repo = tmp_path / "repo"
    first = _edgeserve("export", "--model", "digits-s", "--repository", str(repo), "--verify-batches", "1,3")
    assert first.returncode == 0, first.stderr
    assert "digits-s: exporting (not exported yet)" in first.stdout
    assert "max |onnxruntime - torch|" in first.stdout  # the per-(exit, batch) verification table
    assert any(line.split()[:1] == ["final"] for line in first.stdout.splitlines())
    manifest = json.loads((repo / "digits-s" / "manifest.json").read_text())
    assert [e["name"] for e in manifest["exits"]] == ["stage1", "stage2", "stage3", "final"]
    assert manifest["accuracy_dataset"] == "sklearn-digits-test"
    assert all(0 < e["accuracy"] <= 1 for e in manifest["exits"])
    stage = repo / "digits-s" / "onnx" / "stage3.onnx"
    written = stage.stat().st_mtime_ns

    cached = _edgeserve("export", "--model", "digits-s", "--repository", str(repo))
    assert cached.returncode == 0, cached.stderr
    assert "up to date" in cached.stdout and "skipped" in cached.stdout
    assert stage.stat().st_mtime_ns == written

    forced = _edgeserve(
        "export", "--model", "digits-s", "--repository", str(repo), "--force", "--verify-batches", "2"
    )
    assert forced.returncode == 0, forced.stderr
    assert "wrote" in forced.stdout and stage.stat().st_mtime_ns != written


@pytest.mark.slow
def test_a_user_module_exports_through_the_cli(tmp_path) -> None:
    (tmp_path / "my_models.py").write_text(
        textwrap.dedent(
            """
            import torch
            from torch import nn

            class Tiny(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.stages = nn.ModuleList([nn.Sequential(nn.Linear(4, 8), nn.ReLU()), nn.Linear(8, 8)])
                    self.heads = nn.ModuleList([nn.Linear(8, 3), nn.Linear(8, 3)])
                    self.exit_names = ["first", "last"]
                    self.input_shape = (4,)
                    self.num_classes = 3

            def build():
                torch.manual_seed(0)
                return Tiny()
            """
        )
    )
    result = _edgeserve(
        "export", "--module", "my_models:build", "--name", "tiny", "--repository", "repo", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    manifest = json.loads((tmp_path / "repo" / "tiny" / "manifest.json").read_text())
    assert manifest["source"]["model_factory"] == "my_models:build"
    assert manifest["inputs"][0]["shape"] == [4]


def test_unknown_model_fails_fast_listing_the_known_names(capsys) -> None:
    assert main(["export", "--model", "resnet18", "--repository", "unused"]) == 1
    error = capsys.readouterr().err
    assert error.startswith("edgeserve: error: unknown model 'resnet18'")
    assert "resnet50, resnet101, resnet152, digits-s, digits-m, digits-l" in error


def test_nothing_to_export_says_what_to_give(capsys) -> None:
    assert main(["export"]) == 1
    assert "give --model NAME, --demo or --module" in capsys.readouterr().err


def test_name_with_several_models_is_refused(capsys) -> None:
    assert main(["export", "--demo", "--name", "x"]) == 1
    assert "--name names one model, but 3 are requested" in capsys.readouterr().err


def test_missing_torch_points_at_the_export_extra(capsys, monkeypatch) -> None:
    for package in ("onnx", "onnxscript", "sklearn"):  # loaded first: they probe for torch themselves
        importlib.import_module(package)

    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` fail as on a serving box
    assert main(["export", "--model", "digits-s", "--repository", "unused"]) == 1
    assert "pip install 'edgeserve[export]'" in capsys.readouterr().err


def test_eval_data_out_alone_writes_the_digits_test_split(tmp_path, capsys) -> None:
    path = tmp_path / "digits-test.npz"
    assert main(["export", "--eval-data-out", str(path)]) == 0
    with np.load(path, allow_pickle=False) as data:
        assert data["x"].shape == (360, 1, 16, 16) and data["y"].shape == (360,)
    assert main(["export", "--model", "resnet50", "--eval-data-out", str(path)]) == 1
    assert "digits models only" in capsys.readouterr().err


def test_help_teaches_with_examples_and_building_the_parser_does_not_import_torch() -> None:
    code = (
        "import sys; from edgeserve.cli import build_parser; build_parser(); "
        "assert 'torch' not in sys.modules, 'torch imported'; print('ok')"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
    help_text = _edgeserve("export", "--help").stdout
    assert "examples:" in help_text and "edgeserve export --demo" in help_text
    assert "resnet50, resnet101, resnet152, digits-s, digits-m, digits-l" in help_text
