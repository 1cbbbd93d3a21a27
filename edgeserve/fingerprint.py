"""Device fingerprints: a profile or an engine is only valid on the device it was measured on."""

from __future__ import annotations

import hashlib
import json
import platform
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Fingerprint:
    """What makes latencies comparable: backend, device, threads, power mode and library versions."""

    backend: str
    device: str
    threads: int | None = None
    providers: tuple[str, ...] = ()
    versions: dict[str, str] = field(default_factory=dict)
    extra: dict[str, str] = field(default_factory=dict)

    def key(self) -> str:
        """A file-name-safe key: readable prefix plus a hash of everything."""
        blob = json.dumps(asdict(self), sort_keys=True).encode()
        digest = hashlib.sha256(blob).hexdigest()[:10]
        threads = f"-t{self.threads}" if self.threads is not None else ""
        return f"{_slug(self.backend)}-{_slug(self.device)[:40]}{threads}-{digest}"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["providers"] = list(self.providers)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Fingerprint:
        return cls(
            backend=str(data["backend"]),
            device=str(data["device"]),
            threads=data.get("threads"),
            providers=tuple(data.get("providers", ())),
            versions={str(k): str(v) for k, v in data.get("versions", {}).items()},
            extra={str(k): str(v) for k, v in data.get("extra", {}).items()},
        )

    def differences(self, other: Fingerprint) -> list[str]:
        """Human-readable list of what differs, for error messages."""
        mine, theirs = self.to_dict(), other.to_dict()
        return [f"{k}: {mine[k]!r} != {theirs[k]!r}" for k in mine if mine[k] != theirs[k]]


def cpu_name() -> str:
    """The CPU model as /proc/cpuinfo names it, else what platform knows."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    for pattern in (r"^model name\s*:\s*(.+)$", r"^Model\s*:\s*(.+)$", r"^Hardware\s*:\s*(.+)$"):
        match = re.search(pattern, text, re.MULTILINE)
        if match:
            return match.group(1).strip()
    return platform.processor() or platform.machine() or "unknown-cpu"


def jetson_power_state() -> dict[str, str]:
    """nvpmodel mode and whether clocks look locked, where a Jetson exposes them; empty elsewhere."""
    state: dict[str, str] = {}
    model = Path("/proc/device-tree/model")
    if model.exists():
        state["board"] = model.read_bytes().rstrip(b"\x00").decode(errors="replace")
    nvpmodel = Path("/var/lib/nvpmodel/status")
    if nvpmodel.exists():
        state["nvpmodel"] = nvpmodel.read_text().strip()
    return state


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "x"
