"""Measuring a profile on real sessions: every cell present, sane statistics, saved and reloaded."""

from __future__ import annotations

import gc

import numpy as np
import pytest
from tiny_onnx import TinyRepository

from edgeserve.profiler.measure import MeasureSettings, measure_model, time_cell
from edgeserve.runtime.backends.onnxruntime import OnnxRuntimeBackend


def test_short_profile_has_every_cell_with_ordered_positive_latencies(
    tiny_repository: TinyRepository,
) -> None:
    repository = tiny_repository.repository
    manifest = repository.load_manifest("tiny_b")
    backend = OnnxRuntimeBackend(repository, threads=1, warmup=0)
    backend.load(manifest)
    settings = MeasureSettings(max_batch=3, repeats=5, warmup=2)
    visited: list[tuple[int, int]] = []
    table = measure_model(backend, manifest, settings, on_cell=lambda e, b: visited.append((e, b)))

    assert sorted(table.cells) == [(e, b) for e in range(2) for b in (1, 2, 3)]
    assert visited == sorted(table.cells)
    table.check_complete()
    for cell in table.cells.values():
        assert len(cell.samples_ms) == 5 and min(cell.samples_ms) > 0
        s = cell.stats
        assert 0 < s.p50_ms <= s.p95_ms <= s.p99_ms and np.isfinite(s.cv) and s.cv >= 0
    assert table.settings == {"max_batch": 3, "repeats": 5, "warmup": 2, "seed": 0, "threads": 1}
    assert table.created and table.graphs_sha256 == manifest.graphs_sha256()
    assert table.fingerprint == backend.fingerprint()

    repository.save_profile(table)
    assert repository.load_profile(manifest, backend.fingerprint()) == table


def test_timing_restores_the_garbage_collector(tiny_repository: TinyRepository) -> None:
    backend = OnnxRuntimeBackend(tiny_repository.repository, threads=1, warmup=0)
    backend.load(tiny_repository.models["tiny_a"].manifest)
    x = tiny_repository.models["tiny_a"].random_input(2)
    assert gc.isenabled()
    samples = time_cell(backend, "tiny_a", 1, x, repeats=4, warmup=1)
    assert len(samples) == 4 and all(s > 0 for s in samples)
    assert gc.isenabled()


def test_settings_match_only_the_same_measurement() -> None:
    settings = MeasureSettings(max_batch=4, repeats=20, warmup=3)
    assert settings.matches({**settings.to_dict(), "threads": 1})
    assert not settings.matches({**settings.to_dict(), "repeats": 21})
    assert not settings.matches({"max_batch": 4})
    with pytest.raises(ValueError):
        MeasureSettings(repeats=0)
