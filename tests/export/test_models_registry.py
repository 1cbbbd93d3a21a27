"""The model registry: names, repository names, option checks and user factories."""

from __future__ import annotations

import re
import sys
import textwrap

import pytest

from edgeserve.export import digits, models, resnet
from edgeserve.export.digits_data import ACCURACY_DATASET
from edgeserve.export.errors import ExportError
from edgeserve.export.models import ModelRequest, build_model


def test_registry_names_agree_with_the_model_modules() -> None:
    assert set(models.RESNETS) == set(resnet.LAYERS)
    assert models.DIGITS == digits.DIGITS_MODELS
    assert set(models.STEMS) == set(resnet.STEM_INPUT)
    assert models.DEFAULT_CLASSES == resnet.DEFAULT_CLASSES


@pytest.mark.parametrize(
    ("request_", "name"),
    [
        (ModelRequest(model="resnet50"), "resnet50-cifar"),
        (ModelRequest(model="resnet50", width=0.25), "resnet50-cifar-w0.25"),
        (ModelRequest(model="resnet50", width=1.0, num_classes=100), "resnet50-cifar"),
        (ModelRequest(model="resnet152", stem="imagenet"), "resnet152-imagenet"),
        (ModelRequest(model="resnet101", num_classes=10), "resnet101-cifar-c10"),
        (ModelRequest(model="digits-m"), "digits-m"),
        (ModelRequest(model="resnet50", name="mine"), "mine"),
        (ModelRequest(module="pkg.mod:make_toy"), "make-toy"),
    ],
)
def test_default_repository_names(request_: ModelRequest, name: str) -> None:
    request_.validate()
    assert request_.repository_name() == name


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (
            ModelRequest(model="resnet18"),
            "known models: resnet50, resnet101, resnet152, digits-s, digits-m, digits-l",
        ),
        (ModelRequest(model="digits-s", width=0.5), "--width: only the ResNets"),
        (ModelRequest(model="resnet50", width=0), "--width must be > 0"),
        (ModelRequest(model="resnet50", stem="mnist"), "unknown stem"),
        (ModelRequest(model="resnet50", name="../escape"), "not a valid folder name"),
        (ModelRequest(module="no_colon"), "package.module:factory"),
        (ModelRequest(), "exactly one of"),
    ],
)
def test_bad_requests_are_refused_with_what_to_change(request_: ModelRequest, message: str) -> None:
    with pytest.raises(ExportError, match=re.escape(message)):
        request_.validate()


def test_spec_records_what_decides_the_weights() -> None:
    spec = ModelRequest(model="resnet50", width=0.25).spec()
    assert spec == {
        "model": "resnet50",
        "stem": "cifar",
        "width": "0.25",
        "num_classes": "100",
        "weights": "random init, seed 0 (no pretrained weights offline)",
    }
    assert ModelRequest(model="digits-s").spec()["model"] == "digits-s"


def test_resnet_requests_build_the_asked_architecture() -> None:
    built = build_model(ModelRequest(model="resnet101", stem="imagenet", width=0.125, num_classes=5))
    assert built.module.input_shape == (3, 224, 224) and built.module.num_classes == 5
    assert len(built.module.stages[2]) == 23
    assert built.accuracy is None


def test_digits_requests_carry_measured_accuracy_per_exit() -> None:
    built = build_model(ModelRequest(model="digits-s"))
    assert built.accuracy_dataset == ACCURACY_DATASET
    assert len(built.accuracy) == 4 and all(0 <= a <= 1 for a in built.accuracy)


def test_a_user_factory_is_loaded_from_the_working_directory(tmp_path, monkeypatch) -> None:
    (tmp_path / "user_models_for_test.py").write_text(
        textwrap.dedent(
            """
            from edgeserve.export.digits import build_digits_model

            def make():
                return build_digits_model("digits-s", seed=3)

            not_callable = 3
            """
        )
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    built = build_model(ModelRequest(module="user_models_for_test:make"))
    assert built.module.exit_names == ["stage1", "stage2", "stage3", "final"]
    with pytest.raises(ExportError, match="no callable 'not_callable'"):
        build_model(ModelRequest(module="user_models_for_test:not_callable"))
    with pytest.raises(ExportError, match="cannot import 'missing_module_xyz'"):
        build_model(ModelRequest(module="missing_module_xyz:make"))
    sys.modules.pop("user_models_for_test", None)
