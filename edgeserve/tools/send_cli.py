"""`edgeserve send`: send an image, a .npy file or synthetic inputs to a running server; print answers."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

EPILOG = """\
examples:
  edgeserve send --target unix:///run/edgeserve.sock --model digits-m --synthetic 5
  edgeserve send --target tcp://127.0.0.1:7070 --model digits-m --npy samples.npy --deadline-ms 20
  edgeserve send --target unix:///run/edgeserve.sock --model cam-net --image frame.jpg --capture-now

--npy takes one sample shaped like the model input, or a stack of them (N, ...); uint8 arrays shaped
(H, W, C) are sent as camera frames. --image decodes a picture to uint8 RGB (needs Pillow) and sends
it as a camera frame: the model needs a [models.<name>.preprocess] table in the server config.
One line per answer: id, status, exit, top-1 class and its logit, client latency.
"""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "send",
        help="send inputs to a running server and print the answers",
        description="Send one or more inputs to `edgeserve serve` (pipelined) and print each answer.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--target", required=True, help="unix:///path/to.sock or tcp://host:port")
    parser.add_argument("--token", help="the server's listen.token, if it has one")
    parser.add_argument("--model", required=True)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--image", type=Path, help="an image file (PNG, JPEG, ...), sent as a camera frame")
    source.add_argument("--npy", type=Path, help="a .npy file: one sample or a stack of samples")
    source.add_argument("--synthetic", type=int, metavar="N", help="N random inputs of the model's shape")
    parser.add_argument("--deadline-ms", type=float, help="budget per request (default: the model's SLO)")
    parser.add_argument(
        "--capture-now", action="store_true", help="send capture_ts = now instead of a budget"
    )
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the answers")
    parser.set_defaults(func=run)


def _inputs(args: argparse.Namespace, spec: dict[str, Any]) -> list[Any]:
    import numpy as np

    from edgeserve.errors import InputError

    shape = tuple(spec["input"]["shape"])
    if args.synthetic is not None:
        if args.synthetic < 1:
            raise InputError("--synthetic needs at least 1 input")
        rng = np.random.default_rng(0)
        return list(rng.standard_normal((args.synthetic, *shape)).astype(spec["input"]["dtype"]))
    if args.image is not None:
        try:
            from PIL import Image
        except ImportError:
            raise InputError(
                "--image needs Pillow: pip install 'edgeserve[image]' (or send a .npy with --npy)"
            ) from None
        try:
            with Image.open(args.image) as image:
                return [np.asarray(image.convert("RGB"), dtype=np.uint8)]
        except OSError as exc:
            raise InputError(f"{args.image}: cannot read the image ({exc})") from None
    try:
        array = np.load(args.npy, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise InputError(f"{args.npy}: not a readable .npy file ({exc})") from None
    is_frame = array.dtype == np.uint8 and array.ndim == 3 and array.shape[-1] in (1, 3)
    if tuple(array.shape) == shape or is_frame:
        return [array]
    if tuple(array.shape[1:]) == shape or (array.dtype == np.uint8 and array.ndim == 4):
        return list(array)
    raise InputError(
        f"{args.npy}: shape {array.shape} is neither {shape} nor (N, {', '.join(map(str, shape))})"
    )


def run(args: argparse.Namespace) -> int:
    from edgeserve.errors import InputError
    from edgeserve.wire.client import BlockingClient

    with BlockingClient(args.target, token=args.token) as client:
        if args.model not in client.models:
            raise InputError(
                f"the server does not serve {args.model!r}; it serves {', '.join(client.models)}"
            )
        xs = _inputs(args, client.models[args.model])
        started: list[float] = []
        finished: dict[int, float] = {}
        futures = []
        for k, x in enumerate(xs):
            options: dict[str, Any] = {"deadline_ms": args.deadline_ms}
            if args.capture_now:
                options = {"capture_ts": time.time()}
            started.append(time.perf_counter())
            future = client.submit(args.model, x, **options)
            future.add_done_callback(lambda f, k=k: finished.setdefault(k, time.perf_counter()))
            futures.append(future)
        failed = 0
        for k, (t0, future) in enumerate(zip(started, futures, strict=True)):
            reply = future.result(args.timeout)
            ms = (finished.get(k, time.perf_counter()) - t0) * 1000.0
            if reply.ok and reply.output is not None:
                top = int(reply.output.argmax())
                detail = f"exit {reply.exit_name} class {top} ({float(reply.output[top]):.3f})"
                detail += " LATE" if reply.late else ""
            else:
                failed += 1
                detail = reply.error or ""
            print(f"#{reply.id} {reply.status:<8} {detail}  {ms:.2f} ms", flush=True)
    return 0 if failed == 0 else 1
