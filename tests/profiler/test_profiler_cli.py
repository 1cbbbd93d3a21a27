"""`edgeserve-profile` end to end on the tiny repository: table, cache, --force, --plot, --eval, errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from tiny_onnx import TinyRepository, write_eval_file

from edgeserve.profiler.cli import build_parser, main
from edgeserve.runtime.backends.onnxruntime import TENSORRT, OnnxRuntimeBackend

QUICK = ["--max-batch", "2", "--repeats", "3", "--warmup", "1", "--threads", "1", "--providers", "cpu"]


def profile(tiny: TinyRepository, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "edgeserve.profiler", "--repository", str(tiny.root), *QUICK, *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tiny.root.parent,
    )


def test_profile_command_measures_caches_forces_plots_and_evaluates(
    tmp_path: Path, tiny_repository: TinyRepository
) -> None:
    repository = tiny_repository.repository
    fingerprint = OnnxRuntimeBackend(repository, threads=1, providers=["cpu"]).fingerprint()
    paths = {m: repository.profile_path(m, fingerprint) for m in ("tiny_a", "tiny_b")}

    first = profile(tiny_repository, "--plot", str(tmp_path / "plots" / "latency.png"))
    assert first.returncode == 0, first.stderr
    assert "profiling tiny_a" in first.stderr and "profiling tiny_b" in first.stderr
    assert "tiny_a: latency in ms" in first.stdout and "p95 <- scheduler" in first.stdout
    assert f"profile of tiny_a (written): {paths['tiny_a']}" in first.stdout
    assert (tmp_path / "plots" / "latency.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for model in paths:
        table = repository.load_profile(repository.load_manifest(model), fingerprint)
        assert table.max_batch == 2 and table.settings["repeats"] == 3
    mtimes = {m: p.stat().st_mtime_ns for m, p in paths.items()}

    cached = profile(tiny_repository, "--model", "tiny_a")
    assert cached.returncode == 0, cached.stderr
    assert "profiling" not in cached.stderr and "using the stored profile" in cached.stderr
    assert "profile of tiny_a (cached" in cached.stdout and "tiny_b" not in cached.stdout
    assert paths["tiny_a"].stat().st_mtime_ns == mtimes["tiny_a"]

    forced = profile(tiny_repository, "--model", "tiny_b", "--force")
    assert forced.returncode == 0, forced.stderr
    assert "profiling tiny_b" in forced.stderr and "profile of tiny_b (written)" in forced.stdout
    assert paths["tiny_b"].stat().st_mtime_ns != mtimes["tiny_b"]

    write_eval_file(tmp_path / "eval.npz", tiny_repository.models["tiny_a"])
    evaluated = profile(tiny_repository, "--model", "tiny_a", "--eval", str(tmp_path / "eval.npz"), "--json")
    assert evaluated.returncode == 0, evaluated.stderr
    summary = json.loads(evaluated.stdout)
    (entry,) = summary["models"]
    assert entry["cached"] is True and entry["accuracy"]["final"] == 1.0
    assert (
        set(entry["latency_ms"]) == {"layer1", "layer2", "final"} and len(entry["latency_ms"]["final"]) == 2
    )
    manifest = repository.load_manifest("tiny_a")
    assert [e.accuracy for e in manifest.exits] == [entry["accuracy"][n] for n in manifest.exit_names]
    repository.load_profile(manifest, fingerprint)  # accuracies did not invalidate the profile


def test_changed_settings_measure_again(
    tiny_repository: TinyRepository, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--repository", str(tiny_repository.root), "--model", "tiny_a", *QUICK]
    assert main(argv) == 0
    capsys.readouterr()
    assert main([*argv, "--repeats", "4"]) == 0
    err = capsys.readouterr().err
    assert "other settings" in err and "profiling tiny_a" in err


def _error_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("edgeserve-profile: error: "), err
    return err


def test_missing_model_is_one_clear_line(
    tiny_repository: TinyRepository, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _error_line(capsys, ["--repository", str(tiny_repository.root), "--model", "resnet50", *QUICK])
    assert "resnet50" in err and "edgeserve export --model resnet50" in err


def test_empty_repository_is_one_clear_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = _error_line(capsys, ["--repository", str(tmp_path / "none"), *QUICK])
    assert f"{tmp_path / 'none'} does not exist" in err and "edgeserve export --demo --repository" in err
    (tmp_path / "empty").mkdir()
    err = _error_line(capsys, ["--repository", str(tmp_path / "empty"), *QUICK])
    assert "no models" in err and "edgeserve export" in err


def test_corrupt_stage_file_is_one_clear_line(
    tiny_repository: TinyRepository, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tiny_repository.root / "tiny_b" / "onnx" / "stage1.onnx"
    path.write_bytes(path.read_bytes()[:50])
    err = _error_line(capsys, ["--repository", str(tiny_repository.root), *QUICK])
    assert str(path) in err and "edgeserve export --model tiny_b" in err


def test_missing_eval_file_is_one_clear_line(
    tmp_path: Path, tiny_repository: TinyRepository, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--repository", str(tiny_repository.root), *QUICK, "--eval", str(tmp_path / "missing.npz")]
    assert "missing.npz: eval data file not found" in _error_line(capsys, argv)


def test_eval_shape_mismatch_is_one_clear_line_before_measuring(
    tmp_path: Path, tiny_repository: TinyRepository, capsys: pytest.CaptureFixture[str]
) -> None:
    np.savez(tmp_path / "e.npz", x=np.zeros((4, 1, 8, 8), np.float32), y=np.zeros(4, np.int64))
    argv = ["--repository", str(tiny_repository.root), *QUICK, "--eval", str(tmp_path / "e.npz")]
    err = _error_line(capsys, argv)
    assert "model 'tiny_b' takes (3, 16, 16)" in err
    assert not (tiny_repository.root / "tiny_a" / "profiles").exists()


def test_missing_provider_is_one_clear_line(
    tiny_repository: TinyRepository, capsys: pytest.CaptureFixture[str]
) -> None:
    if TENSORRT in ort.get_available_providers():
        pytest.skip("this onnxruntime has TensorRT")
    argv = ["--repository", str(tiny_repository.root), "--model", "tiny_a", "--providers", "tensorrt"]
    err = _error_line(capsys, argv)
    assert "TensorrtExecutionProvider" in err and "installed:" in err


def test_help_teaches_with_examples() -> None:
    text = build_parser().format_help()
    assert "examples:" in text and "edgeserve-profile --model resnet50" in text
    for option in ("--max-batch", "--repeats", "--warmup", "--threads", "--providers", "--quantile"):
        assert option in text
    for option in ("--cv-threshold", "--plot", "--eval", "--force", "--json", "--repository"):
        assert option in text
