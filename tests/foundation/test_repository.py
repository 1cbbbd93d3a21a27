"""The repository refuses what does not match its manifest, naming the file and the command that fixes it."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from tiny_onnx import TinyRepository

from edgeserve.errors import ProfileError, RepositoryError
from edgeserve.fingerprint import Fingerprint
from edgeserve.profile import ProfileCell, ProfileTable

FINGERPRINT = Fingerprint(
    backend="onnxruntime", device="Test CPU", threads=1, providers=("CPUExecutionProvider",)
)


def _profile(tiny: TinyRepository, model: str = "tiny_a", max_batch: int = 2) -> ProfileTable:
    manifest = tiny.models[model].manifest
    table = ProfileTable(
        model=model,
        exit_names=tuple(manifest.exit_names),
        max_batch=max_batch,
        fingerprint=FINGERPRINT,
        graphs_sha256=manifest.graphs_sha256(),
        settings={"repeats": 3},
        created="2024-01-01T00:00:00+00:00",
    )
    for e in range(len(manifest.exits)):
        for b in range(1, max_batch + 1):
            table.add(ProfileCell.from_samples(e, b, np.array([1.0, 1.1, 1.2]) * (e + 1) * b))
    return table


def test_models_lists_every_model_with_a_manifest(tiny_repository: TinyRepository) -> None:
    assert tiny_repository.repository.models() == ["tiny_a", "tiny_b"]


def test_intact_repository_loads_and_verifies(tiny_repository: TinyRepository) -> None:
    manifest = tiny_repository.repository.load_manifest("tiny_a")
    assert manifest == tiny_repository.models["tiny_a"].manifest


def test_missing_manifest_is_refused_with_the_export_command(tiny_repository: TinyRepository) -> None:
    with pytest.raises(RepositoryError) as err:
        tiny_repository.repository.load_manifest("resnet50")
    message = str(err.value)
    assert "manifest.json" in message and "tiny_a, tiny_b" in message
    assert "edgeserve export --model resnet50" in message


def test_truncated_stage_file_is_refused_with_the_fix(tiny_repository: TinyRepository) -> None:
    path = tiny_repository.root / "tiny_a" / "onnx" / "stage1.onnx"
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(RepositoryError, match="100 bytes on disk") as err:
        tiny_repository.repository.load_manifest("tiny_a")
    assert str(path) in str(err.value) and "edgeserve export --model tiny_a" in str(err.value)


def test_corrupted_stage_bytes_fail_the_checksum_with_the_fix(tiny_repository: TinyRepository) -> None:
    path = tiny_repository.root / "tiny_b" / "onnx" / "stage2.onnx"
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF  # same size, different bytes
    path.write_bytes(bytes(data))
    with pytest.raises(RepositoryError, match="checksum") as err:
        tiny_repository.repository.load_manifest("tiny_b")
    assert str(path) in str(err.value) and "edgeserve export --model tiny_b" in str(err.value)


def test_missing_stage_file_is_refused_with_the_fix(tiny_repository: TinyRepository) -> None:
    path = tiny_repository.root / "tiny_a" / "onnx" / "stage0.onnx"
    path.unlink()
    with pytest.raises(RepositoryError, match="missing") as err:
        tiny_repository.repository.load_manifest("tiny_a")
    assert str(path) in str(err.value) and "edgeserve export" in str(err.value)


def test_manifest_under_the_wrong_folder_is_refused(tiny_repository: TinyRepository) -> None:
    src = tiny_repository.repository.manifest_path("tiny_a")
    dst = tiny_repository.root / "other" / "manifest.json"
    dst.parent.mkdir()
    dst.write_text(src.read_text())
    with pytest.raises(RepositoryError, match="names model 'tiny_a'"):
        tiny_repository.repository.load_manifest("other")


def test_profile_round_trips_through_the_repository(tiny_repository: TinyRepository) -> None:
    table = _profile(tiny_repository)
    path = tiny_repository.repository.save_profile(table)
    assert path.parent == tiny_repository.root / "tiny_a" / "profiles"
    loaded = tiny_repository.repository.load_profile(tiny_repository.models["tiny_a"].manifest, FINGERPRINT)
    assert loaded == table


def test_absent_profile_names_other_devices_and_the_profile_command(tiny_repository: TinyRepository) -> None:
    tiny_repository.repository.save_profile(_profile(tiny_repository))
    here = replace(FINGERPRINT, device="Other CPU")
    with pytest.raises(ProfileError) as err:
        tiny_repository.repository.load_profile(tiny_repository.models["tiny_a"].manifest, here)
    message = str(err.value)
    assert FINGERPRINT.key() in message and "edgeserve-profile --model tiny_a" in message


def test_profile_from_another_fingerprint_is_refused_with_the_fix(tiny_repository: TinyRepository) -> None:
    table = _profile(tiny_repository)
    path = tiny_repository.repository.save_profile(table)
    # A profile copied in from another box under this box's file name.
    here = replace(FINGERPRINT, threads=4)
    target = tiny_repository.repository.profile_path("tiny_a", here)
    target.write_text(path.read_text())
    with pytest.raises(ProfileError, match="another device") as err:
        tiny_repository.repository.load_profile(tiny_repository.models["tiny_a"].manifest, here)
    assert str(target) in str(err.value) and "threads: 1 != 4" in str(err.value)
    assert "edgeserve-profile --model tiny_a" in str(err.value)


def test_profile_for_an_older_export_is_refused_with_the_fix(tiny_repository: TinyRepository) -> None:
    table = _profile(tiny_repository)
    table.graphs_sha256 = "f" * 64
    path = tiny_repository.repository.save_profile(table)
    with pytest.raises(ProfileError, match="earlier export") as err:
        tiny_repository.repository.load_profile(tiny_repository.models["tiny_a"].manifest, FINGERPRINT)
    assert str(path) in str(err.value) and "edgeserve-profile --model tiny_a" in str(err.value)


def test_profile_missing_cells_is_refused_with_the_fix(tiny_repository: TinyRepository) -> None:
    path = tiny_repository.repository.save_profile(_profile(tiny_repository))
    data = json.loads(path.read_text())
    data["cells"] = data["cells"][:-1]
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileError, match="1 cells missing") as err:
        tiny_repository.repository.load_profile(tiny_repository.models["tiny_a"].manifest, FINGERPRINT)
    assert str(path) in str(err.value) and "edgeserve-profile" in str(err.value)


def test_truncated_profile_json_is_refused_with_the_fix(tiny_repository: TinyRepository) -> None:
    path = tiny_repository.repository.save_profile(_profile(tiny_repository))
    path.write_text(path.read_text()[:200])
    with pytest.raises(ProfileError, match="not valid JSON") as err:
        tiny_repository.repository.load_profile(tiny_repository.models["tiny_a"].manifest, FINGERPRINT)
    assert str(path) in str(err.value) and "edgeserve-profile" in str(err.value)


def test_profile_with_other_exits_is_refused(tiny_repository: TinyRepository) -> None:
    table = _profile(tiny_repository)
    table.exit_names = ("a", "b", "c")
    tiny_repository.repository.save_profile(table)
    with pytest.raises(ProfileError, match="exits"):
        tiny_repository.repository.load_profile(tiny_repository.models["tiny_a"].manifest, FINGERPRINT)
