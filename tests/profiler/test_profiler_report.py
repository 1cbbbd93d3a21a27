"""The printed table flags exactly the cells whose spread makes the scheduler's predictions unreliable."""

from __future__ import annotations

import numpy as np
import pytest

from edgeserve.fingerprint import Fingerprint
from edgeserve.profile import ProfileCell, ProfileTable
from edgeserve.profiler.report import MAX_LISTED, NOISY_MARK, format_noisy, format_table, noisy_cells

FINGERPRINT = Fingerprint(backend="onnxruntime", device="Test CPU", threads=1)


def _samples_with_cv(mean: float, cv: float) -> list[float]:
    """Half the samples at mean*(1-cv), half at mean*(1+cv): population std/mean is exactly cv."""
    return [mean * (1 - cv)] * 10 + [mean * (1 + cv)] * 10


def _table(cvs: dict[tuple[int, int], float], max_batch: int = 3) -> ProfileTable:
    table = ProfileTable(
        model="m",
        exit_names=("early", "final"),
        max_batch=max_batch,
        fingerprint=FINGERPRINT,
        graphs_sha256="0" * 64,
        settings={"repeats": 20, "warmup": 2},
        created="2024-01-01T00:00:00+00:00",
    )
    for e in range(2):
        for b in range(1, max_batch + 1):
            table.add(ProfileCell.from_samples(e, b, _samples_with_cv(1.0 + e + b, cvs.get((e, b), 0.0))))
    return table


def test_samples_of_known_spread_give_that_cv() -> None:
    assert _table({(0, 2): 0.2}).cell(0, 2).stats.cv == pytest.approx(0.2, rel=1e-3)


def test_report_flags_exactly_the_cells_above_the_threshold() -> None:
    table = _table({(0, 2): 0.25, (1, 3): 0.12, (1, 1): 0.08})
    assert [(c.exit_name, c.batch) for c in noisy_cells([table], 0.10)] == [("early", 2), ("final", 3)]

    text = format_table(table, "p95", 0.10)
    cv_rows = [line for line in text.splitlines() if line.split()[:1] == ["CV"]]
    assert len(cv_rows) == 2
    marks = [[v.endswith(NOISY_MARK) for v in row.split()[1:]] for row in cv_rows]
    assert marks == [[False, True, False], [False, False, True]]

    advice = format_noisy([table], 0.10)
    assert "2 cells with CV above 10%" in advice
    assert "m exit early batch 2: CV 25.0%" in advice and "m exit final batch 3: CV 12.0%" in advice
    assert "batch 1" not in advice and "close other programs" in advice and "--threads" in advice


def test_long_noisy_list_shows_the_worst_cells_and_counts_the_rest() -> None:
    cvs = {(e, b): 0.11 + 0.01 * (3 * e + b) for e in range(2) for b in range(1, 11)}
    advice = format_noisy([_table(cvs, max_batch=10)], 0.10)
    listed = [line for line in advice.splitlines() if ": CV " in line]
    assert len(listed) == MAX_LISTED and "final batch 10: CV 24.0%" in advice
    assert "early batch 1: CV" not in advice and f"and {20 - MAX_LISTED} more" in advice


def test_higher_threshold_flags_nothing_and_prints_no_advice() -> None:
    table = _table({(0, 2): 0.25})
    assert format_noisy([table], 0.30) == ""
    assert NOISY_MARK not in format_table(table, "p95", 0.30).split("\n", 1)[1]


def test_table_has_a_row_group_per_exit_and_a_column_per_batch() -> None:
    table = _table({}, max_batch=4)
    lines = format_table(table, "p99").splitlines()
    assert lines[0].startswith("m: latency in ms") and "Test CPU" in lines[0] and "20 timed runs" in lines[0]
    assert lines[1].split()[-4:] == ["b=1", "b=2", "b=3", "b=4"]
    assert [line.split()[0] for line in lines[2:] if not line.startswith(" ")] == ["early", "final"]
    sched = [line for line in lines if "p99 <- scheduler" in line]
    assert len(sched) == 2
    expected = f"{table.latency_ms(1, 4, 'p99'):.2f}"
    assert sched[1].split()[-1] == expected
    assert sum("p50" in line for line in lines) == 2


def test_cells_of_very_different_magnitude_stay_readable() -> None:
    table = _table({})
    table.add(ProfileCell.from_samples(1, 3, np.full(5, 1234.5)))
    assert "1234.5" in format_table(table)
