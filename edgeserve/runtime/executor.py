"""The executor: ONE thread owns the backend and runs one batch at a time (time division).

load() and close() happen on that thread (ORT sessions are then created on the thread that runs
them), and so do the batches predicted to take longer than two thread hand-offs. A batch is
handed over with `submit`, whose callback reaches the loop in one wake-up when the batch ends.
With `follow`, the next batch is decided on this thread as soon as one ends, before the loop
hears of it: under load the loop is busy with reads and answers, and the executor would otherwise
idle for a loop turn between batches. Batches are stacked here, off the loop: a copy of a few KB
to MB would otherwise stall arrivals.

A short batch (`inline`) runs on the loop's own thread instead (`run_inline`: in a callback of its
own, or at once where the Server decided it in the callback a request's arrival scheduled): for a
tiny model the two hand-offs (a queue and a wake-up each way) cost more than the batch, and
every Python step of a batch on the executor thread waits for the GIL the busy loop holds.

A finished batch's callback waits in a completion queue. The loop runs it at the next
`run_completed()` (the front door calls it before each read, so under a flood the answers go out
and the connection windows they free are refilled from that very read) or in a callback of its
own, whichever comes first: behind a loop turn of reads it would otherwise wait ~0.6 ms.

ONNX Runtime's `run` releases the GIL and takes it back as it returns; behind a loop busy with
reads that return waited ~0.15-0.4 ms per batch under overload. So before it reads, the loop
steps aside (`step_aside`) when the running batch is due to end: it blocks, the GIL released,
until this thread has started the next batch. The Python between two batches (outputs, the next
decision, stacking) holds the GIL either way; the loop loses only the wait for the batch's end.
That gap is what keeps the backend idle, so it does no more than it must: a batch that ends while
the loop waits there does not wake the loop (it answers the batch as it returns: the caller runs
`run_completed` next), and the waiting loop wakes itself: it naps in 15 us steps of its own
timer (`_nap.c`) until a counter this thread bumps with a plain store changes, where a lock's
release would wake it from here, a futex wake of ~10 us in the gap. Without the compiled nap the
loop blocks on that lock.
"""

from __future__ import annotations

import array
import asyncio
import collections
import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple, TypeVar

import numpy as np

from edgeserve.manifest import Manifest
from edgeserve.runtime.backends.base import Backend
from edgeserve.runtime.validation import Feeds, Sample

try:
    from edgeserve.runtime._nap import nap
except ImportError:  # no compiler at install: the loop blocks on a lock instead
    nap = None

_log = logging.getLogger(__name__)
T = TypeVar("T")
# The loop steps aside this long before a batch's predicted end, and waits at most this long past it.
STEP_ASIDE_AHEAD_S = 50e-6
STEP_ASIDE_LATE_S = 300e-6
NAP_STEP_S = 15e-6  # the loop looks at the executor thread's counter this often while it waits
# A batch to run: model, exit, samples, and the callback to call on the loop with its BatchRun.
Job = tuple[str, int, Sequence[Sample], Callable[["BatchRun"], object]]


def stack(samples: Sequence[Sample]) -> Feeds:
    """The samples as one batch: arrays stacked, maps stacked input by input."""
    first = samples[0]
    if isinstance(first, np.ndarray):
        return np.stack(samples)  # type: ignore[arg-type]
    return {name: np.stack([s[name] for s in samples]) for name in first}  # type: ignore[index]


def inline_safe(backend: Backend) -> bool:
    """Whether the loop may run this backend's batches on its own thread while the executor
    thread owns it (loads, closes): a backend says so with `inline_safe = True` when its run
    may come from any thread (ONNX Runtime sessions); device contexts bound to one thread may not."""
    return bool(getattr(backend, "inline_safe", False))


class BatchRun(NamedTuple):
    """A finished batch: its outputs by name (or the backend's exception) and when it ran.
    (A NamedTuple: one is made between two batches, while the backend waits.)"""

    outputs: dict[str, np.ndarray] | None
    error: BaseException | None
    start: float  # time.monotonic()
    end: float
    # CPU time of the running thread from start to end: the rest of end - start it waited (for
    # the GIL on the return from the backend's run, or for a core), as the busy loop made it.
    cpu_s: float = math.nan


def run_batch(backend: Backend, model: str, exit: int, samples: Sequence[Sample]) -> BatchRun:
    """Stack and run one batch; a backend exception comes back in BatchRun.error."""
    start, cpu = time.monotonic(), time.thread_time()
    try:
        outputs = backend.run_outputs(model, exit, stack(samples))
        return BatchRun(outputs, None, start, time.monotonic(), time.thread_time() - cpu)
    except Exception as exc:  # answered as `error` results; the server keeps serving
        return BatchRun(None, exc, start, time.monotonic(), time.thread_time() - cpu)


class Executor:
    """A single worker thread in front of a backend. Not shared between servers."""

    def __init__(self, make_backend: Callable[[], Backend]) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="edgeserve-executor")
        self._make_backend = make_backend
        self._backend: Backend | None = None
        self.thread_id: int | None = None  # the worker's native thread id (its /proc/self/task entry)
        # Finished batches' callbacks, appended by the executor thread, run on the loop's
        # (deque appends and pops are atomic: no lock).
        self._completed: collections.deque[tuple[Callable[[BatchRun], object], BatchRun]] = (
            collections.deque()
        )
        self._completing = False  # inside run_completed (a callback's answers may read: no re-entry)
        self._threaded = False  # the executor thread is running batches
        # Bumped by that thread as it starts a batch and as it goes idle: the loop naps on it in
        # step_aside. Without the compiled nap, the loop holds the gate there instead, and that
        # thread releases it at the same two points (a Lock may be released by another thread).
        self._turns = array.array("q", [0])
        self._gate = threading.Lock()
        self._waiting = False  # the loop is in step_aside: a batch that ends need not wake it
        self._stepped_aside_for = -1  # the turn the loop last stepped aside in (once per batch)

    @property
    def backend(self) -> Backend | None:
        """The open backend (call its methods through `call`, on the executor thread)."""
        return self._backend

    async def call(self, fn: Callable[..., T], *args: object) -> T:
        """Run `fn(*args)` on the executor thread (after any batch in progress)."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def open(self) -> Backend:
        """Create the backend on the executor thread; load models with `load`."""
        self.thread_id = await self.call(threading.get_native_id)
        self._backend = await self.call(self._make_backend)
        return self._backend

    async def load(self, manifest: Manifest) -> None:
        """Open (and warm up) one model's sessions on the executor thread."""
        if self._backend is None:
            raise RuntimeError("executor is not open")
        await self.call(self._backend.load, manifest)

    def submit(
        self,
        model: str,
        exit: int,
        samples: Sequence[Sample],
        done: Callable[[BatchRun], object],
        follow: Callable[[], Job | None] | None = None,
        inline: bool = False,
    ) -> None:
        """Stack `samples`, run them at `exit` on the executor thread, then call `done(run)` on the
        calling loop; a backend exception comes back in BatchRun.error. `follow`, called on the
        executor thread as each batch ends and before its `done` is sent, returns the next batch
        to run at once, or None. `inline`: run it on the loop's own thread instead, in a callback of
        its own (`follow` unused): for a batch shorter than two thread hand-offs, see `inline_safe`.
        Raises RuntimeError if the executor is not open or closed."""
        backend = self._backend
        if backend is None:
            raise RuntimeError("executor is not open")
        loop = asyncio.get_running_loop()

        if inline:
            loop.call_soon(self.run_inline, model, exit, samples, done)
            return

        def _run() -> None:
            job: Job | None = (model, exit, samples, done)
            gate = self._gate
            turns = self._turns
            self._threaded = True
            try:
                while job is not None:
                    name, at, batch_samples, callback = job
                    turns[0] += 1
                    if gate.locked():  # only this thread releases it: it stays locked until then
                        gate.release()
                    run = run_batch(backend, name, at, batch_samples)
                    try:
                        job = None if follow is None or loop.is_closed() else follow()
                    except Exception:  # the loop decides instead, when `done` reaches it
                        _log.exception("deciding the next batch on the executor thread failed")
                        job = None
                    self._completed.append((callback, run))
                    if not self._waiting:  # a waiting loop runs it as step_aside returns
                        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits
                            loop.call_soon_threadsafe(self.run_completed)
            finally:
                self._threaded = False
                turns[0] += 1
                if gate.locked():
                    gate.release()

        self._pool.submit(_run)

    def step_aside(self, ends_at: float) -> None:
        """On the loop, before it reads: if the executor thread's batch is predicted to end (at
        `ends_at`, time.monotonic()) within STEP_ASIDE_AHEAD_S, or is past it, block until that
        thread starts its next batch or goes idle, at most STEP_ASIDE_LATE_S past `ends_at`; once
        per batch. The caller runs `run_completed` next: a batch that ended meanwhile did not wake
        the loop. See the module docstring."""
        turns = self._turns
        seq = turns[0]
        if not self._threaded or seq == self._stepped_aside_for:
            return
        now = time.monotonic()
        if not now >= ends_at - STEP_ASIDE_AHEAD_S:  # not due, or no prediction (NaN)
            return
        self._stepped_aside_for = seq
        until = max(ends_at, now) + STEP_ASIDE_LATE_S
        self._waiting = True
        try:
            if nap is not None:  # (at once if a batch started since `seq` was read)
                nap(turns, seq, until, NAP_STEP_S)
            else:
                gate = self._gate
                gate.acquire(blocking=False)  # held now (or still, from a wait that timed out)
                if turns[0] == seq and self._threaded:  # else a batch started since: released
                    gate.acquire(timeout=until - now)
        finally:
            self._waiting = False

    def run_completed(self) -> None:
        """On the loop: call the callbacks of the batches that have ended, in the order they ended."""
        completed = self._completed
        if self._completing:
            return
        self._completing = True
        try:
            while completed:
                callback, run = completed.popleft()
                try:
                    callback(run)
                except Exception:  # as the loop would for a callback of its own: log, go on
                    _log.exception("the callback of a finished batch failed")
        finally:
            self._completing = False

    def run_inline(
        self, model: str, exit: int, samples: Sequence[Sample], done: Callable[[BatchRun], object]
    ) -> None:
        """Run a batch on the calling (loop) thread now and call `done`; see `submit`."""
        backend = self._backend
        if backend is None:  # closed since the batch was submitted
            done(BatchRun(None, RuntimeError("executor is closed"), math.nan, time.monotonic()))
        else:
            done(run_batch(backend, model, exit, samples))

    async def close(self) -> None:
        """Release the backend on its own thread (after any running batch), then stop the thread."""
        backend, self._backend = self._backend, None
        try:
            if backend is not None:
                await self.call(backend.close)
        finally:
            self._pool.shutdown(wait=False)
