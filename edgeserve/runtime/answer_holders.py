"""The fronts that write a batch's answers together: the hold and release each one registered.

The Server (around the answers of the batches that ended) and the front process's RemoteServer
(around the answers of one read of its link) call every front's `hold()` before they hand out
answers that belong together and its `release()` after the last, so that each connection writes
its share in one write (Server.answers_together).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

_log = logging.getLogger(__name__)


class AnswerHolders:
    """The (hold, release) pairs of the fronts, in the order they registered."""

    def __init__(self) -> None:
        self._pairs: list[tuple[Callable[[], None], Callable[[], None]]] = []

    def add(self, hold: Callable[[], None], release: Callable[[], None]) -> None:
        self._pairs.append((hold, release))

    def hold(self) -> None:
        for hold, _ in self._pairs:
            hold()

    def release(self) -> None:
        for _, release in self._pairs:
            try:
                release()
            except Exception:  # one front's fault must not cost another's answers
                _log.exception("a front failed to write the answers it held")
