"""The HTTP listeners' connection caps and timeouts in force: the configured ones, and the caps
derived from the descriptors the process may open where they are not set (docs/oip.md, "Limits").
The HTTP listeners enforce them (oip/connections.py), and the gRPC listener passes them to grpc core
(oipgrpc/limits.py).
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass

from edgeserve.config.server import ListenConfig

# Descriptors kept free beside those open when the caps are derived and the socket front's cap:
# what the server opens later (a reload's model files, log rotation, the offload client's
# connections, a scrape's accept racing a refusal).
FD_HEADROOM = 64
# HTTP's cap is this share of the descriptors left; the rest stays free for everything else (the
# gRPC listener, when set, may take one listener's share of HTTP's cap beside it: 7/8 in all).
HTTP_SHARE = 0.5
# One listener may take this share of HTTP's cap (as the socket front's 192 of 256): a flood on
# the OIP port leaves a quarter to /metrics.
LISTENER_SHARE = 0.75
MIN_HTTP_CONNECTIONS = 8  # however few descriptors are left, a few probes and a scrape get in
# An edge box serves a few clients: past 1024 HTTP connections it is a flood, whatever the limit
# (an idle one costs ~6 KiB of the process's memory, measured, plus its kernel socket buffers).
MAX_HTTP_CONNECTIONS = 1024


def derived_caps(soft_limit: int, open_fds: int, socket_connections: int) -> tuple[int, int]:
    """(all HTTP listeners, one listener) from the descriptor limit: HTTP_SHARE of what is left
    once the descriptors open now, FD_HEADROOM and the socket front's `max_connections` are set
    aside, within [MIN_HTTP_CONNECTIONS, MAX_HTTP_CONNECTIONS]; one listener LISTENER_SHARE of
    that. A soft limit of 1024 with 30 open: (337, 252); with the limit at open + 100: (8, 6).
    An unlimited soft limit (RLIM_INFINITY) gives the maximum."""
    if soft_limit < 0 or soft_limit == resource.RLIM_INFINITY:
        total = MAX_HTTP_CONNECTIONS
    else:
        left = soft_limit - open_fds - FD_HEADROOM - socket_connections
        total = max(MIN_HTTP_CONNECTIONS, min(MAX_HTTP_CONNECTIONS, int(left * HTTP_SHARE)))
    return total, max(1, int(total * LISTENER_SHARE))


def open_descriptors() -> int:
    """How many descriptors the process has open (Linux /proc, else /dev/fd; 0 if neither lists them)."""
    for path in ("/proc/self/fd", "/dev/fd"):
        try:
            return len(os.listdir(path))
        except OSError:
            continue
    return 0


@dataclass(frozen=True)
class HttpLimits:
    """The HTTP listeners' limits in force: the configured ones, the caps derived where not set."""

    max_connections: int
    max_connections_per_listener: int
    header_timeout_s: float
    keepalive_timeout_s: float
    body_timeout_s: float
    body_min_rate: int

    @classmethod
    def from_listen(
        cls, listen: ListenConfig, soft_limit: int | None = None, open_fds: int | None = None
    ) -> HttpLimits:
        """`listen`'s limits, the caps it leaves unset derived (`derived_caps`) from the soft
        RLIMIT_NOFILE and the descriptors open now (or the values given)."""
        if soft_limit is None:
            soft_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        total, per_listener = derived_caps(
            soft_limit, open_descriptors() if open_fds is None else open_fds, listen.max_connections
        )
        if listen.http_max_connections is not None:
            total = listen.http_max_connections
            per_listener = max(1, int(total * LISTENER_SHARE))
        if listen.http_max_connections_per_listener is not None:
            per_listener = listen.http_max_connections_per_listener
            total = max(total, per_listener)
        return cls(
            max_connections=total,
            max_connections_per_listener=min(per_listener, total),
            header_timeout_s=listen.http_header_timeout_s,
            keepalive_timeout_s=listen.http_keepalive_timeout_s,
            body_timeout_s=listen.http_body_timeout_s,
            body_min_rate=listen.http_body_min_rate,
        )

    def body_timeout(self, size: int) -> float:
        """How long a body of `size` bytes may take: the floor plus its size at the minimum rate."""
        return self.body_timeout_s + size / self.body_min_rate
