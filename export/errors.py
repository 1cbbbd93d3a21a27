"""The error export raises on purpose: a model that breaks the contract or an export that fails its check."""

from __future__ import annotations

from edgeserve.errors import EdgeServeError


class ExportError(EdgeServeError):
    """A model cannot be exported, or its ONNX graphs do not reproduce the torch model."""
