"""The serving core: an asyncio loop owns one FIFO queue per model and runs the scheduler.

Requests are checked and queued on the loop. When the executor is idle and a request arrives, the
loop asks the policy: drops are answered `expired`, a Dispatch pops a batch and hands it to the
executor thread (one batch at a time; a short batch that empties the queues of an idle loop runs
on the loop itself, see executor.py), a Wait sets one wake-up timer (replaced on the next
arrival). As a batch ends the executor thread asks the same policy for the next one itself
(`_follow`, under the lock the queues share), so the executor never waits for a busy loop; or,
when a front's read came just before the batch's end, the loop decided it ahead
(`_decide_ahead`) and the executor thread starts it without a decision in between. The
finished batch goes back to the loop, which answers each request through its front's `reply`
callback, so every request gets exactly one Result.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgeserve.config.server import BackendConfig, SchedulerConfig, ServerConfig
from edgeserve.manifest import Manifest
from edgeserve.profile import ProfileTable
from edgeserve.repository import ModelRepository
from edgeserve.runtime.answer_holders import AnswerHolders
from edgeserve.runtime.backends.base import Backend
from edgeserve.runtime.batch_ceiling import cap_tables
from edgeserve.runtime.budget import (
    BatchOverhead,
    Throughput,
    admission_excess,
    deepest_kept,
    headroom,
    planned_budget,
    queue_bound,
    shallow_costs,
)
from edgeserve.runtime.calibration import LatencyCalibrator
from edgeserve.runtime.calibration_store import save_calibrated
from edgeserve.runtime.counters import Counters
from edgeserve.runtime.cpu_slice import set_thread_slice, slice_ns, thread_slice_s
from edgeserve.runtime.deadline_check import check_deadlines
from edgeserve.runtime.executor import BatchRun, Executor, Job, inline_safe
from edgeserve.runtime.idle_poll import IdlePoll
from edgeserve.runtime.offload.offloader import OffloadContext, Offloader
from edgeserve.runtime.results import Result, Status
from edgeserve.runtime.running_quantile import RunningQuantile
from edgeserve.runtime.tasks import Task, TaskBook
from edgeserve.runtime.validation import Sample
from edgeserve.scheduler import (
    DEFAULT_POLICY,
    Decision,
    Dispatch,
    LatencyModel,
    Policy,
    PolicyOptions,
    Urgency,
    Wait,
    make_policy,
)
from edgeserve.wire.bounds import real, timing_problem

_log = logging.getLogger(__name__)

BackendFactory = Callable[[ModelRepository, BackendConfig], Backend]
UNKNOWN_MODEL = "(unknown)"  # counter key for requests naming no served model: keys stay bounded
MIN_WAKEUP_S = 1e-4  # a Wait that is already due is retried this much later, never in a busy loop
TIMER_SLACK_S = 1e-3  # event-loop timers are ms-granular: fire a Wait's wake-up this much early
# When the configured policy raises (a bug, or a state it cannot score), this simple rule decides
# instead, so one bad decision never fails the requests queued behind it.
FALLBACK_POLICY = "early-exit-edf"
# The scheduler plans each task to finish before its deadline by the answer's way back, but
# always keeps at least this share of the budget (Server._enqueue).
PLAN_FLOOR = 0.5
PLAN_LAG_STEP_S = 0.2e-3  # the plans' measured margin follows the loop's delays in steps this large
LAG_WEIGHT = 0.2  # EWMA weight of the latest delay of a callback the loop schedules
# The plans leave room for this quantile of a finished batch's wait for the loop, not its mean
# (runtime/running_quantile.py): beside a busy Python client at 2x that wait was 0.6 ms at P50
# and 2.5 ms at P95, and answers planned to the mean reached the client late.
ANSWER_LAG_QUANTILE = 0.9
ANSWER_LAG_STEP_S = 50e-6  # the most it moves a batch
# Short batches run on the loop only while a callback it schedules runs within this (an EWMA):
# past it the loop is busy reading, and a batch run there would hold every connection's frames.
INLINE_LOOP_DELAY_S = 200e-6
# Before a read, the loop decides the batch after the running one when that is due to end within
# this, and this share of its predicted time at most (`_decide_ahead`); the executor thread then
# starts it without deciding. "Due" is the end the batches' measured share of their predicted
# (quantile) time gives, an EWMA of this weight.
DECIDE_AHEAD_S = 300e-6
DECIDE_AHEAD_SHARE = 0.4
DUE_WEIGHT = 0.05


def default_backend(repository: ModelRepository, config: BackendConfig) -> Backend:
    """The backend named in the config, over the server's repository."""
    from edgeserve.runtime.backends.select import create_backend

    return create_backend(
        config.name,
        repository,
        threads=config.threads,
        providers=config.providers or None,
        warmup=config.warmup,
        precision=config.precision,
        device=config.device,
        compose_exits=config.compose_exits,
        slowdown=config.slowdown,
        fingerprint=config.fingerprint,
    )


def load_config(config: ServerConfig | Mapping[str, Any] | str | Path) -> ServerConfig:
    """A ServerConfig from itself, a dict (ServerConfig.from_dict) or a TOML path."""
    if isinstance(config, ServerConfig):
        return config
    if isinstance(config, (str, Path)):
        return ServerConfig.from_toml(config)
    return ServerConfig.from_dict(config)


def _scheduling(tables: list[ProfileTable], sched: SchedulerConfig) -> tuple[LatencyModel, Policy, Policy]:
    """The latency model over the profiles, the configured policy and the fallback policy."""
    latency = LatencyModel.from_profiles(tables, sched.quantile, sched.max_batch)
    options = PolicyOptions(urgency=Urgency(sched.urgency, sched.urgency_clip))
    policy = make_policy(sched.policy or DEFAULT_POLICY, latency, options)
    return latency, policy, make_policy(FALLBACK_POLICY, latency, options)


def _as_run(tables: list[ProfileTable], backend: Backend) -> list[ProfileTable]:
    """The profiles as the backend runs them: the emulated backend's are `slowdown` times longer."""
    scale = float(getattr(backend, "profile_scale", 1.0))
    return [t.scaled(scale) for t in tables]


def _resolve(future: asyncio.Future[Result], result: Result) -> None:
    if not future.done():
        future.set_result(result)


def _deliver(reply: Callable[[Result], object], result: Result) -> None:
    """Hand a Result to its front; a front's fault must not cost the other answers of a batch."""
    try:
        reply(result)
    except Exception:
        _log.exception("a front failed to take the answer of a %r request", result.model)


class Server:
    """Serve the configured models until closed: `async with Server(config) as server: ...`.

    `backend_factory` builds the backend on the executor thread (tests wrap the real ONNX
    Runtime backend with it); by default the config's backend is created.
    """

    def __init__(
        self,
        config: ServerConfig | Mapping[str, Any] | str | Path,
        *,
        backend_factory: BackendFactory | None = None,
    ) -> None:
        self.config = load_config(config)
        self._backend_factory = backend_factory or default_backend
        self._names = tuple(self.config.models)
        self._index = {name: i for i, name in enumerate(self._names)}
        self._take_settings(self.config)
        self.counters = Counters()
        self._manifests: list[Manifest] = []
        # per model and exit: the names its outputs are answered under (see _output_names)
        self._output_names: list[list[tuple[str, ...]]] = []
        # per model: (dtype, sample shape) of its one input, or None for a model with several inputs
        self._inputs: list[tuple[np.dtype[Any], tuple[int, ...]] | None] = []
        self._book = TaskBook(len(self._names))
        self._queues = self._book.queues  # the scheduler's view of the book
        self._executor: Executor | None = None
        self._policy: Policy | None = None
        self._fallback: Policy | None = None
        self._latency: LatencyModel | None = None
        self._shallowest_s: list[float] = []
        # per model: seconds for 0..B tasks in one batch at the shallowest exit (budget.py)
        self._shallow_costs: list[tuple[float, ...]] = []
        # per model: the queue bound in force (max_queue, or derived from the deadline: _use)
        self._max_queue: list[int] = []
        self._full_batch: list[int] = []  # per model: its largest batch
        self._overhead = BatchOverhead(1.0)  # the horizon is the longest deadline (_use)
        self._throughput = Throughput(1.0, 1.0)  # what the fronts may hold (deadlines: _use)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._busy = False
        self._timer: asyncio.TimerHandle | None = None
        self._decide_pending = False
        self._accepting = False
        self._closed = False
        self._idle: asyncio.Event | None = None
        self._close_task: asyncio.Future[None] | None = None
        self._offload: Offloader | None = None  # upstreams (docs/offload.md), when configured
        self._busy_until = 0.0  # predicted end of the running batch (the offload planner reads it)
        self._threaded = False  # the running batch is on the executor thread (not inline)
        self._started_at = 0.0  # the running batch's start (its prediction: `_busy_until`)
        self._due = 0.0  # when it is likely to end: its predicted time scaled by `_due_share`
        self._decide_from = 0.0  # from when `_decide_ahead` may decide the batch after it
        self._due_share = 1.0  # EWMA: the share of their predicted time batches on the thread take
        # The batch after the running one, decided by the loop as that was due to end, and its
        # predicted duration: `_follow` starts it (`_decide_ahead`).
        self._ahead: tuple[Job, float] | None = None
        self._loop_thread_id: int | None = None
        self._inline_ok = False  # the backend lets the loop run short batches itself (executor.py)
        self._loop_delay = 0.0  # EWMA: a callback the loop schedules waits this long to run
        self._kicked_at = 0.0
        # A finished batch waits this long for the loop to answer it (a quantile of the waits).
        self._answer_lag = RunningQuantile(ANSWER_LAG_QUANTILE, ANSWER_LAG_STEP_S)
        # The fronts that write the answers handed out together in one write per connection.
        self._answer_holders = AnswerHolders()
        self._plan_lag = 0.0  # the two delays above as the plans use them (held: PLAN_LAG_STEP_S)
        # The queues and the busy state are shared with the executor thread, which decides the
        # next batch itself as one ends (`_follow`): every change to them holds this lock
        # (reentrant: a failing policy answers the queued requests while the loop holds it).
        self._lock = threading.RLock()
        self._calibration: LatencyCalibrator | None = None  # online latency calibration
        self._idle_poll = IdlePoll(self.config.backend.idle_poll_us * 1e-6)  # see `_poll_idle`
        self._slice_before: float | None = None  # the loop thread's CPU slice before start (cpu_slice.py)

    # -- lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> Server:
        """Load manifests (verified), the backend, the profiles for its fingerprint and the policy.

        A missing or stale profile fails here with the repository's error naming the command to run.
        """
        if self._loop is not None or self._closed:
            raise RuntimeError("a Server starts once; create a new one to serve again")
        self._loop = asyncio.get_running_loop()
        self._loop_thread_id = threading.get_native_id()
        self._idle = asyncio.Event()
        self._idle.set()
        config = self.config
        repository = ModelRepository(Path(config.repository))
        self._manifests = await asyncio.to_thread(lambda: [repository.load_manifest(n) for n in self._names])
        self._inputs = [
            (np.dtype(m.inputs[0].dtype), tuple(m.inputs[0].shape)) if len(m.inputs) == 1 else None
            for m in self._manifests
        ]
        self._output_names = [_output_names(m) for m in self._manifests]
        executor = Executor(lambda: self._backend_factory(repository, config.backend))
        self._executor = executor
        try:
            backend = await executor.open()
            self._inline_ok = inline_safe(backend)
            if hasattr(backend, "choose_profile"):  # emulated: which stored profile these models run
                await executor.call(backend.choose_profile, self._names)
            fingerprint = await executor.call(backend.fingerprint)
            self._fingerprint_key = fingerprint.key()  # names the calibrated tables
            tables = _as_run([repository.load_profile(m, fingerprint) for m in self._manifests], backend)
            tables = cap_tables(tables, [config.models[n].max_batch for n in self._names])  # batch_ceiling.py
            slo_ms = {n: config.models[n].slo_ms for n in self._names}  # no exit can meet it: refused
            check_deadlines(self._names, tables, slo_ms, config.scheduler.quantile)
            self._use(*_scheduling(tables, config.scheduler))
            for manifest in self._manifests:
                await executor.load(manifest)
        except BaseException:
            self._closed = True
            await executor.close()
            raise
        self.counters = Counters()
        self.counters.queue_depth = {name: 0 for name in self._names}
        if config.upstreams:
            self._offload = Offloader(self._offload_context(), config.upstreams)
            await self._offload.start()
        self._shorten_slice(config.backend.loop_slice_us * 1e-6)
        self._accepting = True
        return self

    def _shorten_slice(self, seconds: float) -> None:
        """The loop's thread takes a short CPU slice, after the executor's thread started (which
        keeps its own); `close` gives the old one back (an embedding app owns the thread). A thread
        that has it already (another Server on it) is left to whoever gave it."""
        before = thread_slice_s()
        if (
            seconds
            and before is not None
            and round(before * 1e9) != slice_ns(seconds)
            and set_thread_slice(seconds)
        ):
            self._slice_before = before
            _log.debug("event loop thread: CPU slice %.2f ms (was %.2f ms)", seconds * 1e3, before * 1e3)

    async def __aenter__(self) -> Server:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self, timeout_s: float | None = None) -> None:
        """Stop accepting; serve what is queued for up to `timeout_s` (config default), answer the
        rest `shutdown`, then release the backend on its thread. Later calls wait for the first."""
        if self._close_task is None:
            self._close_task = asyncio.ensure_future(self._close(timeout_s))
        await asyncio.shield(self._close_task)

    async def _close(self, timeout_s: float | None) -> None:
        if self._closed:
            return
        self._accepting = False
        if self._idle is not None:
            timeout = self.config.shutdown_timeout_s if timeout_s is None else timeout_s
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._idle.wait(), timeout)
        self._closed = True
        self._book.closed = True
        self._cancel_timer()
        now = time.monotonic()
        self._answer_queued(Status.SHUTDOWN, now, "server shut down")
        for task in list(self._book.open.values()):  # running here or upstream: answer without waiting
            self._finish(task, self._result(task, Status.SHUTDOWN, now, error="server shut down"))
        if self._executor is not None:
            await self._executor.close()  # waits for a running batch on the executor thread
        if self._offload is not None:  # its in-flight tasks were answered `shutdown` just above
            await self._offload.close()
        if self._calibration is not None and self._calibration.updates:  # keep what it learned
            data, repo = self._calibration.calibrated(), Path(self.config.repository)
            with contextlib.suppress(OSError):
                await asyncio.to_thread(save_calibrated, repo, self._fingerprint_key, data)
        if self._slice_before is not None and self._loop_thread_id is not None:
            set_thread_slice(self._slice_before, self._loop_thread_id)
            self._slice_before = None

    async def reload(self, config: ServerConfig | Mapping[str, Any] | str | Path) -> list[str]:
        """Apply a new config without dropping a request; returns the changed key paths.

        SLOs, queue limits, preprocessing, the scheduler settings and the profiles (re-read for
        this backend's fingerprint) change between two decisions: queued requests stay queued
        (with the deadlines they arrived with) and are served under the new policy. A change
        only a restart can apply (models, backend, repository, listeners) raises ReloadRefused;
        any error leaves the old config serving.
        """
        from edgeserve.config.reload import check_reloadable

        new = load_config(config)
        if not self._accepting or self._executor is None:
            raise RuntimeError("reload needs a started server that is not shutting down")
        changed = check_reloadable(self.config, new)
        backend = self._executor.backend
        if backend is None:
            raise RuntimeError("reload needs an open backend")
        fingerprint = await self._executor.call(backend.fingerprint)
        repository = ModelRepository(Path(self.config.repository))
        manifests = self._manifests
        tables = await asyncio.to_thread(lambda: [repository.load_profile(m, fingerprint) for m in manifests])
        tables = cap_tables(tables, [new.models[n].max_batch for n in self._names])  # batch_ceiling.py
        latency, policy, fallback = _scheduling(_as_run(tables, backend), new.scheduler)
        if not self._accepting:  # shutdown began while the profiles were read: keep what runs
            raise RuntimeError("server began shutting down during the reload")
        # One synchronous block on the loop: no decision can see half of the old and half the new.
        self._take_settings(new)
        self._use(latency, policy, fallback)
        if not self._busy:
            self._kick()  # a pending Wait was computed by the old policy: decide again now
        return changed

    def _take_settings(self, config: ServerConfig) -> None:
        """The per-model limits and the late-task mode, read on every request, from `config`."""
        self.config = config
        self._queue_limits = [config.models[n].max_queue for n in self._names]  # None: derived
        self._budget_s = [config.models[n].slo_ms / 1000.0 for n in self._names]
        self._expire_late = config.scheduler.late_tasks == "expire"
        self._inline_max_s = config.backend.inline_max_ms / 1000.0
        self._admit_by_deadline = config.scheduler.admission == "deadline"

    def _use(self, latency: LatencyModel, policy: Policy, fallback: Policy) -> None:
        """Schedule with these from the next decision on (what start and reload install)."""
        with self._lock:
            self._latency, self._policy, self._fallback = latency, policy, fallback
            self._shallowest_s = [m.latency(0, 1) for m in latency.models]
            self._cost_work(latency)
            self._full_batch = [m.max_batch for m in latency.models]
            self._overhead.horizon_s = max(self._budget_s)
            # (a reload keeps the rate measured so far)
            self._throughput.deadline_s, self._throughput.tick_s = min(self._budget_s), max(self._budget_s)
            self._max_queue = [
                queue_bound(budget, costs) if limit is None else limit
                for limit, budget, costs in zip(
                    self._queue_limits, self._budget_s, self._shallow_costs, strict=True
                )
            ]
            # Online calibration: updates `latency` in place from the batch times observed.
            self._calibration = LatencyCalibrator(latency) if self.config.scheduler.calibration else None

    # -- public API --------------------------------------------------------------------------------

    @property
    def models(self) -> tuple[str, ...]:
        return self._names

    def queue_bound(self, model: str) -> int:
        """How many of `model`'s requests may wait at once: its `max_queue`, or by default the most
        the accelerator can answer within its deadline at the shallowest exit (budget.queue_bound)."""
        m = self._index[model]
        return self._max_queue[m] if self._max_queue else (self._queue_limits[m] or 1)  # (not started)

    def window_bounds(self) -> tuple[int, int]:
        """What a front's windows default to: (a connection's own window, the in-flight total).
        The window is the largest batch, so that any client can keep a batch in flight whatever
        the others do; the total the most requests the server could ever answer in time at once,
        all models together: the largest queue bound (every admitted task's deadline work shares
        one accelerator), so that deadline admission, not a count, refuses (the front's total in
        force is less: `in_flight_limit`)."""
        return max(self._full_batch, default=1), max(self._max_queue, default=1)

    def _host_cpu_s(self) -> float:
        """The process's CPU seconds outside the backend's batches: its Python (budget.Throughput)."""
        return time.process_time() - self.counters.busy_cpu_s

    def in_flight_limit(self, in_flight: int, margin_s: float = 0.0) -> int:
        """How many requests a front with `in_flight` of them unanswered should hold now: no more
        than deadline admission would still take on top (budget.headroom, the accelerator's
        side), nor than the host can answer within the part of the deadlines it has (less the
        front's `margin_s` and the loop's delays, as the plans; budget.Throughput). A front
        refuses past it without decoding; the requests it lets through are checked exactly.
        Unbounded when admission is by count (or work may go upstream)."""
        if not self._admit_by_deadline or self._offload is not None or not self._shallow_costs:
            return 1 << 30
        now = time.monotonic()
        target = self._throughput.target(now, self._host_cpu_s, margin_s + self._plan_lag)
        # Without the lock (the executor thread holds it while it decides): only the queues'
        # lengths are read, and an estimate a batch old only moves which frames are decoded.
        free_in = self._free_for_admission(now) - now
        room = headroom(self._queues, free_in, self._budget_s, self._shallow_costs, self._overhead.value)
        floor = sum(self._full_batch)  # a batch of every model: what the scheduler needs to batch
        return int(min(max(target, floor), in_flight + max(room, 1), 1 << 30))

    @property
    def accepting(self) -> bool:
        """Started and not shutting down: new requests are queued (health checks report this)."""
        return self._accepting

    def manifest(self, model: str) -> Manifest:
        return self._manifests[self._index[model]]

    @property
    def latency_model(self) -> LatencyModel:
        if self._latency is None:
            raise RuntimeError("server not started")
        return self._latency

    def snapshot(self) -> dict[str, Any]:
        """The counters as plain dicts (call on the loop thread)."""
        snapshot = self.counters.snapshot()
        snapshot["upstreams"] = {} if self._offload is None else self._offload.snapshot(time.monotonic())
        snapshot["latency_cells"] = [] if self._calibration is None else self._calibration.cells()
        snapshot["idle_poll_s"] = self._idle_poll.polled_s
        # native thread ids, for the metrics endpoint's per-thread CPU-wait counters
        executor_id = None if self._executor is None else self._executor.thread_id
        threads = {"loop": self._loop_thread_id, "executor": executor_id}
        snapshot["threads"] = {name: tid for name, tid in threads.items() if tid is not None}
        return snapshot

    async def infer(
        self,
        model: str,
        x: Sample,
        *,
        deadline_ms: float | None = None,
        capture_ts: float | None = None,
        reply_margin_s: float = 0.0,
    ) -> Result:
        """Queue one sample (the model's per-sample shape and dtype) and await its Result.

        The deadline is fixed here, once, for every front: `deadline_ms` is this request's budget
        from now; `capture_ts` (Unix time in seconds, time.time()) runs the model's SLO from the
        moment the frame was captured, and a frame already past it is answered `expired` at once;
        neither: the model's SLO from now. A front passes `reply_margin_s`, the time its answer
        needs to reach the client ([listen] reply_margin_ms): the scheduler plans to finish that
        much earlier (see _enqueue). Do not modify `x` until the result is back: it is stacked
        into the batch when its batch runs. Cancelling the call withdraws a queued sample.
        """
        future, task = self._submit(model, x, deadline_ms, capture_ts, reply_margin_s)
        try:
            return await future
        except asyncio.CancelledError:
            if task is not None:
                self._on_cancel(task)
            raise

    def submit(
        self,
        model: str,
        x: Sample,
        *,
        deadline_ms: float | None = None,
        capture_ts: float | None = None,
    ) -> asyncio.Future[Result]:
        """`infer` without a coroutine (call it on the loop): the future resolves to the Result, at
        once for a refusal; cancelling it does not withdraw the sample."""
        return self._submit(model, x, deadline_ms, capture_ts, 0.0)[0]

    def _submit(
        self, model: str, x: Sample, deadline_ms: float | None, capture_ts: float | None, margin_s: float
    ) -> tuple[asyncio.Future[Result], Task | None]:
        # The server's own loop (it is loop-only): asyncio.get_running_loop() is a getpid() call.
        future: asyncio.Future[Result] = (self._loop or asyncio.get_running_loop()).create_future()
        reply = functools.partial(_resolve, future)
        task = self.enqueue(
            model, x, reply, deadline_ms=deadline_ms, capture_ts=capture_ts, reply_margin_s=margin_s
        )
        return future, task

    def run_completed(self) -> None:
        """Answer the batches that have ended now, not a loop turn later (executor.py): a front
        door calls it before it reads, so the windows the answers free take the frames it reads.
        First, if the running batch is due to end, decide the next one for the executor thread
        (`_decide_ahead`) and step aside for it."""
        executor = self._executor
        if executor is not None:
            if self._threaded and self._ahead is None:
                self._decide_ahead()
            executor.step_aside(self._busy_until)
            self._answer_holders.hold()
            try:
                executor.run_completed()
            finally:
                self._answer_holders.release()

    def answers_together(self, hold: Callable[[], None], release: Callable[[], None]) -> None:
        """A front that can hold answers: the Server calls `hold()` before it hands out the answers
        of the batches that ended and `release()` after the last, so that the front writes each
        connection's answers in one write (one syscall and one wake-up of its client per batch,
        not per answer). Answers handed out otherwise (a refusal, a drop) are not held."""
        self._answer_holders.add(hold, release)

    def enqueue(
        self,
        model: str,
        x: Sample,
        reply: Callable[[Result], object],
        *,
        deadline_ms: float | None = None,
        capture_ts: float | None = None,
        reply_margin_s: float = 0.0,
        received: float | None = None,
    ) -> Task | None:
        """The cheapest way in, for fronts (call it on the loop): `reply(result)` is called exactly
        once, on the loop, with the request's Result; at once, before this returns, for a refusal
        (then None is returned). No future and no loop callback per request: under overload the
        loop's time per request is what decides how much is served (docs/runtime.md). `received`:
        the time.monotonic() at which the front read the request; a `deadline_ms` (or the SLO)
        runs from then, so a request that waited in the front's buffer has that much less."""
        task = self._enqueue(model, x, deadline_ms, capture_ts, reply, reply_margin_s, received)
        if isinstance(task, Result):
            _deliver(reply, task)
            return None
        return task

    def _enqueue(
        self,
        model: str,
        x: Sample,
        deadline_ms: float | None,
        capture_ts: float | None,
        reply: Callable[[Result], object],
        margin_s: float = 0.0,
        received: float | None = None,
    ) -> Task | Result:
        """Check the request and queue it as a Task, or refuse it with a Result at once."""
        now = time.monotonic()
        m = self._index.get(model, -1)
        if not self._accepting:
            why = "server is not started" if self._loop is None else "server is stopped or shutting down"
            return self._refuse(model if m >= 0 else UNKNOWN_MODEL, Status.SHUTDOWN, now, why, model)
        if m < 0:
            why = f"unknown model {model!r}; served: {', '.join(self._names)}"
            return self._refuse(UNKNOWN_MODEL, Status.INVALID, now, why, model)
        total, problem = self._budget(m, deadline_ms, capture_ts)
        waited = 0.0 if received is None or capture_ts is not None else max(now - received, 0.0)
        if problem is None and total <= waited:
            if capture_ts is not None:
                slo_ms = self._budget_s[m] * 1000.0
                why = f"captured {slo_ms - total * 1000.0:.1f} ms ago, past the {slo_ms:g} ms SLO"
            else:
                busy = self._busy or any(self._queues)  # else: the deadline is shorter than a read
                why = (
                    f"waited {waited * 1000.0:.1f} ms to be read, past its {total * 1000.0:g} ms deadline "
                    + (
                        "(the server is overloaded)"
                        if busy
                        else "(the server is not busy: reading a request takes that long here; give a "
                        "longer deadline_ms or slo_ms)"
                    )
                )
            return self._refuse(model, Status.EXPIRED, now, why)
        if problem is None:
            x, problem = self._sample(m, x)
        if problem is not None:
            return self._refuse(model, Status.INVALID, now, problem)
        queue = self._queues[m]
        if len(queue) >= self._max_queue[m]:
            why = f"queue of {model!r} is full (max_queue {self._max_queue[m]})"
            return self._refuse(model, Status.REJECTED, now, why)
        assert self._loop is not None and self._idle is not None
        # The policy spends a task's slack on deeper exits up to its deadline, but the answer is
        # not back at the caller then: the loop has yet to pick up the batch (answer_lag, a high
        # quantile) and to run (loop_delay, a mean), and a front's answer then crosses the kernel
        # and the client's read (margin_s). So the scheduler plans to that much before the
        # deadline, never to less than PLAN_FLOOR of what is left; `late` still means the
        # request's own deadline.
        # The measured part is held steady (it moves by PLAN_LAG_STEP_S at least) and the plan
        # counts from the read, so that requests alike get one budget to the bit: a queue with
        # one budget is ordered by urgency, and the policy scores it in a fraction of the time
        # (scheduler/fast_scoring.py), which the executor waits for between two batches.
        # The floor too is held to PLAN_LAG_STEP_S steps of the read-to-queue wait: it binds for
        # short deadlines under load, and a floor that moved with each request's microseconds of
        # waiting gave every task its own budget again.
        lag = self._answer_lag.value + self._loop_delay
        if abs(lag - self._plan_lag) > PLAN_LAG_STEP_S:
            self._plan_lag = lag
        plan = planned_budget(total, waited, margin_s, self._plan_lag, PLAN_FLOOR, PLAN_LAG_STEP_S)
        # Deadline admission (budget.py): refused only when even the shallowest exit, after the
        # running batch and every queued task due before it (in full batches at their shallowest
        # exits), cannot answer it by its planned deadline, which already leaves the answer's way
        # back. An idle server admits: nothing is ahead (a deadline no exit meets at all is refused
        # at start, deadline_check.py). (With upstreams, work the box cannot serve in time may go
        # upstream instead.) The queues are read under the lock: the executor thread pops batches
        # from them (`_follow`).
        by_deadline = self._admit_by_deadline and self._offload is None
        with self._lock:
            excess = 0.0
            if by_deadline and (self._busy or self._ahead is not None or any(self._queues)):
                due = now - waited + plan
                free_at = self._free_for_admission(now)
                excess = admission_excess(
                    self._queues, m, due, free_at, self._shallow_costs, self._overhead.value
                )
            task = None if excess > 0 else self._book.add(m, x, reply, now, plan, total, arrival=now - waited)
        if task is None:
            why = (
                f"overloaded: {model!r} cannot answer within this request's deadline now "
                f"(the work ahead needs {excess * 1000.0:.1f} ms more than it leaves)"
            )
            return self._refuse(model, Status.REJECTED, now, why)
        self.counters.queue_depth[model] = len(queue)
        self._idle.clear()
        if self._busy and self._offload is not None:
            self._offload.poke()  # work beyond local capacity may go upstream now
        self._wake()
        return task

    async def infer_batch(
        self, model: str, xs: np.ndarray | Sequence[np.ndarray], *, deadline_ms: float | None = None
    ) -> list[Result]:
        """One request per sample (xs: (N, *shape) or a list); Results in the same order."""
        return list(await asyncio.gather(*(self.infer(model, x, deadline_ms=deadline_ms) for x in xs)))

    # -- request checks and answers ----------------------------------------------------------------

    def _budget(self, m: int, deadline_ms: object, capture_ts: object) -> tuple[float, str | None]:
        """(seconds from now to the deadline, None) or (nan, what is wrong with the request).

        The bounds are the socket codec's (wire/bounds.timing_problem): deadline_ms from 1 µs to
        1 day, capture_ts within a day of time.time(); any other value, of any type, is a problem
        (so `invalid`), never an exception. A capture_ts in range but past the SLO gives a budget
        <= 0, which the caller answers `expired`.
        """
        now = time.time()
        problem = timing_problem(deadline_ms, capture_ts, now)
        if problem is not None:
            return math.nan, problem
        if capture_ts is not None:
            captured = real(capture_ts)
            assert captured is not None  # checked by timing_problem
            return self._budget_s[m] - (now - captured), None
        if deadline_ms is None:
            return self._budget_s[m], None
        budget_ms = real(deadline_ms)
        assert budget_ms is not None  # checked by timing_problem
        return budget_ms / 1000.0, None

    def _sample(self, m: int, x: Any) -> tuple[Any, str | None]:
        """(the sample as the executor stacks it, None) or (x, what is wrong with it).

        A single-input model takes the bare array, or a one-entry map naming its input; a model
        with several inputs takes a map from each input's name to its array.
        """
        single = self._inputs[m]
        if single is not None:
            dtype, shape = single
            if type(x) is np.ndarray and x.dtype == dtype and x.shape == shape:
                return x, None  # the common case, in well under a microsecond
            if isinstance(x, dict) and len(x) == 1:
                name = self._manifests[m].inputs[0].name
                if name in x:
                    x = x[name]
        name = self._names[m]
        inputs = self._manifests[m].inputs
        if single is None or isinstance(x, dict):
            if not isinstance(x, dict) or set(x) != {t.name for t in inputs}:
                given = sorted(map(str, x)) if isinstance(x, dict) else type(x).__name__
                names = ", ".join(t.name for t in inputs)
                return x, f"model {name!r} takes the inputs {names} (a map from name to array), got {given}"
            for spec in inputs:
                who = f"input {spec.name!r} of model {name!r}"
                problem = _tensor_problem(who, np.dtype(spec.dtype), spec.shape, x[spec.name])
                if problem is not None:
                    return x, problem
            return x, None
        return x, _tensor_problem(f"model {name!r}", *single, x)

    def _refuse(self, key: str, status: Status, now: float, error: str, model: str | None = None) -> Result:
        """Answer at once without queueing; counted under `key` (a served model or UNKNOWN_MODEL).
        An `expired` (past its deadline before it could be queued) is a deadline violation too."""
        self.counters.requests[(key, status.value)] += 1
        if status is Status.EXPIRED:
            self.counters.violations[key] += 1
        return Result(status=status, model=key if model is None else model, queued=now, end=now, error=error)

    def _result(
        self,
        task: Task,
        status: Status,
        end: float,
        *,
        error: str | None = None,
        outputs: dict[str, np.ndarray] | None = None,
        exit: int | None = None,
        start: float = math.nan,
        batch_size: int = 0,
    ) -> Result:
        manifest = self._manifests[task.model]
        spec = manifest.exits[exit] if exit is not None else None
        return Result(
            status=status,
            model=self._names[task.model],
            output=None if not outputs else next(iter(outputs.values())),
            outputs=outputs,
            exit_index=exit,
            exit_name=spec.name if spec else None,
            expected_accuracy=spec.accuracy if spec else None,
            batch_size=batch_size,
            queued=task.queued,
            dispatch=task.dispatch,
            start=start,
            end=end,
            deadline=task.requested,
            error=error,
        )

    def _finish(self, task: Task, result: Result) -> None:
        """Answer a task exactly once and count the answer."""
        if self._answer(task, result):
            self._count(result)

    def _answer(self, task: Task, result: Result) -> bool:
        """Hand a task its answer unless it had one (later answers, e.g. after shutdown, are
        ignored); whether this one went out."""
        if not self._book.answer(task):
            return False
        _deliver(task.reply, result)
        return True

    def _count(self, result: Result) -> None:
        """An answer's counters (after its delivery: no answer waits for them)."""
        self._count_batch([result])

    def _count_batch(self, answered: list[Result]) -> None:
        """The counters of answers that share their status, model, exit and times (one answer, or
        a batch's): each `ok` counter once per batch, not once per answer (the same counts)."""
        counters = self.counters
        if not answered or answered[0].status is not Status.OK:
            for result in answered:
                counters.requests[(result.model, result.status.value)] += 1
                if result.status is Status.EXPIRED:
                    counters.violations[result.model] += 1
            return
        first, n = answered[0], len(answered)
        model, end = first.model, first.end
        counters.requests[(model, Status.OK.value)] += n
        late = sum(result.late for result in answered)
        if late:
            counters.violations[model] += late
        if first.exit_name is not None:
            counters.exit_mix[(model, first.exit_name)] += n
        counters.observe_ok_batch(model, [result.queued for result in answered], first.start, end)
        counters.served[(model, first.served_by)] += n

    def _on_cancel(self, task: Task) -> None:
        """A caller gave up: drop its task if still queued; a running batch completes regardless."""
        self.counters.cancelled[self._names[task.model]] += 1
        with self._lock:
            withdrawn = self._book.withdraw(task)
        if withdrawn:
            self._sync_depths()

    def _sync_depths(self) -> None:
        """Export the queue depths and set the idle event if nothing is left (after any change)."""
        for m, name in enumerate(self._names):
            self.counters.queue_depth[name] = len(self._queues[m])
        self._update_idle()

    # -- scheduling --------------------------------------------------------------------------------

    def _wake(self) -> None:
        """New work in the queues: decide soon if the executor is free; while it is busy, re-arm the
        timer that answers a task `expired` as soon as it turns hopeless (expire mode)."""
        if not self._busy:
            self._kick()
        elif self._expire_late:
            self._arm_timer(math.inf)

    def _cost_work(self, latency: LatencyModel) -> None:
        """Admission's costs from the latency table (at start, reload and calibration): each
        model's shallowest-exit batches at the quantile the policy plans with. (Tried: their means
        and one tail, as a queue of many batches rarely draws all their tails; more late answers
        on the emulated accelerator at 3-5x, 5.2 against 2.7 points at 3x, and no better on the
        CPU once its profile was steady.)"""
        self._shallow_costs = [
            shallow_costs(m.by_batch[b][0] for b in range(m.max_batch)) for m in latency.models
        ]

    def _free_for_admission(self, now: float) -> float:
        """When the executor can start on the queues: after the running batch (one that overran its
        profile may run as long again) and the batch decided after it. Exact under the lock
        (admission); an estimate a batch old without it (`in_flight_limit`)."""
        free_at = self._busy_until if self._busy else now
        if free_at < now:
            free_at = 2.0 * now - self._started_at if self._busy else now
        if self._ahead is not None:
            free_at += self._ahead[1]
        return free_at

    def _free_at(self, now: float) -> float:
        """When the executor is free: now, or the running batch's predicted end."""
        return self._busy_until if self._busy else now

    def _kick(self) -> None:
        """Decide soon (once per loop iteration, so a burst of arrivals is batched together)."""
        if self._busy or self._decide_pending or self._closed:
            return
        assert self._loop is not None
        self._decide_pending = True
        self._kicked_at = now = time.monotonic()
        self._idle_poll.busy(now)
        self._loop.call_soon(self._decide_now)

    def _decide_now(self) -> None:
        self._decide_pending = False
        self._loop_delay += LAG_WEIGHT * (time.monotonic() - self._kicked_at - self._loop_delay)
        self._decide(here=True)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm_timer(self, until: float) -> None:
        """One wake-up: a Wait's `until` (fired TIMER_SLACK_S early, the policy then asked as of
        `until`), or, in expire mode, the moment a queued task turns hopeless if that is sooner."""
        hopeless = math.inf
        if self._expire_late:
            for m, queue in enumerate(self._queues):
                if queue:
                    hopeless = min(hopeless, float(queue.deadlines.min()) - self._shallowest_s[m])
        self._cancel_timer()
        assert self._loop is not None
        if until - TIMER_SLACK_S <= hopeless and not math.isinf(until):
            delay = max(until - TIMER_SLACK_S - time.monotonic(), MIN_WAKEUP_S)
            self._timer = self._loop.call_later(delay, self._decide, until)
        elif not math.isinf(hopeless):
            delay = max(hopeless - time.monotonic(), MIN_WAKEUP_S)
            self._timer = self._loop.call_later(delay, self._decide)

    def _expire_hopeless(self, now: float) -> list[tuple[Task, Result]]:
        """Lazy drop: the tasks even the shallowest exit at batch 1 cannot save, out of their queues,
        with their `expired` Results (answered by the caller, after the lock)."""
        out: list[tuple[Task, Result]] = []
        for m, queue in enumerate(self._queues):
            if not queue:
                continue
            hopeless = queue.deadlines < now + self._shallowest_s[m]
            if hopeless.any():
                for task in self._book.drop(m, queue.ids[hopeless].copy()):
                    out.append((task, self._result(task, Status.EXPIRED, now, error="cannot meet deadline")))
        return out

    def _decide(self, wake_at: float = -math.inf, here: bool = False) -> None:
        """Expire hopeless tasks (expire mode); if the executor is free, ask the policy and act.

        `wake_at`: the `until` of the Wait whose timer fired; the policy is asked as of at least
        that time, so timer granularity (1 ms in uvloop and epoll) never delays a deferred batch.
        `here`: an inline batch runs in this callback (see `_dispatch`).
        """
        if self._closed:
            return
        self._cancel_timer()
        assert self._policy is not None and self._loop is not None
        now = time.monotonic()
        with self._lock:
            answer: list[tuple[Task, Result]] = []
            if self._expire_late:
                answer += self._expire_hopeless(now)
            if self._offload is not None:
                self._offload.plan(now)  # first, so the policy plans only what stays local
            decision = None
            if not self._busy and any(self._queues):
                t0 = time.perf_counter()
                decision = self._ask_policy(max(now, wake_at), now)
                self.counters.decision.add(time.perf_counter() - t0)
            job, inline = None, False
            if decision is not None:
                for drop in decision.drops:
                    for task in self._book.drop(drop.model, drop.task_ids):
                        result = self._result(task, Status.EXPIRED, now, error="dropped by the policy")
                        answer.append((task, result))
                if isinstance(decision, Dispatch):
                    inline = self._runs_inline(decision)
                    job = self._take(decision, now, inline, hopped=inline and not here)
            self._arm_timer(decision.until if isinstance(decision, Wait) else math.inf)
        for task, result in answer:
            self._finish(task, result)
        if job is not None:
            self._dispatch(job, inline, here)
        self._sync_depths()

    def _runs_inline(self, decision: Dispatch) -> bool:
        """Whether the loop runs this batch itself (executor.py): it is short and takes every queued
        task. Under load (tasks left queued) the executor thread runs it, in parallel with the
        loop's reads, and decides the next one itself as it ends."""
        return (
            self._inline_ok
            and decision.predicted_s <= self._inline_max_s
            and self._loop_delay <= INLINE_LOOP_DELAY_S
            and sum(map(len, self._queues)) <= decision.batch
        )

    def _take(self, decision: Dispatch, now: float, inline: bool = False, hopped: bool = False) -> Job:
        """Pop the decided batch and mark the executor busy (holding the lock); an `inline` batch's
        callback says so, so that it frees the executor and answers before the next batch runs,
        and whether the batch waits for a loop callback of its own (`hopped`, see `_dispatch`)."""
        self._start(now, decision.predicted_s, threaded=not inline)
        return self._job(decision, now, inline, hopped)

    def _start(self, now: float, predicted_s: float, threaded: bool) -> None:
        self._busy, self._threaded = True, threaded
        self._busy_until, self._started_at = now + predicted_s, now
        self._due = now + self._due_share * predicted_s
        self._decide_from = self._due - min(DECIDE_AHEAD_S, DECIDE_AHEAD_SHARE * predicted_s)

    def _job(self, decision: Dispatch, now: float, inline: bool = False, hopped: bool = False) -> Job:
        tasks = self._book.pop(decision.model, decision.batch, now)
        m = decision.model
        return (
            self._names[m],
            decision.exit,
            [t.x for t in tasks],
            functools.partial(self._batch_done, m, decision.exit, tasks, inline, hopped),
        )

    def _follow(self) -> Job | None:
        """On the executor thread, as a batch ends: the next batch, decided at once by the same
        policy on the same queues, so the executor does not wait a loop turn for it; None when the
        loop must decide (nothing queued, or a mode whose decisions answer requests or talk to
        upstreams: those happen on the loop, when the finished batch's callback reaches it). The
        batch the loop decided ahead (`_decide_ahead`), if any, without deciding."""
        with self._lock:
            predicted_s = self._busy_until - self._started_at
            if self._threaded and predicted_s > 0:  # (a quantile: most batches end sooner)
                share = min(max((time.monotonic() - self._started_at) / predicted_s, 0.2), 2.0)
                self._due_share += DUE_WEIGHT * (share - self._due_share)
            self._busy = self._threaded = False
            ahead, self._ahead = self._ahead, None
            if self._closed:
                return None  # (an ahead batch's tasks were answered `shutdown` with the rest)
            if ahead is not None:
                job, predicted_s = ahead
                self._start(time.monotonic(), predicted_s, threaded=True)
                self.counters.batches_ahead += 1
                return job
            if self._expire_late or self._offload is not None or not any(self._queues):
                return None
            now = time.monotonic()
            decision = self._thread_decision(now)
            return None if decision is None else self._take(decision, now)

    def _thread_decision(self, at: float) -> Dispatch | None:
        """The policy's batch as of `at` for the executor thread (holding the lock); None where the
        loop must decide instead: the policy raised (the loop asks again, logs and falls back:
        `_ask_policy`), it waits or drops, or the batch is short (the loop runs it itself)."""
        assert self._policy is not None
        t0 = time.perf_counter()
        try:
            decision = self._policy.decide(self._queues, at)
        except Exception:
            return None
        self.counters.decision.add(time.perf_counter() - t0)
        if not isinstance(decision, Dispatch) or decision.drops or self._runs_inline(decision):
            return None
        return self._kept(decision, at)

    def _kept(self, decision: Decision, at: float) -> Decision:
        """The policy's batch at an exit no deeper than keeps deadline admission's promise to the
        tasks it leaves queued (budget.deepest_kept), for a policy that chooses exits to keep
        tasks (`guards_the_tail`: the default's family); holding the lock."""
        if (
            not isinstance(decision, Dispatch)
            or not self._admit_by_deadline
            or self._offload is not None
            or not getattr(self._policy, "guards_the_tail", False)
        ):
            return decision
        model = self.latency_model.models[decision.model]
        pos = model.exit_ids.index(decision.exit)
        if pos == 0:
            return decision
        column = model.by_batch[decision.batch - 1]
        kept = deepest_kept(
            self._queues,
            decision.model,
            decision.batch,
            at,
            column[: pos + 1],
            self._shallow_costs,
            self._overhead.value,
        )
        if kept == pos:
            return decision
        self.counters.exits_kept_shallower += 1
        return dataclasses.replace(decision, exit=model.exit_ids[kept], predicted_s=column[kept])

    def _decide_ahead(self) -> None:
        """On the loop, before a read: if the batch on the executor thread is due to end within
        DECIDE_AHEAD_S (`_due`: most end well before their predicted quantile), decide the next
        one now, as of that end, and leave it for `_follow`, which starts it as the running one
        ends: the decision and the taking of its tasks (~25 us between two batches at 10x, where
        the loop and ONNX Runtime's return share the cores) happen while the backend still runs,
        not while it waits. Same policy, same queues: only requests that arrive in the last
        DECIDE_AHEAD_S miss that batch. The modes whose decisions the loop must act on (expire,
        upstreams), drops and short batches are left to `_follow` and the loop, as before."""
        now = time.monotonic()
        if not now >= self._decide_from or self._expire_late or self._offload is not None:
            return
        with self._lock:  # the executor thread's `_follow` may have started the next one: check again
            if not (self._busy and self._threaded) or self._ahead is not None or self._closed:
                return
            if not any(self._queues) or not now >= self._decide_from:
                return
            decision = self._thread_decision(max(now, self._due))
            if decision is not None:
                self._ahead = (self._job(decision, now), decision.predicted_s)

    def _ask_policy(self, at: float, now: float) -> Decision | None:
        """The configured policy's decision; if it raises, the fallback's; if that raises too (the
        queues themselves are broken), the queued requests are answered `error` so none waits forever."""
        assert self._policy is not None and self._fallback is not None
        try:
            return self._kept(self._policy.decide(self._queues, at), at)
        except Exception:
            self.counters.policy_failures += 1
            _log.exception("policy %s failed; %s decides this time", self._policy.name, self._fallback.name)
        try:
            return self._fallback.decide(self._queues, at)
        except Exception as exc:
            _log.exception(
                "fallback policy %s failed too; answering the queued requests `error`", FALLBACK_POLICY
            )
            self._answer_queued(Status.ERROR, now, f"scheduler failed: {type(exc).__name__}: {exc}")
            return None

    def _answer_queued(self, status: Status, now: float, error: str) -> None:
        """Empty every queue, answering each task `status`."""
        for m in range(len(self._queues)):
            with self._lock:
                tasks = self._book.drain(m)
            for task in tasks:
                self._finish(task, self._result(task, status, now, error=error))
            self.counters.queue_depth[self._names[m]] = 0

    def _update_idle(self) -> None:
        in_flight = 0 if self._offload is None else self._offload.in_flight
        if self._idle is not None and not self._busy and not any(self._queues) and not in_flight:
            self._idle.set()

    def _offload_context(self) -> OffloadContext:
        """What the offloader may use of this Server: the task book and a few callbacks."""
        return OffloadContext(
            book=self._book,
            models=self._names,
            manifests=tuple(self._manifests),
            latency=lambda: self.latency_model,
            free_at=self._free_at,
            wake=self._wake,
            finish=self._finish,
            changed=self._sync_depths,
        )

    def _dispatch(self, job: Job, inline: bool, here: bool = False) -> None:
        """Hand a batch to the executor thread (or, `inline`, to a loop callback); its callback
        (`_batch_done`) runs on the loop when it ends, and the batches `_follow` decides on the
        executor thread run after it without the loop. An inline batch decided in the callback a
        request's arrival scheduled (`here`, `_kick`) runs at once: that callback already waited
        for the loop turn's reads, and the batch took every queued task."""
        assert self._executor is not None and self._loop is not None
        name, exit, samples, done = job
        if inline and here:
            self._executor.run_inline(name, exit, samples, done)
            return
        try:
            self._executor.submit(name, exit, samples, done, follow=self._follow, inline=inline)
        except RuntimeError as exc:  # the executor itself is closed under us: answer, keep going
            with self._lock:
                self._busy = False
            self._loop.call_soon(done, BatchRun(None, exc, math.nan, time.monotonic()))

    def _batch_done(
        self, m: int, exit: int, tasks: list[Task], inline: bool, hopped: bool, run: BatchRun
    ) -> None:
        """A batch ended (the executor thread may already run the next one, see `_follow`): decide
        if it did not, write these answers (the queues do not hold them any more), then do the
        batch's bookkeeping, which no answer waits for. After an inline batch the answers go first
        and the bookkeeping (calibration included) precedes the next decision."""
        lag = time.monotonic() - run.end  # how long the batch waited for the loop
        if lag == lag:  # not nan
            self._answer_lag.observe(lag)
        if inline:
            with self._lock:
                self._busy = False
        else:
            self._decide()
        outputs = run.outputs
        error = None if run.error is None else f"{type(run.error).__name__}: {run.error}"
        if error is None:
            error = _outputs_problem(outputs, len(tasks))
        ran: dict[str, Any] = {"start": run.start, "batch_size": len(tasks)}
        names = self._output_names[m][exit]
        answered: list[Result] = []
        self._answer_holders.hold()
        try:
            for i, task in enumerate(tasks):
                if error is not None or outputs is None:
                    result = self._result(task, Status.ERROR, run.end, error=error, exit=exit, **ran)
                else:
                    mine = {name: value[i] for name, value in zip(names, outputs.values(), strict=False)}
                    result = self._result(task, Status.OK, run.end, outputs=mine, exit=exit, **ran)
                if self._answer(task, result):
                    answered.append(result)
        finally:
            self._answer_holders.release()
        self._count_batch(answered)
        self._account(m, exit, tasks, hopped, run)
        if inline:
            self._decide()
        idle = not self._busy and not self._closed and not any(self._queues)
        if idle and self._idle_poll.idle(time.monotonic()):
            assert self._loop is not None
            self._loop.call_soon(self._poll_idle)

    def _poll_idle(self) -> None:
        """One more loop turn that does not sleep, while the server stays idle (idle_poll.py): the
        loop's epoll does not block while a callback is ready, so the next request is read without
        a wake-up from a halted core. Reads, timers and other callbacks run in between as usual."""
        if self._idle_poll.polling(time.monotonic()) and not self._closed:
            assert self._loop is not None
            self._loop.call_soon(self._poll_idle)

    def _account(self, m: int, exit: int, tasks: list[Task], hopped: bool, run: BatchRun) -> None:
        """A batch's counters, the loop's delay and the online latency calibration."""
        name = self._names[m]
        if hopped and not math.isnan(run.start):  # its callback waited this long behind the loop's others
            self._loop_delay += LAG_WEIGHT * (run.start - tasks[0].dispatch - self._loop_delay)
        if not math.isnan(run.start):
            self.counters.busy_s += run.end - run.start
            self.counters.busy_cpu_s += run.cpu_s
            ready = min(t.queued for t in tasks)
            self._throughput.observe(len(tasks))
            self.counters.observe_batch(name, run.start, run.end, len(tasks), ready)
            model = self.latency_model.models[m]
            self._overhead.observe(ready, run.end, model.latency(model.exit_ids.index(exit), len(tasks)))
            self.counters.batch_overhead_s = self._overhead.value
        self.counters.batches[name] += 1
        if self._calibration is not None and run.error is None and not math.isnan(run.start):
            with self._lock:  # it may update the latency table the executor thread's policy reads
                lines = self._calibration.observe(m, exit, len(tasks), run.end - run.start, run.end)
                self._shallowest_s[m] = self.latency_model.models[m].latency(0, 1)
                self._cost_work(self.latency_model)
            for line in lines:
                _log.warning(line)


def _tensor_problem(who: str, dtype: np.dtype[Any], shape: tuple[int, ...], x: object) -> str | None:
    """`who` names the model, or the input and its model: "model 'm'", "input 'i' of model 'm'"."""
    if not isinstance(x, np.ndarray):
        return f"{who} takes a numpy array, got {type(x).__name__}"
    if x.dtype != dtype:
        return f"{who} takes {dtype} input, got {x.dtype}; convert it before sending"
    if tuple(x.shape) != shape:
        return f"{who} takes one sample shaped {shape}, got {tuple(x.shape)}"
    return None


def _output_names(manifest: Manifest) -> list[tuple[str, ...]]:
    """Per exit, the names its outputs are answered under: the final exit's names when the exit
    gives as many outputs (a head trained for an imported classifier answers as its final output
    does, so a client reads one name whichever exit ran), else the exit's own."""
    final = [t.name for t in manifest.exit_outputs(len(manifest.exits) - 1)]
    names = []
    for i in range(len(manifest.exits)):
        own = [t.name for t in manifest.exit_outputs(i)]
        names.append(tuple(final if len(own) == len(final) else own))
    return names


def _outputs_problem(outputs: dict[str, np.ndarray] | None, size: int) -> str | None:
    """What is wrong with a backend's outputs for a batch of `size`, or None."""
    if not outputs:
        return f"backend returned no outputs for a batch of {size}"
    for name, value in outputs.items():
        if not isinstance(value, np.ndarray) or value.ndim < 1 or value.shape[0] != size:
            shape = getattr(value, "shape", type(value).__name__)
            return f"backend returned {shape} for output {name!r} of a batch of {size}"
    return None
