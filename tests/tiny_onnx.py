"""Tiny early-exit models written with `onnx.helper`, plus their numpy reference forward.

Tests build their repositories from these instead of exporting torch models: a few kilobytes of
real ONNX per stage, the same layout and names as `edgeserve export` writes (input "x", outputs
"features" and "logits", dynamic batch dimension "batch"), and an independent numpy forward to
check the backend's numbers against.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edgeserve.files import sha256_file
from edgeserve.manifest import ExitSpec, Manifest, StageSpec, TensorSpec
from edgeserve.repository import ModelRepository

OPSET = 17
IR_VERSION = 9


@dataclass(frozen=True)
class StageDef:
    """One stage: a 3x3 convolution (+ReLU) and, where `head` is set, a GAP + Linear exit head."""

    channels: int
    stride: int = 1
    head: str | None = None


@dataclass
class StageWeights:
    conv_w: np.ndarray
    conv_b: np.ndarray
    stride: int
    fc_w: np.ndarray | None = None
    fc_b: np.ndarray | None = None


@dataclass
class TinyModel:
    """A model written into a repository, with everything needed to recompute its logits."""

    manifest: Manifest
    weights: list[StageWeights] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.manifest.name

    def forward(self, x: np.ndarray, exit: int) -> np.ndarray:
        """Logits at `exit` computed in float64 numpy, independently of ONNX Runtime."""
        last = self.manifest.exits[exit].stage
        h = x.astype(np.float64)
        for k in range(last + 1):
            w = self.weights[k]
            h = np.maximum(conv2d(h, w.conv_w, w.conv_b, stride=w.stride, pad=1), 0.0)
        head = self.weights[last]
        assert head.fc_w is not None and head.fc_b is not None
        pooled = h.mean(axis=(2, 3))
        return pooled @ head.fc_w.T.astype(np.float64) + head.fc_b

    def random_input(self, batch: int, seed: int = 0) -> np.ndarray:
        rng = np.random.default_rng(seed)
        return rng.standard_normal((batch, *self.manifest.input.shape)).astype(np.float32)


def conv2d(x: np.ndarray, w: np.ndarray, b: np.ndarray, stride: int, pad: int) -> np.ndarray:
    """NCHW convolution with square kernels, the way ONNX Conv defines it."""
    k = w.shape[-1]
    padded = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, (k, k), axis=(2, 3))
    windows = windows[:, :, ::stride, ::stride]
    return np.einsum("nchwij,ocij->nohw", windows, w.astype(np.float64)) + b[None, :, None, None]


def _stage_graph(
    index: int, in_channels: int, stage: StageDef, num_classes: int, rng: np.random.Generator, last: bool
) -> tuple[onnx.ModelProto, StageWeights]:
    scale = 1.0 / np.sqrt(in_channels * 9)
    conv_w = (rng.standard_normal((stage.channels, in_channels, 3, 3)) * scale).astype(np.float32)
    conv_b = (rng.standard_normal(stage.channels) * 0.1).astype(np.float32)
    weights = StageWeights(conv_w=conv_w, conv_b=conv_b, stride=stage.stride)
    inits = [numpy_helper.from_array(conv_w, "conv_w"), numpy_helper.from_array(conv_b, "conv_b")]
    nodes = [
        helper.make_node(
            "Conv", ["x", "conv_w", "conv_b"], ["conv"], pads=[1, 1, 1, 1], strides=[stage.stride] * 2
        ),
        helper.make_node("Relu", ["conv"], ["features" if not last else "relu"]),
    ]
    feat = "features" if not last else "relu"
    outputs = []
    if not last:
        outputs.append(
            helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", None, None, None])
        )
    if stage.head is not None:
        fc_w = (rng.standard_normal((num_classes, stage.channels)) / np.sqrt(stage.channels)).astype(
            np.float32
        )
        fc_b = (rng.standard_normal(num_classes) * 0.1).astype(np.float32)
        weights.fc_w, weights.fc_b = fc_w, fc_b
        inits += [numpy_helper.from_array(fc_w, "fc_w"), numpy_helper.from_array(fc_b, "fc_b")]
        nodes += [
            helper.make_node("GlobalAveragePool", [feat], ["pooled"]),
            helper.make_node("Flatten", ["pooled"], ["flat"], axis=1),
            helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], transB=1),
        ]
        outputs.append(helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", num_classes]))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", in_channels, None, None])
    graph = helper.make_graph(nodes, f"stage{index}", [x], outputs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return model, weights


def write_tiny_model(
    repository: ModelRepository,
    name: str,
    input_shape: tuple[int, int, int],
    stages: list[StageDef],
    num_classes: int = 5,
    seed: int = 0,
) -> TinyModel:
    """Write the stage graphs and a checksummed manifest under `repository.root / name`."""
    rng = np.random.default_rng(seed)
    model_dir = repository.model_dir(name)
    (model_dir / "onnx").mkdir(parents=True, exist_ok=True)
    channels, (height, width) = input_shape[0], input_shape[1:]
    specs: list[StageSpec] = []
    exits: list[ExitSpec] = []
    weights: list[StageWeights] = []
    for k, stage in enumerate(stages):
        last = k == len(stages) - 1
        if last and stage.head is None:
            raise ValueError("the last stage needs an exit head")
        graph, stage_weights = _stage_graph(k, channels, stage, num_classes, rng, last)
        rel = f"onnx/stage{k}.onnx"
        path = model_dir / rel
        onnx.save(graph, str(path))
        in_spec = TensorSpec("x", (channels, height, width))
        height, width = (height - 1) // stage.stride + 1, (width - 1) // stage.stride + 1
        channels = stage.channels
        specs.append(
            StageSpec.chain(
                index=k,
                path=rel,
                sha256=sha256_file(path),
                size_bytes=path.stat().st_size,
                input=in_spec,
                logits=TensorSpec("logits", (num_classes,)) if stage.head else None,
                features=None if last else TensorSpec("features", (channels, height, width)),
            )
        )
        if stage.head:
            exits.append(ExitSpec(name=stage.head, stage=k))
        weights.append(stage_weights)
    manifest = Manifest(
        name=name,
        inputs=(TensorSpec("x", tuple(input_shape)),),
        num_classes=num_classes,
        stages=tuple(specs),
        exits=tuple(exits),
        source={"builder": "tests/tiny_onnx.py", "seed": str(seed)},
    )
    repository.save_manifest(manifest)
    return TinyModel(manifest=manifest, weights=weights)


def write_tiny_repository(root: Path) -> dict[str, TinyModel]:
    """Two models of different cost; `tiny_b` has a stage without an exit head."""
    repository = ModelRepository(root)
    return {
        "tiny_a": write_tiny_model(
            repository,
            "tiny_a",
            (1, 8, 8),
            [StageDef(4, head="layer1"), StageDef(8, stride=2, head="layer2"), StageDef(8, head="final")],
            seed=1,
        ),
        "tiny_b": write_tiny_model(
            repository,
            "tiny_b",
            (3, 16, 16),
            [StageDef(16, head="early"), StageDef(32, stride=2), StageDef(32, head="final")],
            num_classes=7,
            seed=2,
        ),
    }


def write_eval_file(path: Path, tiny: TinyModel, n: int = 23) -> np.ndarray:
    """Labels are the final exit's reference predictions, so the final exit scores 100%."""
    x = tiny.random_input(n, seed=7)
    y = tiny.forward(x, len(tiny.manifest.exits) - 1).argmax(axis=1).astype(np.int64)
    np.savez(path, x=x, y=y)
    return x


@dataclass
class TinyRepository:
    """What the `tiny_repository` fixture hands a test."""

    root: Path
    repository: ModelRepository
    models: dict[str, TinyModel]
