"""The load generator: :mod:`leveret.amqp.client` with a counting fast path.

General-purpose clients (pika, aio-pika) spend tens of microseconds of
Python per message, which would make the *client* the bottleneck. The
connection, handshake, channels and synchronous methods are
:class:`leveret.amqp.client.Connection`'s; on top of them:

* Publishing: the method, content-header and body frames of a message are
  encoded once (:func:`leveret.amqp.frames.encode_publish`) and the resulting bytes are repeated, so a
  batch of N messages is one ``bytes * N`` and one ``transport.write``.
  Back-pressure is respected: writers ``await drain()`` while the transport
  buffer is above its high-water mark.
* Consuming and confirms: incoming data is parsed by a hand-written
  incremental frame parser (``struct`` on the 7-byte frame header) that only
  decodes what it needs: the delivery tag of ``basic.deliver``, the body size
  of content headers, the first 8 body bytes when latency is measured, and
  ``basic.ack``/``basic.nack`` from the broker for publisher confirms.
  Deliveries are acknowledged with ``multiple=True`` every ``ack_every``
  messages.  Every other method frame is decoded by the client
  and goes to the client's own frame handling (replies, channel.close,
  connection.close).

Times are in seconds unless a name says otherwise; latency timestamps are
``time.monotonic_ns()`` (CLOCK_MONOTONIC, comparable across processes on one
Linux host).
"""

from __future__ import annotations

import asyncio
import struct
import time
import urllib.parse

from pamqp import commands

from leveret.amqp import client
from leveret.amqp.client import AMQPError
from leveret.amqp.delivery import decode_frame
from leveret.amqp.frames import (
    FRAME_BODY,
    FRAME_END,
    FRAME_HEADER,
    FRAME_METHOD,
    encode_publish,
)

__all__ = ["AMQPError", "Channel", "Connection", "ack_frame", "message_frames"]

_HDR = struct.Struct(">BHI")  # frame type, channel, payload size
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_ACK = struct.Struct(">BHIHHQBB")  # a complete basic.ack method frame

_BASIC_DELIVER = (60 << 16) | 60
_BASIC_ACK = (60 << 16) | 80
_BASIC_NACK = (60 << 16) | 120


def ack_frame(channel: int, delivery_tag: int, multiple: bool) -> bytes:
    """Bytes of one ``basic.ack`` method frame (13-byte payload)."""
    return _ACK.pack(FRAME_METHOD, channel, 13, 60, 80, delivery_tag, 1 if multiple else 0, FRAME_END)


def message_frames(channel: int, exchange: str, routing_key: str, body: bytes,
                   frame_max: int = 131072, delivery_mode: int | None = None) -> bytes:
    """Marshal one complete ``basic.publish`` (method + header + body frames).

    The body is split into body frames of at most ``frame_max - 8`` bytes.
    """
    return encode_publish(channel, exchange, routing_key, body,
                          {"delivery_mode": delivery_mode}, frame_max)


class Channel(client.Channel):
    """One AMQP channel (declarations, qos, confirm.select: the client's) plus counters
    kept by the fast parser.

    Consumer counters: ``delivered`` (messages fully received), ``last_tag``
    (newest delivery tag), ``latencies_ns`` (list of end-to-end latencies in
    nanoseconds, only when ``measure_latency`` is set).
    Confirm counters: ``confirmed`` (distinct publishes acked by the broker),
    ``nacked`` (publishes nacked).
    """

    def __init__(self, conn: Connection, channel_id: int) -> None:
        super().__init__(conn, channel_id)
        self.conn = conn
        self.id = channel_id
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
        # publisher-confirm state (the fast parser's, not the client's window)
        self.published = 0
        self._confirm_floor = 0  # every tag <= floor is confirmed
        self._confirm_singles: set[int] = set()
        self.nacked = 0

    @property
    def closed(self) -> BaseException | None:
        return self.error

    async def exchange_declare_passive(self, exchange: str) -> None:
        await self.exchange_declare(exchange, passive=True)

    async def consume(self, queue: str, *, ack_every: int = 100, measure_latency: bool = False,
                      consumer_tag: str = "") -> str:
        """Start a consumer; returns its tag.

        ``ack_every``: acknowledge with multiple=True after this many
        deliveries (0 = ``no_ack`` consumer).  ``measure_latency``: read the
        first 8 body bytes as a big-endian ``time.monotonic_ns()`` timestamp.
        """
        self.ack_every = ack_every
        self.measure_latency = measure_latency
        ok = await self._call(commands.Basic.Consume(queue=queue, consumer_tag=consumer_tag,
                                                     no_ack=(ack_every == 0)),
                              commands.Basic.ConsumeOk)
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
        ok = await self._call(commands.Basic.Consume(queue=queue, consumer_tag=consumer_tag,
                                                     no_ack=False), commands.Basic.ConsumeOk)
        return ok.consumer_tag

    async def cancel(self, consumer_tag: str) -> None:  # type: ignore[override]
        await self._call(commands.Basic.Cancel(consumer_tag=consumer_tag),
                         commands.Basic.CancelOk)

    def ack_pending(self) -> None:
        """Acknowledge (multiple=True) everything delivered but not yet acked."""
        if self.settle_counts is not None:
            if self._unacked:
                self.conn.write(ack_frame(self.id, self._last_acked_tag, True))
                self._unacked = 0
        elif self._unacked and self.ack_every:
            self.conn.write(ack_frame(self.id, self.last_tag, True))
            self._unacked = 0

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


class Connection(client.Connection):
    """:class:`leveret.amqp.client.Connection` with the load generator's fast parser.

    Open with ``await Connection.open(host, port)``; then ``await
    conn.channel()``.  ``write()`` queues bytes (sent once per loop turn, or at once
    above 256 KiB), ``drain()`` waits while the transport's write buffer is above its
    high-water mark.
    """

    channel_class = Channel

    def __init__(self, url: str, timeout: float, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(url, timeout, loop)
        self.loop = loop
        self._progress_waiters: list[asyncio.Future] = []

    # ------------------------------------------------------------- opening
    @classmethod
    async def open(cls, host: str, port: int, user: str = "guest", password: str = "guest",
                   vhost: str = "/", timeout: float = 10.0) -> Connection:
        """Connect and perform the AMQP handshake (SASL PLAIN, heartbeats off); later
        calls have no time limit of their own (the workloads set theirs)."""
        quote = urllib.parse.quote
        url = (f"amqp://{quote(user, safe='')}:{quote(password, safe='')}@{host}:{port}/"
               f"{quote(vhost, safe='')}")
        conn = await cls.connect(url, timeout=timeout, name="leveret-bench-loadgen")
        conn.timeout = 1e9
        return conn

    @property
    def closed(self) -> BaseException | None:
        return self.error

    @property
    def transport(self) -> asyncio.Transport | None:
        return self._transport

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    # ------------------------------------------------------------- writing
    def write(self, data: bytes) -> None:
        self._write(data)

    async def wait_progress(self, timeout: float | None = None) -> None:
        """Wait until the parser has seen deliveries or confirms (or timeout)."""
        if self.closed:
            raise self.closed
        fut = self.loop.create_future()
        self._progress_waiters.append(fut)
        try:
            await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            pass

    # ---------------------------------------------------- protocol callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        transport.set_write_buffer_limits(high=1 << 20, low=256 << 10)  # type: ignore[attr-defined]

    def _lost(self, error: BaseException) -> None:
        super()._lost(error)
        self._wake(self._progress_waiters)

    @staticmethod
    def _wake(waiters: list[asyncio.Future]) -> None:
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)
        waiters.clear()

    def data_received(self, data: bytes) -> None:  # hot path, kept flat on purpose
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
                ch = chans.get(chid)
                if ch is None:  # a closed channel's late frames
                    pos = end + 1
                    continue
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
                            self._write(_ACK.pack(FRAME_METHOD, chid, 13, 60, 80, ch.last_tag, 1, FRAME_END))
                            ch._unacked = 0
            elif ftype == FRAME_HEADER:
                ch = chans.get(chid)
                if ch is None:
                    pos = end + 1
                    continue
                body_size = unpack_u64(buf, pos + 11)[0]
                ch._body_left = body_size
                ch._body_first = True
                if body_size == 0:
                    ch.delivered += 1
                    progress = True
                    if ch.ack_every:
                        ch._unacked += 1
                        if ch._unacked >= ch.ack_every:
                            self._write(_ACK.pack(FRAME_METHOD, chid, 13, 60, 80, ch.last_tag, 1, FRAME_END))
                            ch._unacked = 0
            elif ftype == FRAME_METHOD:
                cm = unpack_u32(buf, pos + 7)[0]
                ch = chans.get(chid)
                if cm == _BASIC_DELIVER and ch is not None:
                    tag_at = pos + 12 + buf[pos + 11]  # skip consumer-tag shortstr
                    ch.last_tag = unpack_u64(buf, tag_at)[0]
                elif cm in (_BASIC_ACK, _BASIC_NACK) and ch is not None:
                    tag = unpack_u64(buf, pos + 11)[0]
                    ch._on_confirm(tag, bool(buf[pos + 19] & 1))
                    if cm == _BASIC_NACK:
                        ch.nacked += 1
                    progress = True
                else:
                    self._on_method(bytes(buf[pos:end + 1]))
                    if self.error is not None:
                        return
            # heartbeats (type 8) are ignored: we negotiate heartbeat=0
            pos = end + 1
        if pos:
            del buf[:pos]
        if settled:
            for ch in chans.values():
                if ch.settle_out:
                    self._write(b"".join(ch.settle_out))
                    ch.settle_out.clear()
        self._flush()
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
        """Slow path: the client decodes and handles every other frame (replies,
        channel.close, connection.close, blocked/unblocked)."""
        chid, value = decode_frame(raw)
        if chid == 0:
            self._on_connection_frame(value)
            return
        if isinstance(value, (commands.Basic.Cancel, commands.Basic.Return)):
            return  # not expected in the benchmark workloads
        ch = self._channels.get(chid)
        if ch is not None:
            ch._on_method(value)
        if isinstance(value, commands.Channel.Close):
            self._wake(self._progress_waiters)


async def wait_any_progress(conns: list[Connection], timeout: float) -> None:
    """Wait until one of ``conns`` saw deliveries or confirms (or ``timeout`` seconds);
    raises the reason of a connection that closed meanwhile."""
    waits = [asyncio.ensure_future(c.wait_progress(timeout)) for c in conns]
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for w in waits:
        w.cancel()
    for c in conns:
        if c.closed:
            raise c.closed


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
