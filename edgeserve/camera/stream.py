"""One camera's stream: latest-frame sending with a bounded window, server reconnects, answers.

The grabber thread hands every decoded frame to the event loop; the stream keeps only the newest
one. A frame is sent only while fewer than `window` frames are in flight (at most the server's
`max_in_flight`), so when the server is behind, the frames in between are dropped here, at the
source (counted), instead of queueing anywhere: the age of an answered frame stays about
`window` service times, however fast the camera runs. Each frame carries its `capture_ts`, so its
deadline runs from capture. A lost server is retried with backoff, logged once per episode.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from edgeserve.camera.fit import CameraSetupError, ModelFit, check_frames, model_fit, to_channels
from edgeserve.camera.grabber import Backoff, Frame, Grabber, GrabberSettings
from edgeserve.camera.output import StreamStats, answer_record
from edgeserve.camera.sources import FrameSource, SourceError
from edgeserve.wire.client import AsyncClient, Reply, ServerRefused

log = logging.getLogger("edgeserve.camera")

DEFAULT_WINDOW = 2
DRAIN_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class StreamConfig:
    """One camera: where its frames go and how.

    `window`: frames in flight at most (capped by the server's max_in_flight); 2 hides the
    network round trip while keeping the age of answers near two service times.
    `deadline_ms`: a budget from capture (default: the model's SLO from capture).
    `naive`: send every frame in order, queueing them here (the baseline of benchmarks/camera_latency.py).
    """

    name: str
    model: str
    target: str
    token: str | None = None
    window: int = DEFAULT_WINDOW
    deadline_ms: float | None = None
    full: bool = False
    naive: bool = False


Sink = Callable[[dict[str, Any]], None]


class CameraStream:
    """Runs one source against one server connection until the source ends or `stop()`."""

    def __init__(
        self,
        config: StreamConfig,
        source: FrameSource,
        sink: Sink,
        grabber_settings: GrabberSettings | None = None,
        server_backoff: Backoff | None = None,
    ) -> None:
        self.config = config
        self.source = source
        self.sink = sink
        self.stats = StreamStats(config.name)
        self._grabber_settings = grabber_settings or GrabberSettings()
        self._server_backoff = server_backoff or Backoff()
        self._latest: Frame | None = None
        self._queue: list[Frame] = []  # naive mode only
        self._in_flight = 0
        self._wake = asyncio.Event()
        self._stop_event = asyncio.Event()
        self._stopping = False
        self._source_done = False
        self._source_error: SourceError | None = None
        self._fit: ModelFit | None = None
        self._checked_shape: tuple[int, ...] | None = None
        self.server_reconnects = 0

    # -- called from the grabber thread, through the loop -------------------------------------

    def _on_frame(self, frame: Frame) -> None:
        self.stats.frame_in()
        if self.config.naive:
            self._queue.append(frame)
        else:
            if self._latest is not None:
                self.stats.drop()  # never sent: a newer frame replaces it
            self._latest = frame
        self._wake.set()

    def _on_source_end(self, error: SourceError | None) -> None:
        self._source_done = True
        self._source_error = error
        self._wake.set()

    # -- the stream ---------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop taking frames; run() answers what is in flight (briefly) and returns."""
        self._stopping = True
        self._stop_event.set()
        self._wake.set()

    async def run(self) -> None:
        """Until the source ends or stop(); CameraSetupError or a fatal SourceError end it early."""
        loop = asyncio.get_running_loop()

        def to_loop(callback: Callable[[Any], None]) -> Callable[[Any], None]:
            def call(value: Any) -> None:
                # A read that outlives the stop (a stalled network stream) finds the loop closed.
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(callback, value)

            return call

        grabber = Grabber(
            self.config.name,
            self.source,
            to_loop(self._on_frame),
            to_loop(self._on_source_end),
            self._grabber_settings,
        )
        grabber.start()
        try:
            await self._serve()
        finally:
            await asyncio.to_thread(grabber.stop)
            if self._latest is not None:
                self.stats.drop()
                self._latest = None
        if self._source_error is not None and self._source_error.fatal:
            raise self._source_error

    def _finished(self) -> bool:
        pending = self._latest is not None or bool(self._queue)
        return self._stopping or (self._source_done and not pending)

    async def _serve(self) -> None:
        lost_since: float | None = None
        while not self._finished():
            client = await self._connect(lost_since)
            if client is None:
                return
            try:
                await self._send_frames(client)
            except ConnectionError as exc:
                lost_since = self._server_lost(exc)
                continue
            finally:
                await self._drain(client)
                await client.close()

    async def _connect(self, lost_since: float | None) -> AsyncClient | None:
        """A greeted connection whose model fits; None when stopped first. Retries with backoff.

        `lost_since`: the episode started when a connection dropped (already logged).
        """
        while not self._finished():
            try:
                client = await AsyncClient.connect(self.config.target, token=self.config.token, timeout=5.0)
            except ServerRefused as exc:
                if "token" in str(exc):
                    raise CameraSetupError(f"{self.config.name}: {exc}") from None
                lost_since = await self._retry(lost_since, str(exc))
                continue
            except (OSError, asyncio.TimeoutError) as exc:
                lost_since = await self._retry(lost_since, _describe(exc))
                continue
            self._server_backoff.reset()
            if lost_since is not None:
                self.server_reconnects += 1
                log.warning(
                    "server back",
                    extra={"source": self.config.name, "after_s": round(time.monotonic() - lost_since, 1)},
                )
            try:
                self._fit = model_fit(self.config.name, self.config.model, client.hello)
            except CameraSetupError:
                await client.close()
                raise
            self._window = max(1, min(self.config.window, int(client.hello.get("max_in_flight", 1))))
            self._max_frame_bytes = int(client.hello.get("max_frame_bytes", 8 << 20))
            self._checked_shape = None
            return client
        return None

    async def _retry(self, lost_since: float | None, reason: str) -> float:
        if lost_since is None:
            log.warning(
                "server unreachable; retrying with backoff",
                extra={"source": self.config.name, "target": self.config.target, "reason": reason},
            )
            lost_since = time.monotonic()
        await self._sleep(self._server_backoff.next())
        return lost_since

    def _server_lost(self, exc: BaseException) -> float:
        log.warning(
            "server connection lost; reconnecting with backoff",
            extra={"source": self.config.name, "target": self.config.target, "reason": _describe(exc)},
        )
        return time.monotonic()

    async def _sleep(self, seconds: float) -> None:
        """Sleep, but wake up early on stop()."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._stop_event.wait(), seconds)

    async def _send_frames(self, client: AsyncClient) -> None:
        while True:
            while not self._finished() and not (self._ready() and self._in_flight < self._window):
                self._wake.clear()
                await self._wake.wait()
            if self._finished():
                return
            frame = self._take()
            self._send(client, frame)

    def _ready(self) -> bool:
        return bool(self._queue) if self.config.naive else self._latest is not None

    def _take(self) -> Frame:
        if self.config.naive:
            return self._queue.pop(0)
        frame, self._latest = self._latest, None
        assert frame is not None
        return frame

    def _send(self, client: AsyncClient, frame: Frame) -> None:
        assert self._fit is not None
        image = to_channels(frame.image, self._fit.channels)
        if self._checked_shape != image.shape:
            for warning in check_frames(self.config.name, self._fit, image, self._max_frame_bytes):
                log.warning(warning, extra={"source": self.config.name, "model": self.config.model})
            self._checked_shape = image.shape
        options: dict[str, float] = {}
        if self.config.deadline_ms is not None:
            budget = self.config.deadline_ms - (time.time() - frame.capture_ts) * 1000.0
            if budget <= 0:  # too old to be worth sending
                self.stats.drop()
                return
            options["deadline_ms"] = max(budget, 0.001)
        else:
            options["capture_ts"] = frame.capture_ts
        future = client.send(self.config.model, image, **options)  # ConnectionError if it is gone
        self.stats.sent += 1
        self._in_flight += 1
        future.add_done_callback(lambda f: self._answered(f, frame))

    def _answered(self, future: asyncio.Future[Reply], frame: Frame) -> None:
        self._in_flight -= 1
        self._wake.set()
        if future.cancelled() or future.exception() is not None:
            self.stats.lost += 1
            return
        reply = future.result()
        answered = time.time()
        self.stats.answer(reply.status, reply.late, (answered - frame.capture_ts) * 1000.0)
        self.sink(
            answer_record(
                self.config.name,
                frame.index,
                frame.pos,
                frame.capture_ts,
                answered,
                reply,
                full=self.config.full,
            )
        )

    async def _drain(self, client: AsyncClient) -> None:
        """Give the frames in flight a moment to be answered before the connection closes."""
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while self._in_flight > 0 and client.in_flight > 0 and time.monotonic() < deadline:
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                break


def _describe(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
