"""The audit log: one line per security-relevant action on the ``leveret.audit`` logger,
saying what was done, by whom and from where (the record's time says when). Route that
logger to its own file to keep an audit trail.

Recorded: refused logins (AMQP and HTTP), users, permissions, topic permissions and
vhosts created, changed or deleted, and queues purged or deleted by an operator through
the management API, and the dead-letter console's actions. Secrets are never recorded.

The operators' actions through the management API also go to the broker's
:class:`AuditTrail` (``BrokerCore.audit``), the last :data:`TRAIL_LENGTH` of them, which
the console shows (``GET /api/leveret/audit``); with a store they survive a restart.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..store import Store

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
    """The latest actions of one broker, newest last. :meth:`record` logs as
    :func:`record` does and keeps the entry, in the store too once :meth:`attach` gave
    one (its details must then be JSON values)."""

    def __init__(self, length: int = TRAIL_LENGTH) -> None:
        self.length = length
        self.entries: deque[AuditEntry] = deque(maxlen=length)
        self._store: Store | None = None
        self._names: deque[str] = deque()  # the store's names of the entries, oldest first

    def attach(self, store: Store, rows: list[tuple[str, str, dict]]) -> None:
        """Keep entries in ``store`` from now on; ``rows`` are those it holds (the
        snapshot's ``audit`` definitions, oldest first)."""
        self._store = store
        for _, name, data in rows:
            fields = {**data, "time": data["time_us"] / 1e6}
            del fields["time_us"]
            self.entries.append(AuditEntry(**fields))
            self._names.append(name)

    def record(self, action: str, actor: str, source: str, /, **details: object) -> None:
        record(action, actor, source, **details)
        entry = AuditEntry(round(time.time() * 1e6) / 1e6, action, actor, source or "?", details)
        self.entries.append(entry)
        store = self._store
        if store is not None:
            name = f"{time.time_ns():020d}"
            # (integer microseconds: the store's tables keep a float in 32 bits)
            data = {**asdict(entry), "time_us": round(entry.time * 1e6)}
            del data["time"]
            store.save_definition("audit", "", name, data)
            self._names.append(name)
            while len(self._names) > self.length:
                store.delete_definition("audit", "", self._names.popleft())

    def latest(self, limit: int, user: str | None = None) -> list[AuditEntry]:
        """The ``limit`` newest entries (of ``user``'s actions, when given), newest first."""
        found: list[AuditEntry] = []
        for entry in reversed(self.entries):
            if len(found) >= limit:
                break
            if user is None or entry.user == user:
                found.append(entry)
        return found
