"""One source's grabber thread: read, pace, reconnect; hand each frame to the event loop.

Decoding runs here, never on the event loop. Every frame is handed over (the stream keeps only
the newest), so a slow server never makes this thread slow down and the source's buffers never
fill with stale frames. A lost source is re-opened with backoff and logged once per episode.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from edgeserve.camera.sources import FrameSource, SourceError

log = logging.getLogger("edgeserve.camera")


@dataclass(frozen=True)
class Frame:
    """A decoded frame: `index` counts frames since start, `pos` since the source was (re)opened."""

    image: np.ndarray
    capture_ts: float
    index: int
    pos: int


@dataclass
class Backoff:
    """Exponential retry delays: first, doubled each failure, capped; reset on success."""

    first_s: float = 0.5
    max_s: float = 5.0
    _next: float = 0.0

    def next(self) -> float:
        self._next = self.first_s if self._next == 0.0 else min(self._next * 2.0, self.max_s)
        return self._next

    def reset(self) -> None:
        self._next = 0.0


@dataclass
class GrabberSettings:
    """`fps`: files are played at this rate (default: their own); live sources are thinned to it."""

    fps: float | None = None
    loop_file: bool = False
    backoff: Backoff | None = None


class Grabber:
    """Runs `source` on a daemon thread; `deliver(frame)` and `finished(error|None)` are called from it."""

    def __init__(
        self,
        name: str,
        source: FrameSource,
        deliver: Callable[[Frame], None],
        finished: Callable[[SourceError | None], None],
        settings: GrabberSettings | None = None,
    ) -> None:
        self.name = name
        self.source = source
        self.deliver = deliver
        self.finished = finished
        self.settings = settings or GrabberSettings()
        self.stop_event = threading.Event()
        self.reconnects = 0
        self._thread = threading.Thread(target=self._run, name=f"edgeserve-camera-{name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 6.0) -> None:
        """Ask the thread to stop; it ends after its current read (reads time out after a few s)."""
        self.stop_event.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        error: SourceError | None = None
        try:
            self._loop()
        except SourceError as exc:
            error = exc
        except Exception as exc:  # a library bug must not kill the process with a traceback
            error = SourceError(f"{self.source.spec.uri}: {type(exc).__name__}: {exc}", fatal=True)
        finally:
            self.source.close()
            self.finished(error)

    def _loop(self) -> None:
        backoff = self.settings.backoff or Backoff()
        spec = self.source.spec
        lost_since: float | None = None
        index = 0
        while not self.stop_event.is_set():
            try:
                self.source.open()
            except SourceError as exc:
                if exc.fatal:
                    raise
                lost_since = self._lost(lost_since, str(exc), backoff)
                continue
            if lost_since is not None:
                log.warning(
                    "source back",
                    extra={"source": self.name, "after_s": round(time.monotonic() - lost_since, 1)},
                )
                lost_since = None
                self.reconnects += 1
            try:
                index = self._read_until_end(index, backoff)
            except SourceError as exc:
                if exc.fatal:
                    raise
                self.source.close()
                lost_since = self._lost(lost_since, str(exc), backoff)
                continue
            self.source.close()
            if self.stop_event.is_set() or (not spec.live and not self.settings.loop_file):
                return  # a file ended: this stream is done
            if spec.live:
                lost_since = self._lost(lost_since, f"{spec.uri}: the stream ended", backoff)

    def _lost(self, since: float | None, reason: str, backoff: Backoff) -> float:
        """Log the first failure of an episode, then wait before the next try."""
        if since is None:
            log.warning(
                "source lost; retrying with backoff",
                extra={"source": self.name, "reason": reason, "max_backoff_s": backoff.max_s},
            )
            since = time.monotonic()
        self.stop_event.wait(backoff.next())
        return since

    def _read_until_end(self, index: int, backoff: Backoff) -> int:
        """Read frames until the source ends (return) or fails (SourceError); returns the next index."""
        fps = self.settings.fps
        live = self.source.spec.live
        started = time.monotonic()
        first_pts: float | None = None
        last_taken = -1e9
        pos = 0
        while not self.stop_event.is_set():
            item = self.source.read()
            if item is None:
                return index
            backoff.reset()
            image, captured = item
            now = time.monotonic()
            if live:
                if fps and now - last_taken < 0.9 / fps:  # thin a faster live source to --fps
                    pos += 1
                    continue
            else:
                due = started + pos / fps if fps else None
                pts = self.source.frame_time()
                if due is None and pts is not None:
                    first_pts = pts if first_pts is None else first_pts
                    due = started + (pts - first_pts)
                if due is not None and due > now and self.stop_event.wait(due - now):
                    return index
                captured = time.time()  # a file's frame is "captured" when it is played
            last_taken = time.monotonic()
            self.deliver(Frame(image, captured, index, pos))
            index += 1
            pos += 1
        return index
