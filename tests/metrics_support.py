"""Reading a scrape back through Prometheus' own parser (prometheus_client, a test-only dependency)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _base(name: str) -> str:
    # The parser names counter samples `<family>_total` whether or not the exposition did
    # (Triton's counters have no suffix): compare names without it.
    return name.removesuffix("_total")


def parse_samples(text: str) -> Samples:
    """Every sample of a valid exposition (the parser raises on an invalid one)."""
    return {
        (_base(s.name), frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(_base(name), frozenset(labels.items()))]


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum over every series of `name` whose labels include `labels`."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == _base(name) and want <= ls)


def counter_samples(text: str) -> Samples:
    """The samples that must never decrease: counters and histogram buckets, sums and counts."""
    kept = {}
    for family in text_string_to_metric_families(text):
        if family.type in ("counter", "histogram", "unknown"):  # unknown: Triton's counters
            for s in family.samples:
                kept[(_base(s.name), frozenset(s.labels.items()))] = s.value
    return kept


# -- accelerators: a recorded Jetson tree and a fake NVML (edgeserve.metrics.accelerators) --

ORIN_SYSFS = Path(__file__).parent / "data" / "jetson_agx_orin"


class FakeNvmlError(Exception):
    """What pynvml raises (pynvml.NVMLError)."""


def fake_pynvml(calls: list[str], *, init_fails: bool = False) -> ModuleType:
    """A stand-in `pynvml` with two GPUs: the second has no energy counter (NotSupported), as older
    boards; every call is appended to `calls`."""
    gpus = [
        {"uuid": b"GPU-0d3f5c2e-aaaa-bbbb-cccc-000000000001", "util": 37, "total": 80 << 30, "used": 5 << 30,
         "power": 123456, "limit": 300000, "energy": 987654321},
        {"uuid": "GPU-0d3f5c2e-aaaa-bbbb-cccc-000000000002", "util": 0, "total": 16 << 30, "used": 1 << 20,
         "power": 25000, "limit": 70000, "energy": None},
    ]  # fmt: skip
    module = ModuleType("pynvml")

    def recorded(name: str, result: Callable[..., Any]) -> None:
        def call(*args: Any) -> Any:
            calls.append(name)
            return result(*args)

        setattr(module, name, call)

    def init() -> None:
        if init_fails:
            raise FakeNvmlError("NVML Shared Library Not Found")

    def energy(handle: int) -> int:
        if gpus[handle]["energy"] is None:
            raise FakeNvmlError("Not Supported")
        return gpus[handle]["energy"]

    module.NVMLError = FakeNvmlError  # type: ignore[attr-defined]
    recorded("nvmlInit", init)
    recorded("nvmlDeviceGetCount", lambda: len(gpus))
    recorded("nvmlDeviceGetHandleByIndex", lambda i: i)
    recorded("nvmlDeviceGetUUID", lambda h: gpus[h]["uuid"])
    recorded("nvmlDeviceGetUtilizationRates", lambda h: SimpleNamespace(gpu=gpus[h]["util"], memory=0))
    recorded(
        "nvmlDeviceGetMemoryInfo",
        lambda h: SimpleNamespace(total=gpus[h]["total"], used=gpus[h]["used"], free=0),
    )
    recorded("nvmlDeviceGetPowerUsage", lambda h: gpus[h]["power"])
    recorded("nvmlDeviceGetEnforcedPowerLimit", lambda h: gpus[h]["limit"])
    recorded("nvmlDeviceGetTotalEnergyConsumption", energy)
    return module
