"""Camera frames (uint8, height x width x channels) to a model's image input, in numpy.

The input is (C, H, W) or (H, W, C) with 1 or 3 channels (`image_layout`), float (scaled and
normalised as the `[preprocess]` config says) or uint8 (the resized pixels as they are: a graph
that normalises inside). No OpenCV dependency: nearest and bilinear resizing are a few index
computations, fast enough for the small inputs edge models take.
"""

from __future__ import annotations

import numpy as np

from edgeserve.config.checks import IMAGE_DTYPES, image_layout
from edgeserve.config.server import PreprocessConfig


class PreprocessError(ValueError):
    """The frame does not fit the model's preprocessing; the message says how."""


def resize(frame: np.ndarray, height: int, width: int, interpolation: str = "bilinear") -> np.ndarray:
    """Resize an HxWxC array to height x width (float32 result), pixel centres aligned."""
    h, w = frame.shape[:2]
    src = frame.astype(np.float32, copy=False)
    if (h, w) == (height, width):
        return src
    ys = (np.arange(height, dtype=np.float32) + 0.5) * (h / height) - 0.5
    xs = (np.arange(width, dtype=np.float32) + 0.5) * (w / width) - 0.5
    if interpolation == "nearest":
        yi = np.clip(np.round(ys), 0, h - 1).astype(np.intp)
        xi = np.clip(np.round(xs), 0, w - 1).astype(np.intp)
        return src[yi][:, xi]
    ys, xs = np.clip(ys, 0, h - 1), np.clip(xs, 0, w - 1)
    y0, x0 = np.floor(ys).astype(np.intp), np.floor(xs).astype(np.intp)
    y1, x1 = np.minimum(y0 + 1, h - 1), np.minimum(x0 + 1, w - 1)
    wy, wx = (ys - y0)[:, None, None], (xs - x0)[None, :, None]
    top = src[y0][:, x0] * (1 - wx) + src[y0][:, x1] * wx
    bottom = src[y1][:, x0] * (1 - wx) + src[y1][:, x1] * wx
    return top * (1 - wy) + bottom * wy


def preprocess_frame(
    frame: np.ndarray, config: PreprocessConfig, input_shape: tuple[int, ...], dtype: str = "float32"
) -> np.ndarray:
    """One uint8 HWC frame -> the model's sample: (C, H, W) or (H, W, C), of its dtype."""
    layout = image_layout(input_shape)
    if layout is None or dtype not in IMAGE_DTYPES:
        raise PreprocessError(
            f"camera preprocessing needs an image input ((C, H, W) or (H, W, C) with 1 or 3 channels, "
            f"{'/'.join(IMAGE_DTYPES)}), not {dtype} {input_shape}"
        )
    if layout == "chw":
        want_c, want_h, want_w = input_shape
    else:
        want_h, want_w, want_c = input_shape
    sent_c = 1 if config.channels == "gray" else 3
    if frame.dtype != np.uint8:
        raise PreprocessError(f"camera frames must be uint8, got {frame.dtype}")
    if frame.ndim == 2 and sent_c == 1:
        frame = frame[:, :, None]
    if frame.ndim != 3 or frame.shape[2] != sent_c or frame.shape[0] == 0 or frame.shape[1] == 0:
        raise PreprocessError(
            f"camera frames must be height x width x {sent_c} ({config.channels}), got {tuple(frame.shape)}"
        )
    height, width = config.resize or (want_h, want_w)
    if (height, width) != (want_h, want_w):
        raise PreprocessError(
            f"preprocess.resize {height}x{width} does not match the model's {want_h}x{want_w}"
        )
    image = resize(frame, height, width, config.interpolation)
    if config.channels == "bgr":
        image = image[:, :, ::-1]
    if want_c == 1 and image.shape[2] == 3:
        image = image @ np.array([0.299, 0.587, 0.114], dtype=np.float32)
        image = image[:, :, None]
    elif want_c == 3 and image.shape[2] == 1:
        image = np.repeat(image, 3, axis=2)
    elif image.shape[2] != want_c:
        raise PreprocessError(f"the model takes {want_c} channels; frames have {image.shape[2]}")
    if dtype == "uint8":
        image = np.clip(np.rint(image), 0, 255)
    else:
        mean = np.asarray(config.mean, dtype=np.float32)
        std = np.asarray(config.std, dtype=np.float32)
        image = (image * np.float32(config.scale) - mean) / std
    if layout == "chw":
        image = image.transpose(2, 0, 1)
    return np.ascontiguousarray(image, dtype=np.dtype(dtype))
