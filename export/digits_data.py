"""scikit-learn's bundled digits (1797 8x8 images, 10 classes) as the digits models see them.

No download: the data ships with scikit-learn. The split is fixed (stratified, seed 0, 20% test)
so that training, the accuracies written into manifests and the profiler's `--eval` file agree.
Images are scaled to [0, 1] and upsampled 2x (nearest) to 16x16, which gives the models enough
spatial work to reach millisecond latencies on a CPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

SPLIT_SEED = 0
TEST_FRACTION = 0.2
UPSAMPLE = 2
INPUT_SHAPE = (1, 8 * UPSAMPLE, 8 * UPSAMPLE)
NUM_CLASSES = 10
ACCURACY_DATASET = "sklearn-digits-test"


@dataclass(frozen=True)
class DigitsSplit:
    """Model-ready arrays: x (N, 1, 16, 16) float32 in [0, 1], y (N,) int64."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


def to_model_input(images: np.ndarray) -> np.ndarray:
    """Raw digits images (N, 8, 8), pixel values 0..16 -> (N, 1, 16, 16) float32 in [0, 1]."""
    scaled = np.asarray(images, dtype=np.float32) / 16.0
    upsampled = scaled.repeat(UPSAMPLE, axis=1).repeat(UPSAMPLE, axis=2)
    return np.ascontiguousarray(upsampled[:, None, :, :])


def load_digits_split() -> DigitsSplit:
    """The fixed train/test split (1437 / 360 images)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = to_model_input(digits.images)
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=TEST_FRACTION, stratify=y, random_state=SPLIT_SEED
    )
    return DigitsSplit(x_train, y_train, x_test, y_test)


def write_eval_data(path: Path) -> Path:
    """Write the test split as an eval .npz (`x` float32 in the model input shape, `y` int64).

    This is the format `edgeserve-profile --eval` reads; written via a temporary file and a rename.
    """
    split = load_digits_split()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("wb") as f:
        np.savez(f, x=split.x_test, y=split.y_test)
    tmp.replace(path)
    return path
