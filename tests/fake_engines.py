"""Stand-in TensorRT engine files with real records, for tests of the engine cache (no TensorRT here)."""

from __future__ import annotations

from edgeserve.manifest import Manifest
from edgeserve.repository import ModelRepository
from edgeserve.runtime.backends.engine_cache import (
    BuildTarget,
    EngineRecord,
    batch_sizes,
    engine_path,
    new_record,
    record_path,
)


def write_engine(
    repository: ModelRepository,
    manifest: Manifest,
    stage: int,
    target: BuildTarget,
    max_batch: int = 10,
    profile: tuple[int, int, int] | None = None,
) -> EngineRecord:
    """A stand-in engine file plus the record build-engines would write for it (`profile`: the one
    batch profile of an imported model's engine; None: a profile per batch size)."""
    path = engine_path(repository, manifest.name, target, stage)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"serialized engine " + bytes([stage]) * 64)
    record = new_record(manifest, stage, target, batch_sizes(max_batch), path, 1.5, profile)
    record.save(record_path(repository, manifest.name, target, stage))
    return record
