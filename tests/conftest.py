"""Shared fixtures: a real model repository of tiny ONNX graphs in a temporary directory."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_onnx import TinyRepository, write_tiny_repository

from edgeserve.repository import ModelRepository


@pytest.fixture
def tiny_repository(tmp_path: Path) -> TinyRepository:
    """Two tiny early-exit models (`tiny_a`: 3 exits; `tiny_b`: 2 exits, a headless middle stage)."""
    root = tmp_path / "engines"
    models = write_tiny_repository(root)
    return TinyRepository(root=root, repository=ModelRepository(root), models=models)
