"""The audit log: one line per security-relevant action on the ``leveret.audit`` logger,
saying what was done, by whom and from where (the record's time says when). Route that
logger to its own file to keep an audit trail.

Recorded: refused logins (AMQP and HTTP), users, permissions, topic permissions and
vhosts created, changed or deleted, and queues purged or deleted by an operator through
the management API, and the dead-letter console's actions. Secrets are never recorded.

The operators' actions through the management API also go to the broker's
:class:`AuditTrail` (``BrokerCore.audit``), the last :data:`TRAIL_LENGTH` of them, which
the console shows (``GET /api/leveret/audit``).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("leveret.audit")


def record(action: str, actor: str, source: str, /, **details: object) -> None:
    """Log ``action`` (e.g. ``user.put``) by the user ``actor`` from ``source`` (an
    address), with ``details`` as ``key='value'`` pairs in the order given."""
    extra = " ".join(f"{key}={value!r}" for key, value in details.items())
    log.info("%s by user '%s' from %s%s", action, actor, source or "?", f": {extra}" if extra else "")


TRAIL_LENGTH = 1000


@dataclass(frozen=True)
class AuditEntry:
    """One action: when (epoch seconds), what, by which user, from which address."""

    time: float
    action: str
    user: str
    source: str
    details: dict[str, Any]


class AuditTrail:
    """The latest actions of one broker, newest last (in memory; the log keeps them
    all). :meth:`record` logs as :func:`record` does and keeps the entry."""

    def __init__(self, length: int = TRAIL_LENGTH) -> None:
        self.entries: deque[AuditEntry] = deque(maxlen=length)

    def record(self, action: str, actor: str, source: str, /, **details: object) -> None:
        record(action, actor, source, **details)
        self.entries.append(AuditEntry(time.time(), action, actor, source or "?", details))

    def latest(self, limit: int) -> list[AuditEntry]:
        """The ``limit`` newest entries, newest first."""
        return [self.entries[-i] for i in range(1, min(limit, len(self.entries)) + 1)]
