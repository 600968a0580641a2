"""The node's lease: a node serves its queues only while its store writer's session,
which holds the node's advisory lock, has answered within :data:`LEASE` seconds.

The idle writer pings PostgreSQL every 0.5 s (``store.last_ok``: monotonic seconds of
its last successful round trip). A node cut off from the database (a partition, a
stalled server, a session ended by ``pg_terminate_backend``) stops serving at once
when that round trip is older than LEASE, or as soon as the store reports its session
lost; a survivor takes the node's lock only once PostgreSQL ended the session, then
waits :data:`GRACE` (> LEASE) before it serves the node's queues. So no two nodes ever
deliver the same queue. RabbitMQ's classic queues have no such lease: a partitioned
node keeps its queues (``pause_minority`` stops it instead); here a fenced node exits and
its supervisor restarts it.

``LEVERET_CLUSTER_LEASE`` and ``LEVERET_CLUSTER_GRACE`` (seconds) override the two for
tests; GRACE is kept above LEASE.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("leveret.cluster")

#: seconds without a successful round trip of the writer before the node fences itself
LEASE = 3.0
#: seconds a survivor waits after taking a dead node's lock before serving its queues
GRACE = 3.5
#: seconds between two looks at the lease
CHECK_EVERY = 0.25


def lease_seconds() -> float:
    """LEASE, or ``LEVERET_CLUSTER_LEASE``."""
    return float(os.environ.get("LEVERET_CLUSTER_LEASE", LEASE))


def grace_seconds() -> float:
    """GRACE, or ``LEVERET_CLUSTER_GRACE``, at least LEASE + 0.25 s."""
    return max(float(os.environ.get("LEVERET_CLUSTER_GRACE", GRACE)), lease_seconds() + 0.25)


class LeaseWatchdog:
    """Calls ``fence(reason)`` once, on the loop, when ``store.last_ok`` (monotonic
    seconds) is older than ``lease`` seconds by ``now()``. The store's own loss of its
    session reaches the broker through ``store.on_fenced``."""

    def __init__(
        self,
        store: Any,
        fence: Callable[[str], None],
        lease: float | None = None,
        now: Callable[[], float] = time.monotonic,
        every: float = CHECK_EVERY,
    ) -> None:
        self.store = store
        self.fence = fence
        self.lease = lease_seconds() if lease is None else lease
        self.now = now
        self.every = every
        self.fired = False
        #: when the watchdog started: a long start-up (recovery reads on the writer's
        #: session) does not count against the lease
        self.since = now()
        self._task: asyncio.Task | None = None

    def check(self) -> bool:
        """One look; whether the node was fenced by it."""
        if self.fired:
            return False
        last_ok = getattr(self.store, "last_ok", None)
        if last_ok is None:
            return False
        silent = self.now() - max(last_ok, self.since)
        if silent <= self.lease:
            return False
        self.fired = True
        self.fence(f"no successful round trip to PostgreSQL for {silent:.1f} s (lease {self.lease:.1f} s)")
        return True

    async def _run(self) -> None:
        while not self.fired:
            await asyncio.sleep(self.every)
            try:
                self.check()
            except Exception:  # the watchdog must outlive a bug in a fence callback
                log.exception("lease check failed")

    def start(self) -> None:
        self.since = self.now()
        self._task = asyncio.ensure_future(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
