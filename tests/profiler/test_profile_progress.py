"""Profiling that talks (issue 65, item 5), through the real `edgeserve-profile`: an estimate on the
first line with the flags that shorten a long run, then progress with an ETA: a bar under a
terminal, plain lines in a log."""

from __future__ import annotations

import io
import os
import pty
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tiny_onnx import TinyRepository

from edgeserve.profiler.progress import Estimate, Progress, duration

REPO = Path(__file__).resolve().parents[2]
PROFILE = [sys.executable, "-m", "edgeserve.profiler"]
ENV = {**os.environ, "EDGESERVE_DEBUG": "", "PYTHONUNBUFFERED": "1"}


def _argv(repository: Path, *extra: str) -> list[str]:
    return [*PROFILE, "--repository", str(repository), "--model", "tiny_a", "--threads", "1", *extra]


def test_a_long_profile_says_how_long_on_its_first_lines_and_how_to_shorten_it(
    tiny_repository: TinyRepository,
) -> None:
    """--repeats 200000 makes the tiny model's profile minutes long: the estimate comes before any
    cell is measured, with --max-batch and --repeats to shorten it (the run is then stopped)."""
    process = subprocess.Popen(
        _argv(tiny_repository.root, "--repeats", "200000", "--warmup", "1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
        cwd=REPO,
    )
    lines: list[str] = []
    try:
        assert process.stderr is not None
        for line in process.stderr:
            lines.append(line)
            if "about" in line:
                break
    finally:
        process.kill()
        process.communicate(timeout=30)
    text = "".join(lines)
    assert "Traceback" not in text, text
    estimate = lines[-1]
    assert re.match(r"tiny_a: about \d+ (min|h)", estimate), text
    assert "shorten it with --max-batch 4 (about" in estimate and "--repeats 20 (about" in estimate, estimate


def test_a_log_gets_plain_progress_lines_and_a_terminal_a_bar_with_an_eta(
    tiny_repository: TinyRepository,
) -> None:
    argv = _argv(tiny_repository.root, "--repeats", "3", "--warmup", "1", "--max-batch", "4")
    done = subprocess.run(argv, capture_output=True, text=True, env=ENV, cwd=REPO, timeout=120)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert re.search(r"^tiny_a: about \d+ s at most \(one run of its deepest exit takes", done.stderr, re.M)
    assert "shorten it" not in done.stderr  # a short profile needs no advice
    assert re.search(r"^tiny_a: 12/12 cells \(100%\), .* s/cell, .* elapsed, ETA 0 s$", done.stderr, re.M)

    leader, follower = pty.openpty()
    process = subprocess.Popen(
        [*argv, "--force"], stdout=subprocess.PIPE, stderr=follower, env=ENV, cwd=REPO, text=True
    )
    os.close(follower)
    seen = b""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the terminal closed with the process
            break
        if not chunk:
            break
        seen += chunk
    process.wait(30)
    os.close(leader)
    screen = seen.decode(errors="replace")
    assert process.returncode == 0 and "Traceback" not in screen, screen
    assert re.search(r"tiny_a: \d+/12 cells \[#*\.*\] .* s/cell, .* elapsed, ETA ", screen), screen


def test_the_estimate_and_the_progress_text() -> None:
    slow = Estimate(exits=3, largest=10, warmup=10, repeats=100, first_ms=60.0, last_ms=420.0)
    assert slow.seconds() == pytest.approx(3 * 110 * sum(60 + 40 * (b - 1) for b in range(1, 11)) / 1000)
    line = slow.line("decoder")
    assert line.startswith(f"decoder: about {duration(slow.seconds())} at most")
    assert "--max-batch 4 (about" in line and "--repeats 20 (about" in line
    assert duration(7 * 60 + 5) == "7 min 5 s" and duration(3725) == "1 h 2 min" and duration(4.2) == "4 s"
    now = [0.0]
    out = io.StringIO()
    progress = Progress("m", 4, out, terminal=False, every_s=10.0, clock=lambda: now[0])
    for t in (1.0, 2.0, 12.0, 13.0):
        now[0] = t
        progress.update()
    lines = out.getvalue().splitlines()
    assert lines == [
        "m: 3/4 cells (75%), 4.0 s/cell, 12 s elapsed, ETA 4 s",
        "m: 4/4 cells (100%), 3.2 s/cell, 13 s elapsed, ETA 0 s",
    ]


def test_npz_times_the_cells_on_representative_samples_and_records_it(
    tiny_repository: TinyRepository,
) -> None:
    """--npz FILE: the cells are timed on the file's samples; the profile says so, so that a profile
    on random inputs is not taken for it (nor the other way round)."""
    import json

    import numpy as np

    root = tiny_repository.root
    manifest = tiny_repository.repository.load_manifest("tiny_a")
    (spec,) = manifest.inputs
    samples = np.random.default_rng(3).standard_normal((3, *spec.shape)).astype(np.float32)
    np.savez(root / "real.npz", **{spec.name: samples})
    quick = ["--repeats", "3", "--warmup", "1", "--max-batch", "4"]
    done = subprocess.run(
        _argv(root, *quick, "--npz", str(root / "real.npz")),
        capture_output=True,
        text=True,
        env=ENV,
        cwd=REPO,
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    (profile,) = (root / "tiny_a" / "profiles").glob("*.json")
    assert json.loads(profile.read_text())["settings"]["inputs"].startswith("npz:")
    again = subprocess.run(_argv(root, *quick), capture_output=True, text=True, env=ENV, cwd=REPO)
    assert again.returncode == 0 and "measured with other settings" in again.stderr, again.stderr
    assert "inputs" not in json.loads(profile.read_text())["settings"]  # random inputs again

    np.savez(root / "wrong.npz", image=samples)
    wrong = subprocess.run(
        _argv(root, *quick, "--npz", str(root / "wrong.npz")),
        capture_output=True,
        text=True,
        env=ENV,
        cwd=REPO,
    )
    assert wrong.returncode == 1 and "Traceback" not in wrong.stderr
    line = wrong.stderr.strip().splitlines()[-1]
    assert (
        line.startswith("edgeserve-profile: error: --npz ") and f"numpy.savez(path, {spec.name}=...)" in line
    )
