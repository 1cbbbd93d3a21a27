"""benchmarks/client_backlog.py, briefly, on the tiny models: the AsyncClient as it is against the
client before (issue 65, item 6), on one open-loop trace past capacity."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from repo_paths import REPO
from runtime_support import profiled_tiny_repository

BENCH = REPO / "benchmarks" / "client_backlog.py"


def test_a_short_run_prints_both_clients(tmp_path: Path) -> None:
    root = tmp_path / "engines"
    profiled_tiny_repository(root)
    argv = [sys.executable, str(BENCH), "--repository", str(root), "--model", "tiny_a", "--load", "3"]
    argv += ["--seconds", "1", "--capacity-seconds", "1", "--window", "2"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=180, cwd=REPO)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout + done.stderr
    rows = dict(re.findall(r"^(withdraws|sends-all) +(.*)$", done.stdout, re.M))
    assert set(rows) == {"withdraws", "sends-all"}, done.stdout
    sent, written, withdrawn = (int(v) for v in rows["withdraws"].split()[2:5])
    assert written + withdrawn <= sent  # nothing withdrawn was written
    old_sent, old_written, old_withdrawn = (int(v) for v in rows["sends-all"].split()[2:5])
    assert old_withdrawn == 0 and old_written == old_sent  # the client before wrote everything
