"""The one AMQP 0-9-1 client of this repo: asyncio, with a blocking façade.

:class:`Connection` is an :class:`asyncio.Protocol`: received bytes are decoded in
``data_received``, deliveries straight out of the receive buffer
(:func:`.delivery.take_delivery`, a whole batch per read) into each consumer's deque, so a
reader pays no task, future or coroutine per message. Writes are buffered and sent once
per event-loop turn (or when 256 KiB are waiting), so many publishes go out in one write.

- URL ``amqp://user:pass@host:port/vhost``, PLAIN login, heartbeats off unless asked for;
- channels (:meth:`Connection.channel`), exchange/queue declare, bind, qos, publish;
- publisher confirms with a window (:meth:`Channel.confirm_select`,
  :meth:`Channel.wait_confirms`): a nack raises :class:`PublishError` or is recorded;
- consumers (:meth:`Channel.consume`) with server-sent basic.cancel, basic.get, ack/nack;
- the broker's ``amq.leveret.api`` RPC over direct reply-to (:meth:`Channel.rpc`).

A channel.close from the broker fails the channel's pending and next operations with
:class:`.errors.ChannelError` (``reply_code``, ``reply_text``);
:meth:`Connection.default_channel` then opens a fresh one. A connection.close fails
everything with :class:`.errors.ConnectionError`, a lost socket with
:class:`ConnectionLost`.

:class:`BlockingClient` runs the same coroutines on a private event loop, for code that
is not async (Spark's Python workers, the CLI tools): no thread, and the loop runs only
while a call waits.
"""

from __future__ import annotations

import asyncio
import collections
import json
import socket
import struct
import urllib.parse
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pamqp import commands, frame as pamqp_frame, header as pamqp_header, heartbeat
from pamqp.body import ContentBody

from . import errors
from .delivery import Delivery, decode_frame, take_delivery
from .errors import AMQPError, ChannelError, ConnectionError
from .frames import HEARTBEAT, PROTOCOL_HEADER, encode_publish
from .properties import PROPERTY_NAMES, encode_properties, properties_dict, shortstr

__all__ = [
    "AMQPError",
    "BlockingClient",
    "Channel",
    "ChannelError",
    "ClientError",
    "Connection",
    "ConnectionError",
    "ConnectionLost",
    "Consumer",
    "Delivery",
    "PublishError",
    "RPCError",
    "Timeout",
    "URLParams",
    "parse_url",
    "safe_url",
]

SEND_CHUNK = 256 * 1024  # bytes buffered before a write without waiting for the loop turn
_READ_HIGH = 20000  # deliveries waiting in a consumer before the socket stops being read
_FRAME_HEAD = struct.Struct(">BHI")
_U32 = struct.Struct(">I").unpack_from
_CONTENT_PREFIX = struct.Struct(">HHQH").pack
_PUBLISH_ID = struct.Struct(">HHH").pack(60, 40, 0)
API_EXCHANGE = "amq.leveret.api"
DIRECT_REPLY_TO = "amq.rabbitmq.reply-to"
PENDING, ACKED, NACKED = 0, 1, 2  # publish confirm states
_METHODS: dict[str, type] = {
    cls.name: cls  # type: ignore[attr-defined]
    for cls in commands.INDEX_MAPPING.values()
}


class ClientError(AMQPError):
    """A failure on the client's side of the conversation (a bad URL, a timeout, a
    refused publish, an RPC error); ``reply_code`` is 0."""

    def __init__(self, message: str) -> None:
        Exception.__init__(self, message)
        self.reply_code, self.reply_text = 0, message


class ConnectionLost(ConnectionError):
    """Cannot connect, or the socket closed without a connection.close; ``reply_code``
    is 0."""

    def __init__(self, message: str) -> None:
        Exception.__init__(self, message)
        self.reply_code, self.reply_text = 0, message


class Timeout(ClientError):
    """No answer from the broker in time."""


class PublishError(ClientError):
    """The broker nacked a publish (for example ``x-overflow: reject-publish``)."""


class RPCError(ClientError):
    """``amq.leveret.api`` answered ``{"ok": false}``, or not at all."""


def safe_url(url: str) -> str:
    """``url`` with its password replaced by ``***``."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "<invalid URL>"
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


@dataclass
class URLParams:
    host: str
    port: int
    user: str
    password: str
    vhost: str


def parse_url(url: str) -> URLParams:
    """``amqp://user:pass@host:port/vhost`` (vhost percent-encoded; empty path means
    ``/``; user and password default to guest, the port to 5672). Raises ClientError
    for anything else."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ClientError(f"invalid AMQP URL {safe_url(url)!r}: {exc}") from None
    if parts.scheme != "amqp":
        raise ClientError(f"invalid AMQP URL {safe_url(url)!r}: the scheme must be amqp://")
    if not parts.hostname:
        raise ClientError(f"invalid AMQP URL {safe_url(url)!r}: no host")
    path = parts.path.removeprefix("/")
    vhost = urllib.parse.unquote(path) if path else "/"
    return URLParams(
        parts.hostname,
        port or 5672,
        urllib.parse.unquote(parts.username or "guest"),
        urllib.parse.unquote(parts.password or "guest"),
        vhost,
    )


def _props(properties: pamqp_header.ContentHeader) -> dict[str, Any]:
    p = properties.properties
    props = {name: value for name in PROPERTY_NAMES if (value := getattr(p, name)) is not None}
    if props.get("cluster_id") == "":  # pamqp's default: not on the wire
        del props["cluster_id"]
    return props


def _resolve(waiter: asyncio.Future | None, value: Any = None) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_result(value)


def _fail(waiter: asyncio.Future | None, exc: BaseException) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_exception(exc)


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


class Channel:
    """One AMQP channel. Synchronous methods (declare, bind, qos, consume, get, ...) are
    coroutines, one at a time per channel; publish and ack only buffer bytes."""

    def __init__(self, connection: Connection, number: int) -> None:
        self.connection = connection
        self.number = number
        self.is_open = False
        self.error: BaseException | None = None
        self._lock = asyncio.Lock()
        self._waiter: asyncio.Future | None = None
        self._expect: tuple[type, ...] = ()
        self._consumers: dict[str, Consumer] = {}
        self._content: list | None = None  # [kind, method, header, parts, remaining]
        self.returned: list[Delivery] = []
        # publisher confirms
        self.confirming = False
        self.on_nack = "raise"
        self.nacked: list[int] = []
        self._next_seq = 1
        self._base = 1
        self._low = 1
        self._state = bytearray()
        self._track = False
        self._unconfirmed = 0
        self._nack_error: PublishError | None = None
        self._confirm_waiter: asyncio.Future | None = None
        self._confirm_below = 0
        self._reply_consumer: Consumer | None = None
        self._replies: dict[str, asyncio.Future] = {}

    # -- synchronous methods ------------------------------------------------------
    async def _call(self, method: Any, *reply: type, timeout: float | None = None) -> Any:
        """Send ``method`` and wait for one of ``reply``; ChannelError if the broker
        closes the channel instead, Timeout after ``timeout`` seconds (the connection's
        by default)."""
        async with self._lock:
            if self.error is not None:
                raise self.error
            conn = self.connection
            loop = asyncio.get_running_loop()
            self._waiter = waiter = loop.create_future()
            self._expect = reply
            conn._send_method(self.number, method)
            conn._flush()
            try:
                return await asyncio.wait_for(waiter, timeout or conn.timeout)
            except TimeoutError:
                raise Timeout(
                    f"{conn.safe_url}: no {reply[0].__name__} within {timeout or conn.timeout:g}s"
                ) from None
            finally:
                self._waiter = None

    async def call(self, method: Any, timeout: float | None = None) -> Any:
        """Send any synchronous pamqp method (``commands.Queue.Purge(...)``) and return
        the broker's reply (None for basic.get-empty, a :class:`Delivery` for
        basic.get-ok). Raises ChannelError, ConnectionError, Timeout (``timeout`` in
        seconds; the connection's by default)."""
        replies = tuple(_METHODS[name] for name in method.valid_responses)
        return await self._call(method, *replies, timeout=timeout)

    async def exchange_declare(
        self,
        exchange: str,
        exchange_type: str = "direct",
        passive: bool = False,
        durable: bool = False,
        auto_delete: bool = False,
        internal: bool = False,
        arguments: dict | None = None,
    ) -> None:
        """exchange.declare. Raises ChannelError (404 passive and missing, 406 a
        different declaration, ...)."""
        await self._call(
            commands.Exchange.Declare(
                exchange=exchange,
                exchange_type=exchange_type,
                passive=passive,
                durable=durable,
                auto_delete=auto_delete,
                internal=internal,
                arguments=arguments,
            ),
            commands.Exchange.DeclareOk,
        )

    async def exchange_delete(self, exchange: str, if_unused: bool = False) -> None:
        """exchange.delete. Raises ChannelError."""
        await self._call(
            commands.Exchange.Delete(exchange=exchange, if_unused=if_unused), commands.Exchange.DeleteOk
        )

    async def queue_declare(
        self,
        queue: str = "",
        passive: bool = False,
        durable: bool = False,
        exclusive: bool = False,
        auto_delete: bool = False,
        arguments: dict | None = None,
    ) -> commands.Queue.DeclareOk:
        """queue.declare; the reply has ``queue``, ``message_count``, ``consumer_count``.
        Raises ChannelError (404 passive and missing, 406 different arguments, ...)."""
        return await self._call(
            commands.Queue.Declare(
                queue=queue,
                passive=passive,
                durable=durable,
                exclusive=exclusive,
                auto_delete=auto_delete,
                arguments=arguments,
            ),
            commands.Queue.DeclareOk,
        )

    async def queue_bind(
        self, queue: str, exchange: str, routing_key: str = "", arguments: dict | None = None
    ) -> None:
        """queue.bind. Raises ChannelError."""
        await self._call(
            commands.Queue.Bind(queue=queue, exchange=exchange, routing_key=routing_key, arguments=arguments),
            commands.Queue.BindOk,
        )

    async def queue_purge(self, queue: str) -> int:
        """queue.purge; the number of messages purged. Raises ChannelError."""
        return (await self._call(commands.Queue.Purge(queue=queue), commands.Queue.PurgeOk)).message_count

    async def queue_delete(self, queue: str, if_unused: bool = False, if_empty: bool = False) -> int:
        """queue.delete; the number of messages deleted. Raises ChannelError."""
        return (
            await self._call(
                commands.Queue.Delete(queue=queue, if_unused=if_unused, if_empty=if_empty),
                commands.Queue.DeleteOk,
            )
        ).message_count

    async def qos(self, prefetch_count: int, prefetch_size: int = 0, global_: bool = False) -> None:
        """basic.qos (``prefetch_size`` in bytes, 0 for no limit)."""
        await self._call(
            commands.Basic.Qos(prefetch_size=prefetch_size, prefetch_count=prefetch_count, global_=global_),
            commands.Basic.QosOk,
        )

    async def close(self) -> None:
        """channel.close (nothing if already closed)."""
        if self.is_open:
            try:
                await self._call(
                    commands.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0),
                    commands.Channel.CloseOk,
                )
            finally:
                self._closed(ChannelError(errors.REPLY_SUCCESS, "channel closed"))

    # -- publishing ---------------------------------------------------------------
    async def confirm_select(self, on_nack: str = "raise", track: bool = False) -> None:
        """confirm.select: from now on each publish gets a sequence number (from 1) and
        the broker confirms it. ``on_nack`` "raise": the next publish or
        :meth:`wait_confirms` raises PublishError; "record": nacked sequence numbers
        are appended to ``nacked``. ``track`` keeps every publish's state for
        :meth:`acked` (one byte per publish)."""
        if on_nack not in ("raise", "record"):
            raise ValueError("on_nack must be 'raise' or 'record'")
        self.on_nack, self._track = on_nack, track
        if not self.confirming:
            await self._call(commands.Confirm.Select(), commands.Confirm.SelectOk)
            self.confirming = True

    @property
    def unconfirmed(self) -> int:
        """Publishes sent in confirm mode and not yet acked or nacked."""
        return self._unconfirmed

    @property
    def next_seq(self) -> int:
        """The confirm sequence number the next publish gets (1 + publishes so far)."""
        return self._next_seq

    def acked(self) -> list[int]:
        """Sequence numbers of the publishes the broker acked (``track=True`` only)."""
        base = self._base
        return [base + i for i, state in enumerate(self._state) if state == ACKED]

    def _sequence(self, count: int) -> int:
        """Assign ``count`` sequence numbers; the first."""
        first = self._next_seq
        if self.confirming:
            self._next_seq += count
            if count == 1:
                self._state.append(PENDING)
            else:
                self._state += bytes(count)
            self._unconfirmed += count
        return first

    def publish(
        self,
        exchange: str,
        routing_key: str,
        body: bytes,
        properties: dict[str, Any] | commands.Basic.Properties | None = None,
        mandatory: bool = False,
    ) -> int:
        """Buffer one basic.publish (sent at the end of this loop turn, or at once above
        256 KiB buffered). ``properties`` by pamqp attribute name (``message_type`` for
        ``type``) or a ``Basic.Properties``. Returns the confirm sequence number (0
        outside confirm mode). Raises ChannelError/ConnectionError if closed,
        PublishError for an earlier nack (``on_nack="raise"``), ValueError/TypeError
        for properties that cannot be encoded."""
        if self.error is not None:
            raise self.error
        if self._nack_error is not None:
            raise self._nack_error
        conn = self.connection
        conn._write(
            encode_publish(
                self.number,
                exchange,
                routing_key,
                body,
                properties_dict(properties),
                conn.frame_max,
                mandatory,
            )
        )
        return self._sequence(1) if self.confirming else 0

    def publish_many(
        self,
        exchange: str,
        routing_key: str,
        bodies: Iterable[bytes],
        properties: dict[str, Any] | commands.Basic.Properties | None = None,
        mandatory: bool = False,
    ) -> int:
        """The batched fast path: buffer one basic.publish per body, all with the same
        exchange, routing key and properties (encoded once), in a single write. Returns
        the first confirm sequence number (0 outside confirm mode). Raises as
        :meth:`publish`."""
        if self.error is not None:
            raise self.error
        if self._nack_error is not None:
            raise self._nack_error
        conn = self.connection
        number, step = self.number, conn.frame_max - 8
        method = b"".join(
            (_PUBLISH_ID, shortstr(exchange), shortstr(routing_key), b"\x01" if mandatory else b"\x00")
        )
        flags, props = encode_properties(properties_dict(properties))
        pack = _FRAME_HEAD.pack
        head_size = 14 + len(props)
        method_frame = (
            pack(1, number, len(method))
            + method
            + b"\xce"
            + pack(2, number, head_size)
            + _CONTENT_PREFIX(60, 0, 0, 0)[:4]
        )
        tail = struct.pack(">H", flags) + props + b"\xce"
        q = struct.Struct(">Q").pack
        parts: list[bytes] = []
        count = 0
        for body in bodies:
            size = len(body)
            parts += (method_frame, q(size), tail)
            for i in range(0, size, step):
                chunk = body[i : i + step] if size > step else body
                parts += (pack(3, number, len(chunk)), chunk, b"\xce")
            count += 1
        conn._write(b"".join(parts))
        return self._sequence(count) if self.confirming else 0

    async def wait_confirms(self, below: int = 0, timeout: float | None = None) -> None:
        """Wait until at most ``below`` publishes are unconfirmed (the window). Raises
        PublishError for a nack (``on_nack="raise"``), ChannelError/ConnectionError if
        the channel or connection closes, Timeout after ``timeout`` seconds (default:
        the connection's timeout, at least 30 s)."""
        conn = self.connection
        conn._flush()
        loop = asyncio.get_running_loop()
        limit = timeout or max(conn.timeout, 30.0)
        deadline = loop.time() + limit
        while True:
            if self._nack_error is not None:
                exc, self._nack_error = self._nack_error, None
                raise exc
            if self._unconfirmed <= below:
                return
            if self.error is not None:
                raise self.error
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise Timeout(
                    f"{conn.safe_url}: {self._unconfirmed} publish(es) not confirmed within {limit:g}s"
                )
            self._confirm_below = below
            self._confirm_waiter = loop.create_future()
            try:
                await asyncio.wait_for(self._confirm_waiter, remaining)
            except TimeoutError:
                pass
            finally:
                self._confirm_waiter = None

    def _settle(self, tag: int, multiple: bool, value: int) -> None:
        state, base = self._state, self._base
        settled: Sequence[int]
        if multiple:
            lo, hi = self._low - base, tag - base + 1
            if hi > lo:
                segment = state[lo:hi]
                pending = segment.count(PENDING)
                if pending == len(segment):
                    state[lo:hi] = bytes((value,)) * pending
                    settled = list(range(lo + base, hi + base)) if value == NACKED else ()
                else:
                    settled = [base + i for i in range(lo, hi) if state[i] == PENDING]
                    for seq in settled:
                        state[seq - base] = value
                self._unconfirmed -= pending
            else:
                settled = ()
        else:
            i = tag - base
            settled = ()
            if 0 <= i < len(state) and state[i] == PENDING:
                state[i] = value
                self._unconfirmed -= 1
                settled = (tag,)
        if value == NACKED and settled:
            if self.on_nack == "record":
                self.nacked.extend(settled)
            elif self._nack_error is None:
                self._nack_error = PublishError(
                    f"{self.connection.safe_url} refused (nacked) a published message "
                    f"(sequence {settled[0]}): a queue may be full (x-overflow "
                    "reject-publish) or the broker failed to store it"
                )
        low, end = self._low - base, len(state)
        while low < end and state[low] != PENDING:
            low += 1
        self._low = low + base
        if not self._track and low > 65536:
            del state[:low]
            self._base += low
        if self._confirm_waiter is not None and (
            self._unconfirmed <= self._confirm_below or self._nack_error is not None
        ):
            _resolve(self._confirm_waiter)

    # -- consuming ----------------------------------------------------------------
    async def consume(
        self,
        queue: str,
        no_ack: bool = False,
        exclusive: bool = False,
        arguments: dict | None = None,
        consumer_tag: str = "",
        callback: Callable[[Delivery], None] | None = None,
    ) -> Consumer:
        """basic.consume; the :class:`Consumer` (its deliveries in ``ready``, or given to
        ``callback``). Raises ChannelError (404 no queue, 403 exclusive, ...)."""
        tag = consumer_tag or f"leveret-{uuid.uuid4().hex[:12]}"
        consumer = Consumer(self, tag, queue, callback)
        self._consumers[tag] = consumer
        try:
            await self._call(
                commands.Basic.Consume(
                    queue=queue, consumer_tag=tag, no_ack=no_ack, exclusive=exclusive, arguments=arguments
                ),
                commands.Basic.ConsumeOk,
            )
        except BaseException:
            self._consumers.pop(tag, None)
            raise
        return consumer

    async def get(self, queue: str, no_ack: bool = False) -> Delivery | None:
        """basic.get: one message or None if the queue is empty. Raises ChannelError."""
        return await self._call(
            commands.Basic.Get(queue=queue, no_ack=no_ack), commands.Basic.GetOk, commands.Basic.GetEmpty
        )

    def ack(self, delivery_tag: int, multiple: bool = False) -> None:
        """Buffer a basic.ack (sent with the next write)."""
        if self.error is not None:
            raise self.error
        self.connection._send_method(
            self.number, commands.Basic.Ack(delivery_tag=delivery_tag, multiple=multiple)
        )

    def nack(self, delivery_tag: int, multiple: bool = False, requeue: bool = True) -> None:
        """Buffer a basic.nack (sent with the next write)."""
        if self.error is not None:
            raise self.error
        self.connection._send_method(
            self.number, commands.Basic.Nack(delivery_tag=delivery_tag, multiple=multiple, requeue=requeue)
        )

    def reject(self, delivery_tag: int, requeue: bool = True) -> None:
        """Buffer a basic.reject (sent with the next write)."""
        if self.error is not None:
            raise self.error
        self.connection._send_method(
            self.number, commands.Basic.Reject(delivery_tag=delivery_tag, requeue=requeue)
        )

    # -- amq.leveret.api ----------------------------------------------------------
    async def rpc(self, operation: str, payload: dict, timeout: float | None = None) -> dict:
        """Call ``amq.leveret.api`` over direct reply-to; the reply's fields. Raises
        RPCError for ``{"ok": false}``, a bad reply or none within ``timeout`` seconds;
        ChannelError 404 if the broker has no such exchange."""
        conn = self.connection
        if self._reply_consumer is None or self._reply_consumer.cancelled:
            self._reply_consumer = await self.consume(DIRECT_REPLY_TO, no_ack=True, callback=self._on_reply)
        correlation = uuid.uuid4().hex
        future = self._replies[correlation] = asyncio.get_running_loop().create_future()
        limit = timeout or conn.timeout
        try:
            self.publish(
                API_EXCHANGE,
                operation,
                json.dumps(payload).encode(),
                {
                    "reply_to": DIRECT_REPLY_TO,
                    "correlation_id": correlation,
                    "content_type": "application/json",
                },
            )
            conn._flush()
            try:
                body = await asyncio.wait_for(future, limit)
            except TimeoutError:
                raise RPCError(
                    f"{conn.safe_url}: no reply to {API_EXCHANGE} {operation!r} "
                    f"within {limit:g}s (is this a leveret broker with the "
                    "API?)"
                ) from None
        finally:
            self._replies.pop(correlation, None)
        try:
            reply = json.loads(body)
        except ValueError:
            raise RPCError(f"{API_EXCHANGE} {operation}: bad reply {body[:200]!r}") from None
        if not isinstance(reply, dict) or not reply.get("ok"):
            error = reply.get("error", "failed") if isinstance(reply, dict) else reply
            raise RPCError(f"{API_EXCHANGE} {operation} {json.dumps(payload)}: {error}")
        return reply

    def _on_reply(self, delivery: Delivery) -> None:
        _resolve(self._replies.get(delivery.props.get("correlation_id", "")), delivery.body)

    # -- incoming frames ----------------------------------------------------------
    def _closed(self, error: BaseException) -> None:
        self.is_open = False
        if self.error is None:
            self.error = error
        self.confirming = False
        _fail(self._waiter, error)
        _resolve(self._confirm_waiter)
        for future in self._replies.values():
            _fail(future, error)
        for consumer in self._consumers.values():
            consumer._end(error)
        self._consumers.clear()
        self.connection._channels.pop(self.number, None)

    def _deliver(self, delivery: Delivery) -> None:
        consumer = self._consumers.get(delivery.consumer_tag)
        if consumer is not None:
            consumer._push(delivery)
        # else: a late delivery for a cancelled consumer: dropped (requeued at close)

    def _on_method(self, value: Any) -> None:
        kind = type(value)
        if kind is commands.Basic.Deliver:
            self._content = ["deliver", value, None, [], 0]
        elif kind is commands.Basic.Ack:
            self._settle(value.delivery_tag, value.multiple, ACKED)
        elif kind is commands.Basic.Nack:
            self._settle(value.delivery_tag, value.multiple, NACKED)
        elif kind is commands.Basic.GetOk:
            self._content = ["get", value, None, [], 0]
        elif kind is commands.Basic.Return:
            self._content = ["return", value, None, [], 0]
        elif kind is commands.Basic.Cancel:  # the broker cancelled a consumer
            consumer = self._consumers.pop(value.consumer_tag, None)
            if not value.nowait:
                self.connection._send_method(
                    self.number, commands.Basic.CancelOk(consumer_tag=value.consumer_tag)
                )
            if consumer is not None:
                consumer._end()
        elif kind is commands.Channel.Close:
            self.connection._send_method(self.number, commands.Channel.CloseOk())
            self.connection._flush()
            self._closed(errors.from_reply(ChannelError, value.reply_code, value.reply_text))
        elif kind is commands.Channel.Flow:
            self.connection._send_method(self.number, commands.Channel.FlowOk(value.active))
        elif self._waiter is not None and isinstance(value, self._expect):
            if kind is commands.Basic.GetEmpty:
                _resolve(self._waiter, None)
            else:
                _resolve(self._waiter, value)
        # anything else (a late reply to a timed-out call): ignored

    def _on_content(self, value: Any) -> None:
        content = self._content
        if content is None:
            raise ConnectionError(
                errors.UNEXPECTED_FRAME, f"content frame on channel {self.number} without a method"
            )
        if content[2] is None:
            if not isinstance(value, pamqp_header.ContentHeader):
                raise ConnectionError(errors.UNEXPECTED_FRAME, "expected a content header")
            content[2], content[4] = value, value.body_size
        else:
            if not isinstance(value, ContentBody):
                raise ConnectionError(errors.UNEXPECTED_FRAME, "expected a content body")
            content[3].append(value.value)
            content[4] -= len(value.value)
        if content[4] > 0:
            return
        self._content = None
        kind, method, head, parts = content[:4]
        delivery = Delivery(
            getattr(method, "delivery_tag", 0),
            getattr(method, "redelivered", False),
            method.exchange,
            method.routing_key,
            _props(head),
            b"".join(parts),
            getattr(method, "consumer_tag", ""),
            self.number,
        )
        if kind == "deliver":
            self._deliver(delivery)
        elif kind == "get":
            _resolve(self._waiter, delivery)
        else:
            self.returned.append(delivery)


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
        ConnectionError (403 refused login, 530 no vhost access, ...) from the broker,
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
        except ConnectionError as exc:
            message = f"login to {self.safe_url} refused for user {p.user!r}: {exc}"
            if isinstance(exc, ConnectionLost):
                raise ConnectionLost(message) from None
            raise errors.from_reply(ConnectionError, exc.reply_code, message) from None
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
        """A newly opened channel. Raises ConnectionError if the connection is closed."""
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
            self._protocol_error(ConnectionError(errors.FRAME_ERROR, f"bad frame: {exc!r}"))
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
            self._protocol_error(ConnectionError(errors.FRAME_ERROR, f"bad frame: {exc!r}"))
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
                    ConnectionError,
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
                ConnectionError(errors.COMMAND_INVALID, f"expected {self._expect[0].__name__}, got {value!r}")
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


class BlockingClient:
    """A blocking client on a private event loop: each call runs the asyncio client's
    coroutine to completion (no thread). One channel at a time, opened on demand: after a
    :class:`ChannelError` the next call opens a fresh one. Use as a context manager;
    never pickled (open one per process)."""

    def __init__(self, url: str, timeout: float = 10.0, name: str = "leveret") -> None:
        """Connect (see :meth:`Connection.connect`; ``timeout`` in seconds). Raises
        ClientError, ConnectionLost, ConnectionError, Timeout."""
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
        Raises ChannelError/ConnectionError if the channel or connection closes."""
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
