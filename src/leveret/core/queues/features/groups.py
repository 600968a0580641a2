"""ActiveMQ's message groups: messages with the same ``JMSXGroupID`` go to one consumer,
in order, until it leaves or the group is closed (a message with ``JMSXGroupSeq`` -1).
No argument turns them on: a queue keeps a :class:`MessageGroups` once the first
message with a group arrives, and its dispatch keeps groups together from then on."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..base import Consumer

#: Message groups whose consumer a queue remembers (ActiveMQ's default group cache).
GROUP_CACHE = 1024


class MessageGroups:
    """The consumer of each message group of one queue (``owners``: group -> consumer)."""

    __slots__ = ("owners",)

    def __init__(self) -> None:
        self.owners: dict[str, Consumer] = {}

    def owner(self, group: tuple[str, int | None] | None) -> Consumer | None:
        """The consumer of ``group`` (``(JMSXGroupID, JMSXGroupSeq)``), or None."""
        return self.owners.get(group[0]) if group is not None else None

    def assign(self, group: tuple[str, int | None], consumer: Consumer) -> bool:
        """Messages of ``group`` go to ``consumer`` from now on (a closing message
        ends the group). Returns True when a group was dropped (closed, or the oldest
        forgotten as ActiveMQ's group cache does): what other consumers skipped as its
        messages, they must look at again."""
        owners = self.owners
        name, sequence = group
        dropped = False
        if sequence == -1 or len(owners) >= GROUP_CACHE:
            owners.pop(name if sequence == -1 else next(iter(owners)), None)
            dropped = True
        if sequence != -1:
            owners[name] = consumer
        return dropped

    def forget(self, consumer: Consumer) -> bool:
        """``consumer`` leaves: its groups find another consumer. Returns whether it
        had any (the others must look again at what they skipped for it)."""
        owners = self.owners
        orphans = [name for name, owner in owners.items() if owner is consumer]
        for name in orphans:
            del owners[name]
        return bool(orphans)
