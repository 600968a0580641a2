"""The client's asyncio protocol: handshake, frames in and out, channels, heartbeats."""

from __future__ import annotations

import asyncio
import socket
import struct
from typing import Any

from pamqp import commands, frame as pamqp_frame, header as pamqp_header, heartbeat
from pamqp.body import ContentBody

from .. import errors
from ..delivery import Delivery, decode_frame, take_delivery
from ..errors import AMQPConnectionError, AMQPError
from ..frames import HEARTBEAT, PROTOCOL_HEADER
from .channel import Channel
from .consumer import Consumer
from .errors import ConnectionLost, Timeout
from .futures import fail as _fail, resolve as _resolve
from .url import parse_url, safe_url

SEND_CHUNK = 256 * 1024  # bytes buffered before a write without waiting for the loop turn
_U32 = struct.Struct(">I").unpack_from


class Connection(asyncio.Protocol):
    """One AMQP connection; open it with :meth:`connect`. Subclasses may set
    ``channel_class`` to a subclass of :class:`Channel`."""

    channel_class: type[Channel] = Channel

    def __init__(self, url: str, timeout: float, loop: asyncio.AbstractEventLoop) -> None:
        self.url = url
        self.safe_url = safe_url(url)
        self.params = parse_url(url)
        self.timeout = timeout
        self.frame_max = 131072
        self.channel_max = 2047
        self.heartbeat = 0
        self.server_properties: dict = {}
        self.blocked = False
        self.error: BaseException | None = None
        self._loop = loop
        self._transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._out: list[bytes] = []
        self._out_size = 0
        self._flush_handle: asyncio.Handle | None = None
        self._channels: dict[int, Channel] = {}
        self._next_channel = 1
        self._waiter: asyncio.Future | None = None  # channel 0 replies
        self._expect: tuple[type, ...] = ()
        self._closed_waiter: asyncio.Future = loop.create_future()
        self._write_ok = asyncio.Event()
        self._write_ok.set()
        self._paused: set[int] = set()
        self._heartbeat_handle: asyncio.TimerHandle | None = None
        self._default: Channel | None = None
        self._hold = False  # data_received only buffers: a blocking consumer decodes
        self._data_waiter: asyncio.Future | None = None

    # -- opening and closing ------------------------------------------------------
    @classmethod
    async def connect(
        cls,
        url: str,
        timeout: float = 10.0,
        name: str = "leveret",
        heartbeat: int = 0,
        frame_max: int = 131072,
    ) -> Connection:
        """Connect, log in (PLAIN) and open the URL's vhost. ``timeout`` (seconds)
        bounds each step and is the default for later calls; ``heartbeat`` (seconds,
        0: off) is negotiated down to the broker's; ``frame_max`` in bytes. Raises
        ClientError for a bad URL, ConnectionLost if the socket cannot be opened,
        AMQPConnectionError (403 refused login, 530 no vhost access, ...) from the broker,
        Timeout."""
        loop = asyncio.get_running_loop()
        conn = cls(url, timeout, loop)
        p = conn.params
        try:
            await asyncio.wait_for(loop.create_connection(lambda: conn, p.host, p.port), timeout)
        except (TimeoutError, OSError) as exc:
            raise ConnectionLost(f"cannot connect to {conn.safe_url}: {exc!r}") from None
        try:
            await conn._handshake(name, heartbeat, frame_max)
        except BaseException:
            conn._abort()
            raise
        return conn

    async def _handshake(self, name: str, heartbeat: int, frame_max: int) -> None:
        p = self.params
        self._write(PROTOCOL_HEADER)
        start = await self._call0(None, commands.Connection.Start)
        mechanisms = start.mechanisms.split() if isinstance(start.mechanisms, str) else []
        if mechanisms and "PLAIN" not in mechanisms:
            raise ConnectionLost(f"cannot connect to {self.safe_url}: PLAIN login not offered")
        self.server_properties = start.server_properties or {}
        try:
            tune = await self._call0(
                commands.Connection.StartOk(
                    client_properties={
                        "product": name,
                        "capabilities": {
                            "publisher_confirms": True,
                            "consumer_cancel_notify": True,
                            "basic.nack": True,
                            "connection.blocked": True,
                        },
                    },
                    mechanism="PLAIN",
                    response=f"\0{p.user}\0{p.password}",
                ),
                commands.Connection.Tune,
            )
        except AMQPConnectionError as exc:
            message = f"login to {self.safe_url} refused for user {p.user!r}: {exc}"
            if isinstance(exc, ConnectionLost):
                raise ConnectionLost(message) from None
            raise errors.from_reply(AMQPConnectionError, exc.reply_code, message) from None
        self.frame_max = min(tune.frame_max or frame_max, frame_max)
        self.channel_max = tune.channel_max or 2047
        self.heartbeat = min(heartbeat, tune.heartbeat) if tune.heartbeat else heartbeat
        self._send_method(
            0,
            commands.Connection.TuneOk(
                channel_max=self.channel_max, frame_max=self.frame_max, heartbeat=self.heartbeat
            ),
        )
        await self._call0(commands.Connection.Open(virtual_host=p.vhost), commands.Connection.OpenOk)
        if self.heartbeat:
            self._beat()

    def _beat(self) -> None:
        if self.error is None and self._transport is not None:
            self._transport.write(HEARTBEAT)
            self._heartbeat_handle = self._loop.call_later(self.heartbeat / 2, self._beat)

    async def _call0(self, method: Any, *reply: type) -> Any:
        if self.error is not None:
            raise self.error
        self._waiter = waiter = self._loop.create_future()
        self._expect = reply
        if method is not None:
            self._send_method(0, method)
        self._flush()
        try:
            return await asyncio.wait_for(waiter, self.timeout)
        except TimeoutError:
            raise Timeout(f"{self.safe_url}: no {reply[0].__name__} within {self.timeout:g}s") from None
        finally:
            self._waiter = None

    async def close(self, timeout: float = 2.0) -> None:
        """connection.close, waiting up to ``timeout`` seconds for close-ok; never
        raises."""
        if self.error is None and self._transport is not None:
            try:
                self._send_method(
                    0, commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)
                )
                self._flush()
                await asyncio.wait_for(asyncio.shield(self._closed_waiter), timeout)
            except (TimeoutError, AMQPError, OSError):
                pass
        self._lost(ConnectionLost(f"connection to {self.safe_url} closed"))
        self._abort()

    def _abort(self) -> None:
        if self._transport is not None:
            self._transport.close()
        if self._heartbeat_handle is not None:
            self._heartbeat_handle.cancel()

    @property
    def is_open(self) -> bool:
        return self.error is None

    # -- channels -----------------------------------------------------------------
    async def channel(self) -> Channel:
        """A newly opened channel. Raises AMQPConnectionError if the connection is closed."""
        if self.error is not None:
            raise self.error
        number = self._next_channel
        while number in self._channels:
            number = number % self.channel_max + 1
        self._next_channel = number % self.channel_max + 1
        channel = self.channel_class(self, number)
        self._channels[number] = channel
        try:
            await channel._call(commands.Channel.Open(), commands.Channel.OpenOk)
        except BaseException:
            self._channels.pop(number, None)
            raise
        channel.is_open = True
        return channel

    async def default_channel(self) -> Channel:
        """This connection's current channel, a fresh one if the broker closed the last
        (so a ChannelError only fails the operation that caused it)."""
        if self._default is None or not self._default.is_open:
            self._default = await self.channel()
        return self._default

    # -- writing ------------------------------------------------------------------
    def _write(self, data: bytes) -> None:
        if self.error is not None:
            raise self.error
        self._out.append(data)
        self._out_size += len(data)
        if self._out_size >= SEND_CHUNK:
            self._flush()
        elif self._flush_handle is None:
            self._flush_handle = self._loop.call_soon(self._flush)

    def _send_method(self, channel: int, method: Any) -> None:
        self._write(pamqp_frame.marshal(method, channel))

    def _flush(self) -> None:
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        if self._out and self._transport is not None and self.error is None:
            data = b"".join(self._out) if len(self._out) > 1 else self._out[0]
            self._out.clear()
            self._out_size = 0
            self._transport.write(data)

    @property
    def write_buffer_size(self) -> int:
        """Bytes written and not yet sent (buffered here or in the transport)."""
        size = self._out_size
        if self._transport is not None:
            size += self._transport.get_write_buffer_size()
        return size

    async def drain(self) -> None:
        """Send what is buffered; wait while the transport's buffer is above its high
        water mark. Raises the connection's error if it closed."""
        self._flush()
        while not self._write_ok.is_set():
            if self.error is not None:
                raise self.error
            await self._write_ok.wait()
        if self.error is not None:
            raise self.error

    def pause_writing(self) -> None:
        self._write_ok.clear()

    def resume_writing(self) -> None:
        self._write_ok.set()

    # -- reading ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except (OSError, AttributeError, TypeError):  # not TCP, or uvloop's
                pass

    def _pause_reading(self, consumer: Consumer) -> None:
        if not self._paused and self._transport is not None:
            self._transport.pause_reading()
        self._paused.add(id(consumer))

    def _resume_reading(self, consumer: Consumer) -> None:
        if id(consumer) in self._paused:
            self._paused.discard(id(consumer))
            if not self._paused and self._transport is not None and self.error is None:
                self._transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        if self._hold:
            _resolve(self._data_waiter)
            return
        try:
            self._process(buf)
        except AMQPError as exc:
            self._protocol_error(exc)
        except Exception as exc:
            self._protocol_error(AMQPConnectionError(errors.FRAME_ERROR, f"bad frame: {exc!r}"))
        self._flush()

    def _process(self, buf: bytearray) -> None:
        channels = self._channels
        pushed: set[Consumer] = set()
        last = None
        try:
            while True:
                taken = take_delivery(buf)
                if taken is None:
                    if self._frame(buf):
                        continue
                    return
                # the common case, decoded straight from the buffer, no call per message
                size, delivery = taken
                del buf[:size]
                channel = channels.get(delivery.channel)
                if channel is None:
                    continue  # a closed channel's late delivery
                consumer = channel._consumers.get(delivery.consumer_tag)
                if consumer is None:
                    continue  # a cancelled consumer's: requeued when the channel closes
                if consumer.callback is not None:
                    consumer.callback(delivery)
                    continue
                consumer.ready.append(delivery)
                if consumer is not last:
                    pushed.add(consumer)
                    last = consumer
        finally:
            for consumer in pushed:
                consumer._wake()

    def _pull(self, consumer: Consumer) -> Delivery | None:
        """For a blocking consumer: decode the receive buffer up to the next delivery
        for ``consumer`` and return it, handling every other frame on the way (one
        delivery at a time, as the caller takes them: the cheapest per message). None
        when the buffer holds no complete frame, or the slow path put deliveries in
        ``consumer.ready`` or ended it."""
        buf = self._buf
        channels = self._channels
        tag, number = consumer.tag, consumer.channel.number
        try:
            while True:
                taken = take_delivery(buf)
                if taken is None:
                    if not self._frame(buf) or consumer.ready or consumer.cancelled:
                        return None
                    continue
                size, delivery = taken
                del buf[:size]
                if delivery.consumer_tag == tag and delivery.channel == number:
                    return delivery
                channel = channels.get(delivery.channel)
                if channel is not None:
                    channel._deliver(delivery)
        except AMQPError as exc:
            self._protocol_error(exc)
        except Exception as exc:
            self._protocol_error(AMQPConnectionError(errors.FRAME_ERROR, f"bad frame: {exc!r}"))
        return None

    async def _wait_data(self, timeout: float) -> bool:
        """Send what is buffered, then wait up to ``timeout`` seconds for bytes, which
        are only buffered (see :meth:`_pull`). False on timeout."""
        self._flush()
        if self.error is not None:
            return True
        self._data_waiter = waiter = self._loop.create_future()
        self._hold = True
        try:
            await asyncio.wait_for(waiter, timeout)
        except TimeoutError:
            return False
        finally:
            self._hold = False
            self._data_waiter = None
        return True

    def _frame(self, buf: bytearray) -> bool:
        """Handle the frame at the start of ``buf``; False if it is incomplete."""
        if len(buf) < 7:
            return False
        if buf[:4] == b"AMQP":
            raise ConnectionLost(f"{self.safe_url} does not speak AMQP 0-9-1 (it sent {bytes(buf[:8])!r})")
        size = _U32(buf, 3)[0] + 8
        if len(buf) < size:
            return False
        number, value = decode_frame(buf)
        del buf[:size]
        if number == 0:
            self._on_connection_frame(value)
            return True
        channel = self._channels.get(number)
        if channel is None:
            return True  # a closed channel's late frames
        if isinstance(value, (pamqp_header.ContentHeader, ContentBody)):
            channel._on_content(value)
        else:
            channel._on_method(value)
        return True

    def _on_connection_frame(self, value: Any) -> None:
        kind = type(value)
        if kind is heartbeat.Heartbeat:
            return
        if kind is commands.Connection.Close:
            self._send_method(0, commands.Connection.CloseOk())
            self._flush()
            self._lost(
                errors.from_reply(
                    AMQPConnectionError,
                    value.reply_code,
                    f"{self.safe_url} closed the connection: {value.reply_code} {value.reply_text}",
                )
            )
            self._abort()
        elif kind is commands.Connection.CloseOk:
            _resolve(self._closed_waiter)
        elif kind is commands.Connection.Blocked:
            self.blocked = True
        elif kind is commands.Connection.Unblocked:
            self.blocked = False
        elif self._waiter is not None and isinstance(value, self._expect):
            _resolve(self._waiter, value)
        elif self._waiter is not None:
            self._protocol_error(
                AMQPConnectionError(
                    errors.COMMAND_INVALID, f"expected {self._expect[0].__name__}, got {value!r}"
                )
            )

    def _protocol_error(self, exc: AMQPError) -> None:
        try:
            if self.error is None and self._transport is not None and not isinstance(exc, ConnectionLost):
                self._send_method(
                    0,
                    commands.Connection.Close(
                        reply_code=exc.reply_code, reply_text=exc.reply_text[:255], class_id=0, method_id=0
                    ),
                )
                self._flush()
        except AMQPError:
            pass
        self._lost(exc)
        self._abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost(ConnectionLost(f"connection to {self.safe_url} lost: {exc or 'closed by the broker'}"))
        self._write_ok.set()

    def _lost(self, error: BaseException) -> None:
        if self.error is not None:
            return
        self.error = error
        _resolve(self._closed_waiter)
        _resolve(self._data_waiter)
        _fail(self._waiter, error)
        for channel in list(self._channels.values()):
            channel._closed(error)
        self._write_ok.set()
