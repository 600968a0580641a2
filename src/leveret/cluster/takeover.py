"""Survivors take a dead or fenced node's queues over (docs/cluster.md).

Every :data:`EVERY` seconds each node reads ``cluster_nodes`` (off the loop): a node
whose advisory lock is not held is not LIVE. The first survivor to take the dead node's
lock (:meth:`Catalog.take_over`, on a catalog session) reassigns its durable queues over
the live nodes (balanced) in ``queue_owners`` with ``changes`` rows, moves its scheduled
(delayed) rows with them, deletes its transient definitions (its non-durable queues are
gone, as in RabbitMQ), and releases the lock. Each new owner then waits :data:`GRACE
<leveret.cluster.lease.GRACE>` seconds — longer than the dead node's lease, so a node
merely cut off from the database has stopped serving by then — unless the dead node's
row says it LEFT (a graceful stop released its queues itself), and restores the queues
from the shared store (:mod:`.restore`): every persistent message, ``redelivered`` on
those delivered before, TTL and back-off as stored. The dead node's transient messages
are lost (RabbitMQ classic queues: the same).

Every takeover is measured from the lock taken to the queues serving and kept in
:attr:`ClusterNode.takeovers <leveret.cluster.node.ClusterNode.takeovers>`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .node import ClusterNode

log = logging.getLogger("leveret.cluster")

#: seconds between two looks for dead nodes
EVERY = 0.5


class Takeover:
    """The loop that finds dead nodes and takes their queues over for ``node``."""

    def __init__(
        self, node: ClusterNode, every: float = EVERY, now: Callable[[], float] = time.monotonic
    ) -> None:
        self.node = node
        self.every = every
        self.now = now
        #: (name, started_at) of dead nodes this loop has handled
        self._handled: set[tuple[str, Any]] = set()
        #: nodes seen dead (their remote queues' consumers were cancelled)
        self._dead: set[str] = set()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.every)
            if self.node.fenced is not None:
                return
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the database may be away for a while: next turn
                log.warning("takeover check failed: %s", exc)

    async def tick(self) -> None:
        """One look: refresh the node's view of the cluster, take dead nodes over."""
        node = self.node
        catalog = node.catalog
        rows = await asyncio.to_thread(catalog.nodes)
        owners = await asyncio.to_thread(catalog.owners)
        node.refresh(rows, owners)
        holders = {owner for owner, _ in owners.values()}
        for row in rows:
            if row.name == node.node:
                continue
            if row.live:
                self._dead.discard(row.name)
                continue
            if row.name not in self._dead:
                self._dead.add(row.name)
                node.peer_lost(row.name)
            key = (row.name, row.started_at)
            if key in self._handled and row.name not in holders:
                continue
            if node.fenced is not None:
                return
            started = self.now()
            moved = await asyncio.to_thread(catalog.take_over, row.name)
            first = key not in self._handled
            self._handled.add(key)
            if moved:
                log.warning(
                    "node %s is down (state %s): took %d queues over", row.name, row.state, len(moved)
                )
            if moved or first:  # (its scheduled rows may have come here: read them after the grace)
                grace = 0.0 if row.state == "left" else node.grace
                node.adopt(moved, row.name, started + grace, started)
