"""Start-up checks: can this model take this camera's frames? One clear sentence when it cannot.

Frames go to the server as uint8 height x width x channels, and the server resizes, reorders
colours, normalises and lays them out per the model's `[models.<name>.preprocess]` table
(docs/protocol.md, docs/runtime.md): the table lives in one place, is reloadable, and raw uint8
is 4x smaller than float32. The hello tells the client the model's input shape and the colour order
the server expects; this module runs the same preprocessing code on the first frame, so a model
that cannot take these frames fails at start-up instead of answering `invalid` for every frame.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from edgeserve.config.checks import image_layout
from edgeserve.config.server import PreprocessConfig
from edgeserve.errors import EdgeServeError
from edgeserve.net.preprocess import PreprocessError, preprocess_frame

FRAME_OVERHEAD_BYTES = 512  # the infer message around the tensor's bytes


class CameraSetupError(EdgeServeError):
    """The camera, the model and the server do not fit together; retrying cannot help."""


@dataclass(frozen=True)
class ModelFit:
    """What the stream needs to send frames to a model: the colour order and the input shape."""

    model: str
    channels: str  # "rgb" | "bgr" | "gray"
    input_shape: tuple[int, ...]


def model_fit(name: str, model: str, hello: dict[str, Any]) -> ModelFit:
    """The model's camera input from the server's hello; CameraSetupError when it has none."""
    models = hello.get("models") or {}
    if model not in models:
        served = ", ".join(sorted(models)) or "nothing"
        raise CameraSetupError(f"{name}: the server does not serve {model!r}; it serves {served}")
    entry = models[model]
    camera = entry.get("camera_input")
    if camera is None:
        raise CameraSetupError(
            f"{name}: model {model!r} takes no camera frames: add a [models.{model}.preprocess] table "
            "to the server config (docs/runtime.md)"
        )
    return ModelFit(model, str(camera.get("channels", "rgb")), tuple(entry["input"]["shape"]))


def to_channels(image: np.ndarray, channels: str) -> np.ndarray:
    """An RGB HxWx3 frame in the order the server expects (the source always yields RGB)."""
    if channels == "bgr":
        return np.ascontiguousarray(image[:, :, ::-1])
    if channels == "gray":
        weights = np.array([77, 150, 29], dtype=np.uint16)  # 0.299, 0.587, 0.114 in 1/256ths
        return ((image.astype(np.uint16) @ weights) >> 8).astype(np.uint8)[:, :, None]
    return image


def check_frames(name: str, fit: ModelFit, frame: np.ndarray, max_frame_bytes: int) -> list[str]:
    """CameraSetupError unless the server can preprocess frames like `frame` for the model.

    Returns warnings (aspect ratio) worth one log line. `frame` is already in the server's order.
    """
    height, width = frame.shape[:2]
    size = f"{width}x{height}"
    if len(fit.input_shape) != 3:
        raise CameraSetupError(
            f"{name}: model {fit.model!r} takes {list(fit.input_shape)}, not an image (C, H, W)"
        )
    want_h, want_w = fit.input_shape[1:] if image_layout(fit.input_shape) == "chw" else fit.input_shape[:2]
    if height < want_h or width < want_w:
        raise CameraSetupError(
            f"{name}: frames are {size}, smaller than {fit.model!r}'s {want_w}x{want_h} input; "
            "the server would upscale them: use a larger capture size"
        )
    nbytes = frame.nbytes + FRAME_OVERHEAD_BYTES
    if nbytes > max_frame_bytes:
        raise CameraSetupError(
            f"{name}: {size} frames are {frame.nbytes} bytes, over the server's max_frame_bytes "
            f"({max_frame_bytes}): capture smaller frames (e.g. ?video_size=1280x720) or raise "
            "listen.max_frame_bytes"
        )
    try:
        sample = preprocess_frame(frame, PreprocessConfig(channels=fit.channels), fit.input_shape)
    except PreprocessError as exc:
        raise CameraSetupError(f"{name}: {fit.model!r} cannot take {size} frames: {exc}") from None
    if sample.shape != fit.input_shape:
        raise CameraSetupError(f"{name}: preprocessing gives {sample.shape}, not {fit.input_shape}")
    warnings = []
    frame_aspect, model_aspect = width / height, want_w / want_h
    if abs(frame_aspect / model_aspect - 1.0) > 0.1:
        aspect = f"aspect {frame_aspect:.2f} -> {model_aspect:.2f}"
        warnings.append(f"{size} frames are stretched to {want_w}x{want_h} ({aspect})")
    return warnings
