"""The serving core: an asyncio loop owns one FIFO queue per model and runs the scheduler.

Requests are checked and queued on the loop (`_enqueue`: validation.py checks the sample,
budget.py plans the deadline and admits by it). When the executor is idle and a request arrives,
the loop asks the policy: drops are answered `expired`, a Dispatch pops a batch and hands it to
the executor thread (one batch at a time; a short batch that empties the queues of an idle loop
runs on the loop itself, see executor.py), a Wait sets one wake-up timer (replaced on the next
arrival; wakeups.py). As a batch ends the executor thread asks the same policy for the next one
itself (Pipeline.follow, under the lock the queues share), so the executor never waits for a
busy loop; or, when a front's read came just before the batch's end, the loop decided it ahead
(Pipeline.decide_ahead) and the executor thread starts it without a decision in between
(pipeline.py). The finished batch goes back to the loop, which answers each request through its
front's `reply` callback (answers.py), so every request gets exactly one Result.
"""

from __future__ import annotations

import asyncio
import contextlib
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
from edgeserve.runtime.answers import Answers, deliver
from edgeserve.runtime.backends.base import Backend
from edgeserve.runtime.batch_ceiling import cap_tables
from edgeserve.runtime.budget import (
    BatchOverhead,
    Throughput,
    admission_excess,
    headroom,
    late_on_arrival,
    overloaded,
    planned_budget,
    queue_bound,
    request_budget,
)
from edgeserve.runtime.calibration import LatencyCalibrator
from edgeserve.runtime.calibration_store import save_calibrated
from edgeserve.runtime.counters import Counters
from edgeserve.runtime.cpu_slice import set_thread_slice, shorten_slice
from edgeserve.runtime.deadline_check import check_deadlines
from edgeserve.runtime.executor import BatchRun, Executor, Job, inline_safe
from edgeserve.runtime.idle_poll import IdlePoll
from edgeserve.runtime.offload.offloader import OffloadContext, Offloader
from edgeserve.runtime.pipeline import FALLBACK_POLICY, Pipeline
from edgeserve.runtime.results import Result, Status
from edgeserve.runtime.running_quantile import RunningQuantile
from edgeserve.runtime.settings import RuntimeSettings
from edgeserve.runtime.tasks import Task, TaskBook
from edgeserve.runtime.validation import Sample, SampleCheck
from edgeserve.runtime.wakeups import Wakeups, hopeless_at
from edgeserve.scheduler import (
    DEFAULT_POLICY,
    Dispatch,
    LatencyModel,
    Policy,
    PolicyOptions,
    Urgency,
    Wait,
    make_policy,
)

_log = logging.getLogger(__name__)

BackendFactory = Callable[[ModelRepository, BackendConfig], Backend]
UNKNOWN_MODEL = "(unknown)"  # counter key for requests naming no served model: keys stay bounded


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


class Server:
    """Serve the configured models until closed: `async with Server(config) as server: ...`.

    `backend_factory` builds the backend on the executor thread (tests wrap the real ONNX
    Runtime backend with it); by default the config's backend is created. `settings`: the
    core's tuning constants (RuntimeSettings' defaults unless given).
    """

    def __init__(
        self,
        config: ServerConfig | Mapping[str, Any] | str | Path,
        *,
        backend_factory: BackendFactory | None = None,
        settings: RuntimeSettings | None = None,
    ) -> None:
        self.config = load_config(config)
        self.settings = settings = settings or RuntimeSettings()
        self._backend_factory = backend_factory or default_backend
        self._names = tuple(self.config.models)
        self._index = {name: i for i, name in enumerate(self._names)}
        self.counters = Counters()
        self._manifests: list[Manifest] = []
        self._checks: list[SampleCheck] = []  # per model: its request check (validation.py)
        self._book = TaskBook(len(self._names))
        self._queues = self._book.queues  # the scheduler's view of the book
        self._executor: Executor | None = None
        self._offload: Offloader | None = None  # upstreams (docs/offload.md), when configured
        self._overhead = BatchOverhead(1.0)  # the horizon is the longest deadline (_use)
        self._throughput = Throughput(1.0, 1.0)  # what the fronts may hold (deadlines: _use)
        # The running batch, the one decided after it and the decisions (pipeline.py); its lock
        # guards the queues, which the executor thread pops from as a batch ends.
        self._pipeline = Pipeline(
            self._book,
            self._names,
            self.counters,
            self._overhead,
            done=self._batch_done,
            failed=self._unschedulable,
            settings=settings,
        )
        self._lock = self._pipeline.lock
        self._answers = Answers(self._book, self._names, self.counters, self._lock)
        self._refuse = self._answers.refuse
        self._idle_poll = IdlePoll(self.config.backend.idle_poll_us * 1e-6)  # see wakeups.py
        self._wakeups = Wakeups(self._pipeline, self._idle_poll, self._decide, settings)
        self._take_settings(self.config)
        self._shallowest_s: list[float] = []  # per model: a batch of one at its shallowest exit
        # per model: the queue bound in force (max_queue, or derived from the deadline: _use)
        self._max_queue: list[int] = []
        self._full_batch: list[int] = []  # per model: its largest batch
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread_id: int | None = None
        self._accepting = False
        self._idle: asyncio.Event | None = None
        self._close_task: asyncio.Future[None] | None = None
        # A finished batch waits this long for the loop to answer it (a quantile of the waits).
        self._answer_lag = RunningQuantile(settings.answer_lag_quantile, settings.answer_lag_step_s)
        # That wait and the loop's delay as the plans use them (held in steps: _enqueue).
        self._plan_lag = 0.0
        self._plan_floor, self._plan_step_s = settings.plan_floor, settings.plan_lag_step_s
        self._lag_weight = settings.lag_weight
        self._calibration: LatencyCalibrator | None = None  # online latency calibration
        self._slice_before: float | None = None  # the loop thread's CPU slice before start (cpu_slice.py)

    # -- lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> Server:
        """Load manifests (verified), the backend, the profiles for its fingerprint and the policy.

        A missing or stale profile fails here with the repository's error naming the command to run.
        """
        if self._loop is not None or self._pipeline.closed:
            raise RuntimeError("a Server starts once; create a new one to serve again")
        self._loop = self._wakeups.loop = asyncio.get_running_loop()
        self._loop_thread_id = threading.get_native_id()
        self._idle = asyncio.Event()
        self._idle.set()
        config = self.config
        repository = ModelRepository(Path(config.repository))
        self._manifests = await asyncio.to_thread(lambda: [repository.load_manifest(n) for n in self._names])
        self._checks = [SampleCheck.of(n, m) for n, m in zip(self._names, self._manifests, strict=True)]
        self._answers.load(self._manifests)
        executor = Executor(lambda: self._backend_factory(repository, config.backend))
        self._executor = executor
        try:
            backend = await executor.open()
            self._pipeline.inline_ok = inline_safe(backend)
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
            self._pipeline.closed = True
            await executor.close()
            raise
        self.counters = self._pipeline.counters = self._answers.counters = Counters()
        self.counters.queue_depth = {name: 0 for name in self._names}
        if config.upstreams:
            context = OffloadContext(  # what the offloader may use of this Server
                book=self._book,
                models=self._names,
                manifests=tuple(self._manifests),
                latency=lambda: self.latency_model,
                free_at=self._pipeline.free_at,
                wake=self._wake,
                finish=self._answers.finish,
                changed=self._sync_depths,
            )
            self._offload = Offloader(context, config.upstreams)
            self._take_settings(config)  # (again: the pipeline's modes depend on the upstreams)
            await self._offload.start()
        # The loop's thread takes a short CPU slice; `close` gives the old one back.
        self._slice_before = shorten_slice(config.backend.loop_slice_us * 1e-6)
        self._accepting = True
        return self

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
        if self._pipeline.closed:
            return
        self._accepting = False
        if self._idle is not None:
            timeout = self.config.shutdown_timeout_s if timeout_s is None else timeout_s
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._idle.wait(), timeout)
        self._pipeline.closed = True
        self._book.closed = True
        self._wakeups.cancel()
        now = time.monotonic()
        answers = self._answers
        answers.drain(Status.SHUTDOWN, now, "server shut down")
        for task in list(self._book.open.values()):  # running here or upstream: answer without waiting
            answers.finish(task, answers.result(task, Status.SHUTDOWN, now, error="server shut down"))
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
        if not self._pipeline.busy:
            self._wakeups.kick()  # a pending Wait was computed by the old policy: decide again now
        return changed

    def _take_settings(self, config: ServerConfig) -> None:
        """The per-model limits and the late-task mode, read on every request, from `config`, and
        the pipeline's modes (which depend on the upstreams too)."""
        self.config = config
        self._queue_limits = [config.models[n].max_queue for n in self._names]  # None: derived
        self._budget_s = [config.models[n].slo_ms / 1000.0 for n in self._names]
        self._expire_late = config.scheduler.late_tasks == "expire"
        self._admit_by_deadline = config.scheduler.admission == "deadline"
        pipeline, upstreams = self._pipeline, self._offload is not None
        pipeline.inline_max_s = config.backend.inline_max_ms / 1000.0
        pipeline.loop_only = self._expire_late or upstreams  # decisions only the loop acts on
        pipeline.keeps_tail = self._admit_by_deadline and not upstreams

    def _use(self, latency: LatencyModel, policy: Policy, fallback: Policy) -> None:
        """Schedule with these from the next decision on (what start and reload install)."""
        with self._lock:
            self._pipeline.use(latency, policy, fallback)
            self._shallowest_s = [m.latency(0, 1) for m in latency.models]
            self._full_batch = [m.max_batch for m in latency.models]
            self._overhead.horizon_s = max(self._budget_s)
            # (a reload keeps the rate measured so far)
            self._throughput.deadline_s, self._throughput.tick_s = min(self._budget_s), max(self._budget_s)
            self._max_queue = [
                queue_bound(budget, costs) if limit is None else limit
                for limit, budget, costs in zip(
                    self._queue_limits, self._budget_s, self._pipeline.costs, strict=True
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

    def in_flight_limit(self, in_flight: int, margin_s: float = 0.0) -> int:
        """How many requests a front with `in_flight` of them unanswered should hold now: no more
        than deadline admission would still take on top (budget.headroom, the accelerator's
        side), nor than the host can answer within the part of the deadlines it has (less the
        front's `margin_s` and the loop's delays, as the plans; budget.Throughput). A front
        refuses past it without decoding; the requests it lets through are checked exactly.
        Unbounded when admission is by count (or work may go upstream)."""
        costs = self._pipeline.costs
        if not self._admit_by_deadline or self._offload is not None or not costs:
            return 1 << 30
        now = time.monotonic()
        target = self._throughput.target(now, self.counters.host_cpu_s, margin_s + self._plan_lag)
        # Without the lock (the executor thread holds it while it decides): only the queues'
        # lengths are read, and an estimate a batch old only moves which frames are decoded.
        free_in = self._pipeline.free_for_admission(now) - now
        room = headroom(self._queues, free_in, self._budget_s, costs, self._overhead.value)
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
        latency = self._pipeline.latency
        if latency is None:
            raise RuntimeError("server not started")
        return latency

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
        received: float | None = None,
    ) -> Result:
        """Queue one sample (the model's per-sample shape and dtype) and await its Result.

        The deadline is fixed here, once, for every front: `deadline_ms` is this request's budget
        from now; `capture_ts` (Unix time in seconds, time.time()) runs the model's SLO from the
        moment the frame was captured, and a frame already past it is answered `expired` at once;
        neither: the model's SLO from now. A front passes `reply_margin_s`, the time its answer
        needs to reach the client ([listen] reply_margin_ms): the scheduler plans to finish that
        much earlier (see _enqueue), and `received`, as `enqueue`'s, when the request waited
        since it was read. Do not modify `x` until the result is back: it is stacked into the
        batch when its batch runs. Cancelling the call withdraws a queued sample.
        """
        future, task = self._submit(model, x, deadline_ms, capture_ts, reply_margin_s, received)
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
        return self._submit(model, x, deadline_ms, capture_ts, 0.0, None)[0]

    def _submit(
        self,
        model: str,
        x: Sample,
        deadline_ms: float | None,
        capture_ts: float | None,
        margin_s: float,
        received: float | None,
    ) -> tuple[asyncio.Future[Result], Task | None]:
        # The server's own loop (it is loop-only): asyncio.get_running_loop() is a getpid() call.
        future: asyncio.Future[Result] = (self._loop or asyncio.get_running_loop()).create_future()
        reply = functools.partial(_resolve, future)
        task = self.enqueue(
            model,
            x,
            reply,
            deadline_ms=deadline_ms,
            capture_ts=capture_ts,
            reply_margin_s=margin_s,
            received=received,
        )
        return future, task

    def run_completed(self) -> None:
        """Answer the batches that have ended now, not a loop turn later (executor.py): a front
        door calls it before it reads, so the windows the answers free take the frames it reads.
        First, if the running batch is due to end, decide the next one for the executor thread
        (Pipeline.decide_ahead) and step aside for it."""
        executor = self._executor
        if executor is not None:
            pipeline = self._pipeline
            if pipeline.threaded and pipeline.ahead is None:
                pipeline.decide_ahead()
            executor.step_aside(pipeline.ends)
            holders = self._answers.holders
            holders.hold()
            try:
                executor.run_completed()
            finally:
                holders.release()

    def answers_together(self, hold: Callable[[], None], release: Callable[[], None]) -> None:
        """A front that can hold answers: the Server calls `hold()` before it hands out the answers
        of the batches that ended and `release()` after the last, so that the front writes each
        connection's answers in one write (one syscall and one wake-up of its client per batch,
        not per answer). Answers handed out otherwise (a refusal, a drop) are not held."""
        self._answers.holders.add(hold, release)

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
            deliver(reply, task)
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
        slo_s = self._budget_s[m]
        total, problem = request_budget(slo_s, deadline_ms, capture_ts, time.time())
        waited = 0.0 if received is None or capture_ts is not None else max(now - received, 0.0)
        pipeline = self._pipeline
        if problem is None and total <= waited:
            busy = pipeline.busy or any(self._queues)  # else: the deadline is shorter than a read
            why = late_on_arrival(total, waited, slo_s, capture_ts is not None, busy)
            return self._refuse(model, Status.EXPIRED, now, why)
        if problem is None:
            x, problem = self._checks[m].check(x)
        if problem is not None:
            return self._refuse(model, Status.INVALID, now, problem)
        queue = self._queues[m]
        if len(queue) >= self._max_queue[m]:
            why = f"queue of {model!r} is full (max_queue {self._max_queue[m]})"
            return self._refuse(model, Status.REJECTED, now, why)
        assert self._loop is not None and self._idle is not None
        # Plan to before the deadline by the answer's way back, held in steps (budget.planned_budget).
        step_s, lag = self._plan_step_s, self._answer_lag.value + pipeline.loop_delay
        if abs(lag - self._plan_lag) > step_s:
            self._plan_lag = lag
        plan = planned_budget(total, waited, margin_s, self._plan_lag, self._plan_floor, step_s)
        # Deadline admission (budget.admission_excess), under the lock Pipeline.follow pops with.
        by_deadline = self._admit_by_deadline and self._offload is None
        with self._lock:
            excess = 0.0
            if by_deadline and (pipeline.busy or pipeline.ahead is not None or any(self._queues)):
                due, free_at = now - waited + plan, pipeline.free_for_admission(now)
                excess = admission_excess(self._queues, m, due, free_at, pipeline.costs, self._overhead.value)
            task = None if excess > 0 else self._book.add(m, x, reply, now, plan, total, arrival=now - waited)
        if task is None:
            return self._refuse(model, Status.REJECTED, now, overloaded(model, excess))
        self.counters.queue_depth[model] = len(queue)
        self._idle.clear()
        if pipeline.busy and self._offload is not None:
            self._offload.poke()  # work beyond local capacity may go upstream now
        self._wake()
        return task

    async def infer_batch(
        self, model: str, xs: np.ndarray | Sequence[np.ndarray], *, deadline_ms: float | None = None
    ) -> list[Result]:
        """One request per sample (xs: (N, *shape) or a list); Results in the same order."""
        return list(await asyncio.gather(*(self.infer(model, x, deadline_ms=deadline_ms) for x in xs)))

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
        in_flight = 0 if self._offload is None else self._offload.in_flight
        if self._idle is not None and not self._pipeline.busy and not any(self._queues) and not in_flight:
            self._idle.set()

    # -- scheduling --------------------------------------------------------------------------------

    def _wake(self) -> None:
        """New work in the queues: decide soon if the executor is free; while it is busy, re-arm the
        timer that answers a task `expired` as soon as it turns hopeless (expire mode)."""
        if not self._pipeline.busy:
            self._wakeups.kick()
        elif self._expire_late:
            self._wakeups.arm(math.inf, hopeless_at(self._queues, self._shallowest_s))

    def _decide(self, wake_at: float = -math.inf, here: bool = False) -> None:
        """Expire hopeless tasks (expire mode); if the executor is free, ask the policy and act.

        `wake_at`: the `until` of the Wait whose timer fired; the policy is asked as of at least
        that time, so timer granularity (1 ms in uvloop and epoll) never delays a deferred batch.
        `here`: an inline batch runs in this callback (see `_dispatch`).
        """
        pipeline, answers = self._pipeline, self._answers
        if pipeline.closed:
            return
        self._wakeups.cancel()
        now = time.monotonic()
        with self._lock:
            answer: list[tuple[Task, Result]] = []
            if self._expire_late:
                answer += answers.hopeless(now, self._shallowest_s)
            if self._offload is not None:
                self._offload.plan(now)  # first, so the policy plans only what stays local
            decision = None
            if not pipeline.busy and any(self._queues):
                decision = pipeline.decide_next(max(now, wake_at), now, loop=True)
            job, inline = None, False
            if decision is not None:
                for drop in decision.drops:
                    for task in self._book.drop(drop.model, drop.task_ids):
                        answer.append(
                            (task, answers.result(task, Status.EXPIRED, now, error="dropped by the policy"))
                        )
                if isinstance(decision, Dispatch):
                    inline = pipeline.runs_inline(decision)
                    job = pipeline.take(decision, now, inline, hopped=inline and not here)
            hopeless = hopeless_at(self._queues, self._shallowest_s) if self._expire_late else math.inf
            self._wakeups.arm(decision.until if isinstance(decision, Wait) else math.inf, hopeless)
        for task, result in answer:
            answers.finish(task, result)
        if job is not None:
            self._dispatch(job, inline, here)
        self._sync_depths()

    def _unschedulable(self, exc: Exception, now: float) -> None:
        """Neither policy could decide (the queues themselves are broken): the queued requests are
        answered `error`, so that none waits forever (Pipeline.decide_next)."""
        self._answers.drain(Status.ERROR, now, f"scheduler failed: {type(exc).__name__}: {exc}")

    def _dispatch(self, job: Job, inline: bool, here: bool = False) -> None:
        """Hand a batch to the executor thread (or, `inline`, to a loop callback); its callback
        (`_batch_done`) runs on the loop when it ends, and the batches Pipeline.follow decides on
        the executor thread run after it without the loop. An inline batch decided in the
        callback a request's arrival scheduled (`here`, Wakeups.kick) runs at once: that callback
        already waited for the loop turn's reads, and the batch took every queued task."""
        assert self._executor is not None and self._loop is not None
        name, exit, samples, done = job
        if inline and here:
            self._executor.run_inline(name, exit, samples, done)
            return
        try:
            self._executor.submit(name, exit, samples, done, follow=self._pipeline.follow, inline=inline)
        except RuntimeError as exc:  # the executor itself is closed under us: answer, keep going
            self._pipeline.idle()
            self._loop.call_soon(done, BatchRun(None, exc, math.nan, time.monotonic()))

    def _batch_done(
        self, m: int, exit: int, tasks: list[Task], inline: bool, hopped: bool, run: BatchRun
    ) -> None:
        """A batch ended (the executor thread may already run the next one, Pipeline.follow):
        decide if it did not, write these answers (the queues do not hold them any more), then do
        the batch's bookkeeping, which no answer waits for. After an inline batch the answers go
        first and the bookkeeping (calibration included) precedes the next decision."""
        lag = time.monotonic() - run.end  # how long the batch waited for the loop
        if lag == lag:  # not nan
            self._answer_lag.observe(lag)
        pipeline = self._pipeline
        if inline:
            pipeline.idle()
        else:
            self._decide()
        self._answers.batch(m, exit, tasks, run)
        self._account(m, exit, tasks, hopped, run)
        if inline:
            self._decide()
        if not pipeline.busy and not pipeline.closed and not any(self._queues):
            self._wakeups.idle(time.monotonic())

    def _account(self, m: int, exit: int, tasks: list[Task], hopped: bool, run: BatchRun) -> None:
        """A batch's counters, the loop's delay and the online latency calibration."""
        name = self._names[m]
        if hopped and not math.isnan(run.start):  # its callback waited this long behind the loop's others
            pipeline = self._pipeline
            pipeline.loop_delay += self._lag_weight * (run.start - tasks[0].dispatch - pipeline.loop_delay)
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
                self._pipeline.cost_work()
            for line in lines:
                _log.warning(line)
