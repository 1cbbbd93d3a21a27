"""Who may reach a listener: the `[listen] token` as an HTTP bearer token, and loopback checks.

The HTTP fronts (Open Inference Protocol, metrics) accept `Authorization: Bearer <token>` when a
token is configured; `bearer_ok` compares in constant time. `warn_if_exposed` logs one warning for
a listener bound to a non-loopback address without a token (anyone who can reach it may use it).
"""

from __future__ import annotations

import hmac
import ipaddress
import logging

LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost")


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and localhost; "", 0.0.0.0 and :: (every interface) and other
    names are not."""
    name = host.strip().strip("[]").lower()
    if name in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def bearer_ok(authorization: str | None, token: str) -> bool:
    """Whether an Authorization header value is `Bearer <token>` (scheme case-insensitive). A value
    that is not UTF-8 (aiohttp keeps such bytes as surrogates: `Bearer \\xff`) matches no token."""
    if not authorization:
        return False
    scheme, _, credentials = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return False
    try:
        given = credentials.strip().encode()
    except UnicodeEncodeError:
        return False
    return hmac.compare_digest(given, token.encode())


def warn_if_exposed(log: logging.Logger, what: str, host: str, port: int, token: str | None) -> bool:
    """Log a warning when `what` listens on a non-loopback address with no token; True if it did."""
    if token or is_loopback(host):
        return False
    log.warning(
        "%s listens on %s:%s, not a loopback address, and [listen] token is not set: "
        "anyone who can reach it can use it (set a token, bind 127.0.0.1, or firewall it)",
        what,
        host or "*",
        port,
    )
    return True
