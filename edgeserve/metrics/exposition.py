"""The exposition, by prometheus_client: `Family` builds one of its metric families, a `Collector`
yields them, `encode` renders a registry in the format a scrape's Accept asks for.

Formats: OpenMetrics 1.0 (`application/openmetrics-text`) when the Accept header asks for it, the
text format 0.0.4 otherwise (prometheus_client.exposition.choose_encoder decides).

Counter names: a counter whose name ends in `_total` is a library counter (the family's name
without the suffix, its samples with it: the same series in both formats). Triton's counters have
no suffix (`nv_inference_request_success`); to keep their series names they are exported as
`unknown` (text format: `untyped`), since both formats would otherwise append `_total`.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    UnknownMetricFamily,
)
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, choose_encoder
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4  # text/plain; version=0.0.4; charset=utf-8
TYPES = ("counter", "gauge", "histogram")


class Family:
    """One metric family under its exported name: `add` a sample, `add_histogram` a
    counters.Histogram snapshot; `metric` is the prometheus_client family."""

    __slots__ = ("_sample", "metric", "name", "type")

    def __init__(self, name: str, type: str, help: str) -> None:
        if type not in TYPES:
            raise ValueError(f"metric {name}: type must be one of {TYPES}, got {type!r}")
        self.name = name
        self.type = type
        self._sample = name
        self.metric: Metric
        if type == "gauge":
            self.metric = GaugeMetricFamily(name, help)
        elif type == "histogram":
            self.metric = HistogramMetricFamily(name, help)
        elif name.endswith("_total"):
            self.metric = CounterMetricFamily(name, help)  # named without _total, samples with it
        else:
            self.metric = UnknownMetricFamily(name, help)  # Triton's counter names (no _total)

    @property
    def samples(self) -> list[Sample]:
        return self.metric.samples

    def add(self, value: float, **labels: str) -> Family:
        self.metric.samples.append(Sample(self._sample, labels, value))
        return self

    def add_histogram(self, snapshot: Mapping[str, Any], **labels: str) -> Family:
        """Cumulative `_bucket{le=...}` (the last +Inf), then `_count` and `_sum`."""
        samples, bucket = self.metric.samples, self.name + "_bucket"
        for bound, cumulative in snapshot["buckets"]:
            samples.append(Sample(bucket, {**labels, "le": _le(bound)}, cumulative))
        samples.append(Sample(self.name + "_count", labels, snapshot["count"]))
        samples.append(Sample(self.name + "_sum", labels, float(snapshot["sum"])))
        return self


@functools.lru_cache(maxsize=1024)
def _le(bound: float) -> str:
    """A bucket bound as the `le` label (the bounds are few and fixed: written once)."""
    return floatToGoString(bound)


class FamiliesCollector(Collector):
    """A prometheus_client collector whose `collect` yields the families `source` builds at that
    moment (one snapshot per scrape).

    `yield_gil`: when encoded in a worker thread, let the GIL go between families, so that the
    event loop, if it waits for it, runs after one family's encoding (tens of microseconds) rather
    than after the interpreter's switch interval (5 ms)."""

    def __init__(self, source: Callable[[], Iterable[Family]], *, yield_gil: bool = False) -> None:
        self.source = source
        self.yield_gil = yield_gil

    def collect(self) -> Iterator[Metric]:
        for family in self.source():
            yield family.metric
            if self.yield_gil:
                time.sleep(0)  # releases the GIL


def registry_of(source: Callable[[], Iterable[Family]], *, yield_gil: bool = False) -> CollectorRegistry:
    """A registry of its own (never the library's global one) holding one FamiliesCollector."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FamiliesCollector(source, yield_gil=yield_gil))
    return registry


def encode(registry: Collector, accept: str | None = None) -> tuple[bytes, str]:
    """The scrape body and its Content-Type, in the format `accept` (an Accept header) asks for."""
    encoder, content_type = choose_encoder(accept or "")
    return encoder(registry), content_type


def render(families: Iterable[Family], accept: str | None = None) -> str:
    """The exposition of `families` as text (format 0.0.4 unless `accept` asks for OpenMetrics)."""
    kept = list(families)
    body, _ = encode(registry_of(lambda: kept), accept)
    return body.decode("utf-8")
