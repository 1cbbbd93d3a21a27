"""Where the simulator's profiles and accuracies come from, and a note saying so for every one.

- a model repository: engines/<model>/manifest.json plus one of engines/<model>/profiles/*.json
  (the one for a given fingerprint key, else the only one, else the newest);
- profile JSON files given directly;
- `--paper-gpu`: the synthetic profile of the paper's RTX 3080 (edgeserve.scheduler.synthetic).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from edgeserve.errors import ProfileError
from edgeserve.manifest import Manifest
from edgeserve.profile import ProfileTable
from edgeserve.repository import ModelRepository
from edgeserve.scheduler.synthetic import SYNTHETIC_LABEL, paper_gpu_profiles


@dataclass(frozen=True)
class ProfileSource:
    tables: tuple[ProfileTable, ...]
    manifests: tuple[Manifest, ...] = ()
    notes: tuple[str, ...] = ()
    synthetic: bool = False
    label: str = ""  # one line for tables and plot titles

    @property
    def by_name(self) -> dict[str, ProfileTable]:
        return {t.model: t for t in self.tables}


@dataclass(frozen=True)
class PickedProfile:
    path: Path
    table: ProfileTable
    note: str = field(default="")


def pick_profile(
    repository: ModelRepository, manifest: Manifest, fingerprint_key: str | None = None
) -> PickedProfile:
    """The profile of `manifest` for `fingerprint_key`, else the only one, else the newest; checked
    against the manifest (same export, same exits) and explained in `note`."""
    folder = repository.model_dir(manifest.name) / "profiles"
    fix = f"run `edgeserve-profile --model {manifest.name} --repository {repository.root}`"
    paths = sorted(folder.glob("*.json")) if folder.is_dir() else []
    if fingerprint_key is not None:
        path = folder / f"{fingerprint_key}.json"
        if not path.exists():
            known = ", ".join(p.stem for p in paths) or "none"
            raise ProfileError(
                f"{path}: no profile with fingerprint {fingerprint_key!r} (there: {known}); {fix}"
            )
        chosen, why = path, "as asked"
        table = ProfileTable.load(path)
    elif not paths:
        raise ProfileError(f"{folder}: model {manifest.name!r} has no profile; {fix}")
    elif len(paths) == 1:
        chosen, why = paths[0], "the only one"
        table = ProfileTable.load(chosen)
    else:
        loaded = [(ProfileTable.load(p), p) for p in paths]
        table, chosen = max(loaded, key=lambda tp: (tp[0].created, tp[1].stat().st_mtime, tp[1].name))
        why = (
            f"newest of {len(paths)} (created {table.created or 'unknown'}); pick one with --fingerprint KEY"
        )
    if table.graphs_sha256 != manifest.graphs_sha256():
        raise ProfileError(f"{chosen}: measured for an earlier export of {manifest.name!r}; {fix}")
    if list(table.exit_names) != manifest.exit_names:
        raise ProfileError(f"{chosen}: exits {list(table.exit_names)} differ from the manifest's; {fix}")
    device = f"{table.fingerprint.backend} on {table.fingerprint.device}"
    note = f"{manifest.name}: profile {chosen.stem} ({why}; {device})"
    return PickedProfile(chosen, table, note)


def from_repository(root: Path, models: Sequence[str], fingerprint_key: str | None = None) -> ProfileSource:
    """Profiles of `models` from the repository at `root` (graphs are not needed to simulate)."""
    repository = ModelRepository(Path(root))
    manifests, tables, notes = [], [], []
    for name in models:
        manifest = repository.load_manifest(name, verify=False)
        picked = pick_profile(repository, manifest, fingerprint_key)
        manifests.append(manifest)
        tables.append(picked.table)
        notes.append(picked.note)
    devices = sorted({f"{t.fingerprint.backend} on {t.fingerprint.device}" for t in tables})
    return ProfileSource(
        tuple(tables), tuple(manifests), tuple(notes), False, f"measured: {'; '.join(devices)}"
    )


def from_json(paths: Sequence[Path]) -> ProfileSource:
    tables = [ProfileTable.load(Path(p)) for p in paths]
    names = [t.model for t in tables]
    if len(set(names)) != len(names):
        raise ProfileError(f"two profile files are for the same model ({names}); give one per model")
    synthetic = any(t.fingerprint.backend == "synthetic" for t in tables)
    notes = [
        f"{t.model}: {p} ({t.fingerprint.backend} on {t.fingerprint.device})"
        for t, p in zip(tables, paths, strict=True)
    ]
    label = "synthetic profile" if synthetic else "profiles: " + ", ".join(Path(p).name for p in paths)
    return ProfileSource(tuple(tables), (), tuple(notes), synthetic, label)


def paper_gpu(max_batch: int = 10, seed: int = 0) -> ProfileSource:
    tables = paper_gpu_profiles(max_batch=max_batch, seed=seed)
    note = f"SYNTHETIC profile ({SYNTHETIC_LABEL}; see edgeserve/scheduler/synthetic.py)"
    return ProfileSource(tuple(tables), (), (note,), True, "SYNTHETIC paper-GPU profile")
