"""Offload: send the work the box cannot serve in time to an upstream server, and only that work.

plan.py decides which queued tasks go (see its docstring for the rule); the `Offloader` applies
that plan: it owns the upstreams (client, breaker, estimator, counters, health probes) and the
in-flight batches. It runs on the Server's loop and sees the Server only through an
`OffloadContext`: the task book (queues and open tasks) and a few callbacks; every answer goes
through `finish`, which answers a task exactly once. A failed or timed-out batch opens the breaker
after `failures_to_open` in a row and its tasks go back into the local queue in arrival order,
keeping their deadlines (counted as fallbacks).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from edgeserve.config.checks import ConfigError
from edgeserve.config.upstreams import UpstreamConfig
from edgeserve.manifest import Manifest
from edgeserve.runtime.offload.breaker import BreakerState, CircuitBreaker
from edgeserve.runtime.offload.link_estimator import LinkEstimator
from edgeserve.runtime.offload.plan import Predict, Route, plan
from edgeserve.runtime.results import Result, Status
from edgeserve.runtime.tasks import Task, TaskBook
from edgeserve.scheduler import LatencyModel

if TYPE_CHECKING:  # aiohttp is imported only when upstreams are configured
    from edgeserve.wire.oip_client import OipClient

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OffloadContext:
    """What the Offloader may use of its Server (a helper gets a small named state, not its owner)."""

    book: TaskBook  # the queues it plans over and the open tasks it takes and puts back
    models: tuple[str, ...]
    manifests: tuple[Manifest, ...]
    latency: Callable[[], LatencyModel]  # the current latency model (a reload replaces it)
    free_at: Callable[[float], float]  # when the executor is free: now, or the running batch's end
    wake: Callable[[], None]  # tasks came back to the queues: schedule them
    finish: Callable[[Task, Result], None]  # answer a task, exactly once
    changed: Callable[[], None]  # queues or in-flight changed: export depths, maybe set idle


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

    def __init__(self, context: OffloadContext, configs: Sequence[UpstreamConfig]) -> None:
        from edgeserve.wire.oip_client import OipClient

        self._context = context
        self._book = context.book
        self._closing = False
        self.upstreams: list[Upstream] = []
        for config in configs:
            client = OipClient(
                config.url,
                timeout_s=config.timeout_ms / 1000.0,
                max_connections=config.max_in_flight + 1,
                token=config.token,
            )
            breaker = CircuitBreaker(
                config.failures_to_open, config.cooldown_s, config.max_cooldown_s, name=config.name
            )
            self.upstreams.append(Upstream(config, client, breaker, LinkEstimator()))
        names = context.models
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
        self._sample_bytes = []
        self._output_names: list[str] = []
        for m, manifest in enumerate(self._context.manifests):
            if m in self._routes_by_model and len(manifest.inputs) != 1:
                raise ConfigError(
                    f"upstreams: model {manifest.name!r} takes {len(manifest.inputs)} inputs; offloading "
                    "sends one input tensor, so remove it from the upstreams' models"
                )
            final = manifest.exit_outputs(len(manifest.exits) - 1)
            self._output_names.append(final[0].name)  # an upstream's answer is the final exit's
            tensors = [*manifest.inputs, *final]
            self._sample_bytes.append(sum(_nbytes(t.shape, t.dtype) for t in tensors))
        self._probes = [asyncio.ensure_future(self._probe_loop(u)) for u in self.upstreams]

    @property
    def in_flight(self) -> int:
        return sum(u.in_flight for u in self.upstreams)

    async def close(self) -> None:
        """Stop probing and sending; the Server has already answered every task (exactly once)."""
        self._closing = True
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
        if not self._closing and not self._book.closed:
            self.plan(time.monotonic())

    def _routes(self, now: float) -> dict[int, list[Route]]:
        latency = self._context.latency()
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
        spec = upstream.config.models[self._context.models[m]]
        local = self._context.latency().models[m]
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
        queues = self._book.queues
        if not any(queues[m] for m in self._routes_by_model):
            return 0
        routes = self._routes(now)
        if not routes:
            return 0
        free_at = self._context.free_at(now)
        offloads = plan(queues, self._context.latency(), now, free_at, routes, self._sample_bytes)
        sent = 0
        for offload in offloads:
            upstream = self.upstreams[offload.upstream]
            if not upstream.breaker.allow(now):  # takes the half-open probe slot
                continue
            tasks = self._book.take(offload.model, offload.ids, now)
            ahead = upstream.in_flight
            upstream.in_flight += 1
            upstream.counters.sent += len(tasks)
            send = asyncio.ensure_future(self._send(upstream, offload.model, tasks, now, ahead))
            self._sends.add(send)
            send.add_done_callback(self._sends.discard)
            sent += len(tasks)
        if sent:
            self._context.changed()
        return sent

    # -- sending and answering ---------------------------------------------------------------------

    async def _send(self, upstream: Upstream, m: int, tasks: list[Task], sent_at: float, ahead: int) -> None:
        from edgeserve.wire.oip_client import OipError

        name = self._context.models[m]
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
                result = Result(
                    status=Status.OK,
                    model=name,
                    output=outputs[i],
                    outputs={self._output_names[m]: outputs[i]},
                    batch_size=len(tasks),
                    queued=task.queued,
                    dispatch=task.dispatch,
                    end=now,
                    deadline=task.requested,
                    served_by=upstream.name,
                )
                self._context.finish(task, result)
        else:
            _log.warning("upstream %s failed a batch of %d %s: %s", upstream.name, len(tasks), name, error)
            upstream.breaker.failure(now)
            upstream.counters.failed += len(tasks)
            self._fall_back(upstream, tasks)
        self._context.changed()

    def _fall_back(self, upstream: Upstream, tasks: list[Task]) -> None:
        """Put the tasks of a failed batch back in their local queue (arrival order, same deadline)."""
        back = self._book.requeue(tasks)  # not those answered meanwhile (e.g. at shutdown)
        if not back:
            return
        upstream.counters.fallbacks += len(back)
        self._context.changed()
        self._context.wake()

    # -- health probes -----------------------------------------------------------------------------

    async def _probe_loop(self, upstream: Upstream) -> None:
        """GET /v2/health/ready at start and whenever the link was quiet for a probe interval."""
        from edgeserve.wire.oip_client import OipError

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


def _nbytes(shape: tuple[int, ...], dtype: str) -> int:
    """Bytes of one sample's tensor (a dimension that varies, -1, counted as 1)."""
    return math.prod(max(d, 1) for d in shape) * np.dtype(dtype).itemsize
