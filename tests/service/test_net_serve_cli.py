"""`edgeserve serve` as a real subprocess: ready line, answers in flight at SIGTERM, socket removed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from runtime_support import profiled_tiny_repository

from edgeserve.cli import main as cli_main
from edgeserve.service.serve_cli import ready_urls
from edgeserve.wire.client import BlockingClient


def _write_config(path: Path, repository: Path, sock: Path, extra: str = "") -> None:
    path.write_text(
        f"repository = {json.dumps(str(repository))}\n"
        '[backend]\nname = "onnxruntime"\nthreads = 1\nwarmup = 0\n'
        "[models.tiny_a]\nslo_ms = 2000\n"
        f'[listen]\nunix = {json.dumps(str(sock))}\nunix_mode = "0600"\ntcp = "127.0.0.1:0"\n{extra}'
    )


def _wait_ready(process: subprocess.Popen[str], timeout: float = 60.0) -> list[str]:
    """The URLs from the ready line (stdout), failing with the server's stderr if it never comes."""
    found: list[str] = []

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            if (urls := ready_urls(line)) is not None:
                found.extend(urls)
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout)
    if not found:
        process.kill()
        _, err = process.communicate(timeout=10)
        pytest.fail(f"no ready line within {timeout} s; stderr:\n{err}")
    return found


def test_serve_subprocess_answers_in_flight_requests_on_sigterm_and_removes_its_socket(
    tmp_path: Path,
) -> None:
    repository = tmp_path / "engines"
    models = profiled_tiny_repository(repository)
    sock = tmp_path / "serve.sock"
    config = tmp_path / "serve.toml"
    _write_config(config, repository, sock, "max_in_flight = 64\n")  # the whole burst is read
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "edgeserve.cli", "serve", "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        urls = _wait_ready(process)
        assert urls[0] == f"unix://{sock}" and urls[1].startswith("tcp://127.0.0.1:")
        assert sock.is_socket() and (sock.stat().st_mode & 0o777) == 0o600
        xs = models["tiny_a"].random_input(30, seed=4)
        with BlockingClient(urls[1]) as client:
            assert client.infer("tiny_a", xs[0], timeout=30).ok
            futures = [client.submit("tiny_a", x) for x in xs]
            assert futures[0].result(30).ok  # the server has read the burst; most are still queued
            process.send_signal(signal.SIGTERM)
            replies = [f.result(30) for f in futures]
        code = process.wait(30)
    finally:
        if process.poll() is None:
            process.kill()
        _, err = process.communicate(timeout=10)
    assert code == 0, err
    assert len(replies) == 30 and all(r.status in ("ok", "shutdown") for r in replies)
    assert not sock.exists()
    assert "client connected" in err and "event=stopped" in err


def test_serve_without_a_listener_says_what_to_add(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repository = tmp_path / "engines"
    profiled_tiny_repository(repository)
    config = tmp_path / "serve.toml"
    config.write_text(
        f"repository = {json.dumps(str(repository))}\n"
        "[backend]\nthreads = 1\nwarmup = 0\n[models.tiny_a]\nslo_ms = 50\n"
    )
    assert cli_main(["serve", "--config", str(config)]) == 1
    assert "no listener configured; add [listen]" in capsys.readouterr().err
