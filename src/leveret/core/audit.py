"""The audit log: one line per security-relevant action on the ``leveret.audit`` logger,
saying what was done, by whom and from where (the record's time says when). Route that
logger to its own file to keep an audit trail.

Recorded: refused logins (AMQP and HTTP), users, permissions, topic permissions and
vhosts created, changed or deleted, and queues purged or deleted by an operator through
the management API. Secrets are never recorded.
"""

from __future__ import annotations

import logging

log = logging.getLogger("leveret.audit")


def record(action: str, actor: str, source: str, /, **details: object) -> None:
    """Log ``action`` (e.g. ``user.put``) by the user ``actor`` from ``source`` (an
    address), with ``details`` as ``key='value'`` pairs in the order given."""
    extra = " ".join(f"{key}={value!r}" for key, value in details.items())
    log.info("%s by user '%s' from %s%s", action, actor, source or "?", f": {extra}" if extra else "")
