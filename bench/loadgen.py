"""A small, fast asyncio AMQP 0-9-1 client used only as a load generator.

General-purpose clients (pika, aio-pika) spend tens of microseconds of
Python per message, which would make the *client* the bottleneck.  This
client avoids that:

* Publishing: the method, content-header and body frames of a message are
  marshalled once (with pamqp) and the resulting bytes are repeated, so a
  batch of N messages is one ``bytes * N`` and one ``transport.write``.
  Back-pressure is respected: writers ``await drain()`` while the transport
  buffer is above its high-water mark.
* Consuming and confirms: incoming data is parsed by a hand-written
  incremental frame parser (``struct`` on the 7-byte frame header) that only
  decodes what it needs: the delivery tag of ``basic.deliver``, the body size
  of content headers, the first 8 body bytes when latency is measured, and
  ``basic.ack``/``basic.nack`` from the broker for publisher confirms.
  Deliveries are acknowledged with ``multiple=True`` every ``ack_every``
  messages.  Every other method frame goes through ``pamqp.frame.unmarshal``
  and answers the oldest pending RPC on its channel.

Times are in seconds unless a name says otherwise; latency timestamps are
``time.monotonic_ns()`` (CLOCK_MONOTONIC, comparable across processes on one
Linux host).
"""

from __future__ import annotations

import asyncio
import collections
import struct
import time
from typing import Any

from pamqp import commands, frame, header
from pamqp.body import ContentBody

FRAME_METHOD = 1
FRAME_HEADER = 2
FRAME_BODY = 3
FRAME_HEARTBEAT = 8
FRAME_END = 0xCE

_HDR = struct.Struct(">BHI")  # frame type, channel, payload size
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_ACK = struct.Struct(">BHIHHQBB")  # a complete basic.ack method frame

_BASIC_DELIVER = (60 << 16) | 60
_BASIC_ACK = (60 << 16) | 80
_BASIC_NACK = (60 << 16) | 120


class AMQPError(Exception):
    """The broker closed a channel or the connection, or the socket failed."""


def ack_frame(channel: int, delivery_tag: int, multiple: bool) -> bytes:
    """Bytes of one ``basic.ack`` method frame (13-byte payload)."""
    return _ACK.pack(FRAME_METHOD, channel, 13, 60, 80, delivery_tag, 1 if multiple else 0, FRAME_END)


def message_frames(channel: int, exchange: str, routing_key: str, body: bytes,
                   frame_max: int = 131072, delivery_mode: int | None = None) -> bytes:
    """Marshal one complete ``basic.publish`` (method + header + body frames).

    The body is split into body frames of at most ``frame_max - 8`` bytes.
    """
    parts = [
        frame.marshal(commands.Basic.Publish(exchange=exchange, routing_key=routing_key), channel),
        frame.marshal(header.ContentHeader(0, len(body), commands.Basic.Properties(delivery_mode=delivery_mode)),
                      channel),
    ]
    step = frame_max - 8
    for i in range(0, len(body), step):
        parts.append(frame.marshal(ContentBody(body[i:i + step]), channel))
    return b"".join(parts)


class Channel:
    """One AMQP channel: RPC helpers plus counters kept by the fast parser.

    Consumer counters: ``delivered`` (messages fully received), ``last_tag``
    (newest delivery tag), ``latencies_ns`` (list of end-to-end latencies in
    nanoseconds, only when ``measure_latency`` is set).
    Confirm counters: ``confirmed`` (distinct publishes acked by the broker),
    ``nacked`` (publishes nacked).
    """

    def __init__(self, conn: "Connection", channel_id: int) -> None:
        self.conn = conn
        self.id = channel_id
        self._pending: collections.deque[asyncio.Future] = collections.deque()
        self.closed: AMQPError | None = None
        # consumer state
        self.delivered = 0
        self.last_tag = 0
        self._unacked = 0
        self.ack_every = 0  # 0 = no manual acks (no_ack consumer or none)
        self.measure_latency = False
        self.latencies_ns: list[int] = []
        self._body_left = 0
        self._body_first = False
        # settling consumer (consume_settling): per-message decisions keyed by a body id
        self.settle_counts: bytearray | None = None  # deliveries seen, indexed by message id
        self.settle_rejects = 0       # settle each message this many times before acking it
        self.settle_method = 120      # 120 basic.nack (multiple=False), 90 basic.reject
        self.settle_bits = 2          # nack: bit 1 = requeue; reject: bit 0 = requeue
        self.settle_out: list[bytes] = []  # frames to write at the end of this read
        self._last_acked_tag = 0
        self.rejected = 0             # nacks/rejects sent
        self.acked = 0                # messages acknowledged (counted when the ack is decided)
        self.returned = 0             # first sighting after the last rejection of a message
        self.held_peak = 0            # max of rejected - returned (messages away from the consumer)
        # publisher-confirm state
        self.published = 0
        self._confirm_floor = 0  # every tag <= floor is confirmed
        self._confirm_singles: set[int] = set()
        self.nacked = 0

    # ----------------------------------------------------------- RPC layer
    async def rpc(self, method: Any) -> Any:
        """Send a synchronous method and return the broker's reply frame."""
        if self.closed:
            raise self.closed
        data = frame.marshal(method, self.id)
        fut = self.conn.loop.create_future()
        self._pending.append(fut)
        self.conn.write(data)
        return await fut

    def _reply(self, value: Any) -> None:
        if self._pending:
            fut = self._pending.popleft()
            if not fut.done():
                fut.set_result(value)

    def _fail(self, exc: AMQPError) -> None:
        self.closed = exc
        while self._pending:
            fut = self._pending.popleft()
            if not fut.done():
                fut.set_exception(exc)

    async def queue_declare(self, queue: str = "", *, durable: bool = False, passive: bool = False,
                            exclusive: bool = False, auto_delete: bool = False,
                            arguments: dict | None = None) -> commands.Queue.DeclareOk:
        return await self.rpc(commands.Queue.Declare(queue=queue, durable=durable, passive=passive,
                                                     exclusive=exclusive, auto_delete=auto_delete,
                                                     arguments=arguments))

    async def queue_delete(self, queue: str) -> None:
        await self.rpc(commands.Queue.Delete(queue=queue))

    async def queue_bind(self, queue: str, exchange: str, routing_key: str = "") -> None:
        await self.rpc(commands.Queue.Bind(queue=queue, exchange=exchange, routing_key=routing_key))

    async def exchange_declare(self, exchange: str, exchange_type: str = "direct", *,
                               durable: bool = False, auto_delete: bool = False) -> None:
        await self.rpc(commands.Exchange.Declare(exchange=exchange, exchange_type=exchange_type,
                                                 durable=durable, auto_delete=auto_delete))

    async def exchange_declare_passive(self, exchange: str) -> None:
        await self.rpc(commands.Exchange.Declare(exchange=exchange, passive=True))

    async def exchange_delete(self, exchange: str) -> None:
        await self.rpc(commands.Exchange.Delete(exchange=exchange))

    async def qos(self, prefetch_count: int) -> None:
        await self.rpc(commands.Basic.Qos(prefetch_count=prefetch_count))

    async def confirm_select(self) -> None:
        await self.rpc(commands.Confirm.Select())

    async def consume(self, queue: str, *, ack_every: int = 100, measure_latency: bool = False,
                      consumer_tag: str = "") -> str:
        """Start a consumer; returns its tag.

        ``ack_every``: acknowledge with multiple=True after this many
        deliveries (0 = ``no_ack`` consumer).  ``measure_latency``: read the
        first 8 body bytes as a big-endian ``time.monotonic_ns()`` timestamp.
        """
        self.ack_every = ack_every
        self.measure_latency = measure_latency
        ok = await self.rpc(commands.Basic.Consume(queue=queue, consumer_tag=consumer_tag,
                                                   no_ack=(ack_every == 0)))
        return ok.consumer_tag

    async def consume_settling(self, queue: str, n_ids: int, rejects: int, *, requeue: bool = True,
                               method: str = "nack", ack_every: int = 100, consumer_tag: str = "") -> str:
        """Start a consumer that settles by message id (the first 8 body bytes, big-endian,
        in ``range(n_ids)``): the first ``rejects`` deliveries of each id are answered with
        ``basic.nack`` (``multiple=False``) or ``basic.reject``, with ``requeue``; the next
        one is acknowledged (``multiple=True`` every ``ack_every`` acked messages, so it
        covers only acked tags: earlier nacks are written first). Frames decided during
        one read are written together. Counters: ``rejected``, ``acked``, ``returned``,
        ``held_peak``."""
        self.ack_every = ack_every
        self.measure_latency = False
        self.settle_counts = bytearray(n_ids)
        self.settle_rejects = rejects
        if method == "nack":
            self.settle_method, self.settle_bits = 120, 2 if requeue else 0
        elif method == "reject":
            self.settle_method, self.settle_bits = 90, 1 if requeue else 0
        else:
            raise ValueError(f"method must be nack or reject, not {method!r}")
        ok = await self.rpc(commands.Basic.Consume(queue=queue, consumer_tag=consumer_tag, no_ack=False))
        return ok.consumer_tag

    async def cancel(self, consumer_tag: str) -> None:
        await self.rpc(commands.Basic.Cancel(consumer_tag=consumer_tag))

    def ack_pending(self) -> None:
        """Acknowledge (multiple=True) everything delivered but not yet acked."""
        if self.settle_counts is not None:
            if self._unacked:
                self.conn.write(ack_frame(self.id, self._last_acked_tag, True))
                self._unacked = 0
        elif self._unacked and self.ack_every:
            self.conn.write(ack_frame(self.id, self.last_tag, True))
            self._unacked = 0

    async def close(self) -> None:
        if not self.closed and not self.conn.closed:
            await self.rpc(commands.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
            self.closed = AMQPError("channel closed by client")

    # -------------------------------------------------------- publish side
    def message(self, exchange: str, routing_key: str, body: bytes, persistent: bool = False) -> bytes:
        """Pre-marshalled frames of one publish on this channel."""
        return message_frames(self.id, exchange, routing_key, body, self.conn.frame_max,
                              2 if persistent else None)

    @property
    def confirmed(self) -> int:
        """Number of distinct publishes the broker has confirmed (ack or nack)."""
        return self._confirm_floor + len(self._confirm_singles)

    def _on_confirm(self, tag: int, multiple: bool) -> None:
        if multiple:
            if tag > self._confirm_floor:
                self._confirm_floor = tag
                if self._confirm_singles:
                    self._confirm_singles = {t for t in self._confirm_singles if t > tag}
        elif tag == self._confirm_floor + 1:
            self._confirm_floor = tag
        elif tag > self._confirm_floor:
            self._confirm_singles.add(tag)
        singles = self._confirm_singles
        while singles and (self._confirm_floor + 1) in singles:
            self._confirm_floor += 1
            singles.discard(self._confirm_floor)


class Connection(asyncio.Protocol):
    """An AMQP connection with a fast incremental frame parser.

    Open with ``await Connection.open(host, port)``; then ``await
    conn.channel()``.  ``write()`` queues bytes, ``drain()`` waits while the
    transport's write buffer is above its high-water mark.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._channels: dict[int, Channel] = {}
        self._chan0 = Channel(self, 0)
        self._channels[0] = self._chan0
        self._next_channel = 1
        self._paused = False
        self._drain_waiters: list[asyncio.Future] = []
        self._progress_waiters: list[asyncio.Future] = []
        self._progress = False
        self.closed: AMQPError | None = None
        self.frame_max = 131072
        self.server_properties: dict = {}
        self.blocked = False

    # ------------------------------------------------------------- opening
    @classmethod
    async def open(cls, host: str, port: int, user: str = "guest", password: str = "guest",
                   vhost: str = "/", timeout: float = 10.0) -> "Connection":
        """Connect and perform the AMQP handshake (SASL PLAIN, heartbeats off)."""
        loop = asyncio.get_running_loop()
        _, conn = await asyncio.wait_for(loop.create_connection(lambda: cls(loop), host, port), timeout)
        try:
            await asyncio.wait_for(conn._handshake(user, password, vhost), timeout)
        except BaseException:
            conn.abort()
            raise
        return conn

    async def _handshake(self, user: str, password: str, vhost: str) -> None:
        c0 = self._chan0
        start_fut = self.loop.create_future()
        c0._pending.append(start_fut)
        self.transport.write(frame.marshal(header.ProtocolHeader(), 0))
        start = await start_fut
        if not isinstance(start, commands.Connection.Start):
            raise AMQPError(f"expected connection.start, got {start!r}")
        self.server_properties = start.server_properties or {}
        tune_fut = self.loop.create_future()
        c0._pending.append(tune_fut)
        self.write(frame.marshal(commands.Connection.StartOk(
            client_properties={
                "product": "leveret-bench-loadgen",
                "capabilities": {"publisher_confirms": True, "basic.nack": True,
                                 "consumer_cancel_notify": True, "connection.blocked": True},
            },
            mechanism="PLAIN", response=f"\0{user}\0{password}", locale="en_US"), 0))
        tune = await tune_fut
        if not isinstance(tune, commands.Connection.Tune):
            raise AMQPError(f"expected connection.tune, got {tune!r}")
        self.frame_max = tune.frame_max or 131072
        self.write(frame.marshal(commands.Connection.TuneOk(
            channel_max=tune.channel_max, frame_max=self.frame_max, heartbeat=0), 0))
        await c0.rpc(commands.Connection.Open(virtual_host=vhost))

    async def channel(self) -> Channel:
        """Open a new channel."""
        ch = Channel(self, self._next_channel)
        self._next_channel += 1
        self._channels[ch.id] = ch
        await ch.rpc(commands.Channel.Open())
        return ch

    async def close(self) -> None:
        """Close politely (connection.close / close-ok), then the socket."""
        if self.closed or self.transport is None:
            return
        try:
            close = commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)
            await asyncio.wait_for(self._chan0.rpc(close), 5)
        except (AMQPError, asyncio.TimeoutError, ConnectionError):
            pass
        self.closed = self.closed or AMQPError("connection closed by client")
        self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    # ------------------------------------------------------------- writing
    def write(self, data: bytes) -> None:
        if self.closed:
            raise self.closed
        self.transport.write(data)

    async def drain(self) -> None:
        """Wait while the transport is paused by back-pressure."""
        while self._paused:
            if self.closed:
                raise self.closed
            fut = self.loop.create_future()
            self._drain_waiters.append(fut)
            await fut
        if self.closed:
            raise self.closed

    async def wait_progress(self, timeout: float | None = None) -> None:
        """Wait until the parser has seen deliveries or confirms (or timeout)."""
        if self.closed:
            raise self.closed
        fut = self.loop.create_future()
        self._progress_waiters.append(fut)
        try:
            await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            pass

    # ---------------------------------------------------- protocol callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.set_write_buffer_limits(high=1 << 20, low=256 << 10)  # type: ignore[attr-defined]

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._wake(self._drain_waiters)

    def connection_lost(self, exc: Exception | None) -> None:
        err = self.closed or AMQPError(f"connection lost: {exc!r}" if exc else "connection lost")
        self.closed = err
        for ch in self._channels.values():
            ch._fail(err)
        self._paused = False
        self._wake(self._drain_waiters)
        self._wake(self._progress_waiters)

    @staticmethod
    def _wake(waiters: list[asyncio.Future]) -> None:
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)
        waiters.clear()

    def data_received(self, data: bytes) -> None:  # noqa: C901 - hot path, kept flat on purpose
        buf = self._buf
        buf += data
        n = len(buf)
        pos = 0
        chans = self._channels
        unpack_hdr = _HDR.unpack_from
        unpack_u32 = _U32.unpack_from
        unpack_u64 = _U64.unpack_from
        now = 0
        progress = False
        settled = False
        while n - pos >= 8:
            ftype, chid, size = unpack_hdr(buf, pos)
            end = pos + 7 + size
            if end >= n:
                break
            if ftype == FRAME_BODY:
                ch = chans[chid]
                if ch._body_first:
                    ch._body_first = False
                    if ch.settle_counts is not None:
                        self._settle(ch, unpack_u64(buf, pos + 7)[0])
                        settled = True
                    elif ch.measure_latency and size >= 8:
                        if not now:
                            now = time.monotonic_ns()
                        ch.latencies_ns.append(now - unpack_u64(buf, pos + 7)[0])
                ch._body_left -= size
                if ch._body_left <= 0:
                    ch.delivered += 1
                    progress = True
                    if ch.ack_every and ch.settle_counts is None:
                        ch._unacked += 1
                        if ch._unacked >= ch.ack_every:
                            self.transport.write(_ACK.pack(FRAME_METHOD, chid, 13, 60, 80, ch.last_tag, 1, FRAME_END))
                            ch._unacked = 0
            elif ftype == FRAME_HEADER:
                ch = chans[chid]
                body_size = unpack_u64(buf, pos + 11)[0]
                ch._body_left = body_size
                ch._body_first = True
                if body_size == 0:
                    ch.delivered += 1
                    progress = True
                    if ch.ack_every:
                        ch._unacked += 1
                        if ch._unacked >= ch.ack_every:
                            self.transport.write(_ACK.pack(FRAME_METHOD, chid, 13, 60, 80, ch.last_tag, 1, FRAME_END))
                            ch._unacked = 0
            elif ftype == FRAME_METHOD:
                cm = unpack_u32(buf, pos + 7)[0]
                if cm == _BASIC_DELIVER:
                    tag_at = pos + 12 + buf[pos + 11]  # skip consumer-tag shortstr
                    chans[chid].last_tag = unpack_u64(buf, tag_at)[0]
                elif cm == _BASIC_ACK or cm == _BASIC_NACK:
                    ch = chans[chid]
                    tag = unpack_u64(buf, pos + 11)[0]
                    ch._on_confirm(tag, bool(buf[pos + 19] & 1))
                    if cm == _BASIC_NACK:
                        ch.nacked += 1
                    progress = True
                else:
                    self._on_method(bytes(buf[pos:end + 1]))
            # heartbeats (type 8) are ignored: we negotiate heartbeat=0
            pos = end + 1
        if pos:
            del buf[:pos]
        if settled:
            for ch in chans.values():
                if ch.settle_out:
                    self.transport.write(b"".join(ch.settle_out))
                    ch.settle_out.clear()
        if progress and self._progress_waiters:
            self._wake(self._progress_waiters)

    @staticmethod
    def _settle(ch: Channel, msg_id: int) -> None:
        """Decide the delivery ``ch.last_tag`` of message ``msg_id`` (settling consumer)."""
        counts = ch.settle_counts
        seen = counts[msg_id] + 1
        counts[msg_id] = seen
        tag = ch.last_tag
        if seen <= ch.settle_rejects:
            ch.settle_out.append(_ACK.pack(FRAME_METHOD, ch.id, 13, 60, ch.settle_method, tag,
                                           ch.settle_bits, FRAME_END))
            ch.rejected += 1
            if seen > 1:
                ch.returned += 1
            held = ch.rejected - ch.returned
            if held > ch.held_peak:
                ch.held_peak = held
            return
        if seen == ch.settle_rejects + 1:
            if seen > 1:
                ch.returned += 1
            ch.acked += 1
        # else: a delivery of an already acked id (should not happen); ack it again
        ch._last_acked_tag = tag
        ch._unacked += 1
        if ch._unacked >= ch.ack_every:
            ch.settle_out.append(_ACK.pack(FRAME_METHOD, ch.id, 13, 60, 80, tag, 1, FRAME_END))
            ch._unacked = 0

    def _on_method(self, raw: bytes) -> None:
        """Slow path: decode a method frame with pamqp and dispatch it."""
        _, chid, value = frame.unmarshal(raw)
        ch = self._channels.get(chid)
        if isinstance(value, commands.Connection.Close):
            err = AMQPError(f"connection closed by broker: {value.reply_code} {value.reply_text} "
                            f"(class {value.class_id} method {value.method_id})")
            self.closed = err
            try:
                self.transport.write(frame.marshal(commands.Connection.CloseOk(), 0))
            finally:
                for c in self._channels.values():
                    c._fail(err)
                self._wake(self._progress_waiters)
                self.transport.close()
        elif isinstance(value, commands.Connection.CloseOk):
            self.closed = AMQPError("connection closed")
            self._chan0._reply(value)
        elif isinstance(value, commands.Channel.Close):
            self.transport.write(frame.marshal(commands.Channel.CloseOk(), chid))
            if ch is not None:
                ch._fail(AMQPError(f"channel {chid} closed by broker: {value.reply_code} {value.reply_text}"))
            self._wake(self._progress_waiters)
        elif isinstance(value, commands.Connection.Blocked):
            self.blocked = True
        elif isinstance(value, commands.Connection.Unblocked):
            self.blocked = False
        elif isinstance(value, (commands.Basic.Cancel, commands.Basic.Return)):
            pass  # not expected in the benchmark workloads
        elif ch is not None:
            ch._reply(value)


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop if installed, else the default asyncio loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def loop_name() -> str:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"
