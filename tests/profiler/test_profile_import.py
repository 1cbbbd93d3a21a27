"""`edgeserve-profile --import TABLE.json --model NAME`: a table measured elsewhere, checked and stored."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from emulated_support import JETSON, import_table, table_for, write_table
from repo_paths import REPO
from tiny_onnx import TinyRepository

from edgeserve.errors import ProfileError
from edgeserve.manifest import Manifest
from edgeserve.profile import ProfileTable
from edgeserve.profiler.cli import main
from edgeserve.profiler.importing import import_profile
from edgeserve.scheduler.sources import from_repository


def _manifest(tiny: TinyRepository, model: str = "tiny_a") -> Manifest:
    return tiny.repository.load_manifest(model)


def test_an_imported_table_is_stored_under_its_fingerprint_and_says_how_to_serve_it(
    tmp_path: Path, tiny_repository: TinyRepository
) -> None:
    manifest = _manifest(tiny_repository)
    source = write_table(tmp_path / "jetson.json", table_for(manifest))
    done = import_table(tiny_repository.root, source, "tiny_a")
    assert done.returncode == 0, done.stderr
    key = JETSON.key()
    assert f'name = "emulated", fingerprint = "{key}"' in done.stdout
    assert "other graphs" not in done.stderr
    stored = tiny_repository.repository.load_profile(manifest, JETSON)  # the server's own check passes
    assert stored.imported is not None and stored.imported["checksum_matches"] is True
    assert stored.imported["source"] == str(source.resolve()) and stored.imported["model"] == "tiny_a"
    assert stored.matrix("p50").tolist() == table_for(manifest).matrix("p50").tolist()
    # the simulator reads it from the repository like any stored profile
    picked = from_repository(tiny_repository.root, ["tiny_a"], key)
    assert picked.tables[0].fingerprint == JETSON


def test_a_table_of_other_graphs_is_stored_said_and_recorded(
    tmp_path: Path, tiny_repository: TinyRepository
) -> None:
    manifest = _manifest(tiny_repository)
    theirs = "ab" * 32
    table = table_for(manifest, model="tiny_a-full-width", graphs_sha256=theirs)
    done = import_table(tiny_repository.root, write_table(tmp_path / "t.json", table), "tiny_a")
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if "other graphs" in line]
    assert len(said) == 1 and "abababababab" in said[0] and "checksum_matches = false" in said[0]
    assert "measured for model 'tiny_a-full-width'" in done.stderr
    path = tiny_repository.repository.profile_path("tiny_a", JETSON)
    raw = json.loads(path.read_text())
    assert raw["model"] == "tiny_a" and raw["graphs_sha256"] == manifest.graphs_sha256()
    assert raw["imported"]["graphs_sha256"] == theirs and raw["imported"]["checksum_matches"] is False
    assert raw["imported"]["model"] == "tiny_a-full-width" and raw["imported"]["imported_at"]
    tiny_repository.repository.load_profile(manifest, JETSON)  # accepted for this export


def test_importing_again_replaces_the_stored_table(tmp_path: Path, tiny_repository: TinyRepository) -> None:
    manifest = _manifest(tiny_repository)
    lines: list[str] = []
    first = import_profile(
        tiny_repository.repository,
        write_table(tmp_path / "a.json", table_for(manifest)),
        "tiny_a",
        note=lines.append,
    )
    second = import_profile(
        tiny_repository.repository,
        write_table(tmp_path / "b.json", table_for(manifest, base_ms=5.0)),
        "tiny_a",
        note=lines.append,
    )
    assert (first.replaced, second.replaced) == (False, True) and first.path == second.path
    assert ProfileTable.load(second.path).cell(0, 1).samples_ms[0] == 5.25
    assert lines == []


def _refused(tmp_path: Path, tiny: TinyRepository, data: object, capsys: pytest.CaptureFixture[str]) -> str:
    source = tmp_path / "table.json"
    source.write_text(data if isinstance(data, str) else json.dumps(data))
    code = main(["--import", str(source), "--model", "tiny_a", "--repository", str(tiny.root)])
    err = capsys.readouterr().err
    assert code != 0 and not (tiny.root / "tiny_a" / "profiles").exists()
    assert err.count("\n") == 1, err  # one line
    return err


def test_a_table_with_other_exit_names_is_refused(
    tmp_path: Path, tiny_repository: TinyRepository, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = _manifest(tiny_repository)
    table = table_for(manifest, exit_names=["early", "middle", "late"])
    err = _refused(tmp_path, tiny_repository, table.to_dict(), capsys)
    assert "exits ['early', 'middle', 'late'] differ from those of model 'tiny_a'" in err
    assert str(manifest.exit_names) in err


def test_a_table_past_the_batches_the_model_runs_is_refused(
    tmp_path: Path, tiny_repository: TinyRepository, capsys: pytest.CaptureFixture[str]
) -> None:
    from dataclasses import replace

    manifest = _manifest(tiny_repository)
    fixed = replace(manifest, batch=2)  # graphs that take batches of exactly 2
    tiny_repository.repository.save_manifest(fixed)
    err = _refused(tmp_path, tiny_repository, table_for(fixed, max_batch=4).to_dict(), capsys)
    assert "covers batches 1..4 but model 'tiny_a' runs batches of at most 2" in err
    assert "--max-batch 2" in err


def test_a_table_with_a_cell_outside_its_range_is_refused(
    tmp_path: Path, tiny_repository: TinyRepository, capsys: pytest.CaptureFixture[str]
) -> None:
    data = table_for(_manifest(tiny_repository)).to_dict()
    data["cells"].append({**data["cells"][0], "batch": 0})
    err = _refused(tmp_path, tiny_repository, data, capsys)
    assert "cells outside" in err and "(0, 0)" in err


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ("{not json", "not valid JSON"),
        ([1, 2], "a profile table is a JSON object"),
        ({"schema_version": 1}, "lacks the key"),
    ],
    ids=["not-json", "not-an-object", "not-a-table"],
)
def test_a_file_that_is_not_a_profile_table_is_refused(
    tmp_path: Path,
    tiny_repository: TinyRepository,
    capsys: pytest.CaptureFixture[str],
    data: object,
    message: str,
) -> None:
    assert message in _refused(tmp_path, tiny_repository, data, capsys)


def test_import_needs_exactly_one_model_that_exists(
    tmp_path: Path, tiny_repository: TinyRepository, capsys: pytest.CaptureFixture[str]
) -> None:
    source = write_table(tmp_path / "t.json", table_for(_manifest(tiny_repository)))
    root = str(tiny_repository.root)
    assert main(["--import", str(source), "--repository", root]) != 0
    assert "exactly one --model NAME (got 0)" in capsys.readouterr().err
    assert main(["--import", str(source), "--model", "tiny_x", "--repository", root]) != 0
    assert "--model 'tiny_x' is not in" in capsys.readouterr().err


def test_profiling_with_the_emulated_backend_is_refused(
    tiny_repository: TinyRepository, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--backend", "emulated", "--repository", str(tiny_repository.root)]) != 0
    assert "--import TABLE.json --model NAME" in capsys.readouterr().err


def test_import_profile_raises_profile_errors(tmp_path: Path, tiny_repository: TinyRepository) -> None:
    table = table_for(_manifest(tiny_repository), exit_names=["a", "b", "c"])
    with pytest.raises(ProfileError, match="import a table measured for a model with the same exits"):
        import_profile(tiny_repository.repository, write_table(tmp_path / "t.json", table), "tiny_a")


def test_the_shipped_h200_tables_load_and_say_where_they_came_from() -> None:
    folder = REPO / "benchmarks" / "data" / "gpu-h200"
    for model in ("resnet50-cifar", "resnet101-cifar", "resnet152-cifar"):
        path = folder / f"{model}.json"
        table = ProfileTable.load(path)
        assert table.model == model and table.max_batch == 10
        assert table.exit_names == ("layer1", "layer2", "layer3", "final")
        assert table.fingerprint.device == "NVIDIA H200"
        assert json.loads(path.read_text())["fingerprint_key"] == table.fingerprint.key()
    readme = (folder / "README.md").read_text()
    assert "032fd37" in readme and "--backend torch --device cuda --threads 1 --repeats 30" in readme
