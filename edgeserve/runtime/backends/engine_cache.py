"""Where TensorRT engines live, what they were built from, and when one must be rebuilt.

An engine is only valid for the device, TensorRT version and precision it was built for, and for
the exact ONNX graph it came from. Engines are stored per target:

    engines/<model>/trt/<key>/stage<k>.engine    one engine per stage (profiles: see batch_plan)
    engines/<model>/trt/<key>/stage<k>.json      EngineRecord: what the engine was built from
    engines/trt-timing-cache/<key>.cache         default timing cache, shared by every model

The key names the target; the record is checked anyway (a copied folder must not be trusted), so a
stale engine is rebuilt with the reason, never loaded. Everything here is pure: it runs without
TensorRT and is what `edgeserve build-engines --dry-run` prints.
"""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from edgeserve.config.server import PRECISIONS
from edgeserve.errors import EdgeServeError, RepositoryError
from edgeserve.files import sha256_file, write_atomic
from edgeserve.manifest import Manifest
from edgeserve.repository import ModelRepository
from edgeserve.runtime.backends.buffer_plan import tensorrt_refusal
from edgeserve.runtime.validation import is_chain

SUPPORTED_TRT_MAJORS = (10, 11)
RECORD_SCHEMA_VERSION = 1
DEFAULT_MAX_BATCH = 10


class PrecisionError(EdgeServeError):
    """The requested precision cannot be built with the installed TensorRT from these ONNX graphs."""


@dataclass(frozen=True)
class BuildTarget:
    """What an engine is tied to: the GPU, its compute capability, TensorRT's version, the precision."""

    device: str
    compute_capability: str  # "8.7" for a Jetson Orin
    trt_version: str  # "10.3.0"
    precision: str = "fp32"
    sm_count: int = 0  # multiprocessors; 0: unknown (a --target plan, or a record from before)
    memory_gib: int = 0  # total GPU memory rounded to GiB; 0: unknown

    @property
    def trt_major(self) -> int:
        return int(self.trt_version.split(".", 1)[0])

    def key(self) -> str:
        """Folder name under engines/<model>/trt/: readable and file-name safe.

        Every Jetson Orin module reports the device name "Orin" and sm 8.7, so the key also holds
        the SM count and the memory in GiB when known ("orin-sm87-16sm-15g-trt10.3.0-fp32"): an
        engine tuned on an AGX Orin is not reused on an Orin Nano. Folders from before (no SM part)
        are not looked at: build-engines plans those models as "no engine for this target yet".
        """
        cc = self.compute_capability.replace(".", "")
        size = f"-{self.sm_count}sm-{self.memory_gib}g" if self.sm_count else ""
        return f"{_slug(self.device)[:40]}-sm{cc}{size}-trt{_slug(self.trt_version)}-{self.precision}"


@dataclass(frozen=True)
class PrecisionPlan:
    """How to ask TensorRT for a precision: builder flags (TRT 10) or a strongly typed network."""

    precision: str
    builder_flags: tuple[str, ...]  # names in tensorrt.BuilderFlag
    strongly_typed: bool


def precision_plan(precision: str, trt_major: int, onnx_dtype: str = "float32") -> PrecisionPlan:
    """Validate `precision` for a TensorRT major version and the ONNX graphs' float type.

    TensorRT 10 builds weakly typed networks where BuilderFlag.FP16 lets it pick FP16 kernels.
    TensorRT 11 removed those flags: every network is strongly typed and runs in the ONNX graph's
    own types, so FP16 needs an FP16 ONNX export.
    """
    if precision not in PRECISIONS:
        raise PrecisionError(
            f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)} "
            "(int8 needs calibration, which edgeserve does not implement)"
        )
    if trt_major not in SUPPORTED_TRT_MAJORS:
        raise PrecisionError(
            f"TensorRT {trt_major}.x is not supported; edgeserve builds with TensorRT "
            f"{' or '.join(map(str, SUPPORTED_TRT_MAJORS))} (JetPack 6 ships TensorRT 10); "
            "or serve with `--backend onnxruntime`"
        )
    if onnx_dtype not in ("float32", "float16"):
        raise PrecisionError(f"the ONNX graphs take {onnx_dtype}; TensorRT builds take float32 or float16")
    if trt_major >= 11:
        if precision == "fp16" and onnx_dtype != "float16":
            raise PrecisionError(
                "TensorRT 11 removed BuilderFlag.FP16 (networks are strongly typed), so --precision fp16 "
                "needs an FP16 ONNX export (convert the stages with ModelOpt AutoCast); this model's "
                "graphs are float32: build with --precision fp32"
            )
        if precision == "fp32" and onnx_dtype == "float16":
            raise PrecisionError(
                "TensorRT 11 runs a strongly typed network in its ONNX types: these graphs are float16, "
                "so build them with --precision fp16"
            )
        return PrecisionPlan(precision, (), True)
    if onnx_dtype == "float16":
        if precision != "fp16":
            raise PrecisionError("these ONNX graphs are float16: build them with --precision fp16")
        return PrecisionPlan(precision, (), True)
    return PrecisionPlan(precision, ("FP16",) if precision == "fp16" else (), False)


@dataclass(frozen=True)
class EngineRecord:
    """What one stage engine was built from; stored next to it as JSON."""

    model: str
    stage: int
    onnx_sha256: str
    device: str
    compute_capability: str
    trt_version: str
    precision: str
    batch_sizes: tuple[int, ...]  # the batch sizes served
    engine_sha256: str
    engine_bytes: int
    built_at: str
    build_seconds: float
    schema_version: int = RECORD_SCHEMA_VERSION
    # None: one optimization profile per batch size, profile i = batch_sizes[i] (export's chains);
    # else the graph batch (min, opt, max) of the engine's one profile (imported models).
    batch_profile: tuple[int, int, int] | None = None
    sm_count: int = 0  # BuildTarget.sm_count; 0 in records written before it was kept
    memory_gib: int = 0

    def to_json(self) -> str:
        data = asdict(self)
        data["batch_sizes"] = list(self.batch_sizes)
        if self.batch_profile is None:
            del data["batch_profile"]  # records of per-batch engines read as before
        else:
            data["batch_profile"] = list(self.batch_profile)
        return json.dumps(data, indent=2) + "\n"

    @classmethod
    def load(cls, path: Path) -> EngineRecord:
        try:
            data: Any = json.loads(path.read_text())
            if data.get("schema_version") != RECORD_SCHEMA_VERSION:
                raise ValueError(f"schema_version {data.get('schema_version')!r}")
            profile = data.get("batch_profile")
            if profile is not None and len(profile) != 3:
                raise ValueError(f"batch_profile {profile!r} is not [min, opt, max]")
            return cls(
                model=str(data["model"]),
                stage=int(data["stage"]),
                onnx_sha256=str(data["onnx_sha256"]),
                device=str(data["device"]),
                compute_capability=str(data["compute_capability"]),
                trt_version=str(data["trt_version"]),
                precision=str(data["precision"]),
                batch_sizes=tuple(int(b) for b in data["batch_sizes"]),
                engine_sha256=str(data["engine_sha256"]),
                engine_bytes=int(data["engine_bytes"]),
                built_at=str(data["built_at"]),
                build_seconds=float(data["build_seconds"]),
                batch_profile=_profile_tuple(profile),
                sm_count=int(data.get("sm_count", 0)),
                memory_gib=int(data.get("memory_gib", 0)),
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise RepositoryError(
                f"{path}: unreadable engine record ({exc}); rebuild with `edgeserve build-engines --force`"
            ) from exc

    def save(self, path: Path) -> None:
        write_atomic(path, self.to_json())


def batch_sizes(max_batch: int) -> tuple[int, ...]:
    """One optimization profile per batch size: min = opt = max, so each size gets its own tactics."""
    if max_batch < 1:
        raise ValueError(f"max batch must be >= 1, got {max_batch}")
    return tuple(range(1, max_batch + 1))


def per_batch_chain(manifest: Manifest) -> bool:
    """Whether `manifest` is served the way `edgeserve export`'s classifier chains are: one profile
    per batch size and buffers chained stage to stage (buffer_plan.plan_buffers). Anything else (an
    imported model: several inputs or outputs, tensors passed by name, a fixed batch, unbatched
    tensors) gets one profile covering the batch range and buffers wired by name (plan_tensors)."""
    if not is_chain(manifest) or manifest.max_batch is not None:
        return False
    stages = manifest.stages
    if stages[0].feeds[0][1] != manifest.inputs[0].name:
        return False
    return all(s.feeds[0][1] == p.passes[0] for p, s in itertools.pairwise(stages) if p.passes)


@dataclass(frozen=True)
class BatchPlan:
    """The batch sizes a model's engines serve and how their optimization profiles cover them."""

    sizes: tuple[int, ...]  # batch sizes served: 1..N
    profile: tuple[int, int, int] | None  # graph batch (min, opt, max) of the one profile; None: one per size

    def describe(self) -> str:
        if self.profile is None:
            return f"one profile per batch {_span(self.sizes)}"
        low, opt, high = self.profile
        return f"one profile, batch min {low} opt {opt} max {high}"


def batch_plan(
    manifest: Manifest, max_batch: int = DEFAULT_MAX_BATCH, opt_batch: int | None = None
) -> BatchPlan:
    """How `manifest`'s engines cover batches up to `max_batch`.

    Export's classifier chains: one profile per batch size 1..max_batch (min = opt = max), as
    before. Every other model: one profile per engine. With a dynamic batch it spans 1..max_batch
    and is tuned for `opt_batch` (default max_batch: the batches that matter most are the full
    ones the scheduler forms under load); graphs with a fixed batch N get N for min, opt and max and
    serve 1..N padded; a model with an unbatched tensor runs one sample at a time (1, 1, 1).
    """
    if per_batch_chain(manifest):
        return BatchPlan(batch_sizes(max_batch), None)
    if manifest.batch is not None:
        n = manifest.batch
        return BatchPlan(batch_sizes(n), (n, n, n))
    if manifest.max_batch == 1:
        return BatchPlan((1,), (1, 1, 1))
    sizes = batch_sizes(max_batch)
    if opt_batch is not None and opt_batch < 1:
        raise ValueError(f"opt batch must be >= 1, got {opt_batch}")
    opt = max_batch if opt_batch is None else min(opt_batch, max_batch)
    return BatchPlan(sizes, (1, opt, max_batch))


def graph_float_dtype(manifest: Manifest) -> str:
    """The float type precision_plan checks: float16 when a model input is, else float64 when one is
    (refused), else float32 (graphs taking only integers or booleans compute in float32)."""
    dtypes = {t.dtype for t in manifest.inputs}
    for dtype in ("float16", "float64"):
        if dtype in dtypes:
            return dtype
    return "float32"


def engine_dir(repository: ModelRepository, model: str, target: BuildTarget) -> Path:
    return repository.model_dir(model) / "trt" / target.key()


def engine_path(repository: ModelRepository, model: str, target: BuildTarget, stage: int) -> Path:
    return engine_dir(repository, model, target) / f"stage{stage}.engine"


def record_path(repository: ModelRepository, model: str, target: BuildTarget, stage: int) -> Path:
    return engine_dir(repository, model, target) / f"stage{stage}.json"


def default_timing_cache(repository: ModelRepository, target: BuildTarget) -> Path:
    """One timing cache per target, shared by every model: layer timings carry across models."""
    return repository.root / "trt-timing-cache" / f"{target.key()}.cache"


def new_record(
    manifest: Manifest,
    stage: int,
    target: BuildTarget,
    sizes: tuple[int, ...],
    engine_file: Path,
    build_seconds: float,
    profile: tuple[int, int, int] | None = None,
) -> EngineRecord:
    """The record of an engine just written to `engine_file`."""
    return EngineRecord(
        model=manifest.name,
        stage=stage,
        onnx_sha256=manifest.stages[stage].sha256,
        device=target.device,
        compute_capability=target.compute_capability,
        trt_version=target.trt_version,
        precision=target.precision,
        batch_sizes=sizes,
        engine_sha256=sha256_file(engine_file),
        engine_bytes=engine_file.stat().st_size,
        built_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        build_seconds=round(build_seconds, 3),
        batch_profile=profile,
        sm_count=target.sm_count,
        memory_gib=target.memory_gib,
    )


def stale_reasons(
    record: EngineRecord,
    manifest: Manifest,
    stage: int,
    target: BuildTarget,
    sizes: tuple[int, ...],
    profile: tuple[int, int, int] | None = None,
) -> list[str]:
    """Why an engine built as `record` says cannot serve `manifest` on `target`; empty if it can."""
    wanted: dict[str, Any] = {
        "model": manifest.name,
        "stage": stage,
        "onnx_sha256": manifest.stages[stage].sha256,
        "device": target.device,
        "compute_capability": target.compute_capability,
        "trt_version": target.trt_version,
        "precision": target.precision,
        "batch_sizes": sizes,
        "batch_profile": profile,
    }
    if target.sm_count:  # known here: the engine must come from a GPU of the same size
        wanted |= {"sm_count": target.sm_count, "memory_gib": target.memory_gib}
    reasons = []
    for field_name, value in wanted.items():
        have = getattr(record, field_name)
        if have != value:
            if field_name == "onnx_sha256":
                reasons.append("the ONNX stage changed since the build (model re-exported)")
            elif field_name == "batch_sizes":
                reasons.append(f"built for batches {_span(have)}, wanted {_span(value)}")
            elif field_name == "batch_profile":
                reasons.append(f"built with {_profile(have)}, wanted {_profile(value)}")
            else:
                reasons.append(f"{field_name} {have!r} != {value!r}")
    return reasons


def check_engine_file(record: EngineRecord, path: Path) -> str | None:
    """Why the engine file does not match its record (missing, truncated, replaced), or None."""
    if not path.exists():
        return "engine file missing"
    size = path.stat().st_size
    if size != record.engine_bytes:
        return f"engine file is {size} bytes, its record says {record.engine_bytes} (truncated or replaced)"
    if sha256_file(path) != record.engine_sha256:
        return "engine file checksum differs from its record (corrupt or replaced)"
    return None


@dataclass(frozen=True)
class PlannedEngine:
    """One stage engine and what build-engines will do about it."""

    model: str
    stage: int
    action: str  # "build" (none yet), "rebuild" (stale or forced), "skip" (current) or "refuse"
    reason: str
    engine: Path
    record: Path
    batches: BatchPlan | None = None  # what to build it for


def engine_status(
    repository: ModelRepository,
    manifest: Manifest,
    stage: int,
    target: BuildTarget,
    sizes: tuple[int, ...],
    profile: tuple[int, int, int] | None = None,
) -> tuple[str, str]:
    """("skip" | "build" | "rebuild", reason) for one stage engine on `target`."""
    rec_path = record_path(repository, manifest.name, target, stage)
    eng_path = engine_path(repository, manifest.name, target, stage)
    if not rec_path.exists():
        if eng_path.exists():
            return "rebuild", "engine has no record of what it was built from"
        return "build", "no engine for this target yet"
    try:
        record = EngineRecord.load(rec_path)
    except RepositoryError as exc:
        return "rebuild", str(exc).split(": ", 1)[-1].split(";")[0]
    reasons = stale_reasons(record, manifest, stage, target, sizes, profile)
    problem = check_engine_file(record, eng_path)
    if problem:
        reasons.append(problem)
    if reasons:
        return "rebuild", "; ".join(reasons)
    return "skip", f"current (built {record.built_at})"


def plan_builds(
    repository: ModelRepository,
    manifests: list[Manifest],
    target: BuildTarget,
    max_batch: int = DEFAULT_MAX_BATCH,
    force: bool = False,
    opt_batch: int | None = None,
) -> list[PlannedEngine]:
    """Every stage engine of `manifests` for `target`: which to build, rebuild or skip, and why.

    A model the TensorRT backend cannot serve (buffer_plan.tensorrt_refusal) is planned as
    "refuse" with the reason, so no minutes go into engines nothing would load.
    """
    plan = []
    for manifest in manifests:
        batches = batch_plan(manifest, max_batch, opt_batch)
        refusal = None if batches.profile is None else tensorrt_refusal(manifest)
        if refusal is None:
            precision_plan(target.precision, target.trt_major, graph_float_dtype(manifest))
        for stage in range(len(manifest.stages)):
            if refusal is not None:
                action, reason = "refuse", f"{refusal}; serve it with --backend onnxruntime"
            else:
                action, reason = engine_status(
                    repository, manifest, stage, target, batches.sizes, batches.profile
                )
            if force and action == "skip":
                action, reason = "rebuild", "--force"
            plan.append(
                PlannedEngine(
                    model=manifest.name,
                    stage=stage,
                    action=action,
                    reason=reason,
                    engine=engine_path(repository, manifest.name, target, stage),
                    record=record_path(repository, manifest.name, target, stage),
                    batches=batches,
                )
            )
    return plan


def load_current_record(
    repository: ModelRepository,
    manifest: Manifest,
    stage: int,
    target: BuildTarget,
    sizes: tuple[int, ...] | None = None,
    profile: tuple[int, int, int] | None = None,
) -> EngineRecord:
    """The record of a current engine, or a RepositoryError saying why it is stale and how to rebuild.

    `sizes` None accepts any batch range and profile the engine was built for (serving uses what
    is there and checks the profile kind itself).
    """
    rec_path = record_path(repository, manifest.name, target, stage)
    fix = (
        f"build it with `edgeserve build-engines --model {manifest.name} --repository {repository.root} "
        f"--precision {target.precision}`"
    )
    if not rec_path.exists():
        raise RepositoryError(
            f"{rec_path}: no engine of {manifest.name!r} stage {stage} for this target; {fix}"
        )
    record = EngineRecord.load(rec_path)
    profile = record.batch_profile if sizes is None else profile
    reasons = stale_reasons(record, manifest, stage, target, sizes or record.batch_sizes, profile)
    problem = check_engine_file(record, engine_path(repository, manifest.name, target, stage))
    if problem:
        reasons.append(problem)
    if reasons:
        raise RepositoryError(f"{rec_path}: stale engine ({'; '.join(reasons)}); {fix}")
    return record


def format_plan(plan: list[PlannedEngine], target: BuildTarget) -> str:
    """A table for people: one line per stage engine."""
    lines = [
        f"target {target.key()} (device {target.device!r}, sm {target.compute_capability}, "
        f"TensorRT {target.trt_version}, {target.precision})"
    ]
    width = max((len(p.model) for p in plan), default=5)
    for p in plan:
        profile = "" if p.batches is None or p.batches.profile is None else f" [{p.batches.describe()}]"
        lines.append(f"  {p.action:<8} {p.model:<{width}} stage{p.stage}  {p.reason}{profile}")
    counts = {a: sum(p.action == a for p in plan) for a in ("build", "rebuild", "skip", "refuse")}
    summary = f"{counts['build']} to build, {counts['rebuild']} to rebuild, {counts['skip']} current"
    if counts["refuse"]:
        summary += f", {counts['refuse']} refused (not servable on TensorRT)"
    lines.append(summary)
    return "\n".join(lines)


def _span(sizes: tuple[int, ...]) -> str:
    if sizes and list(sizes) == list(range(sizes[0], sizes[-1] + 1)):
        return f"{sizes[0]}..{sizes[-1]}"
    return ",".join(map(str, sizes))


def _profile_tuple(profile: list[int] | None) -> tuple[int, int, int] | None:
    return None if profile is None else (int(profile[0]), int(profile[1]), int(profile[2]))


def _profile(profile: tuple[int, int, int] | None) -> str:
    if profile is None:
        return "one profile per batch size"
    return "one profile (batch min {}, opt {}, max {})".format(*profile)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-") or "x"
