"""`edgeserve-profile --import TABLE.json --model NAME`: store a profile table measured on another box.

The table (the JSON `edgeserve-profile` writes into <repository>/<model>/profiles/) is read as JSON
(never pickle), checked against NAME's manifest (the same exit names, batches 1..max_batch within
what the model runs) and stored under its own fingerprint key, where the emulated backend
(`[backend] name = "emulated"`) and `edgeserve simulate --fingerprint KEY` find it. The stored copy
carries the manifest's graphs checksum, so the repository accepts it; an `imported` object keeps
where it came from: the source file, the model and graphs checksum it was measured for, whether
that checksum matched the manifest's, and when it was imported.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from edgeserve.errors import ProfileError
from edgeserve.files import read_json_object
from edgeserve.manifest import Manifest
from edgeserve.profile import ProfileTable
from edgeserve.repository import ModelRepository, check_model_name


@dataclass(frozen=True)
class Imported:
    table: ProfileTable  # as stored
    path: Path
    replaced: bool  # a profile of the same fingerprint was there before


def import_profile(
    repository: ModelRepository,
    source: Path,
    model: str,
    note: Callable[[str], None] = print,
    now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.timezone.utc),
) -> Imported:
    """Check the table in `source` against `model`'s manifest and store it; ProfileError (one
    sentence, what to do) when it does not fit. `note` gets a line for each thing worth knowing."""
    check_model_name(repository, model, option="--model")
    manifest = repository.load_manifest(model, verify=False)  # latencies, not graphs, are imported
    data = read_json_object(
        source,
        ProfileError,
        "profile table",
        "give the JSON file `edgeserve-profile` wrote into <repository>/<model>/profiles/ on the other box",
    )
    table = ProfileTable.from_dict(data, origin=str(source))
    _check_fits(table, manifest, source)
    original = table.graphs_sha256
    matches = original == manifest.graphs_sha256()
    record = {
        "source": str(source.resolve()),
        "model": table.model,
        "graphs_sha256": original,
        "checksum_matches": matches,
        "imported_at": now().isoformat(timespec="seconds"),
    }
    stored = replace(table, model=model, graphs_sha256=manifest.graphs_sha256(), imported=record)
    if table.model != model:
        note(f"{model}: the table was measured for model {table.model!r}; stored for {model!r} as asked")
    if not matches:
        note(
            f"{model}: the table was measured for other graphs than this export's (graphs_sha256 "
            f"{original[:12]}, the manifest's {manifest.graphs_sha256()[:12]}): its latencies are "
            "those graphs'; recorded in the stored profile (imported.checksum_matches = false)"
        )
    path = repository.profile_path(model, stored.fingerprint)
    replaced = path.exists()
    repository.save_profile(stored)
    return Imported(stored, path, replaced)


def _check_fits(table: ProfileTable, manifest: Manifest, source: Path) -> None:
    name = manifest.name
    if list(table.exit_names) != manifest.exit_names:
        raise ProfileError(
            f"{source}: the table's exits {list(table.exit_names)} differ from those of model {name!r}, "
            f"{manifest.exit_names}; import a table measured for a model with the same exits"
        )
    largest = manifest.max_batch
    if largest is not None and table.max_batch > largest:
        raise ProfileError(
            f"{source}: the table covers batches 1..{table.max_batch} but model {name!r} runs batches "
            f"of at most {largest}; import a table measured with --max-batch {largest}"
        )
    stray = sorted(
        (e, b) for e, b in table.cells if not (0 <= e < len(table.exit_names) and 1 <= b <= table.max_batch)
    )
    if stray:
        raise ProfileError(
            f"{source}: the table has cells outside its exits 0..{len(table.exit_names) - 1} and batches "
            f"1..{table.max_batch} (exit/batch {stray[0]}); give the file `edgeserve-profile` wrote, unedited"
        )
