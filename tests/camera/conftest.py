"""Fixtures of the camera tests: digits-s exported for real once, and a rendered digits clip."""

from __future__ import annotations

from pathlib import Path

import pytest
from camera_support import Clip, digits_frames, export_digits_s

pytest.importorskip("av", reason="edgeserve camera decodes with PyAV: pip install 'edgeserve[camera]'")
pytest.importorskip("torch", reason="the digits model is exported with torch (the export extra)")


@pytest.fixture(scope="session")
def digits_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_digits_s(tmp_path_factory.mktemp("camera") / "engines")


@pytest.fixture(scope="session")
def clip() -> Clip:
    return digits_frames()
