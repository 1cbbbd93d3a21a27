"""`edgeserve camera`: cameras, streams and video files to a running server, answers as JSON lines."""

from __future__ import annotations

import argparse
import logging
import re

EPILOG = """\
sources (--source, repeat it for several cameras; NAME=URI names one):
  /dev/video0  v4l2:///dev/video0?video_size=1280x720&framerate=30&input_format=mjpeg   USB/V4L2 camera
  csi://0?width=1280&height=720&framerate=30     Jetson CSI camera (nvarguscamerasrc; needs JetPack's OpenCV)
  gst://PIPELINE ! appsink                       any GStreamer pipeline (OpenCV's GStreamer backend)
  rtsp://user:pass@cam.local:554/stream1         RTSP (over TCP; ?rtsp_transport=udp for UDP)
  http://host/stream.mjpg  tcp://host:port  udp://@:5000  srt://...    other network streams
  clip.mp4  file:///videos/clip.mkv              video files, played at their own rate (--fps to change)

examples:
  edgeserve camera --source /dev/video0 --model digits-m --target unix:///run/edgeserve.sock
  edgeserve camera --source door=rtsp://10.0.0.5/stream1 --source yard=csi://0 \\
      --model digits-m --target tcp://127.0.0.1:7070 --out answers.jsonl --deadline-ms 50
  edgeserve camera --source clip.mp4 --model digits-s --target unix:///run/edgeserve.sock --full | jq .

Frames are sent as uint8 RGB (or the order the server asks for) with their capture time, so each
deadline runs from capture; the model needs a [models.<name>.preprocess] table in the server config.
At most --window frames per camera are in flight (capped by the server's max_in_flight); when the
server is behind, older frames are dropped here and counted, never queued: answers stay fresh.
One JSON line per answer (source, frame, pos, capture_ts, answer_ts, age_ms, status, late, exit,
class, score; the full output with --full) on stdout or --out; a one-line summary per camera on
stderr every --stats-every seconds. Lost cameras and servers are retried with backoff.
Needs PyAV for decoding: pip install 'edgeserve[camera]'. More: docs/cameras.md.
"""

_NAMED = re.compile(r"^([A-Za-z][A-Za-z0-9_-]*)=(.+)$")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "camera",
        help="stream cameras, RTSP streams or video files to a server; answers as JSON lines",
        description=(
            "Send frames from V4L2, CSI, RTSP/HTTP/TCP streams or video files to `edgeserve serve`, "
            "newest frame first: stale frames are dropped at the source, so latency never grows."
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--source", action="append", required=True, metavar="[NAME=]URI", help="a camera, stream or file"
    )
    parser.add_argument(
        "--model", action="append", required=True, help="the model for every source, or one per --source"
    )
    parser.add_argument("--target", required=True, help="the server: unix:///path/to.sock or tcp://host:port")
    parser.add_argument("--token", help="the server's listen.token, if it has one")
    parser.add_argument(
        "--fps", type=float, help="play files at F frames/s (default: their own rate); thin live sources to F"
    )
    parser.add_argument(
        "--deadline-ms", type=float, help="budget per frame from capture (default: the model's SLO)"
    )
    parser.add_argument(
        "--window", type=int, default=2, help="frames in flight per camera at most (default 2)"
    )
    parser.add_argument(
        "--out", default="-", metavar="FILE|-", help="where the JSON lines go (default: stdout)"
    )
    parser.add_argument(
        "--full", action="store_true", help="the full output tensor in each line, not only top-1"
    )
    parser.add_argument("--loop", action="store_true", help="play video files again and again")
    parser.add_argument(
        "--stats-every", type=float, default=5.0, metavar="S", help="summary period (0: only at the end)"
    )
    parser.add_argument("--log-format", choices=("logfmt", "json"), default="logfmt")
    parser.set_defaults(func=run)


def split_name(text: str, index: int) -> tuple[str, str]:
    """`NAME=URI` -> (NAME, URI); a bare URI is named cam<index>."""
    match = _NAMED.match(text)
    if match and "/" not in match.group(1):
        return match.group(1), match.group(2)
    return f"cam{index}", text


def run(args: argparse.Namespace) -> int:
    from edgeserve.camera.grabber import GrabberSettings
    from edgeserve.camera.output import JsonLines
    from edgeserve.camera.runner import run_streams
    from edgeserve.camera.sources import open_source, parse_source
    from edgeserve.camera.stream import CameraStream, StreamConfig
    from edgeserve.errors import EdgeServeError
    from edgeserve.logs import configure
    from edgeserve.loop import run as run_loop

    handler = configure("info", args.log_format)
    if len(args.model) not in (1, len(args.source)):
        raise EdgeServeError(f"give one --model for all sources or one per --source ({len(args.source)})")
    if args.window < 1:
        raise EdgeServeError("--window must be at least 1")
    if args.fps is not None and args.fps <= 0:
        raise EdgeServeError("--fps must be positive")
    named = [split_name(text, k) for k, text in enumerate(args.source)]
    names = [name for name, _ in named]
    if len(set(names)) != len(names):
        raise EdgeServeError(f"source names must differ: {', '.join(names)}")
    models = args.model * len(named) if len(args.model) == 1 else args.model
    sources = [open_source(parse_source(uri)) for _, uri in named]
    out = JsonLines(args.out)
    try:

        async def main() -> None:
            streams = [
                CameraStream(
                    StreamConfig(
                        name=name,
                        model=model,
                        target=args.target,
                        token=args.token,
                        window=args.window,
                        deadline_ms=args.deadline_ms,
                        full=args.full,
                    ),
                    source,
                    out.write,
                    GrabberSettings(fps=args.fps, loop_file=args.loop),
                )
                for (name, _), model, source in zip(named, models, sources, strict=True)
            ]
            await run_streams(streams, stats_every_s=args.stats_every)

        run_loop(main())
    finally:
        out.close()
        logging.getLogger().removeHandler(handler)  # leave the root logger as found (in-process callers)
    return 0
