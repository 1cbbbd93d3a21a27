"""Offload: send the work the box cannot serve in time to an upstream server, and only that work.

The rule (`plan`), run by the Server before each scheduling decision and on arrivals while a batch
runs:

1. Local prediction. The executor is free at `free_at` (now, or the running batch's predicted end).
   Every queued task of every model gets a predicted local completion from a simulation of the
   most favourable local service: the shallowest exit, full batches (up to B_max), models served
   earliest-deadline-first by the deadline of their queue's head. So a task counts as "missing
   locally" only when even the fastest local service, after the running batch and the other
   models' queued work ahead of it, finishes after its deadline.
2. While simulating, a missing task of a model with an upstream route whose predicted completion
   (now + base RTT + bytes / bandwidth + the upstream's service time, conservative quantiles from
   LinkEstimator) meets its deadline is taken out of the local plan: the tasks behind it then
   predict earlier, so only the excess over local capacity is chosen. Missing tasks that no
   upstream can save stay local (they are served late or expired as usual).
3. The chosen tasks of each model go as whole batches (at most the upstream's max batch), least
   slack first, to the upstream predicted to answer soonest that has an in-flight slot and a
   breaker that allows it; each batch's prediction is checked again at its real size, and tasks
   it would no longer save stay queued.

`Offloader` owns the upstreams (client, breaker, estimator, counters, health probes) and the
in-flight batches. It is the Server's helper, run on its loop, and works on the Server's queues
and tasks directly; every answer goes through Server._finish, which answers a task exactly once.
A failed or timed-out batch opens the breaker after `failures_to_open` in a row and its tasks go
back into the local queue in arrival order, keeping their deadlines (counted as fallbacks).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from edgeserve.runtime.circuit_breaker import BreakerState, CircuitBreaker
from edgeserve.runtime.link_estimator import LinkEstimator
from edgeserve.runtime.offload_config import UpstreamConfig
from edgeserve.runtime.results import Status
from edgeserve.scheduler import LatencyModel, TaskQueue

if TYPE_CHECKING:
    from edgeserve.oip.client import OipClient
    from edgeserve.runtime.server import Server, _Task

_log = logging.getLogger(__name__)

Predict = Callable[[int, int, int], float]  # (batch, bytes, batches ahead) -> seconds to the answer


@dataclass
class Route:
    """An upstream that may take batches of one model now."""

    upstream: int
    max_batch: int
    slots: int  # batches it may still take now (in-flight cap, or the one half-open probe)
    predict: Predict
    in_flight: int = 0  # our batches already on their way to it (they are served before a new one)


@dataclass(frozen=True)
class Offload:
    """A planned batch: these queued task ids of `model` go to `upstream`."""

    upstream: int
    model: int
    ids: tuple[int, ...]


def plan(
    queues: Sequence[TaskQueue],
    latency: LatencyModel,
    now: float,
    free_at: float,
    routes: dict[int, list[Route]],
    sample_bytes: Sequence[int],
) -> list[Offload]:
    """The batches to send upstream (see the module docstring for the rule). Pure: reads only."""
    if not routes:
        return []
    deadlines = [q.deadlines.tolist() for q in queues]
    sizes = [len(q) for q in queues]
    pos = [0] * len(queues)
    chosen: dict[int, list[int]] = {m: [] for m in routes}  # queue positions, deadline order
    t = now if math.isnan(free_at) else max(now, free_at)
    while True:
        m = -1
        for k in range(len(queues)):
            if pos[k] < sizes[k] and (m < 0 or deadlines[k][pos[k]] < deadlines[m][pos[m]]):
                m = k
        if m < 0:
            break
        model = latency.models[m]
        stop = min(pos[m] + model.max_batch, sizes[m])
        batch = list(range(pos[m], stop))
        pos[m] = stop
        done = t + model.latency(0, len(batch))
        if m in routes:
            best = routes[m][0]
            moved: list[int] = []
            for i in batch:
                size = min(len(chosen[m]) + len(moved) + 1, best.max_batch)
                ahead = best.in_flight + (len(chosen[m]) + len(moved)) // best.max_batch
                remote = now + best.predict(size, size * sample_bytes[m], ahead)
                if deadlines[m][i] < done and remote <= deadlines[m][i]:
                    moved.append(i)
            if moved:
                chosen[m].extend(moved)
                kept = len(batch) - len(moved)
                done = t + model.latency(0, kept) if kept else t
        t = done
    out: list[Offload] = []
    for m, taken in chosen.items():
        ids = queues[m].ids
        rest = sorted(taken, key=lambda i: deadlines[m][i])
        for route in routes[m]:
            while rest and route.slots > 0:
                chunk, rest = rest[: route.max_batch], rest[route.max_batch :]
                answer = now + route.predict(len(chunk), len(chunk) * sample_bytes[m], route.in_flight)
                saved = [i for i in chunk if deadlines[m][i] >= answer]
                if saved:
                    out.append(Offload(route.upstream, m, tuple(int(ids[i]) for i in saved)))
                    route.slots -= 1
                    route.in_flight += 1
    return out


@dataclass
class UpstreamCounters:
    sent: int = 0  # requests sent
    failed: int = 0  # requests in batches that failed or timed out
    fallbacks: int = 0  # requests that came back to the local queue after a failure


@dataclass
class Upstream:
    """One configured upstream and what the runtime knows about it."""

    config: UpstreamConfig
    client: OipClient
    breaker: CircuitBreaker
    estimator: LinkEstimator
    counters: UpstreamCounters = field(default_factory=UpstreamCounters)
    in_flight: int = 0
    last_traffic: float = -math.inf

    @property
    def name(self) -> str:
        return self.config.name


class Offloader:
    """The upstreams of one Server: planning, sending, answering, falling back, probing."""

    def __init__(self, server: Server, configs: Sequence[UpstreamConfig]) -> None:
        from edgeserve.oip.client import OipClient

        self._server = server
        self.upstreams: list[Upstream] = []
        for config in configs:
            client = OipClient(
                config.url, timeout_s=config.timeout_ms / 1000.0, max_connections=config.max_in_flight + 1
            )
            breaker = CircuitBreaker(config.failures_to_open, config.cooldown_s, config.max_cooldown_s)
            self.upstreams.append(Upstream(config, client, breaker, LinkEstimator()))
        names = server.models
        self._routes_by_model = {
            m: [i for i, u in enumerate(self.upstreams) if name in u.config.models]
            for m, name in enumerate(names)
        }
        self._routes_by_model = {m: r for m, r in self._routes_by_model.items() if r}
        self._sample_bytes: list[int] = []
        self._sends: set[asyncio.Task[None]] = set()
        self._probes: list[asyncio.Task[None]] = []
        self._poke_pending = False

    # -- lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> None:
        """Size the samples and start the health probes (the first one at once: an RTT prior)."""
        server = self._server
        self._sample_bytes = []
        for name in server.models:
            manifest = server.manifest(name)
            inputs = math.prod(manifest.input.shape) * np.dtype(manifest.input.dtype).itemsize
            self._sample_bytes.append(int(inputs + 4 * manifest.num_classes))
        self._probes = [asyncio.ensure_future(self._probe_loop(u)) for u in self.upstreams]

    @property
    def in_flight(self) -> int:
        return sum(u.in_flight for u in self.upstreams)

    async def close(self) -> None:
        """Stop probing and sending; the Server has already answered every task (exactly once)."""
        for task in [*self._probes, *self._sends]:
            task.cancel()
        await asyncio.gather(*self._probes, *self._sends, return_exceptions=True)
        for upstream in self.upstreams:
            with contextlib.suppress(Exception):
                await upstream.client.close()

    # -- planning ----------------------------------------------------------------------------------

    def poke(self) -> None:
        """Plan soon (once per loop iteration): an arrival while the executor is busy."""
        if self._poke_pending:
            return
        self._poke_pending = True
        asyncio.get_running_loop().call_soon(self._poked)

    def _poked(self) -> None:
        self._poke_pending = False
        if not self._server._closed:
            self.plan(time.monotonic())

    def _routes(self, now: float) -> dict[int, list[Route]]:
        latency = self._server._latency
        assert latency is not None
        routes: dict[int, list[Route]] = {}
        for m, indices in self._routes_by_model.items():
            found = []
            for i in indices:
                upstream = self.upstreams[i]
                breaker = upstream.breaker
                if not breaker.allow(now, peek=True):
                    continue
                half_open = breaker.state(now) is BreakerState.HALF_OPEN
                slots = 1 if half_open else upstream.config.max_in_flight - upstream.in_flight
                if slots <= 0:
                    continue
                max_batch = upstream.config.max_batch or latency.models[m].max_batch
                predictor = self._predictor(upstream, m, now)
                found.append(Route(i, max_batch, slots, predictor, upstream.in_flight))
            if found:
                found.sort(key=lambda r: r.predict(1, self._sample_bytes[m], r.in_flight))
                routes[m] = found
        return routes

    def _predictor(self, upstream: Upstream, m: int, now: float) -> Predict:
        server = self._server
        name = server.models[m]
        spec = upstream.config.models[name]
        local = server.latency_model.models[m]
        deepest = len(local.exit_ids) - 1

        def prior(batch: int) -> float:
            if spec.service_ms is not None:
                return spec.service_ms / 1000.0
            if batch <= local.max_batch:
                return local.latency(deepest, batch)
            return local.latency(deepest, local.max_batch) * batch / local.max_batch

        memo: dict[tuple[int, int, int], float] = {}  # one plan asks about a few cases, many times

        def predict(batch: int, size: int, ahead: int) -> float:
            key = (batch, size, ahead)
            if key not in memo:
                memo[key] = upstream.estimator.predict(spec.remote, batch, size, now, prior(batch), ahead)
            return memo[key]

        return predict

    def plan(self, now: float) -> int:
        """Pop the tasks the plan sends upstream and send them; returns how many went."""
        server = self._server
        if not any(server._queues[m] for m in self._routes_by_model):
            return 0
        routes = self._routes(now)
        if not routes:
            return 0
        free_at = server._busy_until if server._busy else now
        offloads = plan(server._queues, server.latency_model, now, free_at, routes, self._sample_bytes)
        sent = 0
        for offload in offloads:
            upstream = self.upstreams[offload.upstream]
            if not upstream.breaker.allow(now):  # takes the half-open probe slot
                continue
            ids = server._queues[offload.model].remove(list(offload.ids)).tolist()
            tasks = [server._tasks[i] for i in ids]
            for task in tasks:
                task.dispatch = now
            ahead = upstream.in_flight
            upstream.in_flight += 1
            upstream.counters.sent += len(tasks)
            send = asyncio.ensure_future(self._send(upstream, offload.model, tasks, now, ahead))
            self._sends.add(send)
            send.add_done_callback(self._sends.discard)
            sent += len(tasks)
        if sent:
            for m, name in enumerate(server.models):
                server.counters.queue_depth[name] = len(server._queues[m])
        return sent

    # -- sending and answering ---------------------------------------------------------------------

    async def _send(self, upstream: Upstream, m: int, tasks: list[_Task], sent_at: float, ahead: int) -> None:
        from edgeserve.oip.client import OipError

        server = self._server
        name = server.models[m]
        spec = upstream.config.models[name]
        x = np.stack([t.x for t in tasks])
        slack_ms = (min(t.deadline for t in tasks) - sent_at) * 1000.0
        parameters = {"deadline_ms": round(max(slack_ms, 1.0), 3)} if upstream.config.send_deadline else None
        error: str | None = None
        outputs: np.ndarray | None = None
        try:
            reply = await upstream.client.infer(
                spec.remote,
                {spec.input: x},
                outputs=[spec.output],
                binary=upstream.config.binary,
                parameters=parameters,
            )
            outputs = reply.response.output(spec.output)
            if outputs.ndim < 1 or outputs.shape[0] != len(tasks):
                error = f"answered {outputs.shape} for a batch of {len(tasks)}"
        except OipError as exc:
            error = f"{exc.kind}: {exc}"
            reply = None
        except asyncio.CancelledError:
            upstream.in_flight -= 1
            raise  # shutdown: the Server answers these tasks `shutdown`
        except Exception as exc:  # a bug or an odd answer must not lose the tasks
            error = f"{type(exc).__name__}: {exc}"
            reply = None
        now = time.monotonic()
        upstream.in_flight -= 1
        upstream.last_traffic = now
        if error is None and reply is not None and outputs is not None:
            upstream.breaker.success(now)
            upstream.estimator.add_reply(
                spec.remote,
                len(tasks),
                reply.request_bytes,
                reply.response_bytes,
                reply.rtt_s,
                reply.server_ms,
                now,
                ahead,
            )
            for i, task in enumerate(tasks):
                result = server._result(task, Status.OK, now, batch_size=len(tasks))
                server._finish(task, replace(result, output=outputs[i], served_by=upstream.name))
        else:
            _log.warning("upstream %s failed a batch of %d %s: %s", upstream.name, len(tasks), name, error)
            upstream.breaker.failure(now)
            upstream.counters.failed += len(tasks)
            self._fall_back(upstream, tasks)
        server._update_idle()

    def _fall_back(self, upstream: Upstream, tasks: list[_Task]) -> None:
        """Put the tasks of a failed batch back in their local queue (arrival order, same deadline)."""
        server = self._server
        back = [t for t in tasks if t.id in server._tasks]  # not answered meanwhile (e.g. shutdown)
        if not back or server._closed:
            return
        for task in back:
            task.dispatch = math.nan
            server._queues[task.model].insert(task.id, task.queued, task.deadline - task.queued)
            server.counters.queue_depth[server.models[task.model]] = len(server._queues[task.model])
        upstream.counters.fallbacks += len(back)
        if server._busy:
            if server._expire_late:
                server._arm_timer(math.inf)
        else:
            server._kick()

    # -- health probes -----------------------------------------------------------------------------

    async def _probe_loop(self, upstream: Upstream) -> None:
        """GET /v2/health/ready at start and whenever the link was quiet for a probe interval."""
        from edgeserve.oip.client import OipError

        interval = upstream.config.probe_interval_s
        while True:
            now = time.monotonic()
            if now - upstream.last_traffic >= interval:
                start = time.perf_counter()
                try:
                    ready = await upstream.client.ready()
                except OipError:
                    ready = False
                rtt = time.perf_counter() - start
                now = time.monotonic()
                upstream.last_traffic = now
                if ready:
                    upstream.estimator.add_probe(rtt, now)
                elif upstream.breaker.state(now) is BreakerState.CLOSED:
                    upstream.breaker.failure(now)
                delay = interval
            else:
                delay = interval - (now - upstream.last_traffic)
            await asyncio.sleep(max(delay, 0.01))

    # -- metrics -----------------------------------------------------------------------------------

    def snapshot(self, now: float) -> dict[str, dict[str, Any]]:
        """{name: {rtt_ms, bandwidth_mbps, state, sent, failed, fallbacks}} for Server.snapshot()."""
        out: dict[str, dict[str, Any]] = {}
        for upstream in self.upstreams:
            estimate = upstream.estimator.estimate(now)
            out[upstream.name] = {
                "rtt_ms": estimate.rtt_ms,
                "bandwidth_mbps": estimate.bandwidth_mbps,
                "state": upstream.breaker.state(now).value,
                "sent": upstream.counters.sent,
                "failed": upstream.counters.failed,
                "fallbacks": upstream.counters.fallbacks,
            }
        return out
