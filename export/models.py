"""Model names -> torch modules that follow the early-exit contract, and their repository names.

Requests are validated without torch (the CLI does it before importing anything heavy); only
`build_model` imports torch. Registry: resnet50|resnet101|resnet152 (stem, width, num_classes;
seeded random weights), digits-s|m|l (committed trained weights, with measured per-exit accuracy),
and any user factory given as `package.module:callable`.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from edgeserve.export.errors import ExportError

RESNETS = ("resnet50", "resnet101", "resnet152")
DIGITS = ("digits-s", "digits-m", "digits-l")
KNOWN_MODELS = RESNETS + DIGITS
STEMS = ("cifar", "imagenet")
DEFAULT_STEM = "cifar"
DEFAULT_CLASSES = {"cifar": 100, "imagenet": 1000}
MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")  # one folder under the repository root
_FACTORY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


@dataclass(frozen=True)
class ModelRequest:
    """One model to export: a registry name (`model`) or a user factory (`module`), plus options."""

    model: str | None = None
    module: str | None = None
    stem: str | None = None
    width: float | None = None
    num_classes: int | None = None
    name: str | None = None
    seed: int = 0

    def validate(self) -> None:
        """Raise ExportError for an unknown model or an option that does not apply to it."""
        if (self.model is None) == (self.module is None):
            raise ExportError("give exactly one of a model name (--model) or a factory (--module)")
        if self.module is not None and not _FACTORY.match(self.module):
            raise ExportError(f"--module {self.module!r} must look like package.module:factory")
        if self.model is not None and self.model not in KNOWN_MODELS:
            raise ExportError(
                f"unknown model {self.model!r}; known models: {', '.join(KNOWN_MODELS)} "
                "(or export your own with --module package.module:factory)"
            )
        if self.model not in RESNETS:
            given = [
                f"--{o}"
                for o, v in (("stem", self.stem), ("width", self.width), ("num-classes", self.num_classes))
                if v is not None
            ]
            if given:
                what = self.model or self.module
                raise ExportError(
                    f"{', '.join(given)}: only the ResNets ({', '.join(RESNETS)}) take this, not {what}"
                )
        if self.stem is not None and self.stem not in STEMS:
            raise ExportError(f"unknown stem {self.stem!r}; choose one of {', '.join(STEMS)}")
        if self.width is not None and not self.width > 0:
            raise ExportError(f"--width must be > 0 (1.0 is the standard ResNet), got {self.width}")
        if self.num_classes is not None and self.num_classes < 1:
            raise ExportError(f"--num-classes must be >= 1, got {self.num_classes}")
        if not MODEL_NAME.match(self.repository_name()):
            raise ExportError(
                f"model name {self.repository_name()!r} is not a valid folder name "
                "(use letters, digits, '.', '_', '-')"
            )

    def repository_name(self) -> str:
        """`--name`, or e.g. resnet50-cifar, resnet50-cifar-w0.25, resnet152-imagenet, digits-m."""
        if self.name:
            return self.name
        if self.module is not None:
            return self.module.rsplit(":", 1)[1].replace("_", "-")
        assert self.model is not None
        if self.model not in RESNETS:
            return self.model
        stem = self.stem or DEFAULT_STEM
        name = f"{self.model}-{stem}"
        if self.width is not None and self.width != 1.0:
            name += f"-w{self.width:g}"
        if self.num_classes is not None and self.num_classes != DEFAULT_CLASSES[stem]:
            name += f"-c{self.num_classes}"
        if self.seed:
            name += f"-s{self.seed}"
        return name

    def spec(self) -> dict[str, str]:
        """Provenance for the manifest; also half of the export cache key (the weights are the other)."""
        if self.module is not None:
            return {"model_factory": self.module}
        assert self.model is not None
        if self.model in DIGITS:
            return {
                "model": self.model,
                "weights": f"edgeserve.export/weights/{self.model}.npz (trained on sklearn digits)",
                "preprocessing": "8x8 digits image, pixels/16, 2x nearest upsample -> (1, 16, 16) float32",
            }
        stem = self.stem or DEFAULT_STEM
        return {
            "model": self.model,
            "stem": stem,
            "width": f"{self.width or 1.0:g}",
            "num_classes": str(self.num_classes or DEFAULT_CLASSES[stem]),
            "weights": f"random init, seed {self.seed} (no pretrained weights offline)",
        }


@dataclass(frozen=True)
class BuiltModel:
    """The module to export plus what is known of its accuracy (None: not measured)."""

    module: Any  # torch.nn.Module following edgeserve.export.early_exit.EarlyExitModel
    accuracy: list[float] | None = None
    accuracy_dataset: str | None = None


def build_model(request: ModelRequest) -> BuiltModel:
    """Instantiate the requested model (imports torch). Digits models come with test-split accuracy."""
    request.validate()
    if request.module is not None:
        module = load_factory(request.module)()
        from edgeserve.export.early_exit import exit_stages

        exit_stages(module)
        return BuiltModel(module.eval())
    if request.model in DIGITS:
        from edgeserve.export.digits import exit_accuracies, load_digits_model
        from edgeserve.export.digits_data import ACCURACY_DATASET, load_digits_split

        model = load_digits_model(request.model)
        split = load_digits_split()
        return BuiltModel(model, exit_accuracies(model, split.x_test, split.y_test), ACCURACY_DATASET)
    from edgeserve.export.resnet import early_exit_resnet

    assert request.model is not None
    model = early_exit_resnet(
        request.model,
        stem=request.stem or DEFAULT_STEM,
        width=request.width or 1.0,
        num_classes=request.num_classes,
        seed=request.seed,
    )
    return BuiltModel(model)


def load_factory(spec: str) -> Callable[[], Any]:
    """`package.module:callable` -> the callable. The working directory is importable, as with
    `python -m`, so `--module mymodels:build` finds ./mymodels.py."""
    module_name, _, attribute = spec.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ExportError(
            f"--module {spec}: cannot import {module_name!r} ({exc}); run from the folder that holds it "
            "or add it to PYTHONPATH"
        ) from exc
    factory = getattr(module, attribute, None)
    if not callable(factory):
        raise ExportError(f"--module {spec}: {module_name} has no callable {attribute!r}")
    return factory
