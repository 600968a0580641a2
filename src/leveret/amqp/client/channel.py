"""One channel of the client: declares, publishes with windowed confirms, consumers, RPC."""

from __future__ import annotations

import asyncio
import json
import struct
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from pamqp import commands, header as pamqp_header
from pamqp.body import ContentBody

from .. import errors
from ..delivery import Delivery
from ..errors import AMQPConnectionError, ChannelError
from ..frames import encode_publish
from ..properties import PROPERTY_NAMES, encode_properties, properties_dict, shortstr
from .consumer import Consumer
from .errors import PublishError, RPCError, Timeout
from .futures import fail as _fail, resolve as _resolve

if TYPE_CHECKING:  # the other end of a reference cycle
    from .connection import Connection

_FRAME_HEAD = struct.Struct(">BHI")
_CONTENT_PREFIX = struct.Struct(">HHQH").pack
_PUBLISH_ID = struct.Struct(">HHH").pack(60, 40, 0)
API_EXCHANGE = "amq.leveret.api"
DIRECT_REPLY_TO = "amq.rabbitmq.reply-to"
PENDING, ACKED, NACKED = 0, 1, 2  # publish confirm states
_METHODS: dict[str, type] = {
    cls.name: cls  # type: ignore[attr-defined]
    for cls in commands.INDEX_MAPPING.values()
}


def _props(properties: pamqp_header.ContentHeader) -> dict[str, Any]:
    p = properties.properties
    props = {name: value for name in PROPERTY_NAMES if (value := getattr(p, name)) is not None}
    if props.get("cluster_id") == "":  # pamqp's default: not on the wire
        del props["cluster_id"]
    return props


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
        #: Called as ``on_confirm(tag, multiple, acked)`` after each basic.ack/nack of a
        #: publish was counted (:attr:`settled_below` then says how far it reaches), for
        #: code that reacts to confirms by callback rather than :meth:`wait_confirms`.
        self.on_confirm: Callable[[int, bool, bool], None] | None = None
        self._method_frames: dict[tuple[str, str, bool], bytes] = {}  # publish_encoded's
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
        basic.get-ok). Raises ChannelError, AMQPConnectionError, Timeout (``timeout`` in
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

    @property
    def settled_below(self) -> int:
        """Every publish with a lower confirm sequence number was acked or nacked."""
        return self._low

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
        outside confirm mode). Raises ChannelError/AMQPConnectionError if closed,
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

    def publish_encoded(
        self, exchange: str, routing_key: str, header: bytes, body: bytes, mandatory: bool = False
    ) -> int:
        """Buffer one basic.publish whose content header payload ``header`` (class id,
        weight, body size, property flags and list, as received) is already encoded: it
        goes out byte for byte. Returns the confirm sequence number (0 outside confirm
        mode). Raises as :meth:`publish`."""
        if self.error is not None:
            raise self.error
        if self._nack_error is not None:
            raise self._nack_error
        conn = self.connection
        number = self.number
        pack = _FRAME_HEAD.pack
        key = (exchange, routing_key, mandatory)
        method_frame = self._method_frames.get(key)
        if method_frame is None:
            method = b"".join(
                (_PUBLISH_ID, shortstr(exchange), shortstr(routing_key), b"\x01" if mandatory else b"\x00")
            )
            method_frame = pack(1, number, len(method)) + method + b"\xce"
            if len(self._method_frames) >= 1024:
                self._method_frames.clear()
            self._method_frames[key] = method_frame
        parts = [method_frame, pack(2, number, len(header)), header, b"\xce"]
        size, step = len(body), conn.frame_max - 8
        for i in range(0, size, step):
            chunk = body[i : i + step] if size > step else body
            parts += (pack(3, number, len(chunk)), chunk, b"\xce")
        conn._write(b"".join(parts))
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
        PublishError for a nack (``on_nack="raise"``), ChannelError/AMQPConnectionError if
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
        if self.on_confirm is not None:
            self.on_confirm(tag, multiple, value == ACKED)

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
            raise AMQPConnectionError(
                errors.UNEXPECTED_FRAME, f"content frame on channel {self.number} without a method"
            )
        if content[2] is None:
            if not isinstance(value, pamqp_header.ContentHeader):
                raise AMQPConnectionError(errors.UNEXPECTED_FRAME, "expected a content header")
            content[2], content[4] = value, value.body_size
        else:
            if not isinstance(value, ContentBody):
                raise AMQPConnectionError(errors.UNEXPECTED_FRAME, "expected a content body")
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
