"""The online latency calibrator on the paper's synthetic profile: robust, bounded, with hysteresis."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from edgeserve.runtime import calibration as cal
from edgeserve.runtime.calibration import LatencyCalibrator
from edgeserve.runtime.calibration_store import calibrated_path, load_calibrated, save_calibrated
from edgeserve.scheduler import LatencyModel, make_policy
from edgeserve.scheduler.synthetic import paper_gpu_profiles


@pytest.fixture
def latency() -> LatencyModel:
    return LatencyModel.from_profiles(paper_gpu_profiles(samples=50))


def _feed(c: LatencyCalibrator, model: int, exit_id: int, batch: int, factor: float, n: int, t0: float = 0.0):
    typical = c.latency.models[model].typical
    assert typical is not None
    seconds = float(typical[exit_id, batch - 1]) * factor
    lines = []
    for i in range(n):
        lines += c.observe(model, exit_id, batch, seconds, t0 + 0.1 * i)
    return lines


def test_nominal_batches_leave_the_profile_untouched(latency: LatencyModel) -> None:
    before = latency.padded.copy()
    c = LatencyCalibrator(latency)
    assert _feed(c, 0, 3, 5, 1.03, 50) == []  # inside the band: no drift, no change
    assert not c.drifting(0)
    np.testing.assert_array_equal(latency.padded, before)


def test_a_slowdown_is_seen_logged_and_used_by_the_policy_without_rebuilding_it(
    latency: LatencyModel,
) -> None:
    c = LatencyCalibrator(latency)
    policy = make_policy("stability-safe", latency)
    base_final = latency.models[2].latency(3, 5)
    lines = _feed(c, 2, 3, 5, 1.5, 30)
    assert len(lines) == 1 and lines[0].startswith("latency drift started: ResNet152 runs at 1.5")
    assert latency.models[2].latency(3, 5) == pytest.approx(1.5 * base_final, rel=0.02)
    # A cell never run is scaled with its neighbours (the model's estimate)...
    assert latency.models[2].latency(0, 1) == pytest.approx(1.5 * float(c._models[2].base[0, 0]), rel=0.02)
    # ...other models keep their profile.
    assert latency.models[0].seconds[3, 4] == pytest.approx(c._models[0].base[3, 4])
    assert latency.padded[2, 3, 4] == latency.models[2].latency(3, 5)  # the numpy scorer's copy too
    assert policy.latency is latency
    # Recovery ends the drift (hysteresis: only once back inside the narrower band).
    assert _feed(c, 2, 3, 5, 1.15, 40, t0=10.0) == []
    lines = _feed(c, 2, 3, 5, 1.0, 40, t0=20.0)
    assert len(lines) == 1 and lines[0].startswith("latency drift ended: ResNet152")
    assert latency.models[2].latency(3, 5) == pytest.approx(base_final)


def test_a_model_that_flaps_at_the_bands_edge_is_followed_at_once_but_logged_once_a_minute(
    latency: LatencyModel,
) -> None:
    c = LatencyCalibrator(latency)
    lines = _feed(c, 1, 3, 5, 1.5, 30) + _feed(c, 1, 3, 5, 1.0, 30, t0=3.0)
    assert [line.split(":")[0] for line in lines] == ["latency drift started", "latency drift ended"]
    flaps = []
    for k in range(5):  # 5 more starts and ends within the next 30 s: the scheduler follows each
        t = 6.0 + 6 * k
        flaps += _feed(c, 1, 3, 5, 1.5, 30, t0=t)
        assert c.drifting(1)
        flaps += _feed(c, 1, 3, 5, 1.0, 30, t0=t + 3.0)
        assert not c.drifting(1)
    assert flaps == []
    # A minute after the last message, the next change is logged with the count of the unlogged ones.
    lines = _feed(c, 1, 3, 5, 1.5, 30, t0=3.0 + 2.9 + cal.LOG_QUIET_S)
    assert len(lines) == 1 and lines[0].startswith("latency drift started: ResNet101")
    assert "10 more drift starts and ends since the last message, not logged" in lines[0]
    # Its end, as ever, is logged at once.
    lines = _feed(c, 1, 3, 5, 1.0, 30, t0=70.0)
    assert len(lines) == 1 and lines[0].startswith("latency drift ended: ResNet101")


def test_outliers_are_clipped_and_cannot_start_a_drift(latency: LatencyModel) -> None:
    c = LatencyCalibrator(latency)
    typical = float(latency.models[1].typical[2, 0])
    lines = []
    for i in range(200):
        seconds = typical * (50.0 if i % 5 == 0 else 1.0)  # one batch in five stalls 50x
        lines += c.observe(1, 2, 1, seconds, 0.01 * i)
    assert lines == [] and not c.drifting(1)
    assert max(c._models[1].cells[(2, 1)]) == cal.CLIP


def test_memory_is_bounded_whatever_the_number_of_batches(latency: LatencyModel) -> None:
    c = LatencyCalibrator(latency)
    _feed(c, 0, 1, 3, 1.0, 5000)
    state = c._models[0]
    assert len(state.ratios) == cal.MODEL_WINDOW and len(state.cells[(1, 3)]) == cal.CELL_WINDOW


def test_updates_are_rate_limited(latency: LatencyModel) -> None:
    c = LatencyCalibrator(latency, min_interval_s=0.5)
    typical = float(latency.models[0].typical[3, 0])
    for i in range(40):  # 40 batches in 0.2 s
        c.observe(0, 3, 1, typical * 2.0, 100.0 + 0.005 * i)
    assert c.drifting(0)
    assert c.updates <= 1  # at most one publish inside the interval; the next one waits
    c.observe(0, 3, 1, typical * 2.0, 101.0)
    assert latency.models[0].latency(3, 1) == pytest.approx(2.0 * c._models[0].base[3, 0], rel=0.02)


def test_unknown_exits_failed_batches_and_bad_sizes_are_ignored(latency: LatencyModel) -> None:
    c = LatencyCalibrator(latency)
    assert c.observe(0, 9, 1, 0.01, 0.0) == []
    assert c.observe(0, 0, 11, 0.01, 0.0) == []
    assert c.observe(0, 0, 1, float("nan"), 0.0) == []
    assert c.cells() == []


def test_calibrated_tables_round_trip_as_json(latency: LatencyModel, tmp_path: Path) -> None:
    c = LatencyCalibrator(latency)
    _feed(c, 2, 3, 5, 1.5, 30)
    paths = save_calibrated(tmp_path, "somekey", c.calibrated())
    assert calibrated_path(tmp_path, "ResNet152", "somekey") in paths
    data = load_calibrated(calibrated_path(tmp_path, "ResNet152", "somekey"))
    assert data["drifting"] is True and data["scale"] == pytest.approx(1.5, rel=0.02)
    assert data["latency_ms"][3][4] == pytest.approx(1.5 * data["profile_ms"][3][4], rel=0.02)
    json.dumps(c.cells())  # metrics snapshot is plain data


def test_edgeserve_profile_folds_the_calibrated_table_into_the_stored_profile(
    latency: LatencyModel, tmp_path: Path, capsys
) -> None:
    from edgeserve.profiler.cli import build_parser
    from edgeserve.repository import ModelRepository

    tables = paper_gpu_profiles(samples=50)
    repository = ModelRepository(tmp_path)
    stored = repository.save_profile(tables[2])
    c = LatencyCalibrator(latency)
    _feed(c, 2, 3, 5, 1.5, 30)
    save_calibrated(tmp_path, tables[2].fingerprint.key(), c.calibrated())
    args = build_parser().parse_args(
        ["--repository", str(tmp_path), "--model", "ResNet152", "--write-calibrated"]
    )
    assert args.func(args) == 0
    assert "ResNet152: 40 cells rescaled" in capsys.readouterr().out
    from edgeserve.profile import ProfileTable

    after = ProfileTable.load(stored)
    assert after.latency_ms(3, 5) == pytest.approx(latency.models[2].latency(3, 5) * 1000.0, rel=1e-3)
    assert after.settings["calibrated"]["scale"] == pytest.approx(1.5, rel=0.02)


def test_the_calibration_key_is_validated() -> None:
    from edgeserve.config.checks import ConfigError
    from edgeserve.config.server import ServerConfig

    base = {"repository": ".", "models": {"m": {"slo_ms": 50}}}
    assert ServerConfig.from_dict(base).scheduler.calibration is True
    assert (
        ServerConfig.from_dict({**base, "scheduler": {"calibration": False}}).scheduler.calibration is False
    )
    with pytest.raises(ConfigError, match=r"scheduler\.calibration"):
        ServerConfig.from_dict({**base, "scheduler": {"calibration": "yes"}})
