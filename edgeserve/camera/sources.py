"""Frame sources: a URI -> something with `read() -> (RGB uint8 HxWx3 frame, capture_ts)`.

One URI scheme for every camera, as jetson-inference's videoSource has:

    /dev/video0, v4l2:///dev/video0?video_size=1280x720&framerate=30&input_format=mjpeg   V4L2 (PyAV)
    csi://0?width=1280&height=720&framerate=30&flip=0      Jetson CSI (nvarguscamerasrc, OpenCV+GStreamer)
    gst://videotestsrc ! videoconvert ! appsink            any GStreamer pipeline ending in appsink
    rtsp://cam.local/stream1, http://..., tcp://..., udp://..., rtmp://..., srt://...   streams (PyAV)
    clip.mp4, file:///videos/clip.mp4                      video files (PyAV)

Query parameters of v4l2 and network URIs are FFmpeg options (`rtsp_transport=udp`,
`video_size=640x480`); they are stripped from http/tcp URLs only when they name an FFmpeg option
we know, so a query the camera itself needs stays in the URL. PyAV decodes everything but CSI and
`gst://` (benchmarks/camera_decode.py and docs/cameras.md say why); OpenCV's GStreamer backend
opens those, because nvarguscamerasrc needs Jetson's GStreamer and OpenCV is how Python reaches it.
A source raises SourceError with one readable sentence, never a library's traceback.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import numpy as np

from edgeserve.errors import EdgeServeError

STREAM_SCHEMES = ("rtsp", "rtsps", "rtmp", "rtmps", "http", "https", "tcp", "udp", "srt", "rtp")
# FFmpeg options taken out of network URLs' queries and passed to av.open instead.
FFMPEG_OPTIONS = {
    "rtsp_transport",
    "rtsp_flags",
    "stimeout",
    "timeout",
    "rw_timeout",
    "buffer_size",
    "fifo_size",
    "analyzeduration",
    "probesize",
    "fflags",
    "flags",
    "reconnect",
    "listen",
    "format",
    "video_size",
    "framerate",
    "input_format",
    "pixel_format",
}
OPEN_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 5.0


class SourceError(EdgeServeError):
    """A source could not be opened or stopped delivering; `fatal` when retrying cannot help."""

    def __init__(self, message: str, *, fatal: bool = False) -> None:
        super().__init__(message)
        self.fatal = fatal


@dataclass(frozen=True)
class SourceSpec:
    """A parsed `--source`: its kind, where it is, and the options for the library that opens it."""

    uri: str
    kind: str  # "v4l2" | "csi" | "gstreamer" | "stream" | "file"
    location: str  # device path, URL, file path or GStreamer pipeline
    options: dict[str, str] = field(default_factory=dict)

    @property
    def live(self) -> bool:
        """Live sources deliver frames in real time; files are paced by us (their timestamps)."""
        return self.kind != "file"


def parse_source(uri: str) -> SourceSpec:
    """Parse a source URI (module docstring); SourceError(fatal) for what cannot be a source."""
    text = uri.strip()
    if not text:
        raise SourceError("an empty --source: give a device, a URL or a file", fatal=True)
    if text.startswith("gst://"):
        return SourceSpec(uri, "gstreamer", text.removeprefix("gst://"))
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    query = dict(parse_qsl(parts.query))
    if scheme == "v4l2" or (not scheme and text.startswith("/dev/video")):
        device = parts.path if scheme else text.split("?", 1)[0]
        if not device.startswith("/dev/"):
            device = f"/dev/video{device.strip('/')}" if device.strip("/").isdigit() else device
        return SourceSpec(uri, "v4l2", device, query)
    if scheme == "csi":
        sensor = (parts.netloc or parts.path.strip("/") or "0").strip()
        if not sensor.isdigit():
            raise SourceError(f"{uri}: a CSI source is csi://SENSOR_ID, e.g. csi://0", fatal=True)
        return SourceSpec(uri, "csi", csi_pipeline(int(sensor), query), query)
    if scheme in STREAM_SCHEMES:
        options = {k: v for k, v in query.items() if k in FFMPEG_OPTIONS}
        kept = [(k, v) for k, v in parse_qsl(parts.query) if k not in FFMPEG_OPTIONS]
        url = urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(kept), parts.fragment))
        return SourceSpec(uri, "stream", url, options)
    if scheme == "file":
        return SourceSpec(uri, "file", parts.path, {})
    if scheme and len(scheme) > 1:
        known = "v4l2, csi, gst, file, " + ", ".join(STREAM_SCHEMES)
        raise SourceError(f"{uri}: unknown source scheme {scheme!r}; use one of {known}", fatal=True)
    return SourceSpec(uri, "file", text, {})


def csi_pipeline(sensor_id: int, query: dict[str, str]) -> str:
    """The documented Jetson CSI pipeline: Argus capture, NVMM -> BGRx -> BGR into an appsink.

    appsink keeps one buffer and drops older ones, so a slow reader never sees stale frames.
    """
    width = int(query.get("width", 1280))
    height = int(query.get("height", 720))
    fps = int(query.get("framerate", 30))
    flip = int(query.get("flip", 0))
    return (
        f"nvarguscamerasrc sensor-id={sensor_id} ! "
        f"video/x-raw(memory:NVMM),width={width},height={height},framerate={fps}/1 ! "
        f"nvvidconv flip-method={flip} ! video/x-raw,format=BGRx ! videoconvert ! "
        "video/x-raw,format=BGR ! appsink drop=true max-buffers=1 sync=false"
    )


class FrameSource(Protocol):
    """What a camera stream reads from. Called from one grabber thread only."""

    spec: SourceSpec

    def open(self) -> None:
        """Open (or re-open) the source; SourceError when it cannot."""

    def read(self) -> tuple[np.ndarray, float] | None:
        """The next RGB uint8 HxWx3 frame and its capture time (Unix s); None at the end of a file."""

    def frame_time(self) -> float | None:
        """The last frame's presentation time in the stream (s), for pacing files; None if unknown."""

    def close(self) -> None:
        """Release the device or connection; safe to call twice."""


class PyAVSource:
    """V4L2 devices, network streams and files through PyAV (FFmpeg's demuxers and decoders)."""

    def __init__(self, spec: SourceSpec) -> None:
        self.spec = spec
        self._container: Any = None
        self._frames: Any = None
        self._time: float | None = None

    def open(self) -> None:
        import av

        if self.spec.kind == "file" and not Path(self.spec.location).is_file():
            raise SourceError(f"{self.spec.uri}: no such video file", fatal=True)
        options = dict(self.spec.options)
        fmt = options.pop("format", None)
        if self.spec.kind == "v4l2":
            fmt = fmt or "v4l2"
            if not Path(self.spec.location).exists():
                raise SourceError(f"{self.spec.location}: no such device (is the camera plugged in?)")
        if self.spec.kind == "stream":
            # Low-delay decoding, and RTSP over TCP unless told otherwise (no UDP loss). Not
            # fflags=nobuffer: it discards what the demuxer read while probing (a short stream's
            # first seconds); frames that are stale for that reason are dropped here anyway.
            options.setdefault("flags", "low_delay")
            if self.spec.location.startswith(("rtsp:", "rtsps:")):
                options.setdefault("rtsp_transport", "tcp")
        try:
            self._container = av.open(
                self.spec.location, format=fmt, options=options, timeout=(OPEN_TIMEOUT_S, READ_TIMEOUT_S)
            )
            if not self._container.streams.video:
                raise SourceError(f"{self.spec.uri}: has no video stream", fatal=self.spec.kind == "file")
            stream = self._container.streams.video[0]
            # Frame threading adds a frame of delay per thread; live sources want it small.
            stream.thread_type = "SLICE" if self.spec.live else "AUTO"
            self._frames = self._container.decode(stream)
        except SourceError:
            self.close()
            raise
        except Exception as exc:  # FFmpeg errors are OSError subclasses, but not only
            self.close()
            raise SourceError(f"{self.spec.uri}: cannot open ({_describe(exc)})") from None

    def read(self) -> tuple[np.ndarray, float] | None:
        if self._frames is None:
            raise SourceError(f"{self.spec.uri}: not open")
        try:
            frame = next(self._frames)
        except StopIteration:
            return None
        except Exception as exc:
            raise SourceError(f"{self.spec.uri}: stream error ({_describe(exc)})") from None
        captured = time.time()
        self._time = frame.time
        return frame.to_ndarray(format="rgb24"), captured

    def frame_time(self) -> float | None:
        return self._time

    def close(self) -> None:
        container, self._container, self._frames = self._container, None, None
        if container is not None:
            with contextlib.suppress(Exception):  # closing a broken stream can fail too
                container.close()


class OpenCVSource:
    """CSI cameras and GStreamer pipelines through OpenCV's GStreamer backend (Jetson's OpenCV).

    Written against OpenCV's documented VideoCapture API; not executed here (no Jetson, and the
    pip wheels of OpenCV are built without GStreamer).
    """

    def __init__(self, spec: SourceSpec) -> None:
        self.spec = spec
        self._capture: Any = None

    def open(self) -> None:
        try:
            import cv2
        except ImportError:
            raise SourceError(
                f"{self.spec.uri}: needs OpenCV built with GStreamer (on a Jetson: JetPack's python3-opencv)",
                fatal=True,
            ) from None
        if "GStreamer:                   YES" not in cv2.getBuildInformation():
            raise SourceError(
                f"{self.spec.uri}: this OpenCV ({cv2.__version__}) has no GStreamer backend; "
                "use JetPack's python3-opencv (pip's opencv wheels are built without it)",
                fatal=True,
            )
        capture = cv2.VideoCapture(self.spec.location, cv2.CAP_GSTREAMER)
        if not capture.isOpened():
            capture.release()
            raise SourceError(
                f"{self.spec.uri}: GStreamer could not start the pipeline {self.spec.location!r}"
            )
        self._capture = capture

    def read(self) -> tuple[np.ndarray, float] | None:
        import cv2

        if self._capture is None:
            raise SourceError(f"{self.spec.uri}: not open")
        ok, frame = self._capture.read()
        if not ok:
            raise SourceError(f"{self.spec.uri}: the pipeline stopped delivering frames")
        return cv2.cvtColor(frame, cv2.COLOR_BGR2RGB), time.time()

    def frame_time(self) -> float | None:
        return None

    def close(self) -> None:
        capture, self._capture = self._capture, None
        if capture is not None:
            capture.release()


class ArraySource:
    """Frames from memory at a fixed rate, as a live camera would deliver them (benchmarks, tests)."""

    def __init__(self, frames: np.ndarray, fps: float, *, loop: bool = True, name: str = "array") -> None:
        self.spec = SourceSpec(f"array://{name}", "array", name)
        self.frames = frames
        self.fps = fps
        self.loop = loop
        self._next = 0
        self._due = 0.0

    def open(self) -> None:
        self._next = 0
        self._due = time.monotonic()

    def read(self) -> tuple[np.ndarray, float] | None:
        if self._next >= len(self.frames):
            if not self.loop:
                return None
            self._next = 0
        delay = self._due - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        self._due += 1.0 / self.fps
        frame = self.frames[self._next]
        self._next += 1
        return frame, time.time()

    def frame_time(self) -> float | None:
        return None

    def close(self) -> None:
        pass


def open_source(spec: SourceSpec) -> FrameSource:
    """The library for this kind of source (it is opened by the grabber, with retries)."""
    if spec.kind in ("csi", "gstreamer"):
        return OpenCVSource(spec)
    try:
        import av  # noqa: F401
    except ImportError:
        raise SourceError(
            f"{spec.uri}: decoding needs PyAV: pip install 'edgeserve[camera]'", fatal=True
        ) from None
    return PyAVSource(spec)


def _describe(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text if len(text) <= 200 else text[:200] + "..."
