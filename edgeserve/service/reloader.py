"""SIGHUP for `edgeserve serve`: re-read the TOML file and apply it without dropping a request.

Reloads run one at a time on the event loop; a SIGHUP that arrives during one triggers one more
afterwards (the file may have changed again). A config that does not parse, or changes something
only a restart can apply, is logged as an error and the running config keeps serving: a reload
never takes the server down.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from edgeserve import logs
from edgeserve.config.server import ServerConfig
from edgeserve.errors import EdgeServeError
from edgeserve.service.process import NetServer
from edgeserve.service.sd_notify import Notifier

_log = logging.getLogger("edgeserve.reload")


class ConfigReloader:
    """Reload `path` into `net` on request; `log_level` (the --log-level flag) overrides the file's.

    `manage_logging=False` leaves the process's logging alone (an embedding program owns it)."""

    def __init__(
        self,
        path: Path,
        net: NetServer,
        notifier: Notifier | None = None,
        log_level: str | None = None,
        *,
        manage_logging: bool = True,
    ) -> None:
        self.path = path
        self.manage_logging = manage_logging
        self.net = net
        self.notifier = notifier
        self.log_level = log_level
        self.reloads = 0  # applied
        self.failures = 0  # refused or invalid
        self._task: asyncio.Task[None] | None = None
        self._again = False

    def request(self) -> None:
        """The SIGHUP handler: start a reload, or queue one more if one is running."""
        if self._task is not None and not self._task.done():
            self._again = True
            return
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def wait(self) -> None:
        """Until the requested reloads are done (tests, shutdown)."""
        while self._task is not None and not self._task.done():
            await asyncio.shield(self._task)

    async def _run(self) -> None:
        while True:
            self._again = False
            await self.reload_once()
            if not self._again:
                return

    async def reload_once(self) -> bool:
        """One reload; True when applied. Errors are logged, never raised."""
        if self.notifier is not None:
            self.notifier.reloading()
        try:
            new = await asyncio.to_thread(ServerConfig.from_toml, self.path)
            changed = await self.net.server.reload(new)
        except (EdgeServeError, ValueError, RuntimeError, OSError) as exc:
            self.failures += 1
            _log.error(
                "reload failed; still serving the previous config",
                extra={"config": str(self.path), "error": str(exc)},
            )
            return False
        finally:
            if self.notifier is not None:
                self.notifier.ready()
        self.net.reconfigured()
        if self.manage_logging:
            logs.configure(self.log_level or new.logging.level, new.logging.format)
        self.reloads += 1
        _log.info(
            "reloaded",
            extra={"config": str(self.path), "changed": ",".join(changed) or "nothing"},
        )
        return True
