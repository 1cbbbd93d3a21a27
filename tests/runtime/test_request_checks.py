"""A request's sample and a backend's outputs, checked without a server (runtime/validation.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tiny_onnx import write_tiny_repository

from edgeserve.manifest import TensorSpec
from edgeserve.runtime.validation import SampleCheck, output_names, outputs_problem


@pytest.fixture(scope="module")
def check(tmp_path_factory: pytest.TempPathFactory) -> SampleCheck:
    tiny = write_tiny_repository(tmp_path_factory.mktemp("checks"))["tiny_a"]
    return SampleCheck.of("tiny_a", tiny.manifest)


def test_a_single_input_model_takes_its_sample_bare_or_in_a_map_naming_its_input(check) -> None:
    assert check.single is not None
    dtype, shape = check.single
    x = np.zeros(shape, dtype)
    assert check.check(x) == (x, None)
    got, problem = check.check({check.inputs[0].name: x})
    assert got is x and problem is None


def test_a_wrong_sample_is_told_what_the_model_takes(check) -> None:
    assert check.single is not None
    dtype, shape = check.single
    _, problem = check.check(np.zeros(shape, np.float64))
    assert problem == f"model 'tiny_a' takes {dtype} input, got float64; convert it before sending"
    _, problem = check.check(np.zeros((1, *shape), dtype))
    assert problem == f"model 'tiny_a' takes one sample shaped {shape}, got {(1, *shape)}"
    _, problem = check.check([0.0])
    assert problem == "model 'tiny_a' takes a numpy array, got list"
    _, problem = check.check({"other": np.zeros(shape, dtype)})
    assert problem is not None and "takes the inputs" in problem and "got ['other']" in problem


def test_a_model_with_several_inputs_takes_a_map_of_them_all() -> None:
    inputs = (TensorSpec("image", (3, 2, 2)), TensorSpec("scale", (1,), "int64"))
    check = SampleCheck("two", inputs, None)
    good = {"image": np.zeros((3, 2, 2), np.float32), "scale": np.zeros(1, np.int64)}
    assert check.check(good) == (good, None)
    _, problem = check.check(np.zeros((3, 2, 2), np.float32))
    assert problem == "model 'two' takes the inputs image, scale (a map from name to array), got ndarray"
    _, problem = check.check(good | {"scale": np.zeros(1, np.float32)})
    assert problem == "input 'scale' of model 'two' takes int64 input, got float32; convert it before sending"


def test_a_backends_outputs_must_have_the_batch_first() -> None:
    assert outputs_problem({"y": np.zeros((4, 10))}, 4) is None
    assert outputs_problem({}, 4) == "backend returned no outputs for a batch of 4"
    assert (
        outputs_problem({"y": np.zeros((3, 10))}, 4)
        == "backend returned (3, 10) for output 'y' of a batch of 4"
    )
    assert outputs_problem({"y": [1]}, 1) == "backend returned list for output 'y' of a batch of 1"


def test_every_exit_answers_under_the_final_exits_names_when_it_has_as_many_outputs(tmp_path: Path) -> None:
    tiny = write_tiny_repository(tmp_path)["tiny_a"]
    names = output_names(tiny.manifest)
    assert len(names) == len(tiny.manifest.exits)
    final = tuple(t.name for t in tiny.manifest.exit_outputs(len(tiny.manifest.exits) - 1))
    assert all(n == final for n in names)
