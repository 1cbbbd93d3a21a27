"""The Open Inference Protocol (KServe v2): the HTTP frontend, the client the offload path uses, and
the message codec both share (docs/oip.md)."""
