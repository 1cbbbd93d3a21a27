"""Embed a camera in your own program: frames from any source URI, answers to your callback.

`edgeserve camera` does this from the shell; in Python the same stream hands each answer (a dict,
the command's JSON line) to a function of yours. Frames are dropped at the source when the server
is behind, so `on_answer` always sees fresh results.

    .venv/bin/python examples/camera_embed.py --target unix:///run/edgeserve.sock --model digits-m \\
        --source /dev/video0
    .venv/bin/python examples/camera_embed.py --target tcp://127.0.0.1:7070 --model digits-m \\
        --source rtsp://10.0.0.5/stream1 --seconds 30
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from edgeserve.camera.runner import run_streams
from edgeserve.camera.sources import open_source, parse_source
from edgeserve.camera.stream import CameraStream, StreamConfig
from edgeserve.loop import run


def on_answer(answer: dict[str, Any]) -> None:
    label = answer.get("class", answer.get("error"))
    print(f"frame {answer['frame']}: {answer['status']} {label} ({answer['age_ms']:.1f} ms after capture)")


async def main(args: argparse.Namespace) -> None:
    config = StreamConfig(name="cam", model=args.model, target=args.target)
    stream = CameraStream(config, open_source(parse_source(args.source)), on_answer)
    if args.seconds:
        asyncio.get_running_loop().call_later(args.seconds, stream.stop)
    await run_streams([stream], stats_every_s=0)  # until the file ends, --seconds, or Ctrl-C
    print("answers by status:", dict(stream.stats.answered), "dropped at the source:", stream.stats.dropped)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--target", required=True, help="unix:///path/to.sock or tcp://host:port")
    parser.add_argument("--model", required=True, help="a served model with a [preprocess] table")
    parser.add_argument("--source", required=True, help="a camera, stream or video file (docs/cameras.md)")
    parser.add_argument("--seconds", type=float, help="stop after this long (default: at the end of a file)")
    run(main(parser.parse_args()))
