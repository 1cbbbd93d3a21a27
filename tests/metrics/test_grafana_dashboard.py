"""The Grafana dashboard in docs/grafana queries only metrics the endpoint exports, and the
committed JSON is what its generator writes."""

from __future__ import annotations

import importlib.util
import json
import re
import sys

import pytest
from metrics_support import ORIN_SYSFS, fake_pynvml
from repo_paths import REPO

from edgeserve.metrics import process
from edgeserve.metrics.accelerators import Accelerators
from edgeserve.metrics.catalog import render_metrics
from edgeserve.runtime.counters import Counters, FrontendStats

GRAFANA = REPO / "docs" / "grafana"


def _generator():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("make_dashboard", GRAFANA / "make_dashboard.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _exported_series(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """Every series name a scrape can carry (upstream, process and accelerator metrics included:
    a recorded Jetson tree and a fake NVML): the families' names, and a histogram's _bucket, _sum
    and _count."""
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([]))
    snapshot = Counters().snapshot()
    snapshot["upstreams"] = {
        "u": {"rtt_ms": 1.0, "bandwidth_mbps": 1.0, "state": "closed", "sent": 0, "failed": 0, "fallbacks": 0}
    }
    text = render_metrics(
        snapshot,
        models=["m"],
        frontends={"socket": FrontendStats()},
        process=process.sample(),
        accelerators=Accelerators(ORIN_SYSFS).read(),
    )
    names: set[str] = set()
    for _, name, kind in re.findall(r"^# TYPE ((\S+) (\S+))$", text, flags=re.MULTILINE):
        names.add(name)
        if kind == "histogram":
            names.update(f"{name}_{suffix}" for suffix in ("bucket", "sum", "count"))
    return names


def test_every_dashboard_query_names_exported_series(monkeypatch: pytest.MonkeyPatch) -> None:
    exported = _exported_series(monkeypatch)
    dashboard = json.loads((GRAFANA / "edgeserve-dashboard.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    assert len(exprs) >= 10
    for expr in exprs:
        names = set(re.findall(r"\b((?:edgeserve|nv|process)_[a-z_]+)\b", expr))
        assert names and names <= exported, (expr, names - exported)


def test_committed_dashboard_is_what_the_generator_writes() -> None:
    committed = json.loads((GRAFANA / "edgeserve-dashboard.json").read_text())
    assert committed == _generator().dashboard(), "run: python docs/grafana/make_dashboard.py"
