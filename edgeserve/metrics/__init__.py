"""Prometheus metrics: the text exposition, what is exported (docs/metrics.md) and the endpoint.

Light to import except `endpoint` (aiohttp), which is imported only where an endpoint starts.
"""

from edgeserve.metrics.catalog import collect, render_metrics
from edgeserve.metrics.exposition import CONTENT_TYPE, Family, render

__all__ = ["CONTENT_TYPE", "Family", "collect", "render", "render_metrics"]
