"""Where a new queue lives: RabbitMQ 3.10's queue leader locator (docs/cluster.md).

A queue is declared on one node; it lives on

- ``client-local`` (the default): the node the declaring client is connected to;
- ``balanced``: the live node with the fewest queues (RabbitMQ: the fewest leaders
  while the cluster has under 1000 queues, a random node above; here always the
  fewest, which the catalog counts in one query).

The locator is the ``queue-leader-locator`` policy key if a policy sets it, else the
``x-queue-leader-locator`` argument, else the ``queue_leader_locator`` setting
(RabbitMQ 3.10's ``rabbit_queue_location``: the policy wins over the argument). The
deprecated values ``random``, ``least-leaders`` and ``min-masters`` mean ``balanced``,
any other value ``client-local``, as in RabbitMQ. Exclusive and auto-delete queues
always stay on their connection's node.
"""

from __future__ import annotations

from collections.abc import Iterable

CLIENT_LOCAL = "client-local"
BALANCED = "balanced"
#: RabbitMQ 3.10's older names, all ``balanced`` now
_BALANCED_ALIASES = frozenset(("balanced", "random", "least-leaders", "min-masters"))


def _text(value: object) -> str | None:
    if isinstance(value, (bytes, bytearray)):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else None


def leader_locator(arguments: dict, policy: dict | None, default: str = CLIENT_LOCAL) -> str:
    """``client-local`` or ``balanced`` for a queue declared with ``arguments`` under the
    policy definition ``policy`` (None: none), ``default`` being the setting."""
    chosen = _text((policy or {}).get("queue-leader-locator"))
    if chosen is None:
        chosen = _text(arguments.get("x-queue-leader-locator"))
    if chosen is None:
        chosen = default
    return BALANCED if chosen in _BALANCED_ALIASES else CLIENT_LOCAL


def stays_local(exclusive: bool, auto_delete: bool) -> bool:
    """Exclusive and auto-delete queues live on their connection's node."""
    return exclusive or auto_delete


def least_loaded(local: str, live: Iterable[str], owners: Iterable[str]) -> str:
    """The live node owning the fewest queues (``owners``: the owner node of every
    queue of the cluster), ``local`` on a tie with it, else the first by name."""
    counts = dict.fromkeys(sorted(set(live) | {local}), 0)
    for node in owners:
        if node in counts:
            counts[node] += 1
    fewest = min(counts.values())
    if counts[local] == fewest:
        return local
    return next(node for node, count in counts.items() if count == fewest)
