"""Real video for the camera tests: digits rendered into frames, encoded with PyAV, served live.

`digits_frames` renders scikit-learn digits into 64x64 RGB frames (each digit held for a few
frames and drifting by up to 2 pixels); pixel = value * 255 / 16, so the server's preprocessing
(bilinear 64 -> 16, gray, scale 1/255) gives the digits models exactly their training input up to
the drift and the codec's loss. `write_clip` encodes them to a file; `MjpegHttpServer` and
`TcpStreamServer` serve them live, paced at the clip's rate, the way an IP camera does.
"""

from __future__ import annotations

import http.server
import socket
import threading
import time
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
from runtime_support import export_digits

from edgeserve.repository import ModelRepository

FPS = 25
HOLD = 5  # frames per digit
SIZE = 64


@dataclass(frozen=True)
class Clip:
    frames: np.ndarray  # (N, 64, 64, 3) uint8
    labels: np.ndarray  # (N,) the true digit of each frame

    def label_at(self, pos: int) -> int:
        return int(self.labels[pos % len(self.labels)])


def digits_frames(n_digits: int = 15, seed: int = 0) -> Clip:
    from sklearn.datasets import load_digits

    digits = load_digits()
    rng = np.random.default_rng(seed)
    picks = rng.choice(len(digits.images), n_digits, replace=False)
    frames, labels = [], []
    for k, index in enumerate(picks):
        image = (digits.images[index] * (255.0 / 16.0)).astype(np.uint8)
        big = image.repeat(SIZE // 8, axis=0).repeat(SIZE // 8, axis=1)
        for t in range(HOLD):
            shift = (k + t) % 5 - 2  # drift -2..2 px
            frame = np.roll(big, shift, axis=1)
            frames.append(np.repeat(frame[:, :, None], 3, axis=2))
            labels.append(int(digits.target[index]))
    return Clip(np.stack(frames), np.asarray(labels))


def _encoder(container: Any, codec: str) -> Any:
    stream = container.add_stream(codec, rate=FPS)
    stream.width = stream.height = SIZE
    if codec == "libx264":
        stream.pix_fmt = "yuv420p"
        stream.options = {"crf": "12", "tune": "zerolatency", "preset": "veryfast"}
    else:
        stream.pix_fmt = "yuvj420p"
    return stream


def write_clip(path: Path, clip: Clip, codec: str = "libx264") -> Path:
    import av

    with av.open(str(path), "w") as container:
        stream = _encoder(container, codec)
        for image in clip.frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def jpeg_frames(clip: Clip) -> list[bytes]:
    """Each frame as one JPEG (what an MJPEG camera sends)."""
    import av

    codec = av.CodecContext.create("mjpeg", "w")
    codec.width = codec.height = SIZE
    codec.pix_fmt = "yuvj420p"
    codec.time_base = Fraction(1, FPS)
    codec.options = {"q:v": "2"}
    packets = []
    for k, image in enumerate(clip.frames):
        frame = av.VideoFrame.from_ndarray(image, format="rgb24").reformat(format="yuvj420p")
        frame.pts = k
        packets += codec.encode(frame)
    packets += codec.encode(None)  # the encoder may hold frames back: flush, keep the order
    assert len(packets) == len(clip.frames)
    return [bytes(p) for p in packets]


class MjpegHttpServer:
    """An IP camera: GET / streams multipart/x-mixed-replace JPEGs at FPS, the clip over and over."""

    def __init__(self, clip: Clip) -> None:
        jpegs = jpeg_frames(clip)
        self.connections = 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.connections += 1
                self.send_response(200)
                self.send_header("Content-Type", "multipart/x-mixed-replace;boundary=frame")
                self.end_headers()
                due = time.monotonic()
                try:
                    for k in range(len(jpegs) * 100):
                        jpeg = jpegs[k % len(jpegs)]
                        head = f"--frame\r\nContent-Type: image/jpeg\r\nContent-Length: {len(jpeg)}\r\n\r\n"
                        self.wfile.write(head.encode() + jpeg + b"\r\n")
                        due += 1.0 / FPS
                        time.sleep(max(0.0, due - time.monotonic()))
                except (BrokenPipeError, ConnectionResetError):
                    return

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> MjpegHttpServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class TcpStreamServer:
    """A live H.264-in-MPEG-TS stream on a TCP port, muxed by PyAV as frames are due.

    Each connection gets `frames_per_connection` frames, then the server closes it (a camera
    that goes away); it keeps accepting, so a client that reconnects gets the stream again.
    """

    def __init__(self, clip: Clip, frames_per_connection: int) -> None:
        self.clip = clip
        self.frames_per_connection = frames_per_connection
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"tcp://127.0.0.1:{self.listener.getsockname()[1]}"
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        import av

        self.listener.settimeout(0.2)
        while not self._stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            self.connections += 1
            try:
                with conn.makefile("wb") as sink, av.open(sink, "w", format="mpegts") as container:
                    stream = _encoder(container, "libx264")
                    due = time.monotonic()
                    for k in range(self.frames_per_connection):
                        image = self.clip.frames[k % len(self.clip.frames)]
                        for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                            container.mux(packet)
                        sink.flush()
                        due += 1.0 / FPS
                        time.sleep(max(0.0, due - time.monotonic()))
            except (OSError, ValueError):
                pass
            finally:
                conn.close()

    def __enter__(self) -> TcpStreamServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self.listener.close()


def export_digits_s(root: Path) -> Path:
    """digits-s exported for real into `root`, with a short profile for this machine (threads=1)."""
    from edgeserve.profiler.measure import MeasureSettings, measure_model
    from edgeserve.runtime.backends.onnxruntime import OnnxRuntimeBackend

    repository = ModelRepository(root)
    manifest = export_digits(repository)
    backend = OnnxRuntimeBackend(repository, threads=1, warmup=0)
    backend.load(manifest)
    repository.save_profile(
        measure_model(backend, manifest, MeasureSettings(max_batch=2, repeats=3, warmup=1))
    )
    backend.close()
    return root


def serve_config(root: Path, tmp: Path, *, preprocess: bool = True, slo_ms: float = 1000.0) -> dict[str, Any]:
    model: dict[str, Any] = {"slo_ms": slo_ms, "max_queue": 64}
    if preprocess:
        model["preprocess"] = {"channels": "rgb"}
    return {
        "repository": str(root),
        "shutdown_timeout_s": 5.0,
        "backend": {"name": "onnxruntime", "threads": 1, "warmup": 0},
        "models": {"digits-s": model},
        "listen": {"unix": str(tmp / "edgeserve.sock"), "tcp": "127.0.0.1:0"},
    }


class StreamsThread:
    """`run_streams` on its own event loop thread, so a test can start and stop servers meanwhile."""

    def __init__(self, streams: list[Any]) -> None:
        from edgeserve.loop import new_event_loop

        self.streams = streams
        self.loop = new_event_loop()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        from edgeserve.camera.runner import run_streams

        try:
            self.loop.run_until_complete(run_streams(self.streams, stats_every_s=0))
        except BaseException as exc:  # handed to the test
            self.error = exc
        finally:
            self.loop.close()

    def __enter__(self) -> StreamsThread:
        self._thread.start()
        return self

    def stop(self, timeout: float = 20.0) -> None:
        if self._thread.is_alive():
            for stream in self.streams:
                self.loop.call_soon_threadsafe(stream.stop)
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the camera streams did not stop"
        if self.error is not None:
            raise AssertionError(f"the camera streams failed: {self.error!r}") from self.error

    def __exit__(self, *exc: object) -> None:
        self.stop()


def wait_for(predicate: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
