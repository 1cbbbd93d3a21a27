"""Where the server leaves its calibrated latency tables, and how `edgeserve-profile` reads them back.

`<repository>/<model>/calibrated/<fingerprint key>.json` (JSON, never pickle): written when the
server shuts down, read by `edgeserve-profile --write-calibrated`, which folds it into the stored
profile on request. Kept apart from `profiles/` so a calibration is never loaded as a profile.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from edgeserve.errors import ProfileError
from edgeserve.files import read_json_object, write_atomic


def calibrated_path(repository: Path, model: str, fingerprint_key: str) -> Path:
    return Path(repository) / model / "calibrated" / f"{fingerprint_key}.json"


def save_calibrated(repository: Path, fingerprint_key: str, data: dict[str, Any]) -> list[Path]:
    """One file per model from LatencyCalibrator.calibrated(); returns the paths written."""
    paths = []
    for model, table in data["models"].items():
        path = calibrated_path(repository, model, fingerprint_key)
        path.parent.mkdir(parents=True, exist_ok=True)
        body = {
            "schema_version": 1,
            "model": model,
            "fingerprint_key": fingerprint_key,
            "quantile": data["quantile"],
            **table,
        }
        write_atomic(path, json.dumps(body, indent=1) + "\n")
        paths.append(path)
    return paths


def load_calibrated(path: Path) -> dict[str, Any]:
    return read_json_object(
        path, ProfileError, "calibrated latency table", "run the server with calibration on"
    )
