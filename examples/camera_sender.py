"""A camera client: grab frames, send each with its capture time, print what comes back.

Frames come from a video file or a V4L2 device through OpenCV when it is installed
(`pip install opencv-python-headless`), otherwise from a synthetic moving pattern, so the example
runs anywhere. Frames are sent as uint8 height x width x 3 arrays with `capture_ts`, so the server
budgets each one from the moment it was captured (the model needs a
`[models.<name>.preprocess]` table; see docs/runtime.md). Sending does not wait for answers
(pipelining); answers are printed as they arrive, matched by id.

    .venv/bin/python examples/camera_sender.py --target unix:///run/edgeserve.sock --model cam-net
    .venv/bin/python examples/camera_sender.py --target tcp://127.0.0.1:7070 --model cam-net \\
        --source /dev/video0 --fps 15 --frames 300
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import Counter
from collections.abc import Iterator

import numpy as np

from edgeserve.loop import run
from edgeserve.wire.client import AsyncClient, Reply


def synthetic_frames(height: int = 120, width: int = 160) -> Iterator[np.ndarray]:
    """A moving gradient: cheap, deterministic, and different every frame."""
    ys, xs = np.mgrid[0:height, 0:width]
    t = 0
    while True:
        frame = np.stack([(xs + 3 * t) % 256, (ys + 2 * t) % 256, (xs + ys + t) % 256], axis=-1)
        yield frame.astype(np.uint8)
        t += 1


def opencv_frames(source: str) -> Iterator[np.ndarray]:
    """RGB frames from a file or a device (`/dev/video0` or `0`); needs OpenCV."""
    import cv2  # optional dependency

    capture = cv2.VideoCapture(int(source) if source.isdigit() else source)
    if not capture.isOpened():
        raise SystemExit(f"camera_sender: cannot open {source!r} with OpenCV")
    try:
        while True:
            ok, frame = capture.read()
            if not ok:
                return
            yield cv2.cvtColor(frame, cv2.COLOR_BGR2RGB)
    finally:
        capture.release()


def frames_from(source: str | None) -> Iterator[np.ndarray]:
    if source is None:
        return synthetic_frames()
    try:
        import cv2  # noqa: F401
    except ImportError:
        print("camera_sender: OpenCV is not installed; sending synthetic frames instead")
        return synthetic_frames()
    return opencv_frames(source)


async def main(args: argparse.Namespace) -> None:
    client = await AsyncClient.connect(args.target, token=args.token)
    if args.model not in client.models:
        raise SystemExit(f"camera_sender: the server serves {', '.join(client.models)}, not {args.model!r}")
    if client.models[args.model]["camera_input"] is None:
        raise SystemExit(
            f"camera_sender: {args.model!r} has no preprocess table; it cannot take camera frames"
        )
    statuses: Counter[str] = Counter()
    pending: set[asyncio.Future[Reply]] = set()

    def show(future: asyncio.Future[Reply], captured: float) -> None:
        pending.discard(future)
        if future.exception() is not None:
            statuses["lost"] += 1
            return
        reply = future.result()
        statuses[reply.status] += 1
        age_ms = (time.time() - captured) * 1000.0
        if reply.ok and reply.output is not None:
            top = int(reply.output.argmax())
            print(f"frame {reply.id}: class {top} via {reply.exit_name}, {age_ms:.1f} ms after capture")
        else:
            print(f"frame {reply.id}: {reply.status} ({reply.error})")

    period = 1.0 / args.fps
    next_due = time.monotonic()
    try:
        for index, frame in enumerate(frames_from(args.source)):
            if index >= args.frames:
                break
            await asyncio.sleep(max(0.0, next_due - time.monotonic()))
            next_due += period
            captured = time.time()
            future = client.send(args.model, frame, capture_ts=captured)
            pending.add(future)
            future.add_done_callback(lambda f, c=captured: show(f, c))
        if pending:
            await asyncio.wait(set(pending), timeout=10)
    finally:
        await client.close()
    print("statuses:", dict(statuses))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--target", required=True, help="unix:///path/to.sock or tcp://host:port")
    parser.add_argument("--model", required=True, help="a served model with a preprocess table")
    parser.add_argument("--token")
    parser.add_argument("--source", help="video file or device (/dev/video0, 0); default: synthetic frames")
    parser.add_argument("--fps", type=float, default=30.0)
    parser.add_argument("--frames", type=int, default=100)
    return parser.parse_args()


if __name__ == "__main__":
    run(main(parse_args()))
