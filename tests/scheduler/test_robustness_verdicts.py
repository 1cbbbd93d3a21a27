"""benchmarks/policy_robustness.py's verdicts: `beaten` is the issue's criterion on means over
seeds; `verdict_support` says how often it survives a paired resampling of those seeds."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from types import ModuleType

import pytest
from repo_paths import REPO


@pytest.fixture(scope="module")
def robustness() -> Iterator[ModuleType]:
    path = REPO / "benchmarks" / "policy_robustness.py"
    spec = importlib.util.spec_from_file_location("policy_robustness", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


def _rows(default: list[float], rival: list[float], accuracy: float = 90.0) -> list[dict]:
    cell = {"profile": "p", "workload": "w", "load": 1.0, "p95_ms": 10.0, "slo_ms": 50.0}
    return [
        {**cell, "policy": policy, "seed": seed, "violation_pct": v, "accuracy_pct": accuracy}
        for policy, values in (("default", default), ("rival", rival))
        for seed, v in enumerate(values)
    ]


def test_a_loss_on_every_seed_holds_in_every_resample(robustness: ModuleType) -> None:
    rows = _rows([2.0, 2.2, 1.9, 2.1, 2.0, 2.3], [1.0, 1.1, 0.9, 1.2, 1.0, 1.1])
    assert robustness.verdict_support(rows, ("p", "w", 1.0), "default", "rival") == 1.0


def test_a_loss_made_by_one_seed_is_marked_as_seed_noise(robustness: ModuleType) -> None:
    # the means differ by 0.3 point (beaten: more than max(0.05, 10 %)), all of it from seed 0
    rows = _rows([2.8, 1.0, 1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    means = robustness.aggregate(rows)
    assert robustness.beaten(means[("p", "w", 1.0, "default")], means[("p", "w", 1.0, "rival")])
    support = robustness.verdict_support(rows, ("p", "w", 1.0), "default", "rival")
    assert 0.5 < support < 0.8  # the resamples without seed 0 (about 1/e of them) clear the default


def test_a_rival_less_accurate_by_more_than_half_a_point_never_beats(robustness: ModuleType) -> None:
    rows = _rows([2.0] * 4, [1.0] * 4)
    for r in rows:
        if r["policy"] == "rival":
            r["accuracy_pct"] = 89.0
    assert robustness.verdict_support(rows, ("p", "w", 1.0), "default", "rival") == 0.0
