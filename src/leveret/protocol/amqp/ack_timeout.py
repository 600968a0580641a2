"""Consumer timeouts on an AMQP 0-9-1 channel: what happens when a delivery stays
unacknowledged longer than its timeout (settings and timers: :mod:`leveret.core.
consumer_timeout`).

- mode ``close`` (the default, RabbitMQ 3.12's): the channel is closed with 406
  PRECONDITION_FAILED ``delivery acknowledgement on channel N timed out. Timeout value
  used: MS ms. …`` (RabbitMQ's text, class and method id 0) and, as for any channel
  close, every unacknowledged delivery of the channel returns to its queue;
- mode ``graceful`` (RabbitMQ 4.3's for quorum queues): only the timed-out deliveries
  return (redelivered, as a return: they do not count as failures), and their consumer,
  if still subscribed, is cancelled with basic.cancel; a client that did not announce
  the ``consumer_cancel_notify`` capability gets the channel closed as in ``close``
  (RabbitMQ 4.3 does the same). The channel stays open; the consumer's other
  deliveries stay acknowledgeable and time out on their own. An ack, nack or reject of
  a delivery that timed out is ignored (it is not an unknown delivery tag).

basic.get deliveries time out too (RabbitMQ 3.12 times them out alike), under their
queue's timeout.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from pamqp import commands

from ...amqp.errors import PRECONDITION_FAILED, ChannelError
from ...core.consumer_timeout import REMEMBERED, Deadlines, consume_timeout
from ...core.queues import Queue

if TYPE_CHECKING:
    from .channel import Channel
    from .consumer import ChannelConsumer

log = logging.getLogger("leveret.amqp")

#: A delivery's deadline group: (timeout ms, mode).
Key = tuple[int, str]


def timed_out_text(channel: int, timeout: int) -> str:
    """RabbitMQ's reply text (after ``PRECONDITION_FAILED - ``) for a timed-out delivery."""
    return (
        f"delivery acknowledgement on channel {channel} timed out. Timeout value used: {timeout} ms. "
        "This timeout value can be configured, see consumers doc guide to learn more"
    )


class AckTimeouts:
    """The consumer timeouts of one channel (see the module doc)."""

    __slots__ = ("channel", "deadlines", "default", "timed_out")

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        core = channel.connection.core
        self.default = core.limits.consumer_timeout  # ms, 0: off
        self.deadlines = Deadlines(core.clock, self._key_of, self._expired, lambda: channel.delivery_tag)
        #: tags that timed out in graceful mode (their late ack is ignored), oldest first
        self.timed_out: dict[int, None] = {}

    # -- settings -----------------------------------------------------------------------
    def queue_key(self, queue: Queue, timeout: int | None = None) -> Key | None:
        """The deadline group of ``queue``'s deliveries: ``timeout`` (ms, basic.consume's
        argument) or the queue's (argument or policy, the lower) or the broker's; None
        when timeouts are off."""
        config = queue.config
        if timeout is None:
            timeout = config.consumer_timeout
        if timeout is None:
            timeout = self.default or None
        if timeout is None:
            return None
        return (timeout, config.consumer_timeout_mode or "close")

    def subscribe(self, consumer: ChannelConsumer, queue: Queue, arguments: dict) -> None:
        """Give a new consumer its deadline group; 406 for a bad ``x-consumer-timeout``
        argument (a manual-ack consumer only: no-ack deliveries never wait)."""
        where = f" for queue '{queue.name}' in vhost '{queue.host.name}'"
        timeout = consume_timeout(arguments, where)
        if consumer.no_ack:
            return
        key = self.queue_key(queue, timeout)
        if key is not None:
            consumer.deadline_key = key
            consumer.deadline_group = self.deadlines.group(key, key[0])

    def got(self, queue: Queue, tag: int) -> None:
        """basic.get delivered ``tag`` from ``queue``, to be acknowledged."""
        key = self.queue_key(queue)
        if key is not None:
            self.deadlines.delivered(key, key[0], tag)

    def restored(self, tag: int, queue: Queue | None, consumer: ChannelConsumer | None) -> None:
        """tx.rollback made ``tag`` unacknowledged again: its deadline is watched again."""
        key = consumer.deadline_key if consumer is not None else None
        if consumer is None and queue is not None:
            key = self.queue_key(queue)
        if key is not None:
            self.deadlines.rewind(key, key[0], tag)

    def close(self) -> None:
        """The channel is released: no more timers."""
        self.deadlines.close()

    # -- settled tags ---------------------------------------------------------------------
    def forget(self, tag: int, multiple: bool) -> bool:
        """An ack/nack/reject of ``tag`` (and, ``multiple``, every tag below it): whether
        ``tag`` itself is one that timed out (then it is no error)."""
        timed_out = self.timed_out
        found = tag in timed_out
        if multiple:
            for old in [t for t in timed_out if t <= tag]:
                del timed_out[old]
        elif found:
            del timed_out[tag]
        return found

    # -- timeouts ------------------------------------------------------------------------
    def _key_of(self, tag: int) -> Any:
        item = self.channel.unacked.get(tag)
        if item is None:
            return None
        queue, _, consumer = item
        if consumer is not None:
            return consumer.deadline_key
        return self.queue_key(queue) if queue is not None else None

    def _expired(self, key: Key, tags: list[int]) -> None:
        channel = self.channel
        connection = channel.connection
        if channel.closing or connection.channels.get(channel.number) is not channel:
            return
        timeout, mode = key
        unacked = channel.unacked
        items = [(tag, *unacked[tag]) for tag in tags if tag in unacked]
        if not items:
            return
        consumers: dict[str, ChannelConsumer] = {}
        for _, _, _, consumer in items:
            if consumer is not None and channel.consumers.get(consumer.tag) is consumer:
                consumers[consumer.tag] = consumer
        log.warning(
            "connection %s: channel %d: %d deliveries unacknowledged past the consumer timeout (%d ms, %s)",
            connection.peer,
            channel.number,
            len(items),
            timeout,
            mode,
        )
        if mode == "close" or (consumers and not connection.capabilities.get("consumer_cancel_notify")):
            error = ChannelError(PRECONDITION_FAILED, timed_out_text(channel.number, timeout))
            connection.fail(error, channel.number, (0, 0))  # releases: everything returns
            return
        # graceful: cancel the consumers first, so the returned messages go elsewhere
        for consumer in consumers.values():
            if consumer.queue is not None:
                consumer.queue.remove_consumer(consumer)
            channel.consumers.pop(consumer.tag, None)
            channel.send_method(commands.Basic.Cancel(consumer_tag=consumer.tag, nowait=True))
        remembered = self.timed_out
        for tag, _, _, consumer in items:
            del unacked[tag]
            if consumer is not None:
                consumer.unacked -= 1
            remembered[tag] = None
        while len(remembered) > REMEMBERED:
            del remembered[next(iter(remembered))]
        channel.return_deliveries(items)
        channel.resume()  # room in the channel's prefetch window for the other consumers
