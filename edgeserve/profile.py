"""The profile table: measured latency of every (exit, batch) cell of one model on one device.

The scheduler reads one quantile per cell (p95 by default); the raw samples are kept so the
simulator can draw realistic service times and a person can see how noisy a cell was.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgeserve.errors import ProfileError
from edgeserve.files import read_json_object, write_atomic
from edgeserve.fingerprint import Fingerprint

PROFILE_SCHEMA_VERSION = 1
QUANTILES = ("mean", "p50", "p90", "p95", "p99")


@dataclass(frozen=True)
class CellStats:
    mean_ms: float
    p50_ms: float
    p90_ms: float
    p95_ms: float
    p99_ms: float
    cv: float

    @classmethod
    def of(cls, samples_ms: np.ndarray) -> CellStats:
        samples = np.asarray(samples_ms, dtype=np.float64)
        if samples.size == 0:
            raise ValueError("a profile cell needs at least one sample")
        mean = float(samples.mean())
        p50, p90, p95, p99 = (float(q) for q in np.percentile(samples, [50, 90, 95, 99]))
        cv = float(samples.std() / mean) if mean > 0 else 0.0
        return cls(mean, p50, p90, p95, p99, cv)

    def get(self, quantile: str) -> float:
        if quantile not in QUANTILES:
            raise ValueError(f"unknown quantile {quantile!r}; choose one of {QUANTILES}")
        return float(getattr(self, f"{quantile}_ms"))


@dataclass(frozen=True)
class ProfileCell:
    exit: int
    batch: int
    samples_ms: tuple[float, ...]
    stats: CellStats

    @classmethod
    def from_samples(cls, exit: int, batch: int, samples_ms: np.ndarray | list[float]) -> ProfileCell:
        samples = tuple(round(float(s), 4) for s in samples_ms)
        return cls(exit=exit, batch=batch, samples_ms=samples, stats=CellStats.of(np.asarray(samples)))


@dataclass
class ProfileTable:
    """All cells of one model on one device, keyed by `fingerprint`."""

    model: str
    exit_names: tuple[str, ...]
    max_batch: int
    fingerprint: Fingerprint
    graphs_sha256: str
    cells: dict[tuple[int, int], ProfileCell] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    created: str = ""
    schema_version: int = PROFILE_SCHEMA_VERSION
    # Set by `edgeserve-profile --import`: where the table came from (source, its model and graphs'
    # checksum, whether that matched the manifest's, when); None for a table measured here.
    imported: dict[str, Any] | None = None

    def add(self, cell: ProfileCell) -> None:
        self.cells[(cell.exit, cell.batch)] = cell

    def cell(self, exit: int, batch: int) -> ProfileCell:
        try:
            return self.cells[(exit, batch)]
        except KeyError:
            raise ProfileError(
                f"profile of {self.model!r} has no cell for exit {exit} at batch {batch} "
                f"(exits 0..{len(self.exit_names) - 1}, batch 1..{self.max_batch}); "
                "re-run `edgeserve-profile` with a larger --max-batch"
            ) from None

    def latency_ms(self, exit: int, batch: int, quantile: str = "p95") -> float:
        return self.cell(exit, batch).stats.get(quantile)

    def matrix(self, quantile: str = "p95") -> np.ndarray:
        """Latency as an array [exit, batch-1]: the form the scheduler indexes."""
        out = np.full((len(self.exit_names), self.max_batch), math.nan)
        for (e, b), cell in self.cells.items():
            out[e, b - 1] = cell.stats.get(quantile)
        return out

    def scaled(self, factor: float) -> ProfileTable:
        """The table with every sample `factor` times longer (the emulated backend's `slowdown`):
        a copy, or this table itself for a factor of 1."""
        if factor == 1.0:
            return self
        table = dataclasses.replace(self, cells={})
        for cell in self.cells.values():
            table.add(ProfileCell.from_samples(cell.exit, cell.batch, [s * factor for s in cell.samples_ms]))
        return table

    def noisy_cells(self, cv_threshold: float) -> list[ProfileCell]:
        return [c for c in self.cells.values() if c.stats.cv > cv_threshold]

    def check_complete(self, origin: str = "profile") -> None:
        missing = [
            (e, b)
            for e in range(len(self.exit_names))
            for b in range(1, self.max_batch + 1)
            if (e, b) not in self.cells
        ]
        if missing:
            raise ProfileError(
                f"{origin}: {len(missing)} cells missing, e.g. exit/batch {missing[0]}; "
                "re-run `edgeserve-profile`"
            )

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "schema_version": self.schema_version,
            "model": self.model,
            "exit_names": list(self.exit_names),
            "max_batch": self.max_batch,
            "fingerprint": self.fingerprint.to_dict(),
            "fingerprint_key": self.fingerprint.key(),
            "graphs_sha256": self.graphs_sha256,
            "created": self.created,
            "settings": self.settings,
            "cells": [
                {
                    "exit": c.exit,
                    "exit_name": self.exit_names[c.exit],
                    "batch": c.batch,
                    **{f"{q}_ms": round(c.stats.get(q), 4) for q in QUANTILES},
                    "cv": round(c.stats.cv, 5),
                    "samples_ms": list(c.samples_ms),
                }
                for c in sorted(self.cells.values(), key=lambda c: (c.exit, c.batch))
            ],
        }
        if self.imported is not None:
            data["imported"] = self.imported
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any], origin: str = "profile") -> ProfileTable:
        version = data.get("schema_version")
        if version != PROFILE_SCHEMA_VERSION:
            raise ProfileError(
                f"{origin}: profile schema_version is {version!r}, this edgeserve reads "
                f"{PROFILE_SCHEMA_VERSION}; re-run `edgeserve-profile`"
            )
        try:
            table = cls(
                model=str(data["model"]),
                exit_names=tuple(data["exit_names"]),
                max_batch=int(data["max_batch"]),
                fingerprint=Fingerprint.from_dict(data["fingerprint"]),
                graphs_sha256=str(data["graphs_sha256"]),
                settings=dict(data.get("settings", {})),
                created=str(data.get("created", "")),
                imported=dict(data["imported"]) if data.get("imported") is not None else None,
            )
            for c in data["cells"]:
                # Statistics are recomputed from the samples: the samples are the truth.
                table.add(ProfileCell.from_samples(int(c["exit"]), int(c["batch"]), c["samples_ms"]))
        except KeyError as exc:
            raise ProfileError(
                f"{origin}: profile lacks the key {exc.args[0]!r}; re-run `edgeserve-profile`"
            ) from exc
        except (TypeError, ValueError) as exc:
            raise ProfileError(f"{origin}: profile is malformed ({exc}); re-run `edgeserve-profile`") from exc
        table.check_complete(origin)
        return table

    def save(self, path: Path) -> None:
        write_atomic(path, json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def load(cls, path: Path) -> ProfileTable:
        data = read_json_object(path, ProfileError, "profile", "run `edgeserve-profile` to measure one")
        return cls.from_dict(data, origin=str(path))
