"""The exposition format, the histograms and the documented names, without an HTTP server."""

from __future__ import annotations

import hashlib
import math
import os
import re
import sys
import threading
import time
from pathlib import Path

import pytest
from metrics_support import ORIN_SYSFS, fake_pynvml, parse_samples, value
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families
from repo_paths import REPO
from runtime_support import config_dict, profiled_tiny_repository

from edgeserve.config.server import ListenConfig
from edgeserve.loop import run
from edgeserve.metrics import Family, render, render_metrics
from edgeserve.metrics import process as process_metrics
from edgeserve.metrics.accelerators import Accelerators
from edgeserve.oip.connections import HttpGuard
from edgeserve.runtime.counters import BusyWindow, Counters, FrontendStats, Histogram
from edgeserve.runtime.server import Server

DOCS = REPO / "docs" / "metrics.md"


def test_histogram_counts_a_value_on_a_bucket_bound_in_that_bucket_and_stays_cumulative() -> None:
    histogram = Histogram((0.001, 0.01, 0.1))
    for seconds in (0.0005, 0.001, 0.002, 0.01, 0.05, 3.0):
        histogram.observe(seconds)
    snap = histogram.snapshot()
    assert snap["buckets"] == [[0.001, 2], [0.01, 4], [0.1, 5], [math.inf, 6]]
    assert snap["count"] == 6 and snap["sum"] == pytest.approx(3.0635)
    assert len(histogram.counts) == 4  # memory is per bucket, not per observation


def test_histogram_refuses_bounds_that_are_not_increasing() -> None:
    with pytest.raises(ValueError, match="strictly increasing"):
        Histogram((0.1, 0.01))


def test_busy_window_reports_the_recent_share_and_forgets_old_batches() -> None:
    window = BusyWindow(window_s=10.0, slots=10, started=0.0)
    window.add(100.0, 102.5)  # spans three 1 s slots
    assert window.utilisation(105.0) == pytest.approx(2.5 / 9.0)  # slots 96..105 cover [96, 105]
    assert window.utilisation(115.0) == 0.0  # fell out of the window
    window.add(115.0, 115.5)
    assert window.utilisation(115.5) == pytest.approx(0.5 / 9.5)


def test_busy_window_right_after_start_divides_by_the_time_since_start() -> None:
    window = BusyWindow(window_s=10.0, slots=10, started=50.2)
    window.add(50.3, 50.7)
    assert window.utilisation(51.2) == pytest.approx(0.4 / 1.0)


def test_odd_label_values_and_help_text_are_escaped_and_parse_back_exactly() -> None:
    odd = 'cam "front"\\left\nnight'
    family = Family("edgeserve_requests_total", "counter", "help with \\ and\nnewline")
    family.add(3, model=odd, status="ok")
    text = render([family])
    assert '\\"front\\"' in text and "\\\\left" in text and "\\nnight" in text
    assert len(text.splitlines()) == 3  # the newline in the value did not break the line
    (parsed,) = text_string_to_metric_families(text)
    assert parsed.documentation == "help with \\ and\nnewline"
    assert parsed.samples[0].labels == {"model": odd, "status": "ok"}
    assert parsed.samples[0].value == 3


def test_counters_of_odd_model_names_render_to_parseable_series() -> None:
    counters = Counters()
    odd = 'we"ird\\model\n2'
    counters.requests[(odd, "ok")] += 2
    counters.observe_ok(odd, queued=1.0, start=1.001, end=1.003)
    counters.observe_batch(odd, 1.001, 1.003, 1)
    samples = parse_samples(render_metrics(counters.snapshot(), models=[odd]))
    assert value(samples, "nv_inference_request_success", model=odd, version="1") == 2
    assert value(samples, "edgeserve_request_duration_seconds_count", model=odd) == 1
    assert value(samples, "edgeserve_request_duration_seconds_bucket", model=odd, le="0.002") == 0
    assert value(samples, "edgeserve_request_duration_seconds_bucket", model=odd, le="0.003") == 1


def test_process_sample_reads_this_process_from_proc() -> None:
    sample = process_metrics.sample()
    assert sample.rss_bytes is not None and sample.rss_bytes > 1 << 20
    assert sample.cpu_seconds is not None and sample.cpu_seconds > 0
    assert sample.open_fds is not None and sample.open_fds >= 3
    assert sample.start_time_seconds is not None and sample.start_time_seconds > 1.6e9
    assert process_metrics.rss_bytes(2**22 + 12345) is None  # no such process


def test_a_thread_that_waits_for_a_cpu_has_its_wait_counted() -> None:
    """Two threads hashing (the GIL released) on one core: each waits while the other runs."""
    me = threading.get_native_id()
    if not hasattr(os, "sched_setaffinity") or process_metrics.thread_cpu_wait_s(me) is None:
        pytest.skip("no per-thread schedstat here")
    assert process_metrics.thread_cpu_wait_s(2**22 + 12345) is None  # no such thread
    core, data, waited = min(os.sched_getaffinity(0)), b"x" * (8 << 20), []
    together = threading.Barrier(2)

    def hash_on_one_core() -> None:
        os.sched_setaffinity(0, {core})
        tid = threading.get_native_id()
        together.wait()
        before = process_metrics.thread_cpu_wait_s(tid)
        end = time.monotonic() + 0.3
        while time.monotonic() < end:
            hashlib.sha256(data).digest()  # releases the GIL: both threads want the core
        after = process_metrics.thread_cpu_wait_s(tid)
        assert before is not None and after is not None
        waited.append(after - before)

    threads = [threading.Thread(target=hash_on_one_core) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(waited) == 2 and sum(waited) > 0.1, waited  # ~0.3 s of 0.6 s of wanting one core


def _documented_names() -> set[str]:
    rows = re.findall(r"^\| `([a-z_:]+)` \| (counter|gauge|histogram) \|", DOCS.read_text(), re.MULTILINE)
    return {name for name, _ in rows}


def test_every_documented_metric_is_exported_and_every_exported_one_is_documented(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Everything a scrape can carry: the accelerator families, absent by default, come from a
    recorded Jetson tree and a fake NVML; the same scrape parses in both formats."""
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([]))
    root = tmp_path / "engines"
    models = profiled_tiny_repository(root)

    async def main() -> dict:
        async with Server(config_dict(root)) as server:
            await server.infer_batch("tiny_a", models["tiny_a"].random_input(3))
            return server.snapshot()

    snapshot = run(main())
    # the offload part of the snapshot, in the shape Server.snapshot() carries it when upstreams exist
    snapshot["upstreams"] = {
        "edge-2": {"rtt_ms": 4.0, "bandwidth_mbps": 80.0, "state": "half-open", "sent": 5, "failed": 1,
                   "fallbacks": 2}
    }  # fmt: skip

    stats = FrontendStats(connections=1, requests=3, by_status={"ok": 3})
    guard = HttpGuard(ListenConfig())  # the HTTP listeners' counters, as NetServer's
    guard.add_listener("http")

    everything = {
        "models": ["tiny_a", "tiny_b"],
        "frontends": {"socket": stats},
        "process": process_metrics.sample(),
        "thread_waits": {"executor": 0.25, "loop": 0.5},
        "http": guard,
        "accelerators": Accelerators(ORIN_SYSFS).read(),
    }
    text = render_metrics(snapshot, **everything)
    openmetrics = render_metrics(snapshot, **everything, accept="application/openmetrics-text")
    assert {f.name for f in openmetrics_families(openmetrics)} == {
        f.name for f in text_string_to_metric_families(text)
    }
    families = {f.name: f for f in text_string_to_metric_families(text)}
    exported = {re.search(r"^# TYPE (\S+)", line).group(1) for line in text.splitlines() if "# TYPE" in line}
    documented = _documented_names()
    assert documented == exported
    assert len(families) == len(exported)
    samples = parse_samples(text)
    assert value(samples, "edgeserve_upstream_bandwidth_bytes_per_second", upstream="edge-2") == 1e7
    assert value(samples, "edgeserve_upstream_state", upstream="edge-2", state="half-open") == 1
    assert value(samples, "edgeserve_upstream_state", upstream="edge-2", state="open") == 0
    assert value(samples, "edgeserve_requests_total", model="tiny_a", status="ok") == 3
    assert value(samples, "edgeserve_requests_total", model="tiny_b", status="ok") == 0
    assert value(samples, "edgeserve_thread_cpu_wait_seconds_total", thread="loop") == 0.5
    assert set(snapshot["threads"]) == {"executor", "loop"}  # their native ids, for the endpoint


def test_without_upstreams_no_upstream_series_are_exported() -> None:
    text = render_metrics(Counters().snapshot(), models=["m"])
    assert "edgeserve_upstream" not in text
    assert value(parse_samples(text), "nv_inference_pending_request_count", model="m", version="1") == 0


def test_both_formats_carry_the_same_samples_and_parse_with_prometheus_parsers() -> None:
    counters = Counters()
    odd = 'cam "front"\\left\nnight'
    counters.requests[(odd, "ok")] += 2
    counters.requests[(odd, "rejected")] += 1
    counters.observe_ok(odd, queued=1.0, start=1.001, end=1.003)
    counters.observe_batch(odd, 1.001, 1.003, 1)
    stats = FrontendStats(connections=2, requests=3, by_status={"ok": 2, "rejected": 1})
    kwargs = {"models": [odd], "frontends": {"socket": stats}, "process": process_metrics.sample()}
    text = render_metrics(counters.snapshot(), **kwargs)
    openmetrics = render_metrics(counters.snapshot(), **kwargs, accept="application/openmetrics-text")
    assert text.startswith("# HELP") and openmetrics.endswith("# EOF\n")

    def samples(families) -> set:  # type: ignore[no-untyped-def]
        return {
            (s.name.removesuffix("_total"), frozenset(s.labels.items()), s.value)
            for f in families
            for s in f.samples
        }

    assert samples(text_string_to_metric_families(text)) == samples(openmetrics_families(openmetrics))
    # Triton's counters keep their names (no _total) in both formats
    for body in (text, openmetrics):
        assert re.search(r'^nv_inference_request_success\{.*model="cam', body, re.MULTILINE)
        assert "nv_inference_request_success_total" not in body
    assert "# TYPE edgeserve_requests_total counter" in text
    assert "# TYPE edgeserve_requests counter" in openmetrics and "edgeserve_requests_total{" in openmetrics


def test_the_exposition_is_prometheus_clients_not_a_hand_written_one() -> None:
    source = (REPO / "edgeserve" / "metrics" / "exposition.py").read_text()
    assert "choose_encoder" in source and "# TYPE" not in source and "# HELP" not in source
