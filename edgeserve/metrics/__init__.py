"""Prometheus metrics: what is exported (docs/metrics.md), its exposition by prometheus_client, the
accelerators' metrics and the endpoint.

Light to import except `endpoint` (aiohttp), which is imported only where an endpoint starts.
"""

from edgeserve.metrics.catalog import collect, render_metrics
from edgeserve.metrics.exposition import CONTENT_TYPE, Family, encode, render

__all__ = ["CONTENT_TYPE", "Family", "collect", "encode", "render", "render_metrics"]
