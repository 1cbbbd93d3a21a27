"""Per-exit accuracy through the backend, written into the manifest without invalidating profiles."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tiny_onnx import TinyRepository, write_eval_file

from edgeserve.errors import InputError
from edgeserve.profiler.evaluate import check_fits, exit_accuracies, load_eval_data, write_accuracies
from edgeserve.profiler.measure import MeasureSettings, measure_model
from edgeserve.runtime.backends.onnxruntime import OnnxRuntimeBackend


def test_accuracies_match_the_reference_and_leave_profiles_valid(
    tmp_path: Path, tiny_repository: TinyRepository
) -> None:
    tiny = tiny_repository.models["tiny_a"]
    repository = tiny_repository.repository
    x = write_eval_file(tmp_path / "eval.npz", tiny)
    data = load_eval_data(tmp_path / "eval.npz")
    backend = OnnxRuntimeBackend(repository, threads=1, warmup=0)
    manifest = repository.load_manifest("tiny_a")
    backend.load(manifest)
    repository.save_profile(
        measure_model(backend, manifest, MeasureSettings(max_batch=2, repeats=2, warmup=0))
    )

    accuracies = exit_accuracies(backend, manifest, data, batch_size=4)  # 23 samples: a ragged last batch
    expected = [float((tiny.forward(x, e).argmax(1) == data.y).mean()) for e in range(3)]
    assert accuracies == pytest.approx(expected) and accuracies[-1] == 1.0

    updated, path = write_accuracies(repository, manifest, accuracies, data.name)
    reloaded = repository.load_manifest("tiny_a")
    assert path == repository.manifest_path("tiny_a") and reloaded == updated
    assert [e.accuracy for e in reloaded.exits] == pytest.approx(expected)
    assert reloaded.accuracy_dataset is not None and reloaded.accuracy_dataset.startswith(
        "eval.npz (23 samples"
    )
    repository.load_profile(reloaded, backend.fingerprint())


def test_missing_eval_file_says_what_to_pass(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"not found.*\.npz with x"):
        load_eval_data(tmp_path / "nope.npz")


def test_eval_file_without_labels_is_refused(tmp_path: Path) -> None:
    np.savez(tmp_path / "e.npz", x=np.zeros((2, 1, 8, 8), np.float32))
    with pytest.raises(InputError, match=r"needs arrays 'x' and 'y', found \['x'\]"):
        load_eval_data(tmp_path / "e.npz")


def test_pickled_eval_file_is_refused(tmp_path: Path) -> None:
    np.savez(tmp_path / "e.npz", x=np.array([{"a": 1}], dtype=object), y=np.zeros(1, np.int64))
    with pytest.raises(InputError, match="cannot read eval data"):
        load_eval_data(tmp_path / "e.npz")


def test_float64_eval_samples_are_refused_with_the_conversion(tmp_path: Path) -> None:
    np.savez(tmp_path / "e.npz", x=np.zeros((2, 1, 8, 8)), y=np.zeros(2, np.int64))
    with pytest.raises(InputError, match=r"astype\(np.float32\)"):
        load_eval_data(tmp_path / "e.npz")


def test_eval_samples_of_another_shape_are_refused(tmp_path: Path, tiny_repository: TinyRepository) -> None:
    np.savez(tmp_path / "e.npz", x=np.zeros((2, 1, 8, 8), np.float32), y=np.zeros(2, np.int64))
    data = load_eval_data(tmp_path / "e.npz")
    check_fits(data, tiny_repository.models["tiny_a"].manifest, "e.npz")
    with pytest.raises(
        InputError, match=r"e.npz: samples are shaped \(1, 8, 8\), model 'tiny_b' takes \(3, 16, 16\)"
    ):
        check_fits(data, tiny_repository.models["tiny_b"].manifest, "e.npz")


def test_labels_beyond_the_classes_are_refused(tmp_path: Path, tiny_repository: TinyRepository) -> None:
    np.savez(tmp_path / "e.npz", x=np.zeros((2, 1, 8, 8), np.float32), y=np.array([0, 5]))
    with pytest.raises(InputError, match=r"0\.\.5.*5 classes"):
        check_fits(load_eval_data(tmp_path / "e.npz"), tiny_repository.models["tiny_a"].manifest, "e.npz")
