"""The manifest's JSON form: round trips, and clear refusals of files that cannot be trusted."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from tiny_onnx import TinyRepository

from edgeserve.errors import RepositoryError
from edgeserve.manifest import Manifest


def test_manifest_round_trips_through_its_json_file(tiny_repository: TinyRepository) -> None:
    for name, model in tiny_repository.models.items():
        loaded = Manifest.load(tiny_repository.repository.manifest_path(name))
        assert loaded == model.manifest


def test_manifest_with_accuracies_round_trips(tmp_path: Path, tiny_repository: TinyRepository) -> None:
    manifest = tiny_repository.models["tiny_a"].manifest.with_accuracies([0.25, 0.5, None], "eval.npz")
    manifest.save(tmp_path / "m.json")
    assert Manifest.load(tmp_path / "m.json") == manifest


def test_graphs_sha256_ignores_accuracies_but_tracks_the_graphs(tiny_repository: TinyRepository) -> None:
    manifest = tiny_repository.models["tiny_a"].manifest
    assert manifest.with_accuracies([0.1, 0.2, 0.3], "d").graphs_sha256() == manifest.graphs_sha256()
    stage = replace(manifest.stages[1], sha256="0" * 64)
    changed = replace(manifest, stages=(manifest.stages[0], stage, *manifest.stages[2:]))
    assert changed.graphs_sha256() != manifest.graphs_sha256()


def test_exit_is_found_by_name_or_position_and_a_bad_one_lists_the_choices(
    tiny_repository: TinyRepository,
) -> None:
    manifest = tiny_repository.models["tiny_a"].manifest
    assert manifest.exit_index("layer2") == 1
    assert manifest.exit_index(2) == 2
    with pytest.raises(KeyError, match=r"layer1.*final"):
        manifest.exit_index("layer9")


def test_manifest_that_is_not_json_is_refused_with_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "manifest.json"
    path.write_text("this is not json")
    with pytest.raises(RepositoryError) as err:
        Manifest.load(path)
    assert str(path) in str(err.value) and "edgeserve export" in str(err.value)


def test_truncated_manifest_json_is_refused_with_the_fix(tiny_repository: TinyRepository) -> None:
    path = tiny_repository.repository.manifest_path("tiny_a")
    text = path.read_text()
    path.write_text(text[: len(text) // 2])
    with pytest.raises(RepositoryError, match="not valid JSON") as err:
        tiny_repository.repository.load_manifest("tiny_a")
    assert str(path) in str(err.value) and "edgeserve export" in str(err.value)


def test_wrong_schema_version_is_refused_with_the_fix(tiny_repository: TinyRepository) -> None:
    path = tiny_repository.repository.manifest_path("tiny_a")
    data = json.loads(path.read_text())
    data["schema_version"] = 99
    path.write_text(json.dumps(data))
    with pytest.raises(RepositoryError, match="schema_version is 99") as err:
        tiny_repository.repository.load_manifest("tiny_a")
    assert str(path) in str(err.value) and "edgeserve export" in str(err.value)


def test_manifest_missing_a_key_names_the_key_and_the_file(tiny_repository: TinyRepository) -> None:
    path = tiny_repository.repository.manifest_path("tiny_b")
    data = json.loads(path.read_text())
    del data["exits"]
    path.write_text(json.dumps(data))
    with pytest.raises(RepositoryError, match="exits") as err:
        tiny_repository.repository.load_manifest("tiny_b")
    assert str(path) in str(err.value)
