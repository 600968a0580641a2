"""A classic queue's leases (:mod:`...lease`): one :class:`...lease.Lease` per consumer
group, made on first use, numbering on from where the store says the group's last one
stopped. No argument turns them on."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from ...lease import Lease

if TYPE_CHECKING:
    from ..classic import ClassicQueue


class Leases:
    """The leases of one queue, by consumer group."""

    __slots__ = ("_by_group", "_next_seqs")

    def __init__(self) -> None:
        self._by_group: dict[str, Lease] = {}
        self._next_seqs: dict[str, int] = {}  # next seq of leases recovered from the store

    def get(self, queue: ClassicQueue, group: str) -> Lease:
        """The lease of ``group`` on ``queue``, created on first use."""
        lease = self._by_group.get(group)
        if lease is None:
            lease = self._by_group[group] = Lease(queue, group, self._next_seqs.get(group, 1))
        return lease

    def restore(self, group: str, next_seq: int) -> None:
        """At start-up: ``group``'s lease, once made, numbers on from ``next_seq``."""
        self._next_seqs[group] = next_seq

    def release_all(self) -> None:
        """The queue is going away or the broker stops: every lease hands its messages
        back."""
        for lease in self._by_group.values():
            lease.release_all()

    def __iter__(self) -> Iterator[Lease]:
        return iter(self._by_group.values())

    def __len__(self) -> int:
        return len(self._by_group)
