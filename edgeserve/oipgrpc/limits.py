"""The gRPC listener's caps and timeouts: the HTTP listeners' (oip/connections.py; docs/oip.md,
"Limits") and the socket front's window, as grpc core's server arguments, so that a hostile client
meets the same limits on every transport. grpc core enforces them itself, off the serving loop.
"""

from __future__ import annotations

from edgeserve.config.http_limits import HttpLimits
from edgeserve.config.server import ListenConfig


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000.0))


def server_options(listen: ListenConfig, limits: HttpLimits, window: int) -> list[tuple[str, int]]:
    """grpc.aio.server's options for `listen` under the HTTP listeners' `limits`, with at most
    `window` RPCs at once on one connection."""
    return [
        # A message either way is bounded as a socket frame or an HTTP body (RESOURCE_EXHAUSTED past it).
        ("grpc.max_receive_message_length", listen.max_frame_bytes),
        ("grpc.max_send_message_length", listen.max_frame_bytes),
        # Connections: one listener's share of the descriptors, as the OIP HTTP listener's (past it
        # a new connection is closed at once and its client sees UNAVAILABLE).
        ("grpc.max_allowed_incoming_connections", limits.max_connections_per_listener),
        # A connection must finish its HTTP/2 preface and settings within the time an HTTP request
        # has for its headers (a client that connects and sends nothing is closed; slowloris).
        ("grpc.server_handshake_timeout_ms", _ms(limits.header_timeout_s)),
        # A connection with no RPC for the HTTP keep-alive timeout gets GOAWAY and is closed (a
        # channel reconnects on its next RPC by itself).
        ("grpc.max_connection_idle_ms", _ms(limits.keepalive_timeout_s)),
        # RPCs at once on one connection: the socket front's window (by default the largest batch),
        # so that a flood on one connection holds no more of the queue than a socket connection may;
        # past it the client's HTTP/2 stack waits for a stream to close (flow control). Counted as
        # HTTP/2 counts them (overload_protection off), which clients follow: grpc core's default
        # also counts streams already answered but not yet freed, and refuses past that
        # (REFUSED_STREAM, which a client sees as UNAVAILABLE: 2-6 % of a polite tritonclient's
        # requests beside a flood, measured with the window at 10).
        ("grpc.max_concurrent_streams", window),
        ("grpc.http.overload_protection", 0),
    ]
