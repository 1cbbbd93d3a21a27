"""The model repository on disk (`engines/` by default).

    engines/<model>/manifest.json                 the versioned manifest (edgeserve.manifest)
    engines/<model>/onnx/stage<k>.onnx            one ONNX graph per stage, weights stored once
    engines/<model>/profiles/<fingerprint>.json   profile tables, one per device fingerprint
    engines/<model>/trt/...                       built engines (the TensorRT backend)

Every load checks what it reads against what the manifest promises, so a truncated copy or a
profile from another device or another export is refused with the command that fixes it.
"""

from __future__ import annotations

import difflib
import logging
import os
import shlex
from dataclasses import dataclass, replace
from pathlib import Path

from edgeserve.errors import ProfileError, RepositoryError
from edgeserve.files import sha256_file
from edgeserve.fingerprint import Fingerprint
from edgeserve.manifest import MANIFEST_FILE, Manifest
from edgeserve.profile import ProfileTable

DEFAULT_ROOT = Path("engines")
ROOT_ENV = "EDGESERVE_REPOSITORY"
log = logging.getLogger(__name__)
# Manifests inferred for lone ONNX files, keyed by (path, mtime, size): inferring opens a session.
_INFERRED: dict[tuple[str, int, int], Manifest] = {}


def default_root() -> Path:
    return Path(os.environ.get(ROOT_ENV, DEFAULT_ROOT))


def unknown_model_message(repository: ModelRepository, model: str, what: str) -> str:
    """`<what> 'x': not in <root>; did you mean 'y'?` (difflib), else the models there and how to export."""
    known = repository.models()
    if not repository.root.is_dir():
        return (
            f"{what} {model!r}: the model repository {repository.root} does not exist; export the demo "
            f"models into it with `edgeserve export --demo --repository {repository.root}` or point at "
            "the right folder"
        )
    close = difflib.get_close_matches(model, known, n=1, cutoff=0.6)
    listing = ", ".join(known) or "none"
    if close:
        return (
            f"{what} {model!r} is not in {repository.root}: did you mean {close[0]!r}? "
            f"(models there: {listing})"
        )
    return (
        f"{what} {model!r} is not in {repository.root} (models there: {listing}); export it with "
        f"`edgeserve export --model {model} --repository {repository.root}` when it is one of the models "
        f"`edgeserve export --help` lists (else add --name {model} to the export of the one it is)"
    )


def check_model_name(repository: ModelRepository, model: str, option: str = "model") -> None:
    """RepositoryError with a did-you-mean unless `model` has a manifest in the repository."""
    if not repository.has_model(model):
        raise RepositoryError(unknown_model_message(repository, model, option))


def profile_command(repository: ModelRepository, model: str, fingerprint: Fingerprint | None) -> str:
    """The edgeserve-profile command that measures a profile for this fingerprint (backend, threads)."""
    argv = ["edgeserve-profile", "--model", model, "--repository", str(repository.root)]
    if fingerprint is not None:
        argv += ["--backend", fingerprint.backend]
        if fingerprint.threads is not None:
            argv += ["--threads", str(fingerprint.threads)]
        if "precision" in fingerprint.extra:
            argv += ["--precision", fingerprint.extra["precision"]]
    return shlex.join(argv)


def _threads_measured(folder: Path, fingerprint: Fingerprint) -> list[int]:
    """The thread counts of the profiles in `folder` that differ from `fingerprint` in threads only."""
    found = []
    for other in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            measured = ProfileTable.load(other).fingerprint
        except (ProfileError, OSError, ValueError, KeyError, TypeError):
            continue
        if measured.threads is not None and replace(measured, threads=fingerprint.threads) == fingerprint:
            found.append(measured.threads)
    return sorted(set(found))


@dataclass(frozen=True)
class ModelRepository:
    root: Path

    def model_dir(self, model: str) -> Path:
        return self.root / model

    def manifest_path(self, model: str) -> Path:
        return self.model_dir(model) / MANIFEST_FILE

    def models(self) -> list[str]:
        """Folders with a manifest, and folders holding one lone ONNX file (auto-complete)."""
        if not self.root.is_dir():
            return []
        return sorted(
            p.name
            for p in self.root.iterdir()
            if p.is_dir() and not p.name.startswith(".") and self.has_model(p.name)
        )

    def has_model(self, model: str) -> bool:
        return self.manifest_path(model).exists() or self.lone_onnx(model) is not None

    def lone_onnx(self, model: str) -> Path | None:
        """The one `.onnx` file of a model folder without a manifest (in it or in its onnx/), else None."""
        folder = self.model_dir(model)
        if not folder.is_dir() or self.manifest_path(model).exists():
            return None
        found = [*folder.glob("*.onnx"), *folder.glob("onnx/*.onnx")]
        return found[0] if len(found) == 1 and found[0].is_file() else None

    def infer_manifest(self, model: str) -> Manifest:
        """The manifest of a lone ONNX file, inferred in memory (the folder is never written).

        The same inference as `edgeserve import` without --shape: a graph with a dynamic dimension
        besides the batch is refused with the `edgeserve import ... --shape` command that fixes it.
        """
        from edgeserve import onnx_graph

        path = self.lone_onnx(model)
        if path is None:
            raise RepositoryError(f"{self.model_dir(model)}: " + unknown_model_message(self, model, "model"))
        stat = path.stat()
        key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size)
        if key in _INFERRED:
            return _INFERRED[key]
        command = onnx_graph.import_command(path, model, self.root)
        inference = onnx_graph.infer(
            path,
            model,
            stage_path=path.relative_to(self.model_dir(model)).as_posix(),
            fix=f"import it with `{command} --shape {{shape}}`",
            source={"inferred_from": str(path), "importer": "repository auto-complete"},
        )
        manifest = inference.manifest
        inputs = ", ".join(f"{t.name} {list(t.shape)} {t.dtype}" for t in manifest.inputs)
        outputs = ", ".join(f"{t.name} {list(t.shape)} {t.dtype}" for t in manifest.stages[0].outputs)
        batch = "any batch" if manifest.max_batch is None else f"batch {manifest.max_batch}"
        notes = "".join(f"; {n}" for n in inference.notes)
        log.info(
            "model %r: no manifest, inferred from %s: inputs %s -> outputs %s (per sample), %s%s; "
            "`%s` writes it down",
            model, path, inputs, outputs, batch, notes, command,
        )  # fmt: skip
        _INFERRED[key] = manifest
        return manifest

    def load_manifest(self, model: str, verify: bool = True) -> Manifest:
        path = self.manifest_path(model)
        if not path.exists():
            if self.lone_onnx(model) is not None:
                return self.infer_manifest(model)
            raise RepositoryError(f"{path}: " + unknown_model_message(self, model, "model"))
        manifest = Manifest.load(path)
        if manifest.name != model:
            raise RepositoryError(
                f"{path}: manifest names model {manifest.name!r}, but it lives under {model!r}"
            )
        if verify:
            self.verify(manifest)
        return manifest

    def stage_path(self, manifest: Manifest, stage: int) -> Path:
        return self.model_dir(manifest.name) / manifest.stages[stage].path

    def verify(self, manifest: Manifest) -> None:
        """Size and sha256 of every stage graph against the manifest."""
        fix = f"re-export it with `edgeserve export --model {manifest.name} --repository {self.root}`"
        if (imported := manifest.source.get("imported_from")) is not None:  # `edgeserve import`ed
            fix = (
                f"import it again: `edgeserve import {shlex.quote(str(imported))} --name "
                f"{shlex.quote(manifest.name)} --repository {shlex.quote(str(self.root))} --force`"
            )
        for stage in manifest.stages:
            path = self.stage_path(manifest, stage.index)
            if not path.exists():
                raise RepositoryError(f"{path}: stage graph listed in the manifest is missing; {fix}")
            size = path.stat().st_size
            if size != stage.size_bytes:
                raise RepositoryError(
                    f"{path}: {size} bytes on disk, manifest says {stage.size_bytes} "
                    f"(truncated or replaced); {fix}"
                )
            if sha256_file(path) != stage.sha256:
                raise RepositoryError(
                    f"{path}: checksum does not match the manifest (corrupt or replaced); {fix}"
                )

    def save_manifest(self, manifest: Manifest) -> Path:
        manifest.validate(str(self.manifest_path(manifest.name)))
        path = self.manifest_path(manifest.name)
        manifest.save(path)
        return path

    def profile_path(self, model: str, fingerprint: Fingerprint) -> Path:
        return self.model_dir(model) / "profiles" / f"{fingerprint.key()}.json"

    def save_profile(self, table: ProfileTable) -> Path:
        path = self.profile_path(table.model, table.fingerprint)
        table.save(path)
        return path

    def load_profile(self, manifest: Manifest, fingerprint: Fingerprint) -> ProfileTable:
        """The profile measured for this manifest on this device, or an error saying how to make it."""
        path = self.profile_path(manifest.name, fingerprint)
        fix = f"run `{profile_command(self, manifest.name, fingerprint)}` on this device"
        if not path.exists():
            others = sorted(p.stem for p in path.parent.glob("*.json")) if path.parent.is_dir() else []
            hint = f" (profiles there are for other devices: {', '.join(others)})" if others else ""
            threads = _threads_measured(path.parent, fingerprint)
            if threads:  # the same device with another thread count: the config may follow the profile
                fix += f", or set `[backend] threads = {threads[0]}` to serve with the profile measured so"
            raise ProfileError(f"{path}: no profile of {manifest.name!r} for this device{hint}; {fix}")
        table = ProfileTable.load(path)
        if table.fingerprint != fingerprint:
            diff = "; ".join(table.fingerprint.differences(fingerprint))
            raise ProfileError(f"{path}: measured on another device or setup ({diff}); {fix}")
        if table.graphs_sha256 != manifest.graphs_sha256():
            raise ProfileError(f"{path}: measured for an earlier export of {manifest.name!r}; {fix}")
        if list(table.exit_names) != manifest.exit_names:
            raise ProfileError(f"{path}: exits {list(table.exit_names)} differ from the manifest's; {fix}")
        return table
