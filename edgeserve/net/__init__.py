"""The network front: a length-prefixed msgpack protocol over UNIX and TCP sockets (docs/protocol.md)."""

from edgeserve.wire.client import AsyncClient, BlockingClient, Reply, connect

__all__ = ["AsyncClient", "BlockingClient", "Reply", "connect"]
