"""The versioned manifest of one model in the repository: what its graphs take, give and weigh.

The manifest is plain JSON so that a person can read it and a different process (or a different
language) can trust it without unpickling anything.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from edgeserve.errors import RepositoryError
from edgeserve.files import read_json_object, write_atomic

MANIFEST_SCHEMA_VERSION = 1
MANIFEST_FILE = "manifest.json"


@dataclass(frozen=True)
class TensorSpec:
    """A tensor as one sample sees it: the batch dimension is implicit and always first."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"


@dataclass(frozen=True)
class StageSpec:
    """One ONNX graph: the previous stage's features in; this stage's features and exit logits out.

    The last stage has no `features` output and a stage without an exit head has no `logits`.
    Chaining stages at run time keeps one copy of the weights.
    """

    index: int
    path: str
    sha256: str
    size_bytes: int
    input: TensorSpec
    logits: TensorSpec | None = None
    features: TensorSpec | None = None


@dataclass(frozen=True)
class ExitSpec:
    """An exit point: run stages 0..stage and read that stage's head."""

    name: str
    stage: int
    accuracy: float | None = None


@dataclass(frozen=True)
class Manifest:
    name: str
    input: TensorSpec
    num_classes: int
    stages: tuple[StageSpec, ...]
    exits: tuple[ExitSpec, ...]
    class_names: tuple[str, ...] | None = None
    accuracy_dataset: str | None = None
    source: dict[str, str] = field(default_factory=dict)
    schema_version: int = MANIFEST_SCHEMA_VERSION

    @property
    def exit_names(self) -> list[str]:
        return [e.name for e in self.exits]

    def exit_index(self, exit: int | str) -> int:
        """Accept an exit by position (0 = shallowest) or by name; fail with the valid choices."""
        if isinstance(exit, str):
            if exit in self.exit_names:
                return self.exit_names.index(exit)
            raise KeyError(f"model {self.name!r} has no exit {exit!r}; exits are {self.exit_names}")
        if not 0 <= exit < len(self.exits):
            raise KeyError(
                f"model {self.name!r} has exits 0..{len(self.exits) - 1} ({self.exit_names}), not {exit}"
            )
        return exit

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        return {"schema_version": data.pop("schema_version"), **data}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False) + "\n"

    def graphs_sha256(self) -> str:
        """Checksum of what determines latency (input and graphs), not of accuracies or notes.

        Profiles record it, so a re-exported model invalidates its profiles while measuring accuracy
        into the manifest does not.
        """
        parts = [json.dumps(asdict(self.input), sort_keys=True)]
        parts += [f"{s.index}:{s.path}:{s.sha256}" for s in self.stages]
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()

    def with_accuracies(self, accuracies: list[float | None], dataset: str) -> Manifest:
        """A copy with measured per-exit top-1 accuracy (fractions in [0, 1])."""
        if len(accuracies) != len(self.exits):
            raise ValueError(f"{len(accuracies)} accuracies for {len(self.exits)} exits")
        exits = tuple(replace(e, accuracy=a) for e, a in zip(self.exits, accuracies, strict=True))
        return replace(self, exits=exits, accuracy_dataset=dataset)

    @classmethod
    def from_dict(cls, data: dict[str, Any], origin: str = "manifest") -> Manifest:
        version = data.get("schema_version")
        if version != MANIFEST_SCHEMA_VERSION:
            raise RepositoryError(
                f"{origin}: manifest schema_version is {version!r}, this edgeserve reads "
                f"{MANIFEST_SCHEMA_VERSION}; re-export the model with `edgeserve export`"
            )
        try:
            stages = tuple(
                StageSpec(
                    index=int(s["index"]),
                    path=str(s["path"]),
                    sha256=str(s["sha256"]),
                    size_bytes=int(s["size_bytes"]),
                    input=_tensor(s["input"]),
                    logits=_tensor(s["logits"]) if s.get("logits") else None,
                    features=_tensor(s["features"]) if s.get("features") else None,
                )
                for s in data["stages"]
            )
            exits = tuple(
                ExitSpec(name=str(e["name"]), stage=int(e["stage"]), accuracy=e.get("accuracy"))
                for e in data["exits"]
            )
            names = data.get("class_names")
            manifest = cls(
                name=str(data["name"]),
                input=_tensor(data["input"]),
                num_classes=int(data["num_classes"]),
                stages=stages,
                exits=exits,
                class_names=tuple(names) if names is not None else None,
                accuracy_dataset=data.get("accuracy_dataset"),
                source=dict(data.get("source", {})),
                schema_version=int(version),
            )
        except KeyError as exc:
            raise RepositoryError(f"{origin}: manifest lacks the key {exc.args[0]!r}") from exc
        except (TypeError, ValueError) as exc:
            raise RepositoryError(f"{origin}: manifest is malformed: {exc}") from exc
        manifest.validate(origin)
        return manifest

    def validate(self, origin: str = "manifest") -> None:
        if not self.stages or not self.exits:
            raise RepositoryError(f"{origin}: a model needs at least one stage and one exit")
        if [s.index for s in self.stages] != list(range(len(self.stages))):
            raise RepositoryError(f"{origin}: stage indices must be 0..{len(self.stages) - 1} in order")
        stages = [e.stage for e in self.exits]
        if stages != sorted(set(stages)) or not all(0 <= s < len(self.stages) for s in stages):
            raise RepositoryError(
                f"{origin}: exits must be ordered shallow to deep on distinct stages, got {stages}"
            )
        for stage in self.stages[:-1]:
            if stage.features is None:
                raise RepositoryError(
                    f"{origin}: stage {stage.index} feeds the next stage but has no features"
                )
        for e in self.exits:
            if self.stages[e.stage].logits is None:
                raise RepositoryError(f"{origin}: exit {e.name!r} is on stage {e.stage}, which has no logits")

    @classmethod
    def load(cls, path: Path) -> Manifest:
        fix = "re-export the model with `edgeserve export` (see `edgeserve export --help`)"
        return cls.from_dict(read_json_object(path, RepositoryError, "manifest", fix), origin=str(path))

    def save(self, path: Path) -> None:
        write_atomic(path, self.to_json())


def _tensor(data: dict[str, Any]) -> TensorSpec:
    return TensorSpec(
        name=str(data["name"]), shape=tuple(int(d) for d in data["shape"]), dtype=str(data["dtype"])
    )
