"""The digits model family: data split, committed weights, accuracy by exit, deterministic training."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edgeserve.export.digits import (
    DIGITS_MODELS,
    build_digits_model,
    exit_accuracies,
    load_digits_model,
    weights_path,
)
from edgeserve.export.digits_data import DigitsSplit, load_digits_split, write_eval_data
from edgeserve.export.errors import ExportError
from edgeserve.export.state_npz import save_state_npz, state_sha256
from edgeserve.export.train_digits import TrainConfig, train_digits_model


@pytest.fixture(scope="module")
def split() -> DigitsSplit:
    return load_digits_split()


def test_split_is_fixed_stratified_and_model_ready(split: DigitsSplit) -> None:
    assert split.x_train.shape == (1437, 1, 16, 16) and split.x_test.shape == (360, 1, 16, 16)
    assert split.x_train.dtype == np.float32 and split.y_test.dtype == np.int64
    assert split.x_test.min() == 0.0 and split.x_test.max() == 1.0
    assert np.bincount(split.y_test, minlength=10).min() >= 35  # stratified: ~36 of each digit
    again = load_digits_split()
    assert np.array_equal(again.x_test, split.x_test) and np.array_equal(again.y_test, split.y_test)


@pytest.mark.parametrize("name", DIGITS_MODELS)
def test_committed_weights_give_accuracy_that_increases_with_depth(name: str, split: DigitsSplit) -> None:
    accuracy = exit_accuracies(load_digits_model(name), split.x_test, split.y_test)
    assert all(np.diff(accuracy) > 0), accuracy
    assert accuracy[-1] >= 0.95, accuracy
    assert accuracy[0] <= 0.5, f"the first exit should be clearly weaker: {accuracy}"


def test_models_grow_in_depth_and_size(split: DigitsSplit) -> None:
    sizes = [sum(p.numel() for p in build_digits_model(n).parameters()) for n in DIGITS_MODELS]
    convs = [
        sum(isinstance(m, torch.nn.Conv2d) for m in build_digits_model(n).modules()) for n in DIGITS_MODELS
    ]
    assert sizes == sorted(sizes) and len(set(sizes)) == 3
    assert convs == sorted(convs) and len(set(convs)) == 3


@pytest.mark.parametrize("name", DIGITS_MODELS)
def test_committed_weights_are_small_pickle_free_npz_keyed_by_state_dict(name: str) -> None:
    path = weights_path(name)
    assert path.stat().st_size < 1024 * 1024
    with np.load(path, allow_pickle=False) as data:
        assert sorted(data.files) == sorted(build_digits_model(name).state_dict())


def test_weights_of_another_model_are_refused_with_the_retrain_command(tmp_path) -> None:
    path = save_state_npz(build_digits_model("digits-s"), tmp_path / "s.npz")
    with pytest.raises(
        ExportError, match=r"s\.npz: weights do not fit .*python -m edgeserve.export.train_digits"
    ):
        load_digits_model("digits-m", path=path)
    with pytest.raises(ExportError, match="weights file is missing"):
        load_digits_model("digits-m", path=tmp_path / "absent.npz")


def test_eval_data_file_is_the_test_split_in_the_profiler_format(tmp_path, split: DigitsSplit) -> None:
    path = write_eval_data(tmp_path / "eval" / "digits-test.npz")
    with np.load(path, allow_pickle=False) as data:
        assert sorted(data.files) == ["x", "y"]
        assert data["x"].dtype == np.float32 and data["y"].dtype == np.int64
        assert np.array_equal(data["x"], split.x_test) and np.array_equal(data["y"], split.y_test)


def test_training_is_deterministic_and_leaves_torch_settings_alone(split: DigitsSplit) -> None:
    small = DigitsSplit(split.x_train[:192], split.y_train[:192], split.x_test[:64], split.y_test[:64])
    config = TrainConfig(epochs=2, batch_size=64)
    threads = torch.get_num_threads()
    first_model, first = train_digits_model("digits-s", small, config)
    second_model, second = train_digits_model("digits-s", small, config)
    assert first.epoch_losses == second.epoch_losses
    assert state_sha256(first_model) == state_sha256(second_model)
    assert first.epoch_losses[1] < first.epoch_losses[0]
    assert torch.get_num_threads() == threads and not torch.are_deterministic_algorithms_enabled()
    assert not first_model.training
