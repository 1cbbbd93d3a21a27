"""`edgeserve train-exits`: early-exit heads for a model split into stages (`edgeserve import --split-at`).

The backbone stays frozen: the stage graphs run with ONNX Runtime to give, for every labelled
sample, the tensors each stage passes on (the features at the split points) and the model's own
output. A small head (global average pool + one linear layer) is trained on those features for
each split point (`train`), written as ONNX nodes and merged into its stage graph (`heads`), so
that stage k then has an exit of its own, and the manifest gains one exit per split point with its
measured accuracy. Training needs only numpy; merging needs onnx (the `export` extra).
"""

from edgeserve.errors import EdgeServeError


class TrainExitsError(EdgeServeError):
    """The model or the labelled data cannot be used for exit training; the message says the fix."""


__all__ = ["TrainExitsError"]
