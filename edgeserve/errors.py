"""Errors a user can act on: each one names the file or key at fault and says what to run."""

from __future__ import annotations


class EdgeServeError(Exception):
    """Base class of every error edgeserve raises on purpose."""


class RepositoryError(EdgeServeError):
    """A model repository file is missing, truncated, corrupt or does not match its manifest."""


class ProfileError(EdgeServeError):
    """A profile table is missing, stale (another device or manifest) or malformed."""


class InputError(EdgeServeError):
    """A request's tensor has the wrong dtype or shape for the model."""


class BackendUnavailableError(EdgeServeError):
    """The requested backend or execution provider is not installed on this machine."""
