"""Accelerator metrics: a recorded Jetson AGX Orin sysfs tree, a fake NVML, a machine with neither,
both exposition formats, and reading off the event loop."""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
from pathlib import Path

import aiohttp
import pytest
from metrics_support import ORIN_SYSFS, fake_pynvml, parse_samples, value
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families

from edgeserve.config.server import MetricsConfig
from edgeserve.loop import run
from edgeserve.metrics import render, render_metrics
from edgeserve.metrics.accelerators import Accelerators, Nvml, jetson_families
from edgeserve.metrics.endpoint import MetricsEndpoint
from edgeserve.runtime.counters import Counters

OPENMETRICS = "application/openmetrics-text; version=1.0.0"
JETSON_FAMILIES = {
    "edgeserve_jetson_gpu_load",
    "edgeserve_jetson_rail_voltage_volts",
    "edgeserve_jetson_rail_current_amperes",
    "edgeserve_jetson_rail_power_watts",
    "edgeserve_jetson_temperature_celsius",
    "edgeserve_jetson_clock_hertz",
    "edgeserve_jetson_nvpmodel_mode",
}
NVML_FAMILIES = {
    "nv_gpu_utilization",
    "nv_gpu_memory_total_bytes",
    "nv_gpu_memory_used_bytes",
    "nv_gpu_power_usage",
    "nv_gpu_power_limit",
    "nv_energy_consumption",
}


def _no_nvml() -> Nvml:
    def missing():  # type: ignore[no-untyped-def]
        raise ImportError("No module named 'pynvml'")

    return Nvml(load=missing)


def test_every_jetson_metric_reads_from_a_recorded_orin_tree() -> None:
    families = Accelerators(ORIN_SYSFS, nvml=_no_nvml()).read()
    assert {f.name for f in families} == JETSON_FAMILIES
    samples = parse_samples(render(families))
    assert value(samples, "edgeserve_jetson_gpu_load") == pytest.approx(0.372)
    assert value(samples, "edgeserve_jetson_rail_voltage_volts", rail="VDD_GPU_SOC") == pytest.approx(4.984)
    assert value(samples, "edgeserve_jetson_rail_current_amperes", rail="VDD_GPU_SOC") == pytest.approx(1.208)
    assert value(samples, "edgeserve_jetson_rail_power_watts", rail="VDD_GPU_SOC") == pytest.approx(
        4.984 * 1.208
    )
    assert value(samples, "edgeserve_jetson_rail_power_watts", rail="VDDQ_VDD2_1V8AO") == pytest.approx(
        4.992 * 0.160
    )
    rails = {dict(labels)["rail"] for name, labels in samples if name == "edgeserve_jetson_rail_power_watts"}
    assert rails == {"VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0", "VDDQ_VDD2_1V8AO"}  # not the NC channels
    assert value(samples, "edgeserve_jetson_temperature_celsius", zone="gpu-thermal") == pytest.approx(46.875)
    assert value(samples, "edgeserve_jetson_temperature_celsius", zone="tj-thermal") == pytest.approx(48.562)
    assert value(samples, "edgeserve_jetson_clock_hertz", clock="gpu") == 1300500000
    assert value(samples, "edgeserve_jetson_clock_hertz", clock="emc") == 3199000000
    assert value(samples, "edgeserve_jetson_nvpmodel_mode", mode_id="2", mode="MODE_30W") == 1


def test_the_older_gpu_load_path_and_a_missing_debugfs_still_read(tmp_path: Path) -> None:
    (tmp_path / "sys/devices/gpu.0").mkdir(parents=True)
    (tmp_path / "sys/devices/gpu.0/load").write_text("999\n")
    zone = tmp_path / "sys/class/thermal/thermal_zone0"
    zone.mkdir(parents=True)
    (zone / "type").write_text("GPU-therm\n")
    (zone / "temp").write_text("not a number\n")  # unreadable: that zone is absent
    families = {f.name: f for f in jetson_families(tmp_path)}
    assert set(families) == {"edgeserve_jetson_gpu_load"}
    assert families["edgeserve_jetson_gpu_load"].samples[0].value == pytest.approx(0.999)


def test_a_machine_with_no_source_exports_none_of_the_families_and_logs_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    zone = tmp_path / "sys/class/thermal/thermal_zone0"  # any Linux has thermal zones: not a Jetson
    zone.mkdir(parents=True)
    (zone / "type").write_text("x86_pkg_temp\n")
    (zone / "temp").write_text("41000\n")
    caplog.set_level(logging.INFO)
    accelerators = Accelerators(tmp_path, nvml=_no_nvml())
    assert accelerators.read() == []
    assert run(accelerators.families()) == []
    text = render_metrics(Counters().snapshot(), models=["m"], accelerators=accelerators.read())
    assert "nv_gpu" not in text and "edgeserve_jetson" not in text and "nv_energy" not in text
    assert not [r for r in caplog.records if r.name.startswith("edgeserve")]


def test_nvml_is_initialised_once_and_read_per_gpu_under_tritons_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[str] = []
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(calls))
    accelerators = Accelerators(Path("/nonexistent"), max_age_s=0.0)
    families = accelerators.read()
    assert {f.name for f in families} == NVML_FAMILIES
    per_gpu = [
        "nvmlDeviceGetHandleByIndex",
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetEnforcedPowerLimit",
        "nvmlDeviceGetTotalEnergyConsumption",
    ]
    assert calls == ["nvmlInit", "nvmlDeviceGetCount", *per_gpu, *per_gpu]
    calls.clear()
    accelerators.read()
    assert calls[0] == "nvmlDeviceGetCount"  # initialised once
    first, second = "GPU-0d3f5c2e-aaaa-bbbb-cccc-000000000001", "GPU-0d3f5c2e-aaaa-bbbb-cccc-000000000002"
    for text in (render(families), render(families, OPENMETRICS)):
        samples = parse_samples(text) if "# EOF" not in text else _openmetrics_samples(text)
        assert value(samples, "nv_gpu_utilization", gpu_uuid=first) == pytest.approx(0.37)
        assert value(samples, "nv_gpu_memory_total_bytes", gpu_uuid=first) == 80 << 30
        assert value(samples, "nv_gpu_memory_used_bytes", gpu_uuid=second) == 1 << 20
        assert value(samples, "nv_gpu_power_usage", gpu_uuid=first) == pytest.approx(123.456)
        assert value(samples, "nv_gpu_power_limit", gpu_uuid=second) == pytest.approx(70.0)
        assert value(samples, "nv_energy_consumption", gpu_uuid=first) == pytest.approx(987654.321)
        assert (("nv_energy_consumption", frozenset({("gpu_uuid", second)}))) not in samples  # NotSupported
    assert "nv_energy_consumption{" in render(families)  # Triton's name, no _total


def test_nvml_that_fails_to_initialise_exports_nothing_and_is_not_retried(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[str] = []
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(calls, init_fails=True))
    caplog.set_level(logging.INFO)
    accelerators = Accelerators(Path("/nonexistent"))
    assert accelerators.read() == [] and accelerators.read() == []
    assert calls == ["nvmlInit"]
    assert not [r for r in caplog.records if r.name.startswith("edgeserve")]


def _openmetrics_samples(text: str) -> dict:
    return {
        (s.name.removesuffix("_total"), frozenset(s.labels.items())): s.value
        for family in openmetrics_families(text)
        for s in family.samples
    }


class _StubServer:
    """What the endpoint reads of a Server: its snapshot and its models."""

    models = ("m",)

    def __init__(self) -> None:
        self.counters = Counters()
        self.counters.requests[("m", "ok")] += 4
        self.counters.observe_ok("m", queued=1.0, start=1.001, end=1.003)

    def snapshot(self) -> dict:
        return self.counters.snapshot()


def test_the_endpoint_negotiates_the_format_and_reads_accelerators_off_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[str] = []
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(calls))
    accelerators = Accelerators(ORIN_SYSFS)
    read_in: list[int] = []
    plain_read = accelerators.read

    def read() -> list:
        read_in.append(threading.get_ident())
        return plain_read()

    monkeypatch.setattr(accelerators, "read", read)

    async def main() -> tuple[dict[str, tuple[str, str]], int]:
        config = MetricsConfig(listen=("127.0.0.1", 0))
        endpoint = MetricsEndpoint(_StubServer(), config, accelerators=accelerators)  # type: ignore[arg-type]
        async with endpoint, aiohttp.ClientSession() as http:
            answers = {}
            for accept in ("", OPENMETRICS, "application/openmetrics-text", "text/plain;version=0.0.4"):
                async with http.get(endpoint.url, headers={"Accept": accept} if accept else {}) as response:
                    assert response.status == 200
                    answers[accept] = (response.headers["Content-Type"], await response.text())
        return answers, threading.get_ident()

    answers, loop_thread = run(main())
    assert read_in and loop_thread not in read_in  # NVML and sysfs were read in a worker thread
    assert len(read_in) == 1  # cached for max_age_s: four scrapes, one read
    for accept, (content_type, text) in answers.items():
        if "openmetrics" in accept:
            assert content_type.startswith("application/openmetrics-text; version=1.0.0")
            assert text.endswith("# EOF\n")
            samples = _openmetrics_samples(text)
        else:
            assert content_type == "text/plain; version=0.0.4; charset=utf-8"
            samples = parse_samples(text)
        assert value(samples, "nv_inference_request_success", model="m", version="1") == 4
        assert value(samples, "edgeserve_requests_total", model="m", status="ok") == 4
        assert value(samples, "edgeserve_request_duration_seconds_count", model="m") == 1
        assert value(samples, "edgeserve_jetson_rail_power_watts", rail="VIN_SYS_5V0") == pytest.approx(
            4.976 * 1.104
        )
        assert (
            value(samples, "nv_gpu_utilization", gpu_uuid="GPU-0d3f5c2e-aaaa-bbbb-cccc-000000000001") == 0.37
        )


def test_accelerators_read_again_once_their_age_passes() -> None:
    accelerators = Accelerators(ORIN_SYSFS, nvml=_no_nvml(), max_age_s=0.0)

    async def twice() -> tuple[list, list]:
        first = await accelerators.families()
        await asyncio.sleep(0)
        return first, await accelerators.families()

    first, second = run(twice())
    assert first is not second and {f.name for f in first} == {f.name for f in second}
