"""benchmarks/soak.py end to end, briefly: a real `edgeserve serve` subprocess on the tiny models."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from repo_paths import REPO
from runtime_support import profiled_tiny_repository

SOAK = REPO / "benchmarks" / "soak.py"


def test_a_short_soak_loses_nothing_and_its_counts_agree_with_the_server(tmp_path: Path) -> None:
    root = tmp_path / "engines"
    profiled_tiny_repository(root)
    argv = [sys.executable, str(SOAK), "--seconds", "3", "--every", "1", "--rate", "150"]
    argv += ["--repository", str(root), "--model", "tiny_a", "--model", "tiny_b", "--slo-ms", "1000"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "lost 0" in out and "PASS: nothing lost, counters agree" in out
    sent = int(out.split("\nsent ", 1)[1].split(",", 1)[0])
    assert 300 <= sent <= 600  # ~150 req/s for 3 s
    assert f"answers by status (server): ok {sent}," in out
    assert "judged at this client: 0 of" in out  # the client's view beside the server's (issue 65)
    rows = [line for line in out.splitlines() if line.strip() and line.split()[0].isdigit()]
    assert len(rows) >= 4  # one sample per second, RSS and scraped counts on each row
    assert all(float(row.split()[1]) > 10 for row in rows)  # RSS in MiB


def test_soak_without_the_models_says_to_run_make_demo(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SOAK), "--seconds", "1", "--repository", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "run `make demo` first" in done.stderr
