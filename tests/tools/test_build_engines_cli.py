"""`edgeserve build-engines`: the dry-run plan on a tiny repository, and clear refusals without TensorRT."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest
from fake_engines import write_engine
from tiny_onnx import TinyRepository

from edgeserve.errors import BackendUnavailableError, EdgeServeError, RepositoryError
from edgeserve.runtime.backends.engine_cache import BuildTarget, PrecisionError
from edgeserve.tools.build_engines import add_parser, parse_target

ORIN = "Orin (nvgpu):8.7:10.3.0"


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="edgeserve")
    add_parser(parser.add_subparsers())
    args = parser.parse_args(["build-engines", *argv])
    return args.func(args)


@pytest.fixture
def no_tensorrt(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make `import tensorrt` fail, as on a box without it, whatever this machine has."""
    monkeypatch.setitem(sys.modules, "tensorrt", None)


def test_dry_run_for_a_target_plans_every_stage_and_skips_current_engines(
    tiny_repository: TinyRepository, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = tiny_repository.repository
    write_engine(repo, repo.load_manifest("tiny_a"), 0, parse_target(ORIN, "fp32"))
    assert run(["--repository", str(repo.root), "--dry-run", "--target", ORIN]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("target orin-nvgpu-sm87-trt10.3.0-fp32 (device 'Orin (nvgpu)', sm 8.7")
    assert out[1].split()[:3] == ["skip", "tiny_a", "stage0"]
    assert [line.split()[:3] for line in out[2:7]] == [
        ["build", "tiny_a", "stage1"],
        ["build", "tiny_a", "stage2"],
        ["build", "tiny_b", "stage0"],
        ["build", "tiny_b", "stage1"],
        ["build", "tiny_b", "stage2"],
    ]
    assert out[-1] == "5 to build, 0 to rebuild, 1 current"
    assert not any(p.suffix == ".engine" for p in (repo.root / "tiny_b").rglob("*")), "dry run built nothing"


def test_dry_run_names_why_an_engine_is_rebuilt(
    tiny_repository: TinyRepository, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = tiny_repository.repository
    write_engine(repo, repo.load_manifest("tiny_a"), 0, parse_target(ORIN, "fp32"), max_batch=10)
    run(
        [
            "--repository",
            str(repo.root),
            "--model",
            "tiny_a",
            "--dry-run",
            "--target",
            ORIN,
            "--max-batch",
            "4",
        ]
    )
    out = capsys.readouterr().out
    assert "rebuild  tiny_a stage0  built for batches 1..10, wanted 1..4" in out
    assert "tiny_b" not in out


def test_dry_run_without_tensorrt_still_lists_what_would_be_built(
    tiny_repository: TinyRepository, capsys: pytest.CaptureFixture[str], no_tensorrt: None
) -> None:
    assert run(["--repository", str(tiny_repository.root), "--model", "tiny_b", "--dry-run"]) == 0
    captured = capsys.readouterr()
    assert "no TensorRT target on this machine (TensorRT's Python package is not importable" in captured.err
    assert [line.split()[:3] for line in captured.out.splitlines() if "stage" in line] == [
        ["build", "tiny_b", f"stage{k}"] for k in range(3)
    ]


def test_building_without_tensorrt_says_what_is_missing_and_the_alternative(
    tiny_repository: TinyRepository, no_tensorrt: None
) -> None:
    with pytest.raises(BackendUnavailableError) as info:
        run(["--repository", str(tiny_repository.root)])
    message = str(info.value)
    assert "TensorRT's Python package is not importable" in message
    assert "comes with JetPack" in message and "--backend onnxruntime" in message


def test_fp16_for_tensorrt_11_from_fp32_graphs_is_refused(tiny_repository: TinyRepository) -> None:
    target = "NVIDIA H100:9.0:11.0.0"
    with pytest.raises(PrecisionError, match="needs an FP16 ONNX export"):
        run(
            [
                "--repository",
                str(tiny_repository.root),
                "--dry-run",
                "--target",
                target,
                "--precision",
                "fp16",
            ]
        )


def test_target_is_only_for_planning(tiny_repository: TinyRepository) -> None:
    with pytest.raises(EdgeServeError, match="--target only plans"):
        run(["--repository", str(tiny_repository.root), "--target", ORIN])
    with pytest.raises(EdgeServeError, match="DEVICE:CC:TRT_VERSION"):
        run(["--repository", str(tiny_repository.root), "--dry-run", "--target", "Orin"])
    assert parse_target("Orin:8.7:10.3.0", "fp16") == BuildTarget("Orin", "8.7", "10.3.0", "fp16")


def test_empty_repository_says_how_to_export_a_model(tmp_path: Path) -> None:
    with pytest.raises(RepositoryError, match="no models to build; export one first"):
        run(["--repository", str(tmp_path), "--dry-run"])


def test_help_teaches_with_examples(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        run(["--help"])
    text = capsys.readouterr().out
    assert "optimization profile per batch size" in text
    assert "edgeserve build-engines --dry-run" in text and "jetson_clocks" in text
