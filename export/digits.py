"""digits-s, digits-m, digits-l: a small early-exit CNN family standing in for ResNet50/101/152.

Trained in seconds on scikit-learn's digits (see train_digits), they give the CPU demo three
models whose exits really differ in cost and accuracy. The first three stages run at full 16x16
resolution with few channels, so their receptive fields stay small and the early exits stay
clearly weaker; the last stage widens and downsamples, which is where most of the cost (and the
last few points of accuracy) is, and where the three models differ most.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from edgeserve.export.digits_data import INPUT_SHAPE, NUM_CLASSES
from edgeserve.export.early_exit import PoolLinearHead, forward_exit
from edgeserve.export.state_npz import load_state_npz

EXIT_NAMES = ("stage1", "stage2", "stage3", "final")
WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"

# Per model, per stage: the (out_channels, stride) of each conv3x3-BN-ReLU.
ARCHITECTURES: dict[str, tuple[tuple[tuple[int, int], ...], ...]] = {
    "digits-s": (((8, 1),), ((16, 1),), ((16, 1),), ((32, 1), (48, 2))),
    "digits-m": (((8, 1),), ((16, 1),), ((16, 1), (16, 1)), ((32, 1), (64, 2), (64, 1))),
    "digits-l": (((8, 1),), ((16, 1),), ((16, 1), (16, 1), (16, 1)), ((48, 1), (48, 1), (96, 2), (96, 1))),
}
DIGITS_MODELS = tuple(ARCHITECTURES)


def _conv_bn_relu(in_channels: int, out_channels: int, stride: int) -> list[nn.Module]:
    return [
        nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(inplace=True),
    ]


class DigitsNet(nn.Module):
    """Plain conv stages with a pool+Linear head after each (follows EarlyExitModel)."""

    def __init__(self, architecture: tuple[tuple[tuple[int, int], ...], ...]) -> None:
        super().__init__()
        self.input_shape: tuple[int, ...] = INPUT_SHAPE
        self.num_classes: int = NUM_CLASSES
        self.exit_names: list[str] = list(EXIT_NAMES)
        if len(architecture) != len(EXIT_NAMES):
            raise ValueError(f"a digits model has {len(EXIT_NAMES)} stages, got {len(architecture)}")
        stages, heads = [], []
        channels = INPUT_SHAPE[0]
        for convs in architecture:
            layers: list[nn.Module] = []
            for out_channels, stride in convs:
                layers += _conv_bn_relu(channels, out_channels, stride)
                channels = out_channels
            stages.append(nn.Sequential(*layers))
            heads.append(PoolLinearHead(channels, NUM_CLASSES))
        self.stages = nn.ModuleList(stages)
        self.heads = nn.ModuleList(heads)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for stage in self.stages:
            x = stage(x)
        return self.heads[-1](x)

    def all_exit_logits(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Logits of every exit in one pass (training sums their losses)."""
        logits = []
        for stage, head in zip(self.stages, self.heads, strict=True):
            x = stage(x)
            logits.append(head(x))
        return logits


def build_digits_model(name: str, *, seed: int = 0) -> DigitsNet:
    """A freshly initialised (untrained) digits model, deterministic for a given seed."""
    if name not in ARCHITECTURES:
        raise ValueError(f"unknown digits model {name!r}; choose one of {list(DIGITS_MODELS)}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return DigitsNet(ARCHITECTURES[name])


def weights_path(name: str) -> Path:
    return WEIGHTS_DIR / f"{name}.npz"


def load_digits_model(name: str, path: Path | None = None) -> DigitsNet:
    """The trained model from the committed weights (export/weights/<name>.npz), in eval mode."""
    model = build_digits_model(name)
    fix = "retrain with `python -m edgeserve.export.train_digits`"
    load_state_npz(model, path or weights_path(name), fix)
    return model.eval()


@torch.no_grad()
def exit_accuracies(model: DigitsNet, x: np.ndarray, y: np.ndarray) -> list[float]:
    """Top-1 accuracy (fraction) of every exit on (x, y), in eval mode."""
    was_training = model.training
    model.eval()
    inputs = torch.from_numpy(x)
    labels = torch.from_numpy(y)
    accuracies = [
        float((forward_exit(model, inputs, k).argmax(1) == labels).float().mean())
        for k in range(len(model.exit_names))
    ]
    model.train(was_training)
    return accuracies
