"""Early-exit ResNet50/101/152, written from scratch (no torchvision), with exits after each layer.

Stage 0 = stem + layer1, stage 1 = layer2, stage 2 = layer3, stage 3 = layer4; every stage has an
exit head (adaptive average pool + flatten + one Linear; the last one is the usual avgpool + fc).
No pretrained weights exist offline, so weights are initialised deterministically from a seed, with
BatchNorm statistics randomised around identity so the exported inference-form BatchNorm is really
exercised and activations stay O(1) even through ResNet152.
"""

from __future__ import annotations

import torch
from torch import nn

from edgeserve.export.early_exit import PoolLinearHead

LAYERS: dict[str, tuple[int, int, int, int]] = {
    "resnet50": (3, 4, 6, 3),
    "resnet101": (3, 4, 23, 3),
    "resnet152": (3, 8, 36, 3),
}
EXIT_NAMES = ("layer1", "layer2", "layer3", "final")
STEM_INPUT: dict[str, tuple[int, int, int]] = {"cifar": (3, 32, 32), "imagenet": (3, 224, 224)}
DEFAULT_CLASSES: dict[str, int] = {"cifar": 100, "imagenet": 1000}
MIN_CHANNELS = 8


def scaled(channels: int, width: float) -> int:
    """A channel count under the width multiplier, never below MIN_CHANNELS."""
    return max(MIN_CHANNELS, round(channels * width))


def _bn(channels: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(channels)


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (carries the stride), 1x1 expand x4, plus the identity or a projection."""

    expansion = 4

    def __init__(self, in_channels: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        out = planes * self.expansion
        self.conv1 = nn.Conv2d(in_channels, planes, 1, bias=False)
        self.bn1 = _bn(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = _bn(planes)
        self.conv3 = nn.Conv2d(planes, out, 1, bias=False)
        self.bn3 = _bn(out)
        self.relu = nn.ReLU(inplace=True)
        self.downsample: nn.Module | None = None
        if stride != 1 or in_channels != out:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, out, 1, stride=stride, bias=False), _bn(out)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return self.relu(y + identity)


def _stem(stem: str, channels: int) -> nn.Sequential:
    if stem == "cifar":
        return nn.Sequential(
            nn.Conv2d(3, channels, 3, padding=1, bias=False), _bn(channels), nn.ReLU(inplace=True)
        )
    return nn.Sequential(
        nn.Conv2d(3, channels, 7, stride=2, padding=3, bias=False),
        _bn(channels),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(3, stride=2, padding=1),
    )


class EarlyExitResNet(nn.Module):
    """A bottleneck ResNet cut into four stages, one exit per stage (follows EarlyExitModel)."""

    def __init__(
        self,
        layers: tuple[int, int, int, int],
        *,
        stem: str = "cifar",
        width: float = 1.0,
        num_classes: int | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if stem not in STEM_INPUT:
            raise ValueError(f"stem must be one of {sorted(STEM_INPUT)}, not {stem!r}")
        if width <= 0:
            raise ValueError(f"width must be > 0, not {width}")
        self.input_shape: tuple[int, ...] = STEM_INPUT[stem]
        self.num_classes: int = num_classes or DEFAULT_CLASSES[stem]
        self.exit_names: list[str] = list(EXIT_NAMES)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            stem_channels = scaled(64, width)
            stages: list[nn.Module] = []
            heads: list[nn.Module] = []
            in_channels = stem_channels
            for index, (blocks, planes) in enumerate(zip(layers, (64, 128, 256, 512), strict=True)):
                planes = scaled(planes, width)
                stride = 1 if index == 0 else 2
                layer = []
                for b in range(blocks):
                    layer.append(Bottleneck(in_channels, planes, stride if b == 0 else 1))
                    in_channels = planes * Bottleneck.expansion
                body = nn.Sequential(*layer)
                stages.append(nn.Sequential(_stem(stem, stem_channels), body) if index == 0 else body)
                heads.append(PoolLinearHead(in_channels, self.num_classes))
            self.stages = nn.ModuleList(stages)
            self.heads = nn.ModuleList(heads)
            _init_weights(self)
        self.eval()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The plain (no early exit) forward: all stages, final head."""
        for stage in self.stages:
            x = stage(x)
        return self.heads[-1](x)


@torch.no_grad()
def _init_weights(model: nn.Module) -> None:
    """He init for convs; BatchNorm near identity with random statistics; a damped residual branch.

    Scaling each block's last BatchNorm by 0.2 keeps the residual stream from growing block after
    block, so logits of an untrained ResNet152 stay O(1) and a 1e-4 export tolerance is meaningful.
    """
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            nn.init.kaiming_normal_(module.weight, mode="fan_in", nonlinearity="relu")
        elif isinstance(module, nn.BatchNorm2d):
            module.weight.uniform_(0.8, 1.2)
            module.bias.uniform_(-0.1, 0.1)
            module.running_mean.uniform_(-0.1, 0.1)
            module.running_var.uniform_(0.8, 1.25)
        elif isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=module.in_features**-0.5)
            nn.init.zeros_(module.bias)
    for module in model.modules():
        if isinstance(module, Bottleneck):
            module.bn3.weight.mul_(0.2)


def early_exit_resnet(
    depth: str, *, stem: str = "cifar", width: float = 1.0, num_classes: int | None = None, seed: int = 0
) -> EarlyExitResNet:
    """`depth` is 'resnet50', 'resnet101' or 'resnet152'; the model is returned in eval mode."""
    if depth not in LAYERS:
        raise ValueError(f"unknown ResNet {depth!r}; choose one of {sorted(LAYERS)}")
    return EarlyExitResNet(LAYERS[depth], stem=stem, width=width, num_classes=num_classes, seed=seed)
