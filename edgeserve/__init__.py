"""edgeserve: deadline-aware multi-DNN serving for one edge box."""

__version__ = "0.1.0"
