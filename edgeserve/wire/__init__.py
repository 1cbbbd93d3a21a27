"""What crosses a socket, both ends: the msgpack frame and tensor codecs with the socket client
(docs/protocol.md), and the Open Inference Protocol codec with its HTTP client (docs/oip.md).

Knows nothing of the Server: the fronts above and the offload path use it.
"""
