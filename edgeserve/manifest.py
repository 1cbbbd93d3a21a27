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

MANIFEST_SCHEMA_VERSION = 2
READABLE_SCHEMA_VERSIONS = (1, 2)  # 1: one input, stages with `input`/`logits`/`features` (read as 2)
MANIFEST_FILE = "manifest.json"


@dataclass(frozen=True)
class TensorSpec:
    """A tensor as one sample sees it: the batch dimension is implicit and first when `batched`.

    An unbatched tensor (a graph input or output without a batch dimension, such as a detector's
    list of boxes) is whole per request: its model is served one sample at a time.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    batched: bool = True

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}
        if not self.batched:
            data["batched"] = False
        return data


@dataclass(frozen=True)
class StageSpec:
    """One ONNX graph. It takes model inputs and tensors earlier stages pass on; of its outputs,
    those named in `passes` feed later stages and the others are what its exit returns.

    A classifier stage exported by edgeserve takes one input and gives `features` (passed on) and
    `logits` (its exit head); the last stage passes nothing. Chaining stages at run time keeps one
    copy of the weights.
    """

    index: int
    path: str
    sha256: str
    size_bytes: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    passes: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()  # per input, the tensor that feeds it; () when named alike

    @classmethod
    def chain(
        cls,
        index: int,
        path: str,
        sha256: str,
        size_bytes: int,
        input: TensorSpec,
        logits: TensorSpec | None = None,
        features: TensorSpec | None = None,
        source: str = "features",
    ) -> StageSpec:
        """A classifier stage: one input, an optional exit head and optional features passed on.

        A stage after the first is fed by the tensor the stage before passes on (`source`; edgeserve
        export names it `features`), whatever its own input is called.
        """
        outputs = tuple(t for t in (features, logits) if t is not None)
        passes = (features.name,) if features is not None else ()
        sources = (source,) if index > 0 and source != input.name else ()
        return cls(index, path, sha256, size_bytes, (input,), outputs, passes, sources)

    @property
    def feeds(self) -> list[tuple[str, str]]:
        """(input name, name of the tensor that feeds it) for each input."""
        sources = self.sources or tuple(t.name for t in self.inputs)
        return [(t.name, source) for t, source in zip(self.inputs, sources, strict=True)]

    @property
    def input(self) -> TensorSpec:
        """The one input of a single-input stage (classifier chains)."""
        if len(self.inputs) != 1:
            raise ValueError(f"stage {self.index} takes {len(self.inputs)} inputs, not one")
        return self.inputs[0]

    @property
    def exit_outputs(self) -> tuple[TensorSpec, ...]:
        """What an exit on this stage returns: every output not passed on."""
        return tuple(t for t in self.outputs if t.name not in self.passes)

    @property
    def passed(self) -> tuple[TensorSpec, ...]:
        return tuple(t for t in self.outputs if t.name in self.passes)

    @property
    def logits(self) -> TensorSpec | None:
        """The exit output of a classifier stage (one output not passed on), else None."""
        outs = self.exit_outputs
        return outs[0] if len(outs) == 1 else None

    @property
    def features(self) -> TensorSpec | None:
        """The one tensor a classifier stage passes on, else None."""
        passed = self.passed
        return passed[0] if len(passed) == 1 else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "path": self.path,
            "sha256": self.sha256,
            "size_bytes": self.size_bytes,
            "inputs": [t.to_dict() for t in self.inputs],
            "outputs": [t.to_dict() for t in self.outputs],
            "passes": list(self.passes),
            **({"sources": list(self.sources)} if self.sources else {}),
        }


@dataclass(frozen=True)
class ExitSpec:
    """An exit point: run stages 0..stage and return that stage's exit outputs."""

    name: str
    stage: int
    accuracy: float | None = None


@dataclass(frozen=True)
class Manifest:
    """A served model. `num_classes` is set for classifiers (accuracy per exit is measured for
    them); `batch` is the one batch size graphs with a fixed batch dimension take (None: any)."""

    name: str
    inputs: tuple[TensorSpec, ...]
    stages: tuple[StageSpec, ...]
    exits: tuple[ExitSpec, ...]
    num_classes: int | None = None
    batch: int | None = None
    class_names: tuple[str, ...] | None = None
    accuracy_dataset: str | None = None
    source: dict[str, str] = field(default_factory=dict)
    schema_version: int = MANIFEST_SCHEMA_VERSION
    # False: a sample's answer depends on the others in its batch (a graph that normalises over the
    # batch axis, pads to the longest sample, runs NMS over the batch): served one sample at a time.
    batch_invariant: bool = True

    @property
    def input(self) -> TensorSpec:
        """The one input of a single-input model."""
        if len(self.inputs) != 1:
            names = ", ".join(t.name for t in self.inputs)
            raise ValueError(f"model {self.name!r} takes {len(self.inputs)} inputs ({names}), not one")
        return self.inputs[0]

    @property
    def input_names(self) -> list[str]:
        return [t.name for t in self.inputs]

    @property
    def max_batch(self) -> int | None:
        """The largest batch the graphs take: `batch`, 1 when a tensor is unbatched or the answers
        depend on the batch (`batch_invariant` False), else None."""
        tensors = [*self.inputs, *(t for s in self.stages for t in s.outputs)]
        if any(not t.batched for t in tensors) or not self.batch_invariant:
            return 1
        return self.batch

    def exit_outputs(self, exit: int) -> tuple[TensorSpec, ...]:
        return self.stages[self.exits[exit].stage].exit_outputs

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
        return {
            "schema_version": self.schema_version,
            "name": self.name,
            "inputs": [t.to_dict() for t in self.inputs],
            "batch": self.batch,
            "num_classes": self.num_classes,
            "stages": [s.to_dict() for s in self.stages],
            "exits": [asdict(e) for e in self.exits],
            "class_names": None if self.class_names is None else list(self.class_names),
            "accuracy_dataset": self.accuracy_dataset,
            "source": dict(self.source),
            **({} if self.batch_invariant else {"batch_invariant": False}),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False) + "\n"

    def graphs_sha256(self) -> str:
        """Checksum of what determines latency (inputs and graphs), not of accuracies or notes.

        Profiles record it, so a re-exported model invalidates its profiles while measuring accuracy
        into the manifest does not. (A single-input model hashes as schema 1 did.)
        """
        parts = [json.dumps(t.to_dict(), sort_keys=True) for t in self.inputs]
        if self.batch is not None:
            parts.append(f"batch:{self.batch}")
        if not self.batch_invariant:
            parts.append("one sample at a time")
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
        if version not in READABLE_SCHEMA_VERSIONS or type(version) is not int:
            raise RepositoryError(
                f"{origin}: manifest schema_version is {version!r}, this edgeserve reads "
                f"{', '.join(map(str, READABLE_SCHEMA_VERSIONS))}; re-export or re-import the model "
                "(`edgeserve export` or `edgeserve import`)"
            )
        try:
            if version == 1:
                inputs: tuple[TensorSpec, ...] = (_tensor(data["input"]),)
                sources = ["", *(str((s.get("features") or {}).get("name", "")) for s in data["stages"])]
                stages = tuple(_stage_v1(s, sources[k]) for k, s in enumerate(data["stages"]))
            else:
                inputs = tuple(_tensor(t) for t in data["inputs"])
                stages = tuple(_stage(s) for s in data["stages"])
            exits = tuple(
                ExitSpec(name=str(e["name"]), stage=int(e["stage"]), accuracy=e.get("accuracy"))
                for e in data["exits"]
            )
            names = data.get("class_names")
            classes = data.get("num_classes")
            batch = data.get("batch")
            manifest = cls(
                name=str(data["name"]),
                inputs=inputs,
                stages=stages,
                exits=exits,
                num_classes=None if classes is None else int(classes),
                batch=None if batch is None else int(batch),
                class_names=tuple(names) if names is not None else None,
                accuracy_dataset=data.get("accuracy_dataset"),
                source=dict(data.get("source", {})),
                schema_version=MANIFEST_SCHEMA_VERSION,
                batch_invariant=bool(data.get("batch_invariant", True)),
            )
        except KeyError as exc:
            raise RepositoryError(f"{origin}: manifest lacks the key {exc.args[0]!r}") from exc
        except (TypeError, ValueError, AttributeError) as exc:
            raise RepositoryError(f"{origin}: manifest is malformed: {exc}") from exc
        manifest.validate(origin)
        return manifest

    def validate(self, origin: str = "manifest") -> None:
        if not self.inputs:
            raise RepositoryError(f"{origin}: a model needs at least one input")
        if not self.stages or not self.exits:
            raise RepositoryError(f"{origin}: a model needs at least one stage and one exit")
        if [s.index for s in self.stages] != list(range(len(self.stages))):
            raise RepositoryError(f"{origin}: stage indices must be 0..{len(self.stages) - 1} in order")
        stages = [e.stage for e in self.exits]
        if stages != sorted(set(stages)) or not all(0 <= s < len(self.stages) for s in stages):
            raise RepositoryError(
                f"{origin}: exits must be ordered shallow to deep on distinct stages, got {stages}"
            )
        if self.batch is not None and self.batch < 1:
            raise RepositoryError(f"{origin}: batch must be a positive size or null, got {self.batch}")
        available = {t.name for t in self.inputs}
        for stage in self.stages:
            if stage.sources and len(stage.sources) != len(stage.inputs):
                raise RepositoryError(f"{origin}: stage {stage.index} needs one source per input")
            missing = [source for _, source in stage.feeds if source not in available]
            if missing:
                raise RepositoryError(
                    f"{origin}: stage {stage.index} takes {missing}, which neither the model's inputs "
                    "nor an earlier stage give"
                )
            unknown = sorted(set(stage.passes) - {t.name for t in stage.outputs})
            if unknown:
                raise RepositoryError(
                    f"{origin}: stage {stage.index} passes {unknown}, not among its outputs"
                )
            available |= set(stage.passes)
        for stage in self.stages[:-1]:
            if not stage.passes:
                raise RepositoryError(
                    f"{origin}: stage {stage.index} feeds the next stage but passes nothing on"
                )
        for e in self.exits:
            if not self.stages[e.stage].exit_outputs:
                raise RepositoryError(
                    f"{origin}: exit {e.name!r} is on stage {e.stage}, which has no exit outputs"
                )

    @classmethod
    def load(cls, path: Path) -> Manifest:
        fix = _remake_fix(path)
        return cls.from_dict(read_json_object(path, RepositoryError, "manifest", fix), origin=str(path))

    def save(self, path: Path) -> None:
        write_atomic(path, self.to_json())


def _remake_fix(path: Path) -> str:
    """How to write the manifest at `path` again: `edgeserve import ... --force` for a model that
    was imported (its `imported_from` is still readable in the damaged text), else `edgeserve export`."""
    import re

    try:
        text = path.read_text(errors="replace")
    except OSError:
        text = ""
    found = re.search(r'"imported_from"\s*:\s*"((?:[^"\\]|\\.)+)"', text)
    if found is None:
        return "re-export the model with `edgeserve export` (see `edgeserve export --help`)"
    import shlex

    source = found.group(1).replace("\\\\", "\\")
    return (
        f"import it again: `edgeserve import {shlex.quote(source)} --name {shlex.quote(path.parent.name)} "
        f"--repository {shlex.quote(str(path.parent.parent))} --force`"
    )


def _tensor(data: dict[str, Any]) -> TensorSpec:
    return TensorSpec(
        name=str(data["name"]),
        shape=tuple(int(d) for d in data["shape"]),
        dtype=str(data["dtype"]),
        batched=bool(data.get("batched", True)),
    )


def _stage(data: dict[str, Any]) -> StageSpec:
    return StageSpec(
        index=int(data["index"]),
        path=str(data["path"]),
        sha256=str(data["sha256"]),
        size_bytes=int(data["size_bytes"]),
        inputs=tuple(_tensor(t) for t in data["inputs"]),
        outputs=tuple(_tensor(t) for t in data["outputs"]),
        passes=tuple(str(n) for n in data.get("passes", ())),
        sources=tuple(str(n) for n in data.get("sources", ())),
    )


def _stage_v1(data: dict[str, Any], source: str) -> StageSpec:
    return StageSpec.chain(
        index=int(data["index"]),
        path=str(data["path"]),
        sha256=str(data["sha256"]),
        size_bytes=int(data["size_bytes"]),
        input=_tensor(data["input"]),
        logits=_tensor(data["logits"]) if data.get("logits") else None,
        features=_tensor(data["features"]) if data.get("features") else None,
        source=source,
    )
