"""The emulated accelerator: a real Server over tiny models whose batches take a stored profile's time.

The profile is one "measured on a Jetson" (tests/emulated_support.py), stored with `edgeserve-profile
--import` in a subprocess. Timing is asserted as a lower bound only: a batch holds the executor at
least its cell's smallest sample times the slowdown (less the nap's bounded early wake-up).
"""

from __future__ import annotations

import asyncio
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from emulated_support import JETSON, OTHER, import_table, samples_ms, table_for, write_table
from tiny_onnx import write_tiny_repository

from edgeserve.config.checks import ConfigError
from edgeserve.config.reload import ReloadRefused, check_reloadable
from edgeserve.config.server import BackendConfig, ServerConfig
from edgeserve.errors import InputError, ProfileError
from edgeserve.loop import run
from edgeserve.manifest import Manifest
from edgeserve.repository import ModelRepository
from edgeserve.runtime.backends.emulated import EARLY_MAX_S, EmulatedBackend
from edgeserve.runtime.backends.select import choose_backend, create_backend
from edgeserve.runtime.results import Result, Status
from edgeserve.runtime.server import Server

SLOWDOWN = 2.0
MODELS = ("tiny_a", "tiny_b")


@pytest.fixture(scope="module")
def jetson_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny models with the Jetson's tables imported as a user would."""
    base = tmp_path_factory.mktemp("emulated")
    root = base / "engines"
    models = write_tiny_repository(root)
    for name, tiny in models.items():
        source = write_table(base / f"{name}-jetson.json", table_for(tiny.manifest))
        done = import_table(root, source, name)
        assert done.returncode == 0, done.stderr
    return root


def _copy(root: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "engines"
    shutil.copytree(root, copy)
    return copy


def _config(root: Path, **backend: Any) -> dict[str, Any]:
    return {
        "repository": str(root),
        "shutdown_timeout_s": 5.0,
        "backend": {"name": "emulated", **backend},
        "models": {name: {"slo_ms": 2000, "max_queue": 64} for name in MODELS},
    }


def _manifests(root: Path) -> dict[str, Manifest]:
    repository = ModelRepository(root)
    return {name: repository.load_manifest(name) for name in MODELS}


def _serve(config: dict[str, Any], requests: dict[str, int]) -> tuple[list[Result], dict[str, Any]]:
    manifests = _manifests(Path(config["repository"]))

    async def main() -> tuple[list[Result], dict[str, Any]]:
        async with Server(config) as server:
            calls = []
            for name, n in requests.items():
                spec = manifests[name].input
                x = np.random.default_rng(1).standard_normal((n, *spec.shape)).astype(spec.dtype)
                calls += [server.infer(name, xi) for xi in x]
            results = await asyncio.gather(*calls)
            planned = {
                name: [[model.latency(e, b) for b in range(1, 5)] for e in range(len(manifests[name].exits))]
                for name, model in zip(MODELS, server.latency_model.models, strict=True)
            }
            return list(results), planned

    return run(main())


def test_a_server_answers_with_the_manifests_outputs_at_the_profiles_pace(jetson_root: Path) -> None:
    config = _config(jetson_root, slowdown=SLOWDOWN)
    results, planned = _serve(config, {"tiny_a": 14, "tiny_b": 9})
    again, _ = _serve(config, {"tiny_a": 14, "tiny_b": 9})
    manifests = _manifests(jetson_root)
    for r in results:
        assert r.status is Status.OK, r.error
        assert r.exit_index is not None and r.outputs is not None
        specs = manifests[r.model].exit_outputs(r.exit_index)
        assert len(r.outputs) == len(specs)
        for (name, value), spec in zip(r.outputs.items(), specs, strict=True):
            assert value.shape == spec.shape and value.dtype == np.dtype(spec.dtype), (name, spec)
        # the batch held the executor at least its cell's fastest sample, times the slowdown
        fastest_s = min(samples_ms(r.exit_index, r.batch_size, 2.0)) * SLOWDOWN / 1000.0
        assert r.end - r.start >= fastest_s - EARLY_MAX_S, (r.exit_index, r.batch_size)
    for a, b in zip(results, again, strict=True):  # deterministic outputs
        assert a.outputs is not None and b.outputs is not None
        for x, y in zip(a.outputs.values(), b.outputs.values(), strict=True):
            assert np.array_equal(x, y)
    # the scheduler planned with the imported profile, scaled by the slowdown
    table = ModelRepository(jetson_root).load_profile(manifests["tiny_a"], JETSON)
    np.testing.assert_allclose(planned["tiny_a"], table.matrix("p95") * SLOWDOWN / 1000.0, rtol=1e-3)


def test_a_batch_waits_without_using_a_cpu_or_holding_the_gil(jetson_root: Path) -> None:
    backend = EmulatedBackend(ModelRepository(jetson_root), slowdown=10.0)  # 20-25 ms a batch
    manifest = _manifests(jetson_root)["tiny_a"]
    backend.load(manifest)
    x = np.zeros((2, *manifest.input.shape), dtype=manifest.input.dtype)
    counts = [0]
    stop = threading.Event()

    def count() -> None:
        while not stop.is_set():
            counts[0] += 1

    other = threading.Thread(target=count)
    other.start()
    try:
        time.sleep(0.01)
        before, start, cpu = counts[0], time.monotonic(), time.thread_time()
        out = backend.run_outputs("tiny_a", 2, x)
        wall, used, counted = time.monotonic() - start, time.thread_time() - cpu, counts[0] - before
    finally:
        stop.set()
        other.join()
    assert wall >= min(samples_ms(2, 2, 2.0)) * 10.0 / 1000.0 - EARLY_MAX_S
    assert used < 0.25 * wall  # asleep, not spinning
    assert counted > 1000  # another Python thread ran meanwhile: the GIL was free
    assert list(out) == [t.name for t in manifest.exit_outputs(2)]


def test_the_drawn_latencies_are_the_cells_samples_and_follow_the_seed(jetson_root: Path) -> None:
    def draws(seed: int) -> list[float]:
        backend = EmulatedBackend(ModelRepository(jetson_root), slowdown=3.0, seed=seed)
        backend.load(_manifests(jetson_root)["tiny_b"])
        return [backend.latency_s("tiny_b", 1, 3) for _ in range(40)]

    first = draws(0)
    assert first == draws(0) and first != draws(1)
    allowed = {round(s * 3.0 / 1000.0, 9) for s in samples_ms(1, 3, 2.0)}
    assert {round(d, 9) for d in first} == allowed  # every sample drawn, nothing else


def test_bad_requests_are_input_errors_as_with_any_backend(jetson_root: Path) -> None:
    backend = create_backend("emulated", ModelRepository(jetson_root))
    manifest = _manifests(jetson_root)["tiny_a"]
    x = np.zeros((1, *manifest.input.shape), dtype=manifest.input.dtype)
    with pytest.raises(InputError, match=r"'tiny_a' is not loaded \(loaded: none\)"):
        backend.run("tiny_a", 0, x)
    backend.load(manifest)
    with pytest.raises(InputError, match=r"exits 0\.\.2"):
        backend.run("tiny_a", 3, x)
    with pytest.raises(InputError, match="convert it"):
        backend.run("tiny_a", 0, x.astype(np.float64))
    assert backend.fingerprint() == JETSON and backend.inline_safe is False
    backend.close()
    with pytest.raises(InputError, match="not loaded"):
        backend.run("tiny_a", 0, x)


def _start(config: dict[str, Any]) -> None:
    async def main() -> None:
        async with Server(config):
            pass

    run(main())


def test_several_stored_profiles_need_the_fingerprint_key(jetson_root: Path, tmp_path: Path) -> None:
    root = _copy(jetson_root, tmp_path)
    for name, manifest in _manifests(root).items():
        done = import_table(root, write_table(tmp_path / f"{name}.json", table_for(manifest, OTHER)), name)
        assert done.returncode == 0, done.stderr
    with pytest.raises(ProfileError) as refused:
        _start(_config(root))
    message = str(refused.value)
    assert JETSON.key() in message and OTHER.key() in message
    assert "tensorrt on Jetson Orin Nano (test)" in message
    assert 'set [backend] fingerprint = "KEY"' in message

    results, _ = _serve(_config(root, fingerprint=OTHER.key()), {"tiny_a": 3})
    assert all(r.status is Status.OK for r in results)


def test_no_stored_profile_names_the_import_command(tmp_path: Path) -> None:
    root = tmp_path / "engines"
    write_tiny_repository(root)
    with pytest.raises(ProfileError, match=r"edgeserve-profile --import TABLE\.json --model tiny_a"):
        _start(_config(root))


def test_a_key_one_model_lacks_is_refused_with_the_import_command(jetson_root: Path, tmp_path: Path) -> None:
    root = _copy(jetson_root, tmp_path)
    manifest = _manifests(root)["tiny_a"]
    done = import_table(root, write_table(tmp_path / "t.json", table_for(manifest, OTHER)), "tiny_a")
    assert done.returncode == 0, done.stderr
    with pytest.raises(ProfileError, match=r"model 'tiny_b' has no stored profile .*--model tiny_b"):
        _start(_config(root, fingerprint=OTHER.key()))


def _backend_config(**backend: Any) -> ServerConfig:
    return ServerConfig.from_dict(
        {"backend": {"name": "emulated", **backend}, "models": {"m": {"slo_ms": 50}}}
    )


def test_the_backend_keys_are_checked_and_need_a_restart() -> None:
    config = _backend_config(slowdown=4, fingerprint="a-b_1.c")
    assert (config.backend.slowdown, config.backend.fingerprint) == (4.0, "a-b_1.c")
    assert (BackendConfig().slowdown, BackendConfig().fingerprint) == (1.0, None)
    for bad in (0, -1.0, "2", True, float("inf")):
        with pytest.raises(ConfigError, match=r"backend\.slowdown: must be a number > 0"):
            _backend_config(slowdown=bad)
    for bad in ("../x", "", 3):
        with pytest.raises(ConfigError, match=r"backend\.fingerprint: must be a stored profile's key"):
            _backend_config(fingerprint=bad)
    with pytest.raises(ReloadRefused, match=r"backend\.slowdown"):
        check_reloadable(config, _backend_config(slowdown=8, fingerprint="a-b_1.c"))


def test_auto_never_picks_the_emulated_backend() -> None:
    def nothing(name: str) -> None:
        return None

    auto = choose_backend("auto", find_spec=nothing, has_gpu=lambda: False, ort_providers=lambda: [])
    assert auto.name == "onnxruntime" and choose_backend("emulated").name == "emulated"
