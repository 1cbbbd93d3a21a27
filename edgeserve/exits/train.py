"""Features from the frozen backbone and the exit heads trained on them, with numpy only.

`plan_exits` checks that a model can take exit heads (one input, split into stages, a classifier
output at the end), `load_labelled` checks the user's .npz against it, `collect_features` runs
the stage graphs with ONNX Runtime over every sample (batched, with a progress bar) and keeps the
pooled features at each split point, and `train_head` fits softmax regression on standardised
features by minibatch Adam and folds the standardisation into the weights it returns.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgeserve.exits import TrainExitsError
from edgeserve.exits.heads import FLOAT_TYPES, HeadInput
from edgeserve.manifest import Manifest, StageSpec, TensorSpec

MIN_TRAIN = 20
MIN_VAL = 10


@dataclass(frozen=True)
class ExitPlan:
    """What train-exits will do to a model: a head per split stage, reading `heads[k]`."""

    manifest: Manifest
    input: TensorSpec
    heads: dict[int, list[HeadInput]]  # stage index -> the passed tensors its head pools
    final_stage: int
    final_output: str
    num_classes: int
    old_exits: list[str]  # exits on split stages from an earlier run (replaced with --force)

    @property
    def split_stages(self) -> list[int]:
        return sorted(self.heads)


@dataclass(frozen=True)
class LabelledData:
    x: np.ndarray
    y: np.ndarray
    class_names: tuple[str, ...] | None


@dataclass
class Features:
    """Pooled features per split stage, the final output, and one raw batch for the checks."""

    pooled: dict[int, np.ndarray]
    final: np.ndarray
    sample_x: np.ndarray
    sample_passed: dict[tuple[int, str], np.ndarray]  # (stage, name) -> the first batch's tensor


@dataclass(frozen=True)
class Head:
    """logits = features @ weight.T + bias (standardisation folded in)."""

    weight: np.ndarray  # (classes, features) float32
    bias: np.ndarray  # (classes,) float32
    train_accuracy: float

    def logits(self, features: np.ndarray) -> np.ndarray:
        return features.astype(np.float32) @ self.weight.T + self.bias


def plan_exits(manifest: Manifest, output: str | None, force: bool) -> ExitPlan:
    """Check the model can take exit heads; the split stages, the heads' inputs and the final output."""
    name = manifest.name
    if len(manifest.inputs) != 1:
        names = ", ".join(t.name for t in manifest.inputs)
        raise TrainExitsError(
            f"model {name!r} takes {len(manifest.inputs)} inputs ({names}): train-exits supports "
            "single-input models only, not yet models with several inputs"
        )
    model_input = manifest.inputs[0]
    if len(manifest.stages) < 2:
        raise TrainExitsError(
            f"model {name!r} is one stage, so there is no split point to put an exit at: import it split, "
            f"`edgeserve import FILE.onnx --name {name} --split-at TENSOR[,TENSOR...]` (intermediate "
            "tensor names of the graph, shallow to deep), then run train-exits again"
        )
    unbatched = [
        t.name for t in (model_input, *(t for s in manifest.stages for t in s.outputs)) if not t.batched
    ]
    if unbatched:
        raise TrainExitsError(
            f"model {name!r}: {', '.join(unbatched)} has no batch dimension; exit heads need batched "
            "features and a batched classifier output"
        )
    last = manifest.stages[-1]
    final_stage = last.index
    if not any(e.stage == final_stage for e in manifest.exits):
        raise TrainExitsError(
            f"model {name!r} has no exit on its last stage: re-import it (`edgeserve import`) so that the "
            "whole model's output is its deepest exit"
        )
    candidates = last.exit_outputs
    if output is None:
        if len(candidates) != 1:
            raise TrainExitsError(
                f"model {name!r} gives {len(candidates)} outputs ({', '.join(t.name for t in candidates)}): "
                "say which one is the class scores with --output NAME"
            )
        final = candidates[0]
    else:
        chosen = [t for t in candidates if t.name == output]
        if not chosen:
            raise TrainExitsError(
                f"--output {output!r}: model {name!r} gives {', '.join(t.name for t in candidates)}; "
                "choose one of those"
            )
        final = chosen[0]
    if len(final.shape) != 1 or final.shape[0] < 2 or final.dtype not in FLOAT_TYPES:
        raise TrainExitsError(
            f"model {name!r}: output {final.name!r} is {final.dtype} of shape {list(final.shape)} per "
            "sample, not class scores (classes,): train-exits is for classifiers; choose the scores with "
            "--output NAME"
        )
    num_classes = final.shape[0]
    if manifest.num_classes is not None and manifest.num_classes != num_classes:
        raise TrainExitsError(
            f"model {name!r}: the manifest says {manifest.num_classes} classes, output {final.name!r} gives "
            f"{num_classes}; choose the class scores with --output NAME"
        )
    heads: dict[int, list[HeadInput]] = {}
    for stage in manifest.stages[:-1]:
        usable = [
            HeadInput(t.name, len(t.shape) + 1, t.dtype)
            for t in stage.passed
            if t.dtype in FLOAT_TYPES and len(t.shape) >= 1
        ]
        if not usable:
            raise TrainExitsError(
                f"model {name!r}: stage {stage.index} passes no floating-point tensor a head can pool "
                f"({', '.join(stage.passes)}); split the model at a feature map instead (--split-at)"
            )
        heads[stage.index] = usable
    old = [e.name for e in manifest.exits if e.stage != final_stage]
    if old and not force:
        raise TrainExitsError(
            f"model {name!r} already has exits on its split stages ({', '.join(old)}): rerun with --force to "
            "train new heads in their place"
        )
    return ExitPlan(manifest, model_input, heads, final_stage, final.name, num_classes, old)


def load_labelled(path: Path, plan: ExitPlan) -> LabelledData:
    """x and y (and class_names) from the .npz, checked against the model's input and classes."""
    spec = plan.input
    shape = ", ".join(map(str, spec.shape))
    want = f"x (N, {shape}) {spec.dtype} and y (N,) int labels 0..{plan.num_classes - 1}"
    try:
        archive = np.load(path, allow_pickle=False)
    except (ValueError, OSError) as exc:
        if isinstance(exc, FileNotFoundError):
            raise TrainExitsError(f"--data {path}: no such file; give the .npz with {want}") from None
        raise TrainExitsError(
            f"--data {path}: not a readable .npz ({exc}); write it with np.savez(FILE, x=..., y=...): {want}"
        ) from None
    if not hasattr(archive, "files"):
        raise TrainExitsError(
            f"--data {path}: a single array, not an .npz; write np.savez(FILE, x=..., y=...): {want}"
        )
    with archive:
        missing = [k for k in ("x", "y") if k not in archive.files]
        if missing:
            raise TrainExitsError(
                f"--data {path}: no {' or '.join(repr(k) for k in missing)} in the file (it has "
                f"{', '.join(archive.files) or 'nothing'}); write np.savez(FILE, x=..., y=...): {want}"
            )
        try:
            x, y = archive["x"], archive["y"]
            names = archive["class_names"] if "class_names" in archive.files else None
        except ValueError as exc:  # object arrays need pickle, which is off
            raise TrainExitsError(f"--data {path}: {exc}; store plain numeric arrays and strings") from None
    if x.shape[1:] != spec.shape or x.ndim != len(spec.shape) + 1:
        raise TrainExitsError(
            f"--data {path}: x has shape {list(x.shape)}, model {plan.manifest.name!r} takes "
            f"(N, {shape}) (input {spec.name!r}); preprocess the samples to that shape"
        )
    if x.dtype != np.dtype(spec.dtype):
        raise TrainExitsError(
            f"--data {path}: x is {x.dtype}, model {plan.manifest.name!r} takes {spec.dtype}; "
            f"save x.astype(np.{spec.dtype})"
        )
    if y.ndim != 1 or len(y) != len(x):
        raise TrainExitsError(
            f"--data {path}: y has shape {list(y.shape)}; it needs one label per sample, shape ({len(x)},)"
        )
    if not np.issubdtype(y.dtype, np.integer):
        raise TrainExitsError(
            f"--data {path}: y is {y.dtype}; labels are class indices 0..{plan.num_classes - 1}: save "
            "y.astype(np.int64)"
        )
    out = (y < 0) | (y >= plan.num_classes)
    if out.any():
        raise TrainExitsError(
            f"--data {path}: {int(out.sum())} labels outside 0..{plan.num_classes - 1} "
            f"(e.g. {int(y[out][0])}); the model's output {plan.final_output!r} has {plan.num_classes} "
            "classes, in its own order"
        )
    class_names = None
    if names is not None:
        class_names = tuple(str(n) for n in np.asarray(names).reshape(-1))
        if len(class_names) != plan.num_classes:
            raise TrainExitsError(
                f"--data {path}: {len(class_names)} class_names for {plan.num_classes} classes; give "
                "one name per class or leave class_names out"
            )
    return LabelledData(x=x, y=y.astype(np.int64), class_names=class_names)


def split_indices(n: int, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Shuffled train and held-out indices; too few samples for either is an error."""
    if not 0.0 < val_fraction < 1.0:
        raise TrainExitsError(f"--val-fraction {val_fraction}: give a fraction between 0 and 1, e.g. 0.2")
    n_val = round(n * val_fraction)
    n_train = n - n_val
    if n_train < MIN_TRAIN or n_val < MIN_VAL:
        need = max(int(np.ceil(MIN_VAL / val_fraction)), int(np.ceil(MIN_TRAIN / (1 - val_fraction))))
        raise TrainExitsError(
            f"{n} labelled samples are too few: --val-fraction {val_fraction} leaves {n_train} to train and "
            f"{n_val} to measure, and train-exits needs at least {MIN_TRAIN} and {MIN_VAL}; give at least "
            f"{need} samples (a few hundred or more for useful heads)"
        )
    order = np.random.default_rng(seed).permutation(n)
    return order[n_val:], order[:n_val]


def pool(tensor: np.ndarray) -> np.ndarray:
    """(N, C, ...) -> (N, C): the mean over every axis after the channel axis, as the ONNX head does."""
    t = np.asarray(tensor, dtype=np.float32)
    if t.ndim <= 2:
        return t.reshape(len(t), -1)
    return t.reshape(t.shape[0], t.shape[1], -1).mean(axis=2, dtype=np.float64).astype(np.float32)


def head_features(plan: ExitPlan, stage: int, outputs: dict[tuple[int, str], np.ndarray]) -> np.ndarray:
    return np.concatenate([pool(outputs[stage, h.name]) for h in plan.heads[stage]], axis=1)


class StageRunner:
    """The stage graphs chained with ONNX Runtime, batch by batch (padded for a fixed batch size)."""

    def __init__(self, manifest: Manifest, paths: list[Path], threads: int | None = None) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        if threads is not None:
            options.intra_op_num_threads = threads
        options.log_severity_level = 3
        self.manifest = manifest
        self.sessions = [
            ort.InferenceSession(str(p), options, providers=["CPUExecutionProvider"]) for p in paths
        ]

    def run(
        self, x: np.ndarray, wanted: dict[int, list[str]], upto: int | None = None
    ) -> dict[tuple[int, str], np.ndarray]:
        """Run stages 0..upto on x; the outputs named in `wanted[k]`, keyed (k, name).

        Keyed by stage too: chain stages (`edgeserve export`) all call their passed tensor `features`.
        """
        from edgeserve.runtime.backends.onnxruntime import graph_feeds

        env, n = graph_feeds(self.manifest, {self.manifest.inputs[0].name: x})  # a fixed batch: padded
        found: dict[tuple[int, str], np.ndarray] = {}
        last = len(self.manifest.stages) - 1 if upto is None else upto
        for stage, session in zip(self.manifest.stages[: last + 1], self.sessions, strict=False):
            names = list(dict.fromkeys([*stage.passes, *wanted.get(stage.index, [])]))
            feeds = {name: env[source] for name, source in stage.feeds}
            values = session.run(names, feeds)
            env.update(zip(names, values, strict=True))
            found.update({(stage.index, k): env[k][:n] for k in wanted.get(stage.index, [])})
        return found


def backbone_outputs(plan: ExitPlan) -> dict[int, list[str]]:
    """What the backbone gives that the heads and the checks read: every passed tensor, the final output."""
    wanted = {s.index: list(s.passes) for s in plan.manifest.stages[:-1]}
    wanted[plan.final_stage] = [plan.final_output]
    return wanted


def collect_features(
    plan: ExitPlan,
    runner: StageRunner,
    x: np.ndarray,
    batch_size: int,
    progress: Callable[[int], None] | None = None,
) -> Features:
    """Pooled features at every split stage and the final output, for every sample."""
    wanted = backbone_outputs(plan)
    step = batch_size if plan.manifest.batch is None else plan.manifest.batch
    pooled: dict[int, list[np.ndarray]] = {k: [] for k in plan.heads}
    finals: list[np.ndarray] = []
    sample_passed: dict[tuple[int, str], np.ndarray] = {}
    for start in range(0, len(x), step):
        batch = x[start : start + step]
        outputs = runner.run(batch, wanted)
        if start == 0:
            sample_passed = dict(outputs)
        for k in plan.heads:
            pooled[k].append(head_features(plan, k, outputs))
        finals.append(np.asarray(outputs[plan.final_stage, plan.final_output], dtype=np.float32))
        if progress is not None:
            progress(len(batch))
    return Features(
        pooled={k: np.concatenate(v) for k, v in pooled.items()},
        final=np.concatenate(finals),
        sample_x=x[:step],
        sample_passed=sample_passed,
    )


def train_head(
    features: np.ndarray,
    labels: np.ndarray,
    num_classes: int,
    epochs: int,
    seed: int,
    learning_rate: float = 0.01,
    weight_decay: float = 1e-3,
    batch_size: int = 64,
) -> Head:
    """Softmax regression on standardised features (minibatch Adam); standardisation folded in."""
    rng = np.random.default_rng(seed)
    f = features.astype(np.float64)
    mean = f.mean(axis=0)
    std = f.std(axis=0)
    std[std < 1e-6] = 1.0  # a constant feature carries nothing: leave it unscaled
    z = (f - mean) / std
    n, d = z.shape
    w = np.zeros((num_classes, d))
    b = np.zeros(num_classes)
    m = [np.zeros_like(w), np.zeros_like(b)]
    v = [np.zeros_like(w), np.zeros_like(b)]
    beta1, beta2, eps, t = 0.9, 0.999, 1e-8, 0
    onehot = np.eye(num_classes)[labels]
    for _ in range(epochs):
        order = rng.permutation(n)
        for start in range(0, n, batch_size):
            idx = order[start : start + batch_size]
            logits = z[idx] @ w.T + b
            logits -= logits.max(axis=1, keepdims=True)
            p = np.exp(logits)
            p /= p.sum(axis=1, keepdims=True)
            err = (p - onehot[idx]) / len(idx)
            grads = [err.T @ z[idx] + weight_decay * w, err.sum(axis=0)]
            t += 1
            for i, (param, grad) in enumerate(zip((w, b), grads, strict=True)):
                m[i] = beta1 * m[i] + (1 - beta1) * grad
                v[i] = beta2 * v[i] + (1 - beta2) * grad**2
                step = learning_rate * (m[i] / (1 - beta1**t)) / (np.sqrt(v[i] / (1 - beta2**t)) + eps)
                param -= step
    weight = (w / std).astype(np.float32)
    bias = (b - (w / std) @ mean).astype(np.float32)
    head = Head(weight=weight, bias=bias, train_accuracy=0.0)
    accuracy = top1(head.logits(features), labels)
    return Head(weight=weight, bias=bias, train_accuracy=accuracy)


def top1(scores: np.ndarray, labels: np.ndarray) -> float:
    return float((np.asarray(scores).argmax(axis=1) == labels).mean())


def stage_paths(root: Path, manifest: Manifest) -> list[Path]:
    return [root / manifest.name / s.path for s in manifest.stages]


def progress_bar(total: int, desc: str):
    """tqdm on stderr, shown on a terminal only (as edgeserve-profile's)."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="sample", file=sys.stderr, disable=None, leave=False)


def head_output_name(exit_name: str) -> str:
    return f"{exit_name}.logits"


def exit_name_for(stage: StageSpec, taken: set[str]) -> str:
    """`stage{k+1}` as `edgeserve export` names exits (stage1 is after stage 0), unique in the model."""
    name = f"stage{stage.index + 1}"
    while name in taken:
        name = f"{name}_exit"
    return name
