"""benchmarks/accelerator.py end to end, briefly: two levels of 2 s on the emulated backend.

What the run's numbers say about the runtime is for a person to judge (timed unit tests are not);
checked here is that it sets up its repository (export, `edgeserve-profile --import`), sends the
same trace it simulates, accounts for every request it offered and prints its table.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from repo_paths import REPO

ACCELERATOR = REPO / "benchmarks" / "accelerator.py"
TABLES = REPO / "benchmarks" / "data" / "gpu-h200"


def test_a_short_emulated_run_accounts_for_every_request(tmp_path: Path) -> None:
    pytest.importorskip("edgeserve.runtime.backends.emulated", reason="no emulated backend in this tree")
    pytest.importorskip("torch", reason="the set-up exports the ResNets, which needs the export extra")
    if not all((TABLES / f"resnet{d}-cifar.json").exists() for d in (50, 101, 152)):
        pytest.skip(f"no H200 profile tables in {TABLES}")
    out = tmp_path / "accelerator.json"
    argv = [sys.executable, str(ACCELERATOR), "--levels", "0.9", "2", "--seconds", "2", "--pause", "0.2"]
    argv += ["--cache", str(tmp_path / "cache"), "--json", str(out)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    text = done.stdout
    assert "profile: torch on NVIDIA H200 (emulated, slowdown 4)" in text
    table = text[text.index("the table (each runtime row beside the simulator's on the same trace)") :]
    assert table.count("simulator") >= 2 and table.count("runtime/2") == 2
    assert "lost (no answer 2 s after the last send, or never sent): none" in text
    result = json.loads(out.read_text())
    sims = {row["level"]: row for row in result["simulator"]}
    rows = result["runtime"]["2"]
    assert [row["level"] for row in rows] == [0.9, 2.0] and set(sims) == {0.9, 2.0}
    for row in rows:
        answered = row["in_deadline"] + row["late"] + row["refused"] + row["expired"] + row["other"]
        assert row["offered"] == answered + row["lost"] and row["offered"] > 0
        assert row["lost"] == 0 and row["other"] == 0
        assert row["offered"] == sims[row["level"]]["offered"]  # the simulator's trace, sent whole
        assert row["exit_mix"] and abs(sum(row["exit_mix"].values()) - 1) < 1e-9
