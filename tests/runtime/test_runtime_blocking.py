"""The blocking wrapper and the light top-level import."""

from __future__ import annotations

import concurrent.futures
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from runtime_support import HookedFactory, config_dict, profiled_tiny_repository

import edgeserve
from edgeserve.errors import ProfileError


def test_blocking_server_answers_calls_from_several_threads(tmp_path: Path) -> None:
    root = tmp_path / "engines"
    models = profiled_tiny_repository(root)
    xa = models["tiny_a"].random_input(24, seed=5)
    xb = models["tiny_b"].random_input(24, seed=6)
    with edgeserve.BlockingServer(config_dict(root)) as server, ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(server.infer, "tiny_a", x, timeout=30) for x in xa]
        futures += [pool.submit(server.infer, "tiny_b", x, timeout=30) for x in xb]
        results = [f.result() for f in futures]
        batch = server.infer_batch("tiny_a", xa[:3], deadline_ms=500)
        snap = server.snapshot()
    for x, r in zip(xa, results[:24], strict=True):
        assert r.ok
        expected = models["tiny_a"].forward(x[None], r.exit_index or 0)[0]
        np.testing.assert_allclose(r.output, expected, rtol=1e-4, atol=1e-4)
    assert all(r.ok and r.model == "tiny_b" for r in results[24:])
    assert [r.ok for r in batch] == [True] * 3
    assert snap["requests"] == {"tiny_a": {"ok": 27}, "tiny_b": {"ok": 24}}
    with pytest.raises(RuntimeError, match="not started"):
        server.infer("tiny_a", xa[0])


def test_blocking_server_start_errors_surface_in_the_caller(tmp_path: Path) -> None:
    from tiny_onnx import write_tiny_repository

    root = tmp_path / "engines"
    write_tiny_repository(root)
    with pytest.raises(ProfileError, match="edgeserve-profile"), edgeserve.BlockingServer(config_dict(root)):
        pass


def test_import_edgeserve_loads_neither_onnxruntime_nor_the_server() -> None:
    code = (
        "import sys, edgeserve\n"
        "assert 'onnxruntime' not in sys.modules and 'edgeserve.runtime.server' not in sys.modules\n"
        "edgeserve.ServerConfig\n"
        "assert 'onnxruntime' not in sys.modules\n"
        "assert edgeserve.Server.__name__ == 'Server' and 'Result' in dir(edgeserve)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_blocking_timeout_cancels_the_queued_request(tmp_path: Path) -> None:
    root = tmp_path / "engines"
    models = profiled_tiny_repository(root)
    factory = HookedFactory(delay_s=0.5)
    x = models["tiny_a"].random_input(2)
    with (
        edgeserve.BlockingServer(config_dict(root), backend_factory=factory) as server,
        ThreadPoolExecutor(1) as pool,
    ):
        first = pool.submit(server.infer, "tiny_a", x[0])
        assert factory.backend is not None and factory.backend.entered.wait(10)
        with pytest.raises(concurrent.futures.TimeoutError):
            server.infer("tiny_a", x[1], timeout=0.1)
        assert first.result().ok
        snap = server.snapshot()
    # Never served, never answered: only the first request ran. (It is counted as cancelled once it
    # reached the queue; on a very slow machine the timeout may cancel it before it got there.)
    assert snap["requests"] == {"tiny_a": {"ok": 1}}
    assert len(factory.backend.spans) == 1
    assert snap["cancelled"] in ({"tiny_a": 1}, {})
