"""The profile table: JSON round trips, statistics recomputed from samples, the scheduler's matrix."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgeserve.errors import ProfileError
from edgeserve.fingerprint import Fingerprint
from edgeserve.profile import CellStats, ProfileCell, ProfileTable

FINGERPRINT = Fingerprint(
    backend="onnxruntime",
    device="Test CPU",
    threads=2,
    providers=("CPUExecutionProvider",),
    versions={"ort": "1"},
)


def _table(max_batch: int = 3, exits: tuple[str, ...] = ("early", "final")) -> ProfileTable:
    table = ProfileTable(
        model="m",
        exit_names=exits,
        max_batch=max_batch,
        fingerprint=FINGERPRINT,
        graphs_sha256="a" * 64,
        settings={"repeats": 4, "warmup": 1},
        created="2024-01-01T00:00:00+00:00",
    )
    for e in range(len(exits)):
        for b in range(1, max_batch + 1):
            base = 1.0 + e + 0.5 * b
            table.add(ProfileCell.from_samples(e, b, [base, base * 1.1, base * 0.9, base * 1.3]))
    return table


def test_profile_table_round_trips_through_json(tmp_path: Path) -> None:
    table = _table()
    table.save(tmp_path / "p.json")
    assert ProfileTable.load(tmp_path / "p.json") == table


def test_loaded_statistics_are_recomputed_from_the_samples(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    _table().save(path)
    data = json.loads(path.read_text())
    data["cells"][0]["p95_ms"] = 999.0  # a hand-edited statistic does not survive loading
    data["cells"][0]["samples_ms"] = [2.0, 2.0, 2.0, 6.0]
    path.write_text(json.dumps(data))
    cell = ProfileTable.load(path).cell(0, 1)
    assert cell.stats.mean_ms == pytest.approx(3.0)
    assert cell.stats.p50_ms == pytest.approx(2.0)
    assert cell.stats.p95_ms == pytest.approx(np.percentile([2, 2, 2, 6], 95))
    assert cell.stats.cv == pytest.approx(np.std([2, 2, 2, 6]) / 3.0)


def test_matrix_is_indexed_by_exit_and_batch_minus_one() -> None:
    table = _table()
    matrix = table.matrix("p50")
    assert matrix.shape == (2, 3)
    assert matrix[1, 2] == pytest.approx(table.latency_ms(1, 3, "p50"))
    assert not np.isnan(matrix).any()


def test_missing_cell_says_how_to_measure_it() -> None:
    with pytest.raises(ProfileError, match="--max-batch"):
        _table().cell(0, 4)


def test_unknown_quantile_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="p95"):
        _table().latency_ms(0, 1, "p42")


def test_other_profile_schema_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    data = _table().to_dict()
    data["schema_version"] = 0
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileError, match="schema_version") as err:
        ProfileTable.load(path)
    assert str(path) in str(err.value) and "edgeserve-profile" in str(err.value)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(min_value=0.001, max_value=1e4), min_size=1, max_size=60))
def test_cell_statistics_are_ordered_and_cv_is_finite(samples: list[float]) -> None:
    stats = CellStats.of(np.asarray(samples))
    assert stats.p50_ms <= stats.p90_ms <= stats.p95_ms <= stats.p99_ms
    assert min(samples) <= stats.mean_ms * (1 + 1e-9) and stats.mean_ms <= max(samples) * (1 + 1e-9)
    assert stats.cv >= 0 and math.isfinite(stats.cv)
