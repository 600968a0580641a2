"""Confirmed publishing for the durability tests, on :mod:`leveret.amqp.client`:
publishes persistent messages at full speed with publisher confirms, keeping at most
``window`` unconfirmed, and records exactly which publishes were confirmed (basic.ack,
``multiple`` included) even when the broker dies mid-stream (the client's confirm
tracking, ``track=True``).

pika's BlockingConnection waits for each confirm in turn; the client keeps the pipe full.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from pamqp import commands

from leveret.amqp.client import AMQPError, Channel, Connection

PERSISTENT = commands.Basic.Properties(delivery_mode=2)
TRANSIENT = commands.Basic.Properties(delivery_mode=1)

#: a closed channel or connection, or a lost socket
ConnectionLost = AMQPError


def make_body(tag: str, index: int, size: int = 0) -> bytes:
    """A self-checking body: ``tag:index:`` repeated up to ``size`` bytes."""
    prefix = f"{tag}:{index:08d}:".encode()
    if size <= len(prefix):
        return prefix
    return (prefix * (size // len(prefix) + 1))[:size]


def body_index(body: bytes) -> tuple[str, int]:
    """(tag, index) of a :func:`make_body` body; raises ValueError if it is damaged."""
    tag, index, _ = body.split(b":", 2)
    result = tag.decode(), int(index)
    if body != make_body(result[0], result[1], len(body)):
        raise ValueError(f"damaged body {body[:60]!r}")
    return result


class ConfirmTracker:
    """Which publishes of one confirm-mode channel were acked (sequence numbers from 1)."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel

    def acked(self) -> list[int]:
        return self.channel.acked()

    @property
    def nacked(self) -> int:
        return len(self.channel.nacked)

    @property
    def next_seq(self) -> int:
        return self.channel.next_seq

    @property
    def outstanding(self) -> int:
        return self.channel.unconfirmed


class AsyncClient:
    """One :class:`leveret.amqp.client.Connection`; channels by number, as the
    durability tests use them."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self._channels: dict[int, Channel] = {}

    @classmethod
    async def connect(cls, host: str, port: int, vhost: str = "/") -> AsyncClient:
        vhost = vhost.replace("/", "%2F")
        return cls(await Connection.connect(f"amqp://guest:guest@{host}:{port}/{vhost}",
                                            name="leveret-tests"))

    async def channel(self, confirm: bool = False) -> int:
        channel = await self.connection.channel()
        if confirm:
            await channel.confirm_select(on_nack="record", track=True)
        self._channels[channel.number] = channel
        return channel.number

    def tracker(self, channel: int) -> ConfirmTracker:
        return ConfirmTracker(self._channels[channel])

    async def rpc(self, channel: int, method: Any, timeout: float = 10) -> Any:
        """Send a synchronous method, return the reply (raises ConnectionLost on a
        channel or connection close)."""
        return await self._channels[channel].call(method, timeout)

    def publish(self, channel: int, exchange: str, routing_key: str, body: bytes,
                properties: commands.Basic.Properties = PERSISTENT) -> int:
        """Write one publish (no waiting); returns its confirm sequence number (0 when
        the channel is not in confirm mode)."""
        return self._channels[channel].publish(exchange, routing_key, body, properties)

    async def drain(self) -> None:
        await self.connection.drain()

    async def publish_many(self, channel: int, exchange: str, routing_key: str,
                           bodies: Iterable[bytes], window: int = 1000,
                           properties: commands.Basic.Properties = PERSISTENT,
                           on_publish: Callable[[int, bytes], None] | None = None,
                           wait: bool = True, timeout: float = 60) -> ConfirmTracker:
        """Publish ``bodies`` keeping at most ``window`` unconfirmed; with ``wait``,
        return once all are confirmed. Raises ConnectionLost if the broker goes away
        (the tracker still says which publishes were acked)."""
        ch = self._channels[channel]
        loop = self.connection._loop
        deadline = loop.time() + timeout
        for count, body in enumerate(bodies):
            if ch.unconfirmed >= window:
                await ch.wait_confirms(window - 1, max(0.01, deadline - loop.time()))
            seq = ch.publish(exchange, routing_key, body, properties)
            if on_publish is not None:
                on_publish(seq, body)
            if count % 200 == 199:
                await self.connection.drain()
        await self.connection.drain()
        if wait:
            await ch.wait_confirms(0, max(0.1, deadline - loop.time()))
        return ConfirmTracker(ch)

    async def wait_confirms(self, channel: int, timeout: float = 30) -> None:
        await self._channels[channel].wait_confirms(0, timeout)

    async def close(self) -> None:
        await self.connection.close()
