"""The free-disk resource alarm, as RabbitMQ's ``disk_free_limit``.

Every ``interval`` seconds it compares the free space of the data directory's file
system with the limit (bytes) and raises or clears the broker's alarm; while raised,
publishing connections get connection.blocked and are no longer read from.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable

from ..core.broker import BrokerCore
from .periodic import PeriodicCheck

log = logging.getLogger("leveret.alarm")


class DiskMonitor(PeriodicCheck):
    """Checks the free space under ``path`` every ``interval`` seconds against
    ``limit()`` bytes and sets the alarm of ``core``."""

    def __init__(self, core: BrokerCore, path: str, limit: Callable[[], int], interval: float = 1.0) -> None:
        self.core = core
        self.path = path
        self.limit = limit  # read at every check, so it can be changed at run time
        self.interval = interval

    def check(self) -> None:
        """Compare once; raise or clear the alarm when the state changes. A failed
        ``statvfs`` is logged and changes nothing."""
        try:
            free = shutil.disk_usage(self.path).free
        except OSError as exc:
            log.warning("cannot read free disk space of %s: %s", self.path, exc)
            return
        low = free < self.limit()
        if low != ("disk" in self.core.alarm_sources):
            log.warning(
                "free disk space %s: %d bytes free, limit %d bytes",
                "is low" if low else "is back",
                free,
                self.limit(),
            )
            self.core.set_alarm(low, "disk")
