"""benchmarks/overload.py end to end, briefly, on models it was not written for: the tiny ones.

The goodput it prints is for a person to judge (timed unit tests are not); what is checked here
is that it runs on any models of a repository, answers every request it sent, and says what it
measured.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from repo_paths import REPO
from runtime_support import profiled_tiny_repository

OVERLOAD = REPO / "benchmarks" / "overload.py"


@pytest.mark.parametrize("polite", ["socket", "http"])
def test_a_short_run_on_other_models_answers_every_request(tmp_path: Path, polite: str) -> None:
    root = tmp_path / "engines"
    profiled_tiny_repository(root)
    out = tmp_path / "overload.json"
    argv = [sys.executable, str(OVERLOAD), "--repository", str(root), "--model", "tiny_a"]
    argv += ["--model", "tiny_b", "--slo-ms", "200", "--levels", "2", "--seconds", "1"]
    argv += [
        "--capacity-seconds",
        "1",
        "--pause",
        "0.2",
        "--grace",
        "2",
        "--json",
        str(out),
        "--polite",
        polite,
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "deadline_ms {'tiny_a': 200.0, 'tiny_b': 200.0}" in done.stdout
    assert "lost (no answer 2 s after the last send): none" in done.stdout
    assert f"fairness polite ({'http' if polite == 'http' else 'tcp'}): offered" in done.stdout
    assert "goal, fairness: the polite connection" in done.stdout
    rows = {row["level"]: row for row in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"closed", "2x", "fair"}
    assert rows["closed"]["in_deadline_per_s"] > 0 and rows["2x"]["offered_per_s"] > 0
    for row in rows.values():
        assert row["lost"] == 0
        assert len(row["in_deadline_by_model_per_s"]) == 2


def test_a_model_missing_from_the_repository_is_named(tmp_path: Path) -> None:
    argv = [sys.executable, str(OVERLOAD), "--repository", str(tmp_path), "--model", "absent"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "no model absent in" in done.stderr and "export and profile them first" in done.stderr
