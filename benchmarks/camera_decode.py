"""Decode cost per frame of PyAV and OpenCV on this machine: which library `edgeserve camera` uses.

    .venv/bin/python benchmarks/camera_decode.py                 # ~1 min on a 2-core VM
    .venv/bin/python benchmarks/camera_decode.py --frames 60 --repeats 2

Writes its own clips with PyAV (H.264 through libx264 and MJPEG, 640x480 and 1280x720, a moving
pattern with noise so the encoder cannot skip work), then decodes each to RGB uint8 arrays (what a
camera source hands the sender) with every library importable here: PyAV (`to_ndarray("rgb24")`)
and OpenCV (`VideoCapture` + `cvtColor`, its FFmpeg backend). Both decode on one thread, the
per-camera budget on an edge box running several cameras. Prints wall and CPU milliseconds per
frame (median over the repeats); CPU time is the steadier number on a shared machine.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

SIZES = ((640, 480), (1280, 720))
CODECS = (("h264", "libx264", "mp4", "yuv420p"), ("mjpeg", "mjpeg", "avi", "yuvj420p"))


def write_clip(path: Path, codec: str, pix_fmt: str, width: int, height: int, frames: int) -> None:
    import av

    rng = np.random.default_rng(0)
    ys, xs = np.mgrid[0:height, 0:width]
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=30)
        stream.width, stream.height, stream.pix_fmt = width, height, pix_fmt
        if codec == "libx264":
            stream.options = {"preset": "veryfast", "tune": "zerolatency"}
        for t in range(frames):
            base = np.stack([(xs + 4 * t) % 256, (ys + 3 * t) % 256, ((xs + ys) // 2 + t) % 256], axis=-1)
            noise = rng.integers(0, 24, size=(height, width, 1))
            image = np.clip(base + noise, 0, 255).astype(np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def decode_pyav(path: Path) -> int:
    import av

    count = 0
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        stream.thread_count = 1
        for frame in container.decode(stream):
            frame.to_ndarray(format="rgb24")
            count += 1
    return count


def decode_opencv(path: Path) -> int:
    import cv2

    capture = cv2.VideoCapture(str(path), cv2.CAP_FFMPEG, [cv2.CAP_PROP_N_THREADS, 1])
    count = 0
    try:
        while True:
            ok, frame = capture.read()
            if not ok:
                break
            cv2.cvtColor(frame, cv2.COLOR_BGR2RGB)
            count += 1
    finally:
        capture.release()
    return count


def decoders() -> dict[str, Callable[[Path], int]]:
    found: dict[str, Callable[[Path], int]] = {}
    try:
        import av

        found[f"PyAV {av.__version__}"] = decode_pyav
    except ImportError:
        pass
    try:
        import cv2

        cv2.setNumThreads(1)
        found[f"OpenCV {cv2.__version__}"] = decode_opencv
    except ImportError:
        pass
    return found


def measure(decode: Callable[[Path], int], path: Path, repeats: int) -> tuple[float, float, int]:
    """(wall ms per frame, CPU ms per frame, frames), medians over `repeats` runs after one warm-up."""
    decode(path)
    walls, cpus, count = [], [], 0
    for _ in range(repeats):
        wall0, cpu0 = time.perf_counter(), time.process_time()
        count = decode(path)
        walls.append((time.perf_counter() - wall0) * 1000.0 / max(count, 1))
        cpus.append((time.process_time() - cpu0) * 1000.0 / max(count, 1))
    return statistics.median(walls), statistics.median(cpus), count


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--frames", type=int, default=120, help="frames per clip")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    found = decoders()
    if "PyAV" not in " ".join(found):
        raise SystemExit("the clips are written with PyAV: pip install 'edgeserve[camera]'")
    print(f"decoders: {', '.join(found)}; {args.frames} frames per clip, median of {args.repeats} runs")
    print(f"{'clip':<22} {'decoder':<16} {'frames':>6} {'wall ms/frame':>14} {'CPU ms/frame':>13}")
    with tempfile.TemporaryDirectory() as tmp:
        for name, codec, container, pix_fmt in CODECS:
            for width, height in SIZES:
                path = Path(tmp) / f"{name}-{width}x{height}.{container}"
                write_clip(path, codec, pix_fmt, width, height, args.frames)
                for decoder, decode in found.items():
                    wall, cpu, count = measure(decode, path, args.repeats)
                    clip = f"{name} {width}x{height}"
                    print(f"{clip:<22} {decoder:<16} {count:>6} {wall:>14.3f} {cpu:>13.3f}", flush=True)


if __name__ == "__main__":
    main()
