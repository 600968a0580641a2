"""A small asyncio AMQP 0-9-1 client (pamqp over asyncio streams) for durability tests:
publishes persistent messages at full speed with publisher confirms, keeping at most
``window`` unconfirmed, and records exactly which publishes were confirmed (basic.ack,
``multiple`` included) even when the broker dies mid-stream.

pika's BlockingConnection waits for each confirm in turn; this keeps the pipe full.
"""

from __future__ import annotations

import asyncio
import struct
from collections import OrderedDict
from typing import Any, Callable, Iterable

from pamqp import commands, frame, header as pamqp_header
from pamqp.heartbeat import Heartbeat

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_END = b"\xce"
PERSISTENT = commands.Basic.Properties(delivery_mode=2)
TRANSIENT = commands.Basic.Properties(delivery_mode=1)

# confirm status per publish
PENDING, ACKED, NACKED = 0, 1, 2


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


class ConnectionLost(Exception):
    pass


class ConfirmTracker:
    """Publish sequence numbers of one confirm-mode channel and their fate."""

    def __init__(self) -> None:
        self.next_seq = 1
        self.status = bytearray(1)  # index 0 unused
        self.outstanding: OrderedDict[int, None] = OrderedDict()
        self.changed = asyncio.Event()

    def published(self) -> int:
        seq = self.next_seq
        self.next_seq += 1
        self.status.append(PENDING)
        self.outstanding[seq] = None
        return seq

    def settle(self, tag: int, multiple: bool, value: int) -> None:
        if multiple:
            while self.outstanding:
                seq = next(iter(self.outstanding))
                if seq > tag:
                    break
                self.outstanding.popitem(last=False)
                self.status[seq] = value
        elif self.outstanding.pop(tag, 0) is None:
            self.status[tag] = value
        self.changed.set()

    def acked(self) -> list[int]:
        return [seq for seq in range(1, self.next_seq) if self.status[seq] == ACKED]

    @property
    def nacked(self) -> int:
        return self.status.count(NACKED)


class AsyncClient:
    """One connection; channels are opened on demand. Not a general client: enough for
    declare/purge/delete, confirmed publishing and basic.get."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.frame_max = 131072
        self.lost: BaseException | None = None
        self._replies: dict[int, asyncio.Queue] = {}
        self._confirms: dict[int, ConfirmTracker] = {}
        self._task: asyncio.Task | None = None
        self._next_channel = 1
        self.channel_errors: list[Any] = []

    @classmethod
    async def connect(cls, host: str, port: int, vhost: str = "/") -> AsyncClient:
        reader, writer = await asyncio.open_connection(host, port)
        client = cls(reader, writer)
        writer.write(PROTOCOL_HEADER)
        await client._expect(0, commands.Connection.Start)
        client.send(0, commands.Connection.StartOk(
            client_properties={"product": "leveret-tests"}, mechanism="PLAIN",
            response="\x00guest\x00guest"))
        tune = await client._expect(0, commands.Connection.Tune)
        client.frame_max = tune.frame_max or client.frame_max
        client.send(0, commands.Connection.TuneOk(channel_max=tune.channel_max,
                                                  frame_max=client.frame_max, heartbeat=0))
        client.send(0, commands.Connection.Open(virtual_host=vhost))
        await client._expect(0, commands.Connection.OpenOk)
        client._task = asyncio.get_running_loop().create_task(client._read_loop())
        return client

    # -- framing ----------------------------------------------------------------------
    async def _read_frame(self) -> tuple[int, Any]:
        head = await self.reader.readexactly(7)
        size = struct.unpack_from(">I", head, 3)[0]
        rest = await self.reader.readexactly(size + 1)
        _, channel, value = frame.unmarshal(head + rest)
        return channel, value

    async def _expect(self, channel: int, kind: type) -> Any:
        while True:
            got_channel, value = await self._read_frame()
            if isinstance(value, Heartbeat):
                continue
            if got_channel == channel and isinstance(value, kind):
                return value
            raise ConnectionLost(f"expected {kind.__name__}, got {value!r}")

    def send(self, channel: int, method: Any) -> None:
        if self.lost is not None:
            raise ConnectionLost(str(self.lost))
        self.writer.write(frame.marshal(method, channel))

    async def _read_loop(self) -> None:
        try:
            while True:
                channel, value = await self._read_frame()
                if isinstance(value, Heartbeat):
                    continue
                if isinstance(value, (commands.Basic.Ack, commands.Basic.Nack)):
                    tracker = self._confirms.get(channel)
                    if tracker is not None:
                        tracker.settle(value.delivery_tag, value.multiple,
                                       ACKED if isinstance(value, commands.Basic.Ack) else NACKED)
                    continue
                if isinstance(value, commands.Connection.Close):
                    self.writer.write(frame.marshal(commands.Connection.CloseOk(), 0))
                    raise ConnectionLost(f"connection.close {value.reply_code} {value.reply_text}")
                if isinstance(value, commands.Channel.Close):
                    self.channel_errors.append(value)
                    self.writer.write(frame.marshal(commands.Channel.CloseOk(), channel))
                queue = self._replies.get(channel)
                if queue is not None:
                    queue.put_nowait(value)
        except (asyncio.IncompleteReadError, ConnectionError, OSError, ConnectionLost) as exc:
            self.lost = exc
        except asyncio.CancelledError:
            self.lost = ConnectionLost("closed")
            raise
        finally:
            for tracker in self._confirms.values():
                tracker.changed.set()
            for queue in self._replies.values():
                queue.put_nowait(None)

    async def _reply(self, channel: int, timeout: float = 10) -> Any:
        value = await asyncio.wait_for(self._replies[channel].get(), timeout)
        if value is None:
            raise ConnectionLost(str(self.lost))
        if isinstance(value, commands.Channel.Close):
            raise ConnectionLost(f"channel.close {value.reply_code} {value.reply_text}")
        return value

    async def rpc(self, channel: int, method: Any, timeout: float = 10) -> Any:
        """Send a synchronous method, return the reply (raises ConnectionLost on a
        channel or connection close)."""
        self.send(channel, method)
        return await self._reply(channel, timeout)

    async def channel(self, confirm: bool = False) -> int:
        number = self._next_channel
        self._next_channel += 1
        self._replies[number] = asyncio.Queue()
        await self.rpc(number, commands.Channel.Open())
        if confirm:
            self._confirms[number] = ConfirmTracker()
            await self.rpc(number, commands.Confirm.Select())
        return number

    def tracker(self, channel: int) -> ConfirmTracker:
        return self._confirms[channel]

    # -- publishing -------------------------------------------------------------------
    def publish(self, channel: int, exchange: str, routing_key: str, body: bytes,
                properties: commands.Basic.Properties = PERSISTENT) -> int:
        """Write one publish (no waiting); returns its confirm sequence number (0 when
        the channel is not in confirm mode)."""
        if self.lost is not None:
            raise ConnectionLost(str(self.lost))
        assert len(body) <= self.frame_max - 8
        self.writer.write(b"".join((
            frame.marshal(commands.Basic.Publish(exchange=exchange, routing_key=routing_key),
                          channel),
            frame.marshal(pamqp_header.ContentHeader(body_size=len(body), properties=properties),
                          channel),
            struct.pack(">BHI", 3, channel, len(body)) + body + FRAME_END if body else b"")))
        tracker = self._confirms.get(channel)
        return tracker.published() if tracker is not None else 0

    async def publish_many(self, channel: int, exchange: str, routing_key: str,
                           bodies: Iterable[bytes], window: int = 1000,
                           properties: commands.Basic.Properties = PERSISTENT,
                           on_publish: Callable[[int, bytes], None] | None = None,
                           wait: bool = True, timeout: float = 60) -> ConfirmTracker:
        """Publish ``bodies`` keeping at most ``window`` unconfirmed; with ``wait``,
        return once all are confirmed. Raises ConnectionLost if the broker goes away
        (the tracker still says which publishes were acked)."""
        tracker = self._confirms[channel]
        method = frame.marshal(commands.Basic.Publish(exchange=exchange, routing_key=routing_key),
                               channel)
        headers: dict[int, bytes] = {}
        write = self.writer.write
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        for count, body in enumerate(bodies):
            while len(tracker.outstanding) >= window:
                if self.lost is not None:
                    raise ConnectionLost(str(self.lost))
                tracker.changed.clear()
                await self.writer.drain()
                await asyncio.wait_for(tracker.changed.wait(), max(0.01, deadline - loop.time()))
            if self.lost is not None:
                raise ConnectionLost(str(self.lost))
            size = len(body)
            head = headers.get(size)
            if head is None:
                head = headers[size] = frame.marshal(
                    pamqp_header.ContentHeader(body_size=size, properties=properties), channel)
            write(method + head + struct.pack(">BHI", 3, channel, size) + body + FRAME_END)
            seq = tracker.published()
            if on_publish is not None:
                on_publish(seq, body)
            if count % 200 == 199:
                await self.writer.drain()
        await self.writer.drain()
        if wait:
            await self.wait_confirms(channel, max(0.1, deadline - loop.time()))
        return tracker

    async def wait_confirms(self, channel: int, timeout: float = 30) -> None:
        tracker = self._confirms[channel]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while tracker.outstanding:
            if self.lost is not None:
                raise ConnectionLost(str(self.lost))
            tracker.changed.clear()
            await asyncio.wait_for(tracker.changed.wait(), max(0.01, deadline - loop.time()))

    async def close(self) -> None:
        if self.lost is None:
            try:
                self.send(0, commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
                await self.writer.drain()
            except (ConnectionError, ConnectionLost, OSError):
                pass
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (ConnectionError, OSError):
            pass
