"""BlockingClient: the asyncio client driven on a private event loop, for synchronous code."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

from pamqp import commands

from .. import errors
from ..delivery import Delivery
from ..errors import AMQPError, ChannelError
from .channel import Channel
from .connection import SEND_CHUNK, Connection
from .errors import Timeout


class BlockingClient:
    """A blocking client on a private event loop: each call runs the asyncio client's
    coroutine to completion (no thread). One channel at a time, opened on demand: after a
    :class:`ChannelError` the next call opens a fresh one. Use as a context manager;
    never pickled (open one per process)."""

    def __init__(self, url: str, timeout: float = 10.0, name: str = "leveret") -> None:
        """Connect (see :meth:`Connection.connect`; ``timeout`` in seconds). Raises
        ClientError, ConnectionLost, AMQPConnectionError, Timeout."""
        self.url = url
        self.timeout = timeout
        self._loop = asyncio.new_event_loop()
        try:
            self.connection = self._run(Connection.connect(url, timeout, name))
        except BaseException:
            self._loop.close()
            raise
        self._confirming = False

    def _run(self, coro: Any) -> Any:
        return self._loop.run_until_complete(coro)

    def close(self) -> None:
        """Close the connection and the loop; never raises."""
        if self._loop.is_closed():
            return
        try:
            self._run(self.connection.close())
            self._loop.run_until_complete(asyncio.sleep(0))
        finally:
            self._loop.close()

    def __enter__(self) -> BlockingClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> None:
        raise TypeError("leveret.amqp.client.BlockingClient cannot be pickled: open one per process")

    def _channel(self) -> Channel:
        channel = self.connection._default
        if channel is None or not channel.is_open:
            channel = self._run(self.connection.default_channel())
        return channel

    def channel(self) -> int:
        """The open channel's number, opening a new one if needed."""
        return self._channel().number

    # -- declarations -------------------------------------------------------------
    def exchange_declare(self, exchange: str, exchange_type: str = "direct", **kwargs: Any) -> None:
        """See :meth:`Channel.exchange_declare`."""
        self._run(self._channel().exchange_declare(exchange, exchange_type, **kwargs))

    def queue_declare(
        self,
        queue: str = "",
        passive: bool = False,
        durable: bool = True,
        arguments: dict | None = None,
        **kwargs: Any,
    ) -> commands.Queue.DeclareOk:
        """See :meth:`Channel.queue_declare` (durable by default here)."""
        return self._run(
            self._channel().queue_declare(
                queue, passive=passive, durable=durable, arguments=arguments, **kwargs
            )
        )

    def queue_bind(
        self, queue: str, exchange: str, routing_key: str = "", arguments: dict | None = None
    ) -> None:
        """See :meth:`Channel.queue_bind`."""
        self._run(self._channel().queue_bind(queue, exchange, routing_key, arguments))

    def queue_purge(self, queue: str) -> int:
        """See :meth:`Channel.queue_purge`."""
        return self._run(self._channel().queue_purge(queue))

    def queue_delete(self, queue: str) -> int:
        """See :meth:`Channel.queue_delete`."""
        return self._run(self._channel().queue_delete(queue))

    def exchange_exists(self, exchange: str) -> bool:
        """Whether ``exchange`` exists (a passive declare). Raises ChannelError for
        anything but 404."""
        try:
            self.exchange_declare(exchange, passive=True)
        except ChannelError as exc:
            if exc.reply_code == errors.NOT_FOUND:
                return False
            raise
        return True

    def queue_exists(self, queue: str) -> commands.Queue.DeclareOk | None:
        """The passive declare's reply (``message_count``, ...) or None if ``queue``
        does not exist. Raises ChannelError for anything but 404."""
        try:
            return self.queue_declare(queue, passive=True)
        except ChannelError as exc:
            if exc.reply_code == errors.NOT_FOUND:
                return None
            raise

    # -- publishing ---------------------------------------------------------------
    def confirm_select(self, on_nack: str = "raise", track: bool = False) -> None:
        """See :meth:`Channel.confirm_select`."""
        self._run(self._channel().confirm_select(on_nack, track))

    @property
    def unconfirmed(self) -> int:
        """Publishes not yet confirmed on the current channel."""
        channel = self.connection._default
        return channel.unconfirmed if channel is not None and channel.is_open else 0

    def publish(
        self,
        exchange: str,
        routing_key: str,
        body: bytes,
        properties: dict[str, Any] | commands.Basic.Properties | None = None,
        mandatory: bool = False,
    ) -> int:
        """Buffer one message (sent when 256 KiB are buffered, or with the next call
        that waits); see :meth:`Channel.publish`."""
        seq = self._channel().publish(exchange, routing_key, body, properties, mandatory)
        if self.connection.write_buffer_size > 4 * SEND_CHUNK:
            self._run(self.connection.drain())
        return seq

    def wait_confirms(self, below: int = 0, timeout: float | None = None) -> None:
        """See :meth:`Channel.wait_confirms`."""
        self._run(self._channel().wait_confirms(below, timeout))

    # -- consuming ----------------------------------------------------------------
    def qos(self, prefetch: int) -> None:
        """basic.qos with ``prefetch`` messages."""
        self._run(self._channel().qos(prefetch))

    def ack(self, delivery_tag: int, multiple: bool = False) -> None:
        """Buffer a basic.ack on the current channel."""
        self._channel().ack(delivery_tag, multiple)

    def nack(self, delivery_tag: int, multiple: bool = False, requeue: bool = True) -> None:
        """Buffer a basic.nack on the current channel."""
        self._channel().nack(delivery_tag, multiple, requeue)

    def get(self, queue: str, no_ack: bool = False) -> Delivery | None:
        """basic.get; see :meth:`Channel.get`."""
        return self._run(self._channel().get(queue, no_ack))

    def consume(
        self,
        queue: str,
        arguments: dict | None = None,
        no_ack: bool = False,
        idle_timeout: float | None = None,
    ) -> Iterator[Delivery]:
        """Deliveries of a new consumer until the broker cancels it (basic.cancel), or,
        with ``idle_timeout`` (seconds), until none arrives for that long (it is then
        cancelled). Without ``idle_timeout``, Timeout if none arrives within the
        client's timeout. Deliveries are decoded one by one straight from the receive
        buffer as they are taken (what costs least per message), frames of any other
        kind handled on the way; the event loop runs only when the buffer is empty.
        Raises ChannelError/AMQPConnectionError if the channel or connection closes."""
        conn = self.connection
        consumer = self._run(self._channel().consume(queue, no_ack=no_ack, arguments=arguments))
        limit = idle_timeout or self.timeout
        pull = conn._pull
        while True:
            if consumer.ready:  # put there by the slow path (or while another call ran)
                yield from consumer.take()
                continue
            delivery = pull(consumer)
            if delivery is not None:
                yield delivery
                continue
            if consumer.ready:
                continue
            if consumer.cancelled:
                if consumer.error is not None:
                    raise consumer.error
                return
            if conn.error is not None:
                raise conn.error
            if self._run(conn._wait_data(limit)):
                continue
            if idle_timeout is None:
                raise Timeout(f"{conn.safe_url}: no delivery from {queue!r} within {self.timeout:g}s")
            try:
                self._run(consumer.cancel())
            except AMQPError:
                pass
            return

    # -- amq.leveret.api ----------------------------------------------------------
    def rpc(self, operation: str, payload: dict, timeout: float | None = None) -> dict:
        """See :meth:`Channel.rpc`."""
        return self._run(self._channel().rpc(operation, payload, timeout))
