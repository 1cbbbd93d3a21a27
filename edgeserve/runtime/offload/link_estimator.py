"""What one upstream costs: round-trip time, bandwidth and its service time, learnt from our own traffic.

Model (Jellyfish, Sect. 3.3): a remote completion takes
    network = base RTT + bytes / bandwidth,   plus the upstream's service time for the batch.
Every reply is a sample (request_bytes, response_bytes, rtt_s, server_ms): when the upstream reports
its own time (edgeserve does), network = rtt - server time exactly; otherwise the service time is
what the current network estimate leaves of the rtt. Health probes (a few bytes) sample the base RTT
alone, so the estimate exists before the first offload and stays fresh while idle.

Why sliding windows with order statistics rather than an EWMA or Jellyfish's harmonic mean:
* A single stall (GC pause, retransmit, a 10x spike) moves an EWMA for many samples and drags a
  harmonic mean of bandwidth towards zero; a median ignores it outright, and a p90 of a 32-sample
  window ignores up to three of them.
* A step change (a link that gets slower) shows in the p90 after ~4 samples and in the median after
  half a window: fast enough to stop offloading to a link that degraded, and the window is also cut
  to the last `horizon_s` seconds, so an old regime cannot linger while traffic is sparse.
* The cost is bounded: a few deques of at most `window` floats per upstream and per (model, batch).
`predict` sums conservative quantiles (p90 of the base RTT, bandwidth at its p25, service time at
its p90): a prediction that errs should err towards "keep it local", which is always safe.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

MIN_BANDWIDTH = 1e3  # bytes/s: clamps of a per-sample bandwidth whose transfer time is ~0 or negative
MAX_BANDWIDTH = 1e11
MIN_TRANSFER_S = 20e-6  # below this a transfer is indistinguishable from RTT jitter


@dataclass
class _Window:
    """(time, value) samples: at most `size`, none older than `horizon_s` (checked on read)."""

    size: int
    horizon_s: float
    items: deque[tuple[float, float]] = field(default_factory=deque)

    _sorted: list[float] | None = None  # cache, dropped when the window changes

    def add(self, t: float, value: float) -> None:
        self.items.append((t, value))
        while len(self.items) > self.size:
            self.items.popleft()
        self._sorted = None

    def quantile(self, q: float, now: float) -> float | None:
        """Linear-interpolated quantile (numpy's default method) of the samples still in the horizon."""
        while self.items and self.items[0][0] < now - self.horizon_s:
            self.items.popleft()
            self._sorted = None
        if not self.items:
            return None
        if self._sorted is None:
            self._sorted = sorted(v for _, v in self.items)
        values = self._sorted
        pos = q * (len(values) - 1)
        lo = int(pos)
        hi = min(lo + 1, len(values) - 1)
        return values[lo] + (values[hi] - values[lo]) * (pos - lo)


@dataclass
class LinkEstimate:
    """A snapshot for the metrics endpoint; nan before any sample."""

    rtt_ms: float
    bandwidth_mbps: float


class LinkEstimator:
    """Per-upstream RTT, bandwidth and service-time estimates from reply and probe samples.

    Times are seconds on one monotonic clock, passed in (`now`) so tests drive it synthetically.
    `prior_rtt_s` seeds the base RTT until a sample arrives; `prior_bandwidth` (bytes/s) likewise.
    """

    def __init__(
        self,
        *,
        window: int = 32,
        horizon_s: float = 30.0,
        quantile: float = 0.9,
        prior_rtt_s: float | None = None,
        prior_bandwidth: float | None = None,
    ) -> None:
        self.window = window
        self.horizon_s = horizon_s
        self.quantile = quantile
        self._rtt = _Window(window, horizon_s)  # base RTT samples, seconds
        self._bandwidth = _Window(window, horizon_s)  # bytes/s per reply that carried a payload
        self._service: dict[tuple[str, int], _Window] = {}  # (model, batch) -> seconds
        self._prior_rtt_s = prior_rtt_s
        self._prior_bandwidth = prior_bandwidth

    # -- samples -------------------------------------------------------------------------------------

    def add_probe(self, rtt_s: float, now: float) -> None:
        """A round trip with (almost) no payload and no service: a pure base-RTT sample."""
        if rtt_s >= 0 and math.isfinite(rtt_s):
            self._rtt.add(now, rtt_s)

    def add_reply(
        self,
        model: str,
        batch: int,
        request_bytes: int,
        response_bytes: int,
        rtt_s: float,
        server_ms: float | None,
        now: float,
        ahead: int = 0,
    ) -> None:
        """One infer reply. With `server_ms` the network time is exact; without it the service time
        is the rtt minus the network time predicted from the estimates so far (median RTT, median
        bandwidth), never below zero.

        `ahead`: how many of our batches to this upstream were in flight when this one was sent.
        The upstream is modelled as one server working through our batches in turn (true of an
        edgeserve upstream, conservative for a GPU server that overlaps them), so the service
        time is stored per position, service / (1 + ahead), and `predict` scales it back."""
        if not (rtt_s >= 0 and math.isfinite(rtt_s)):
            return
        size = request_bytes + response_bytes
        if server_ms is not None and math.isfinite(server_ms) and server_ms >= 0:
            service = min(server_ms / 1000.0, rtt_s)
            network = rtt_s - service
            base = self.rtt_s(now, 0.5)
            transfer = -math.inf if base is None else network - base
            if base is None:
                self._rtt.add(now, network)  # no probe yet: this upper bound is the best we have
            elif transfer > MIN_TRANSFER_S:
                self._bandwidth.add(now, min(max(size / transfer, MIN_BANDWIDTH), MAX_BANDWIDTH))
            else:
                # The payload moved faster than the RTT jitter: the link is not the bottleneck. This
                # is still a sample (else one slow reply would be the only one in the window); the
                # base absorbs it: network time close to the base is itself a base-RTT sample.
                self._bandwidth.add(now, MAX_BANDWIDTH)
                self._rtt.add(now, max(network, 0.0))
        else:
            service = max(rtt_s - self.network_s(size, now, 0.5), 0.0)
        self._service_window(model, batch).add(now, service / (1 + max(ahead, 0)))

    def _service_window(self, model: str, batch: int) -> _Window:
        key = (model, batch)
        if key not in self._service:
            self._service[key] = _Window(max(self.window // 2, 8), self.horizon_s)
        return self._service[key]

    # -- estimates -----------------------------------------------------------------------------------

    def rtt_s(self, now: float, q: float | None = None) -> float | None:
        """Base RTT at quantile `q` (default: the conservative one); the prior when unsampled."""
        value = self._rtt.quantile(self.quantile if q is None else q, now)
        return self._prior_rtt_s if value is None else value

    def bandwidth(self, now: float, q: float | None = None) -> float | None:
        """Bytes/s at quantile `q` (default: 1 - the conservative quantile, a low bandwidth)."""
        value = self._bandwidth.quantile(1.0 - self.quantile if q is None else q, now)
        return self._prior_bandwidth if value is None else value

    def network_s(self, size: int, now: float, q: float | None = None) -> float:
        """Base RTT + size / bandwidth; 0 for an unknown part (no sample, no prior)."""
        rtt = self.rtt_s(now, q) or 0.0
        bandwidth = self.bandwidth(now, None if q is None else 1.0 - q)
        return rtt + (size / bandwidth if bandwidth else 0.0)

    def service_s(self, model: str, batch: int, now: float) -> float | None:
        """The upstream's service time for (model, batch) at the conservative quantile.

        An unseen batch size borrows from the nearest seen one of the same model: a larger batch's
        time as is (batching never makes a batch faster), else a smaller one's scaled up linearly
        (pessimistic: real batching is sublinear). None when the model was never seen.
        """
        exact = self._service.get((model, batch))
        if exact is not None and (value := exact.quantile(self.quantile, now)) is not None:
            return value
        seen = sorted(
            (b, v)
            for (m, b), w in self._service.items()
            if m == model and (v := w.quantile(self.quantile, now)) is not None
        )
        larger = [v for b, v in seen if b > batch]
        if larger:
            return larger[0]
        if seen:
            b, v = seen[-1]
            return v * batch / b
        return None

    def predict(
        self, model: str, batch: int, size: int, now: float, prior_service_s: float = 0.0, ahead: int = 0
    ) -> float:
        """Seconds from sending a batch of `size` bytes (request + response) to having its answer,
        at conservative quantiles, with `ahead` of our batches already in flight to this upstream;
        `prior_service_s` stands in for a never-measured service time. math.inf when nothing is
        known about the link yet (no probe, no reply, no prior)."""
        if self.rtt_s(now) is None:
            return math.inf
        service = self.service_s(model, batch, now)
        return self.network_s(size, now) + (prior_service_s if service is None else service) * (1 + ahead)

    def estimate(self, now: float) -> LinkEstimate:
        """Median RTT (ms) and median bandwidth (megabits/s) for the metrics endpoint."""
        rtt = self.rtt_s(now, 0.5)
        bandwidth = self.bandwidth(now, 0.5)
        return LinkEstimate(
            rtt_ms=math.nan if rtt is None else rtt * 1000.0,
            bandwidth_mbps=math.nan if bandwidth is None else bandwidth * 8.0 / 1e6,
        )
