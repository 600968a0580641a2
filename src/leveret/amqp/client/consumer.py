"""One basic.consume on the client side: deliveries batched in a deque."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

from pamqp import commands

from ..delivery import Delivery
from .futures import resolve as _resolve

if TYPE_CHECKING:  # the other end of a reference cycle
    from .channel import Channel

_READ_HIGH = 20000  # deliveries waiting in a consumer before the socket stops being read


class Consumer:
    """One basic.consume. Deliveries wait in a deque until taken, a batch at a time
    (:meth:`batch`), or go to ``callback`` as they are decoded. ``cancelled`` is set when
    the consumer ends (cancelled by us or by the broker: queue deleted, stream range
    done, ...); ``error`` when its channel or connection closed."""

    def __init__(
        self, channel: Channel, tag: str, queue: str, callback: Callable[[Delivery], None] | None
    ) -> None:
        self.channel, self.tag, self.queue = channel, tag, queue
        self.callback = callback
        self.ready: collections.deque[Delivery] = collections.deque()
        self.cancelled = False
        self.error: BaseException | None = None
        self._waiter: asyncio.Future | None = None

    def _push(self, delivery: Delivery) -> None:
        if self.callback is not None:
            self.callback(delivery)
            return
        self.ready.append(delivery)
        if self._waiter is not None:
            _resolve(self._waiter)
            self._waiter = None
        if len(self.ready) > _READ_HIGH:
            self.channel.connection._pause_reading(self)

    def _end(self, error: BaseException | None = None) -> None:
        self.cancelled = True
        if error is not None and self.error is None:
            self.error = error
        _resolve(self._waiter)
        self._waiter = None
        self.channel.connection._resume_reading(self)

    def take(self) -> collections.deque[Delivery]:
        """The deliveries received so far (possibly none), without waiting."""
        batch = self.ready
        self.ready = collections.deque()
        self.channel.connection._resume_reading(self)
        return batch

    def _wake(self) -> None:
        """After a read that pushed deliveries here (the fast path)."""
        if self._waiter is not None:
            _resolve(self._waiter)
            self._waiter = None
        if len(self.ready) > _READ_HIGH:
            self.channel.connection._pause_reading(self)

    async def batch(self, timeout: float | None = None) -> collections.deque[Delivery]:
        """The deliveries received so far, waiting up to ``timeout`` seconds (None:
        forever) for at least one. An empty batch means the timeout passed, or the
        consumer ended (``cancelled``). Raises the channel's or connection's error if it
        closed."""
        if not self.ready and not self.cancelled:
            self.channel.connection._flush()
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await asyncio.wait_for(asyncio.shield(self._waiter), timeout)
            except TimeoutError:
                pass
            finally:
                self._waiter = None
        if not self.ready and self.error is not None:
            raise self.error
        return self.take()

    async def __aiter__(self) -> AsyncIterator[Delivery]:
        """Deliveries until the consumer ends."""
        while True:
            batch = await self.batch()
            if not batch and self.cancelled:
                return
            for delivery in batch:
                yield delivery

    async def cancel(self) -> None:
        """basic.cancel and wait for cancel-ok (nothing if already ended). Deliveries
        already received stay in ``ready``."""
        if self.cancelled or not self.channel.is_open:
            self.cancelled = True
            return
        await self.channel._call(commands.Basic.Cancel(consumer_tag=self.tag), commands.Basic.CancelOk)
        self.channel._consumers.pop(self.tag, None)
        self._end()
