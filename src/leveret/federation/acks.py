"""Acknowledging a link's upstream deliveries in batches: one ``basic.ack`` with
``multiple=True`` per event-loop turn instead of one per message.

A link settles each delivery when its fate is known (published and confirmed here,
dropped as a loop, nacked back); :class:`UpstreamAcks` then acknowledges, once per
loop turn, every delivery tag up to the highest one below which all are settled. This
is what RabbitMQ's federation link does with the downstream's multiple confirms (one
upstream ack for many), and it spares a frame, a write and the upstream's handling of
it per message. A delivery not yet settled holds back the acks of the later ones (at
most ``prefetch-count`` deliveries wait), never an ack of its own.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

log = logging.getLogger("leveret.federation")


class UpstreamAcks:
    """Batched acknowledgements on one upstream (aiormq) ``channel`` whose delivery tags
    run from 1 (one instance per channel: a new channel starts again)."""

    def __init__(self, channel: Any) -> None:
        self.channel = channel
        self.floor = 0  # every delivery tag <= floor has been acked (or nacked) upstream
        self._settled: set[int] = set()  # settled tags above the floor
        self._scheduled = False
        self._held = False
        self._tasks: set[asyncio.Future] = set()
        self.sent = 0  # basic.ack frames sent (each covers every tag up to its own)

    def hold(self) -> None:
        """Send no ack until :meth:`release`: a queue link pausing (its ``basic.cancel``
        on its way) must not reopen the upstream's prefetch window meanwhile, or the
        upstream would deliver more than ``prefetch-count`` past the point where
        demand went (RabbitMQ's bound: its link's cancel precedes its next acks)."""
        self._held = True

    def release(self) -> None:
        """Acks may go again (those settled meanwhile go in this turn's batch)."""
        if self._held:
            self._held = False
            if self._settled and not self._scheduled:
                self._scheduled = True
                asyncio.get_running_loop().call_soon(self._flush)

    def ack(self, tag: int) -> None:
        """Delivery ``tag`` may be acknowledged (in this turn's ``multiple`` ack)."""
        self._settled.add(tag)
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def settled(self, tag: int) -> None:
        """Delivery ``tag`` was answered otherwise (a ``basic.nack`` already sent): later
        multiple acks may cover it."""
        self.ack(tag)

    def _flush(self) -> None:
        self._scheduled = False
        if self._held:
            return
        floor, settled = self.floor, self._settled
        while floor + 1 in settled:
            floor += 1
            settled.discard(floor)
        if floor == self.floor or self.channel.is_closed:
            return
        self.floor = floor
        self.sent += 1
        task = asyncio.ensure_future(self.channel.basic_ack(floor, multiple=True))
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Future) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # the channel went: the link's session ends on its closing and reconnects
            log.debug("federation: upstream ack failed: %r", task.exception())
