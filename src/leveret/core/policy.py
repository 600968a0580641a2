"""RabbitMQ's policies: queue and exchange settings applied by name pattern.

A policy has a ``name``, a regular expression ``pattern`` matched against the queue or
exchange name (``re.search``, as RabbitMQ), ``apply_to`` (``queues``, ``exchanges`` or
``all``), a ``priority`` (the highest matching policy applies, alone) and a
``definition`` whose keys are the queue arguments without their ``x-`` prefix
(``message-ttl``, ``dead-letter-exchange``, ``max-redeliveries`` …).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field


@dataclass
class Policy:
    """One policy of virtual host ``vhost`` (see the module doc). Raises ValueError
    for a bad ``apply_to``, re.error for a bad ``pattern``."""

    name: str
    pattern: str
    definition: dict
    apply_to: str = "all"
    priority: int = 0
    vhost: str = "/"
    _regex: re.Pattern = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.apply_to not in ("queues", "exchanges", "all"):
            raise ValueError(f"policy {self.name}: apply-to must be queues, exchanges or all")
        self._regex = re.compile(self.pattern)

    def matches(self, vhost: str, name: str, kind: str) -> bool:
        """Whether it applies to the ``kind`` (``queues``/``exchanges``) ``name`` in
        ``vhost``."""
        return self.vhost == vhost and self.apply_to in (kind, "all") and self._regex.search(name) is not None


def matching(policies: list[Policy], vhost: str, name: str, kind: str) -> Policy | None:
    """The policy that applies to a ``kind`` (``queues``/``exchanges``) named ``name``."""
    found = [p for p in policies if p.matches(vhost, name, kind)]
    return max(found, key=lambda p: p.priority) if found else None
