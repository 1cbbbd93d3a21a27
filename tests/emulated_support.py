"""Profile tables "measured on another device" for the tiny models, and `edgeserve-profile --import`.

The emulated backend runs no model, so its tests need no real profile: a table is written by hand
(a made-up Jetson fingerprint, a few ms per cell so batch times dominate any scheduling noise) and
stored the way a user would, with `edgeserve-profile --import` in a subprocess.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from edgeserve.fingerprint import Fingerprint
from edgeserve.manifest import Manifest
from edgeserve.profile import ProfileCell, ProfileTable

MAX_BATCH = 4
JETSON = Fingerprint(
    backend="tensorrt",
    device="Jetson Orin Nano (test)",
    threads=None,
    versions={"tensorrt": "10.3"},
    extra={"nvpmodel": "15W", "precision": "fp16"},
)
OTHER = Fingerprint(backend="torch", device="NVIDIA H200 (test)", threads=1, versions={"torch": "2.11"})


def samples_ms(exit: int, batch: int, base_ms: float) -> list[float]:
    """Five samples, the smallest base + exit + batch/4 ms: deeper and larger takes longer."""
    return [base_ms + exit + 0.25 * batch + 0.1 * k for k in range(5)]


def table_for(
    manifest: Manifest,
    fingerprint: Fingerprint = JETSON,
    *,
    base_ms: float = 2.0,
    max_batch: int = MAX_BATCH,
    model: str | None = None,
    graphs_sha256: str | None = None,
    exit_names: list[str] | None = None,
) -> ProfileTable:
    """A complete table for `manifest` as if measured on `fingerprint`."""
    table = ProfileTable(
        model=model or manifest.name,
        exit_names=tuple(exit_names or manifest.exit_names),
        max_batch=max_batch,
        fingerprint=fingerprint,
        graphs_sha256=graphs_sha256 or manifest.graphs_sha256(),
        settings={"max_batch": max_batch, "repeats": 5, "warmup": 1},
        created="2026-11-28T00:00:00+00:00",
    )
    for e in range(len(table.exit_names)):
        for b in range(1, max_batch + 1):
            table.add(ProfileCell.from_samples(e, b, samples_ms(e, b, base_ms)))
    return table


def write_table(path: Path, table: ProfileTable | dict[str, Any]) -> Path:
    data = table.to_dict() if isinstance(table, ProfileTable) else table
    path.write_text(json.dumps(data, indent=1))
    return path


def import_table(root: Path, table: Path, model: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`edgeserve-profile --import TABLE --model MODEL --repository ROOT` as a user runs it."""
    argv = ["--import", str(table), "--model", model, "--repository", str(root), *args]
    return subprocess.run(
        [sys.executable, "-m", "edgeserve.profiler", *argv],
        capture_output=True,
        text=True,
        timeout=120,
    )
