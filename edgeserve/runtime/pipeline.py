"""The executor's pipeline: the running batch and at most one batch decided after it.

As vLLM v1's batch queue (`EngineCore.step_with_batch_queue`) schedules the next batch while one
runs, so that the accelerator never waits for the scheduler, the next batch here is decided
while the running one ends, in one place (`decide_next`) for three callers:

- the loop, when the executor is free (Server._decide): any decision, Waits and drops included,
  the fallback policy's where the configured one raises; a short batch that takes every queued
  task runs on the loop itself (`take(..., inline=True)`, executor.py);
- the executor thread, as its batch ends (`follow`): the next batch at once, so that the executor
  does not wait a loop turn for it; only a Dispatch it can start as is (else the loop decides);
- the loop before a read, as the running batch is due to end (`decide_ahead`): the same, as of
  that end, left for `follow` to start without deciding (the decision and the taking of its
  tasks then happen while the backend still runs, not while it waits).

One lock, this object's, guards the queues, the running batch's times and the latency table
(calibration updates it): admission reads the queues and `free_for_admission` together, and the
executor thread pops a batch and starts it together. With a lock of its own for the times,
admission could see a batch's tasks gone from the queue before the batch counts as running (free
at `now`), and admit a request the work ahead leaves no time for. Reentrant: a failing policy
answers the queued requests while the loop holds it.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence

from edgeserve.runtime.budget import BatchOverhead, deepest_kept, shallow_costs
from edgeserve.runtime.counters import Counters
from edgeserve.runtime.executor import BatchRun, Job
from edgeserve.runtime.settings import RuntimeSettings
from edgeserve.runtime.tasks import Task, TaskBook
from edgeserve.scheduler import Decision, Dispatch, LatencyModel, Policy

_log = logging.getLogger(__name__)

# When the configured policy raises (a bug, or a state it cannot score), this simple rule decides
# instead, so one bad decision never fails the requests queued behind it.
FALLBACK_POLICY = "early-exit-edf"
# A finished batch's callback on the loop: (model, exit, tasks, inline, hopped, the run).
Done = Callable[[int, int, list[Task], bool, bool, BatchRun], object]
# The policy and its fallback both raised (the queues themselves are broken): the error, and now.
Failed = Callable[[Exception, float], None]


class Pipeline:
    """The running batch, the batch decided after it, and how the next one is decided.

    `done` gets each batch's run on the loop; `failed` answers the queued requests when even the
    fallback policy raises. `clock` is time.monotonic (tests pass their own). The Server sets the
    mode flags (`loop_only`, `keeps_tail`, `inline_ok`, `inline_max_s`, `closed`) and installs the
    policies with `use`, holding `lock`.
    """

    def __init__(
        self,
        book: TaskBook,
        names: Sequence[str],
        counters: Counters,
        overhead: BatchOverhead,
        done: Done,
        failed: Failed,
        settings: RuntimeSettings | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        settings = settings or RuntimeSettings()
        self.lock = threading.RLock()
        self.book = book
        self.queues = book.queues
        self.names = tuple(names)
        self.counters = counters
        self.overhead = overhead  # admission's per-batch overhead (the Server observes it)
        self.done = done
        self.failed = failed
        self.clock = clock
        self._ahead_s, self._ahead_share = settings.decide_ahead_s, settings.decide_ahead_share
        self._due_weight = settings.due_weight
        self._inline_loop_delay_s = settings.inline_loop_delay_s
        # How to decide: `use` installs these (start, reload).
        self.policy: Policy | None = None
        self.fallback: Policy | None = None
        self.latency: LatencyModel | None = None
        # per model: seconds for 0..B tasks in one batch at the shallowest exit (budget.py)
        self.costs: list[tuple[float, ...]] = []
        self.loop_only = False  # expire mode or upstreams: decisions the loop must act on
        self.keeps_tail = False  # deadline admission without upstreams: `kept` may apply
        self.inline_ok = False  # the backend lets the loop run short batches itself (executor.py)
        self.inline_max_s = 0.0
        self.loop_delay = 0.0  # EWMA: a callback the loop schedules waits this long to run
        self.closed = False
        # The running batch: whether there is one, on the executor thread (not inline), its start,
        # its predicted end, when it is likely to end (its predicted time scaled by `due_share`,
        # an EWMA of the share batches on the thread take) and from when `decide_ahead` may
        # decide the batch after it.
        self.busy = False
        self.threaded = False
        self.started = 0.0
        self.ends = 0.0
        self.due = 0.0
        self.decide_from = 0.0
        self.due_share = 1.0
        # The batch after the running one, decided ahead, and its predicted duration.
        self.ahead: tuple[Job, float] | None = None

    def use(self, latency: LatencyModel, policy: Policy, fallback: Policy) -> None:
        """Decide with these from the next decision on (holding the lock)."""
        self.latency, self.policy, self.fallback = latency, policy, fallback
        self.cost_work()

    def cost_work(self) -> None:
        """Admission's costs from the latency table (at start, reload and calibration): each
        model's shallowest-exit batches at the quantile the policy plans with. (Tried: their means
        and one tail, as a queue of many batches rarely draws all their tails; more late answers
        on the emulated accelerator at 3-5x, 5.2 against 2.7 points at 3x, and no better on the
        CPU once its profile was steady.)"""
        assert self.latency is not None
        self.costs = [
            shallow_costs(m.by_batch[b][0] for b in range(m.max_batch)) for m in self.latency.models
        ]

    # -- when the executor is free -------------------------------------------------------------------

    def free_at(self, now: float) -> float:
        """When the executor is free: now, or the running batch's predicted end."""
        return self.ends if self.busy else now

    def free_for_admission(self, now: float) -> float:
        """When the executor can start on the queues: after the running batch (one that overran its
        profile may run as long again) and the batch decided after it. Exact under the lock
        (admission); an estimate a batch old without it (Server.in_flight_limit)."""
        free_at = self.ends if self.busy else now
        if free_at < now:
            free_at = 2.0 * now - self.started if self.busy else now
        if self.ahead is not None:
            free_at += self.ahead[1]
        return free_at

    # -- starting and ending batches -----------------------------------------------------------------

    def take(self, decision: Dispatch, now: float, inline: bool = False, hopped: bool = False) -> Job:
        """Pop the decided batch and mark the executor busy (holding the lock); an `inline` batch's
        callback says so, so that it frees the executor and answers before the next batch runs,
        and whether the batch waits for a loop callback of its own (`hopped`, Server._dispatch)."""
        self._start(now, decision.predicted_s, threaded=not inline)
        return self._job(decision, now, inline, hopped)

    def _start(self, now: float, predicted_s: float, threaded: bool) -> None:
        self.busy, self.threaded = True, threaded
        self.ends, self.started = now + predicted_s, now
        self.due = now + self.due_share * predicted_s
        self.decide_from = self.due - min(self._ahead_s, self._ahead_share * predicted_s)

    def _job(self, decision: Dispatch, now: float, inline: bool = False, hopped: bool = False) -> Job:
        tasks = self.book.pop(decision.model, decision.batch, now)
        m = decision.model
        return (
            self.names[m],
            decision.exit,
            [t.x for t in tasks],
            functools.partial(self.done, m, decision.exit, tasks, inline, hopped),
        )

    def idle(self) -> None:
        """The running batch ended where no `follow` runs: inline, or never started."""
        with self.lock:
            self.busy = False

    def follow(self) -> Job | None:
        """On the executor thread, as a batch ends: the batch decided ahead, if any, without
        deciding; else the next batch, decided at once by the same policy on the same queues; None
        when the loop must decide (nothing queued, a decision only the loop can act on, or a mode
        whose decisions answer requests or talk to upstreams: those happen on the loop, when the
        finished batch's callback reaches it)."""
        with self.lock:
            predicted_s = self.ends - self.started
            if self.threaded and predicted_s > 0:  # (a quantile: most batches end sooner)
                share = min(max((self.clock() - self.started) / predicted_s, 0.2), 2.0)
                self.due_share += self._due_weight * (share - self.due_share)
            self.busy = self.threaded = False
            ahead, self.ahead = self.ahead, None
            if self.closed:
                return None  # (an ahead batch's tasks were answered `shutdown` with the rest)
            if ahead is not None:
                job, predicted_s = ahead
                self._start(self.clock(), predicted_s, threaded=True)
                self.counters.batches_ahead += 1
                return job
            if self.loop_only or not any(self.queues):
                return None
            now = self.clock()
            decision = self.decide_next(now, now)
            return None if decision is None else self.take(decision, now)

    def decide_ahead(self) -> None:
        """On the loop, before a read: if the batch on the executor thread is due to end within
        `decide_ahead_s` (`due`: most end well before their predicted quantile), decide the next
        one now, as of that end, and leave it for `follow`, which starts it as the running one
        ends (~25 us between two batches at 10x, where the loop and ONNX Runtime's return share
        the cores, move into the batch). Same policy, same queues: only requests that arrive in
        the last `decide_ahead_s` miss that batch. The loop-only modes, drops and short batches are
        left to `follow` and the loop."""
        now = self.clock()
        if not now >= self.decide_from or self.loop_only:
            return
        with self.lock:  # the executor thread's `follow` may have started the next one: check again
            if not (self.busy and self.threaded) or self.ahead is not None or self.closed:
                return
            if not any(self.queues) or not now >= self.decide_from:
                return
            decision = self.decide_next(max(now, self.due), now)
            if decision is not None:
                self.ahead = (self._job(decision, now), decision.predicted_s)

    # -- deciding ------------------------------------------------------------------------------------

    def decide_next(self, at: float, now: float, loop: bool = False) -> Decision | None:
        """The next batch as of `at` (holding the lock), for all three callers.

        `loop` (the loop, the executor free): the configured policy's decision at an exit that
        keeps admission's promise (`kept`), whatever it is (a Wait, drops); if it raises, the
        fallback's; if that raises too, None, the queued requests answered `error` (`failed`).
        Otherwise (for the executor thread): only a Dispatch without drops that is not short
        enough for the loop to run (`runs_inline`), else None: the loop asks again as the batch's
        callback reaches it (and logs and falls back if the policy raises)."""
        policy = self.policy
        assert policy is not None
        t0 = time.perf_counter()
        if not loop:
            try:
                decision = policy.decide(self.queues, at)
            except Exception:
                return None
            self.counters.decision.add(time.perf_counter() - t0)
            if not isinstance(decision, Dispatch) or decision.drops or self.runs_inline(decision):
                return None
            return self.kept(decision, at)
        try:
            decision = self.kept(policy.decide(self.queues, at), at)
        except Exception:
            self.counters.policy_failures += 1
            assert self.fallback is not None
            _log.exception("policy %s failed; %s decides this time", policy.name, self.fallback.name)
            decision = self._fall_back(at, now)
        self.counters.decision.add(time.perf_counter() - t0)
        return decision

    def _fall_back(self, at: float, now: float) -> Decision | None:
        assert self.fallback is not None
        try:
            return self.fallback.decide(self.queues, at)
        except Exception as exc:
            _log.exception(
                "fallback policy %s failed too; answering the queued requests `error`", self.fallback.name
            )
            self.failed(exc, now)
            return None

    def runs_inline(self, decision: Dispatch) -> bool:
        """Whether the loop runs this batch itself (executor.py): it is short and takes every queued
        task. Under load (tasks left queued) the executor thread runs it, in parallel with the
        loop's reads, and decides the next one itself as it ends."""
        return (
            self.inline_ok
            and decision.predicted_s <= self.inline_max_s
            and self.loop_delay <= self._inline_loop_delay_s
            and sum(map(len, self.queues)) <= decision.batch
        )

    def kept(self, decision: Decision, at: float) -> Decision:
        """The policy's batch at an exit no deeper than keeps deadline admission's promise to the
        tasks it leaves queued (budget.deepest_kept), for a policy that chooses exits to keep
        tasks (`guards_the_tail`: the default's family); holding the lock."""
        if (
            not isinstance(decision, Dispatch)
            or not self.keeps_tail
            or not getattr(self.policy, "guards_the_tail", False)
        ):
            return decision
        assert self.latency is not None
        model = self.latency.models[decision.model]
        pos = model.exit_ids.index(decision.exit)
        if pos == 0:
            return decision
        column = model.by_batch[decision.batch - 1]
        kept = deepest_kept(
            self.queues,
            decision.model,
            decision.batch,
            at,
            column[: pos + 1],
            self.costs,
            self.overhead.value,
        )
        if kept == pos:
            return decision
        self.counters.exits_kept_shallower += 1
        return dataclasses.replace(decision, exit=model.exit_ids[kept], predicted_s=column[kept])
