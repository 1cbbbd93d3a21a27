"""Accelerator metrics, read at scrape time off the serving path (docs/metrics.md, "Accelerators").

Discrete GPUs: NVML through nvidia-ml-py (`import pynvml`), under Triton's names (`nv_gpu_*`,
`nv_energy_consumption`, label `gpu_uuid`). Jetsons: the documented sysfs and hwmon files of
Jetson Linux (`edgeserve_jetson_*`): GPU load, the INA3221 power rails, thermal zones, the GPU and
EMC clocks and the nvpmodel mode.

Every source is optional: one that is absent (no NVML library, no GPU, not a Jetson, a file that
cannot be read) exports nothing, and is logged at debug level only. Reading takes file reads and
NVML calls, so `Accelerators.families` runs `read` in a worker thread (asyncio.to_thread) and
keeps the result for `max_age_s`: never on the request path, never blocking the event loop.
`root` is the filesystem root the sysfs paths are read under (tests pass a recorded tree).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from edgeserve.metrics.exposition import Family

_log = logging.getLogger(__name__)

GPU_LOAD = ("sys/devices/platform/gpu.0/load", "sys/devices/gpu.0/load")  # per mille
INA3221 = "sys/bus/i2c/drivers/ina3221/*/hwmon/hwmon*"  # in[123]_label, in[123]_input mV, curr[123]_input mA
THERMAL = "sys/class/thermal/thermal_zone*"  # type, temp (millidegrees Celsius)
GPU_DEVFREQ = "sys/class/devfreq/*gpu*/cur_freq"  # Hz
EMC_RATE = "sys/kernel/debug/bpmp/debug/clk/emc/rate"  # Hz, readable by root only
NVPMODEL_CONF = "etc/nvpmodel.conf"  # < POWER_MODEL ID=0 NAME=MAXN > ...
NVPMODEL_STATUS = "var/lib/nvpmodel/status"  # pmode:0000
_POWER_MODEL = re.compile(r"<\s*POWER_MODEL\s+ID=(\d+)\s+NAME=(\S+?)\s*>")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _number(path: Path) -> float | None:
    text = _read(path)
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


def jetson_families(root: Path) -> list[Family]:
    """The Jetson families the files under `root` carry: none on another machine (thermal zones,
    which any Linux may have, only where a Jetson source was found)."""
    families: list[Family] = []
    load = next((v for p in GPU_LOAD if (v := _number(root / p)) is not None), None)
    if load is not None:
        gpu_load = Family("edgeserve_jetson_gpu_load", "gauge", "Jetson GPU load (0-1), from gpu.0/load")
        families.append(gpu_load.add(load / 1000.0))
    families += _rails(root)
    clock = Family(
        "edgeserve_jetson_clock_hertz",
        "gauge",
        "Current clock rate: gpu (devfreq cur_freq), emc (bpmp debugfs, readable by root only)",
    )
    gpu_freq = next((v for p in sorted(root.glob(GPU_DEVFREQ)) if (v := _number(p)) is not None), None)
    if gpu_freq is not None:
        clock.add(gpu_freq, clock="gpu")
    if (emc := _number(root / EMC_RATE)) is not None:
        clock.add(emc, clock="emc")
    mode = _nvpmodel(root)
    if mode is not None:
        nvpmodel = Family("edgeserve_jetson_nvpmodel_mode", "gauge", "The nvpmodel power mode in force (1)")
        families.append(nvpmodel.add(1, mode_id=mode[0], mode=mode[1]))
    if not families:
        return []  # not a Jetson (or none of its files readable)
    temperature = Family(
        "edgeserve_jetson_temperature_celsius", "gauge", "Temperature of each thermal zone (sysfs thermal)"
    )
    for zone in sorted(root.glob(THERMAL)):
        kind, millidegrees = _read(zone / "type"), _number(zone / "temp")
        if kind and millidegrees is not None:
            temperature.add(millidegrees / 1000.0, zone=kind)
    return families + [f for f in (clock, temperature) if f.samples]


def _rails(root: Path) -> list[Family]:
    volts = Family("edgeserve_jetson_rail_voltage_volts", "gauge", "Bus voltage of each INA3221 power rail")
    amps = Family("edgeserve_jetson_rail_current_amperes", "gauge", "Current of each INA3221 power rail")
    watts = Family(
        "edgeserve_jetson_rail_power_watts", "gauge", "Power of each INA3221 power rail (voltage x current)"
    )
    for hwmon in sorted(root.glob(INA3221)):
        for channel in (1, 2, 3):
            rail = _read(hwmon / f"in{channel}_label")
            millivolts = _number(hwmon / f"in{channel}_input")
            milliamps = _number(hwmon / f"curr{channel}_input")
            if not rail or rail == "NC" or millivolts is None or milliamps is None:
                continue
            volts.add(millivolts / 1000.0, rail=rail)
            amps.add(milliamps / 1000.0, rail=rail)
            watts.add(millivolts * milliamps / 1e6, rail=rail)
    return [volts, amps, watts] if volts.samples else []


def _nvpmodel(root: Path) -> tuple[str, str] | None:
    status = _read(root / NVPMODEL_STATUS)
    found = re.search(r"pmode:\s*(\d+)", status or "")
    if found is None:
        return None
    mode_id = str(int(found.group(1)))
    names = {m.group(1): m.group(2) for m in _POWER_MODEL.finditer(_read(root / NVPMODEL_CONF) or "")}
    return mode_id, names.get(mode_id, "")


class Nvml:
    """NVML through pynvml, initialised on the first read; `load` returns the module (tests pass a
    fake). If the library, the driver or a GPU is missing, `families` is empty from then on."""

    def __init__(self, load: Callable[[], ModuleType] | None = None) -> None:
        self._load = load or _import_pynvml
        self._module: ModuleType | None = None
        self._failed = False

    def _nvml(self) -> ModuleType | None:
        if self._module is None and not self._failed:
            try:
                module = self._load()
                module.nvmlInit()
            except Exception as exc:  # no library, no driver, no GPU: no NVML metrics
                _log.debug("NVML unavailable: %s", exc)
                self._failed = True
                return None
            self._module = module
        return self._module

    def families(self) -> list[Family]:
        nvml = self._nvml()
        if nvml is None:
            return []
        util = Family("nv_gpu_utilization", "gauge", "GPU utilization rate [0.0 - 1.0)")
        total = Family("nv_gpu_memory_total_bytes", "gauge", "GPU total memory, in bytes")
        used = Family("nv_gpu_memory_used_bytes", "gauge", "GPU used memory, in bytes")
        power = Family("nv_gpu_power_usage", "gauge", "GPU power usage in watts")
        limit = Family("nv_gpu_power_limit", "gauge", "GPU power management limit in watts")
        energy = Family(
            "nv_energy_consumption", "counter", "GPU energy consumption in joules since the driver loaded"
        )
        try:
            count = nvml.nvmlDeviceGetCount()
        except Exception as exc:
            _log.debug("NVML device count: %s", exc)
            return []
        for index in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                uuid = _text(nvml.nvmlDeviceGetUUID(handle))
            except Exception as exc:
                _log.debug("NVML device %d: %s", index, exc)
                continue
            readings = (
                (util, "nvmlDeviceGetUtilizationRates", lambda r: r.gpu / 100.0),  # percent
                (total, "nvmlDeviceGetMemoryInfo", lambda r: r.total),
                (used, "nvmlDeviceGetMemoryInfo", lambda r: r.used),
                (power, "nvmlDeviceGetPowerUsage", lambda r: r / 1000.0),  # mW
                (limit, "nvmlDeviceGetEnforcedPowerLimit", lambda r: r / 1000.0),  # mW
                (energy, "nvmlDeviceGetTotalEnergyConsumption", lambda r: r / 1000.0),  # mJ
            )
            for family, call, convert in readings:
                try:
                    family.add(convert(getattr(nvml, call)(handle)), gpu_uuid=uuid)
                except Exception as exc:  # not supported on this device: that sample is absent
                    _log.debug("NVML %s on %s: %s", call, uuid, exc)
        return [f for f in (util, total, used, power, limit, energy) if f.samples]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _import_pynvml() -> ModuleType:
    import pynvml

    return pynvml


# How old a scrape's accelerator values may be. Triton refreshes its GPU metrics every 2 s
# (--metrics-interval-ms 2000) and scrapers poll every 5 s or more (Prometheus' default: 1 min), so
# under 2 s every scrape sees values fresher than Triton's, while two scrapers (or a retried scrape)
# within the second share one read of NVML and sysfs instead of each paying for their own.
MAX_AGE_S = 1.0


class Accelerators:
    """The accelerator families of this machine, read in a worker thread at most every `max_age_s`."""

    def __init__(
        self, root: Path | str = "/", *, nvml: Nvml | None = None, max_age_s: float = MAX_AGE_S
    ) -> None:
        self.root = Path(root)
        self.nvml = nvml if nvml is not None else Nvml()
        self.max_age_s = max_age_s
        self._cached: list[Family] = []
        self._read_at: float | None = None

    def read(self) -> list[Family]:
        """Every family now (blocking: file reads and NVML calls; call from a worker thread)."""
        return [*self.nvml.families(), *jetson_families(self.root)]

    @property
    def cached(self) -> list[Family]:
        return self._cached

    async def families(self) -> list[Family]:
        """The families, read again in a worker thread when older than `max_age_s`."""
        now = time.monotonic()
        if self._read_at is None or now - self._read_at >= self.max_age_s:
            self._cached = await asyncio.to_thread(self.read)
            self._read_at = time.monotonic()
        return self._cached
