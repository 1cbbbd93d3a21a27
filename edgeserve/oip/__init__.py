"""The Open Inference Protocol (KServe v2) HTTP front (docs/oip.md); its codec and client are in wire/."""
