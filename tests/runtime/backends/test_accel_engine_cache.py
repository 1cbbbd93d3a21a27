"""Engine cache keys, records and staleness: a stale TensorRT engine is rebuilt with its reason, never loaded.

All of this is pure (no TensorRT): engine files here are stand-in bytes with real records.
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from fake_engines import write_engine
from tiny_onnx import TinyRepository

from edgeserve.errors import RepositoryError
from edgeserve.runtime.backends.engine_cache import (
    BuildTarget,
    EngineRecord,
    PrecisionError,
    batch_sizes,
    default_timing_cache,
    engine_dir,
    engine_path,
    load_current_record,
    plan_builds,
    precision_plan,
    record_path,
    stale_reasons,
)

ORIN = BuildTarget("Orin (nvgpu)", "8.7", "10.3.0", "fp32")


def test_engine_key_names_device_capability_trt_version_and_precision() -> None:
    assert ORIN.key() == "orin-nvgpu-sm87-trt10.3.0-fp32"
    assert replace(ORIN, precision="fp16").key() != ORIN.key()
    assert replace(ORIN, trt_version="10.4.0").key() != ORIN.key()
    assert ORIN.trt_major == 10


def test_engines_live_per_target_under_the_models_trt_folder(tiny_repository: TinyRepository) -> None:
    repo = tiny_repository.repository
    assert engine_path(repo, "tiny_a", ORIN, 2) == repo.root / "tiny_a" / "trt" / ORIN.key() / "stage2.engine"
    assert record_path(repo, "tiny_a", ORIN, 2).name == "stage2.json"
    assert default_timing_cache(repo, ORIN) == repo.root / "trt-timing-cache" / f"{ORIN.key()}.cache"


def test_fresh_repository_plans_every_stage_for_building(tiny_repository: TinyRepository) -> None:
    repo = tiny_repository.repository
    manifests = [repo.load_manifest(m) for m in ("tiny_a", "tiny_b")]
    plan = plan_builds(repo, manifests, ORIN)
    assert [(p.model, p.stage, p.action) for p in plan] == [
        (m, k, "build") for m in ("tiny_a", "tiny_b") for k in range(3)
    ]
    assert all(p.reason == "no engine for this target yet" for p in plan)


def test_current_engine_is_skipped_and_force_rebuilds_it(tiny_repository: TinyRepository) -> None:
    repo = tiny_repository.repository
    manifest = repo.load_manifest("tiny_a")
    write_engine(repo, manifest, 0, ORIN)
    plan = plan_builds(repo, [manifest], ORIN)
    assert [p.action for p in plan] == ["skip", "build", "build"]
    assert plan[0].reason.startswith("current (built ")
    forced = plan_builds(repo, [manifest], ORIN, force=True)
    assert [p.action for p in forced] == ["rebuild", "build", "build"]
    assert forced[0].reason == "--force"


def test_engine_record_round_trips_through_json(tiny_repository: TinyRepository, tmp_path: Path) -> None:
    repo = tiny_repository.repository
    record = write_engine(repo, repo.load_manifest("tiny_b"), 1, ORIN, max_batch=4)
    loaded = EngineRecord.load(record_path(repo, "tiny_b", ORIN, 1))
    assert loaded == record
    assert loaded.batch_sizes == (1, 2, 3, 4)
    assert loaded.onnx_sha256 == repo.load_manifest("tiny_b").stages[1].sha256


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"device": "NVIDIA A100"}, "device 'Orin (nvgpu)' != 'NVIDIA A100'"),
        ({"compute_capability": "8.0"}, "compute_capability '8.7' != '8.0'"),
        ({"trt_version": "10.4.0"}, "trt_version '10.3.0' != '10.4.0'"),
        ({"precision": "fp16"}, "precision 'fp32' != 'fp16'"),
    ],
)
def test_engine_for_another_target_is_stale_with_the_reason(
    tiny_repository: TinyRepository, change: dict[str, str], reason: str
) -> None:
    repo = tiny_repository.repository
    manifest = repo.load_manifest("tiny_a")
    record = write_engine(repo, manifest, 0, ORIN)
    assert stale_reasons(record, manifest, 0, ORIN, batch_sizes(10)) == []
    assert stale_reasons(record, manifest, 0, replace(ORIN, **change), batch_sizes(10)) == [reason]


def test_reexported_stage_makes_its_engine_stale(tiny_repository: TinyRepository) -> None:
    repo = tiny_repository.repository
    manifest = repo.load_manifest("tiny_a")
    for k in range(3):
        write_engine(repo, manifest, k, ORIN)
    stages = list(manifest.stages)
    stages[1] = replace(stages[1], sha256="0" * 64)
    reexported = replace(manifest, stages=tuple(stages))
    plan = plan_builds(repo, [reexported], ORIN)
    assert [p.action for p in plan] == ["skip", "rebuild", "skip"]
    assert "ONNX stage changed" in plan[1].reason


def test_other_batch_range_makes_the_engine_stale(tiny_repository: TinyRepository) -> None:
    repo = tiny_repository.repository
    manifest = repo.load_manifest("tiny_a")
    write_engine(repo, manifest, 0, ORIN, max_batch=10)
    plan = plan_builds(repo, [manifest], ORIN, max_batch=8)
    assert (plan[0].action, plan[0].reason) == ("rebuild", "built for batches 1..10, wanted 1..8")


def test_truncated_engine_file_is_rebuilt_with_the_reason(tiny_repository: TinyRepository) -> None:
    repo = tiny_repository.repository
    manifest = repo.load_manifest("tiny_a")
    write_engine(repo, manifest, 0, ORIN)
    path = engine_path(repo, "tiny_a", ORIN, 0)
    path.write_bytes(path.read_bytes()[:10])
    plan = plan_builds(repo, [manifest], ORIN)
    assert plan[0].action == "rebuild" and "truncated or replaced" in plan[0].reason


def test_engine_without_a_record_or_with_a_broken_one_is_rebuilt(tiny_repository: TinyRepository) -> None:
    repo = tiny_repository.repository
    manifest = repo.load_manifest("tiny_a")
    write_engine(repo, manifest, 0, ORIN)
    write_engine(repo, manifest, 1, ORIN)
    record_path(repo, "tiny_a", ORIN, 0).unlink()
    record_path(repo, "tiny_a", ORIN, 1).write_text("{not json")
    plan = plan_builds(repo, [manifest], ORIN)
    assert plan[0].action == "rebuild" and "no record" in plan[0].reason
    assert plan[1].action == "rebuild" and "unreadable engine record" in plan[1].reason


def test_loading_a_stale_engine_is_refused_with_the_build_command(tiny_repository: TinyRepository) -> None:
    repo = tiny_repository.repository
    manifest = repo.load_manifest("tiny_a")
    write_engine(repo, manifest, 0, ORIN)
    assert load_current_record(repo, manifest, 0, ORIN).stage == 0
    upgraded = replace(ORIN, trt_version="10.4.0")  # engines copied over after a JetPack upgrade
    shutil.copytree(engine_dir(repo, "tiny_a", ORIN), engine_dir(repo, "tiny_a", upgraded))
    with pytest.raises(
        RepositoryError, match=r"stale engine \(trt_version '10.3.0' != '10.4.0'\).*build-engines"
    ):
        load_current_record(repo, manifest, 0, upgraded)
    with pytest.raises(RepositoryError, match=r"no engine of 'tiny_a' stage 1.*build-engines --model tiny_a"):
        load_current_record(repo, manifest, 1, ORIN)


def test_trt10_fp16_sets_the_builder_flag_on_a_weakly_typed_network() -> None:
    plan = precision_plan("fp16", 10)
    assert plan.builder_flags == ("FP16",) and not plan.strongly_typed
    assert precision_plan("fp32", 10).builder_flags == ()


def test_trt11_builds_strongly_typed_networks_and_fp16_needs_an_fp16_onnx() -> None:
    assert precision_plan("fp32", 11).strongly_typed
    assert precision_plan("fp16", 11, onnx_dtype="float16") == precision_plan("fp16", 11, "float16")
    assert precision_plan("fp16", 11, "float16").builder_flags == ()
    with pytest.raises(PrecisionError, match=r"removed BuilderFlag.FP16.*FP16 ONNX export.*--precision fp32"):
        precision_plan("fp16", 11, onnx_dtype="float32")


def test_fp16_onnx_on_trt10_is_built_strongly_typed() -> None:
    assert precision_plan("fp16", 10, "float16").strongly_typed
    with pytest.raises(PrecisionError, match="--precision fp16"):
        precision_plan("fp32", 10, "float16")


@pytest.mark.parametrize(
    ("precision", "major", "message"),
    [("int8", 10, "int8 needs calibration"), ("fp32", 8, "TensorRT 8.x is not supported")],
)
def test_unsupported_precision_or_trt_version_is_refused(precision: str, major: int, message: str) -> None:
    with pytest.raises(PrecisionError, match=message):
        precision_plan(precision, major)


def test_plan_checks_the_precision_before_planning(tiny_repository: TinyRepository) -> None:
    repo = tiny_repository.repository
    trt11_fp16 = BuildTarget("H100", "9.0", "11.0.0", "fp16")
    with pytest.raises(PrecisionError, match="FP16 ONNX"):
        plan_builds(repo, [repo.load_manifest("tiny_a")], trt11_fp16)
