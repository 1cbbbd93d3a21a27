"""benchmarks/offload.py judges violations at the client, as overload.py does, with the server's view
beside (issue 65, item 8): an `ok` answer the server had in time but that came back past the SLO is a
violation at the client and not in the server's column."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from typing import Any

import pytest
from repo_paths import REPO

OFFLOAD = REPO / "benchmarks" / "offload.py"


def _module() -> Any:  # the benchmark script, imported by its path
    pytest.importorskip("onnx")
    sys.path.insert(0, str(OFFLOAD.parent))
    spec = importlib.util.spec_from_file_location("offload_bench", OFFLOAD)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look themselves up there
    spec.loader.exec_module(module)
    return module


def test_a_row_judges_at_the_client_and_shows_the_servers_view_beside() -> None:
    run = _module().Run(sent=4)
    run.statuses = ["ok", "ok", "ok", "expired"]
    run.late = [False, False, True, False]
    run.latency_ms = [20.0, 300.0, 200.0, 5.0]  # the second: in time at the server, late here
    fields = run.row(2.0, "offload", slo_ms=150.0).split()
    assert fields[:2] == ["2.00", "offload"]
    assert float(fields[2]) == 75.0 and float(fields[4]) == 50.0  # client 3 of 4, server 2 of 4


def test_a_short_run_prints_both_views() -> None:
    pytest.importorskip("onnx")
    argv = [sys.executable, str(OFFLOAD), "--loads", "2", "--duration", "1"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240, cwd=REPO)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout + done.stderr
    assert "viol %: not ok or back past the SLO at this client" in done.stdout
    assert " load mode      viol %   P95 ms  server v%  upstream %  answered/sent" in done.stdout
    rows = re.findall(r"^ 2\.00 (local|offload) +([\d.]+) +([\d.]+|nan) +([\d.]+) ", done.stdout, re.M)
    assert [r[0] for r in rows] == ["local", "offload"], done.stdout
