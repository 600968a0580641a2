"""The links between the nodes of a cluster: AMQP itself, leveret's own client
(docs/cluster.md).

:class:`Peers` holds one :class:`PeerLink` per (peer node, vhost), made when first
needed; each is one AMQP connection to the peer, logged in as
:data:`~leveret.core.auth.CLUSTER_USER` with the cluster secret (the peer's owner side,
:mod:`.owner`, routes what arrives there to its local queues only). A link is the
:class:`~leveret.core.queues.remote.OwnerLink` of every remote queue that node owns:

- **forwards**: one channel in confirm mode carries every publish this node forwards to
  that node, header and body byte for byte (:meth:`Channel.publish_encoded`), so the
  order of one channel's publishes to one queue holds. Confirms come back by callback
  (``Channel.on_confirm``) and settle the waits of :mod:`.confirms` by position: no
  future or callback per message. Forwards made while the link connects are held and
  sent once it is up.
- **relays**: a channel per relayed consumer (basic.qos, basic.consume with manual
  acks); deliveries are read straight out of the receive buffer with their content
  header undecoded (:func:`take_raw_delivery`) and restored by the AMQP format, so they
  pass through untouched.
- **basic.get** on a channel of its own (manual acks), queue.purge and a passive
  queue.declare for the figures on the connection's default channel.

A lost link fails its unconfirmed forwards (negative confirms) and ends its relays (the
local consumers are cancelled); the next use after :data:`RETRY_SECONDS` connects again.
A link with more than :data:`FLOW_HIGH` forwards unconfirmed holds the node's publishers
(:class:`FlowGate`, with the store's backlog) until it is back under :data:`FLOW_LOW`.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from pamqp import commands

from ..amqp import field_table
from ..amqp.client import Channel, Connection
from ..amqp.client.consumer import Consumer as ClientConsumer
from ..amqp.delivery import Delivery, decode_deliver, delivery_frames
from ..amqp.errors import AMQPError, ChannelError
from ..core.auth import CLUSTER_USER
from ..core.message import FORMATS

if TYPE_CHECKING:
    from ..core.message import Message
    from ..core.queues.remote import RelaySink

log = logging.getLogger("leveret.cluster")

#: seconds before a lost link may connect again
RETRY_SECONDS = 1.0
#: seconds a link's connection and its calls may take
TIMEOUT = 5.0
#: forwards sent and not yet confirmed on one link above which this node's publishers
#: are held (:mod:`leveret.core.flow`), and under which they are released
FLOW_HIGH, FLOW_LOW = 20000, 10000
AMQP_FORMAT = "amqp-0-9-1"

_U32 = struct.Struct(">I").unpack_from
_U64 = struct.Struct(">Q").unpack_from
CONNECTING, UP, DOWN = "connecting", "up", "down"
_SETTLE = struct.Struct(">BHIHHQBB").pack
_ACK, _REJECT, _NACK = 80, 90, 120  # basic.ack, basic.reject, basic.nack method ids


def _settle_frame(channel: int, method: int, tag: int, bits: int) -> bytes:
    """basic.ack/reject/nack ``tag`` on ``channel`` (``bits``: multiple 1, requeue 2
    for nack; requeue 1 for reject), encoded by hand."""
    return _SETTLE(1, channel, 13, 60, method, tag, bits, 0xCE)


def with_bcc(header: bytes, keys: tuple[str, ...]) -> bytes:
    """``header`` with a ``BCC`` header again for the sender-selected ``keys`` (CC keys
    first, then BCC's) that its ``CC`` header does not name: the publishing node took
    ``BCC`` out (RabbitMQ's rule), and the owner routes the forward again with it (and
    takes it out again before any consumer sees it)."""
    offset = field_table.headers_offset(header)
    if offset is None:
        return header
    try:
        table, end = field_table.decode_table(header, offset)
    except ValueError:
        return header
    cc = table.get("CC")
    named = len([v for tag, v in cc[1] if tag == "S"]) if cc is not None and cc[0] == "A" else 0
    hidden = keys[named:]
    if not hidden or "BCC" in table:
        return header
    table["BCC"] = ("A", [("S", key.encode()) for key in hidden])
    return header[:offset] + field_table.encode_table(table) + header[end:]


@dataclass
class RawDelivery(Delivery):
    """A delivery whose content header payload ``header`` is kept as received
    (``props`` stays empty)."""

    header: bytes = b""


def take_raw_delivery(buf: bytearray) -> tuple[int, RawDelivery] | None:
    """A complete basic.deliver with its content header and a one-frame (or empty)
    body at the start of ``buf``: (bytes it takes, the delivery, header undecoded).
    None when ``buf`` starts with anything else or is incomplete (the caller then
    reads frame by frame). Never raises."""
    frames = delivery_frames(buf)
    if frames is None:
        return None
    taken, end, pos, head_end, body = frames
    try:
        d: Any = decode_deliver(buf, 11, end)
    except Exception:
        return None
    delivery = RawDelivery(
        d.delivery_tag,
        d.redelivered,
        d.exchange,
        d.routing_key,
        {},
        body,
        d.consumer_tag,
        buf[1] << 8 | buf[2],
    )
    delivery.header = bytes(buf[pos + 7 : head_end])
    return taken, delivery


class PeerChannel(Channel):
    """A channel whose content (deliveries, get-ok) keeps its header undecoded; the
    relay it carries (if any) hears of its end."""

    def __init__(self, connection: Connection, number: int) -> None:
        super().__init__(connection, number)
        self.relay: Relay | None = None
        #: called with the error when the channel closes (the link's forward channel)
        self.on_closed: Callable[[BaseException], None] | None = None
        self.get_count = 0  # message_count of the last basic.get-ok
        self._raw: list | None = None  # [kind, method, header, parts, remaining]

    def _on_method(self, value: Any) -> None:
        kind = type(value)
        if kind is commands.Basic.Deliver or kind is commands.Basic.GetOk or kind is commands.Basic.Return:
            self._raw = [kind, value, None, [], 0]
            return
        super()._on_method(value)
        if kind is commands.Basic.Cancel and self.relay is not None:
            self.relay.ended()

    def on_raw_content(self, ftype: int, payload: bytes) -> None:
        """A content header (``ftype`` 2) or body (3) frame's payload."""
        raw = self._raw
        if raw is None:
            return
        if ftype == 2:
            raw[2], raw[4] = payload, _U64(payload, 4)[0]
        else:
            raw[3].append(payload)
            raw[4] -= len(payload)
        if raw[2] is None or raw[4] > 0:
            return
        self._raw = None
        kind, method, header, parts = raw[:4]
        delivery = RawDelivery(
            getattr(method, "delivery_tag", 0),
            getattr(method, "redelivered", False),
            method.exchange,
            method.routing_key,
            {},
            b"".join(parts),
            getattr(method, "consumer_tag", ""),
            self.number,
        )
        delivery.header = header
        if kind is commands.Basic.Deliver:
            self._deliver(delivery)
        elif kind is commands.Basic.GetOk:
            self.get_count = method.message_count
            if self._waiter is not None and not self._waiter.done():
                self._waiter.set_result(delivery)

    def _closed(self, error: BaseException) -> None:
        super()._closed(error)
        if self.relay is not None:
            self.relay.ended()
        if self.on_closed is not None:
            on_closed, self.on_closed = self.on_closed, None
            on_closed(error)


class PeerConnection(Connection):
    """The client connection of a link: content frames stay undecoded
    (:class:`PeerChannel`), deliveries are taken whole from the receive buffer."""

    channel_class = PeerChannel

    def _process(self, buf: bytearray) -> None:
        channels = self._channels
        while True:
            taken = take_raw_delivery(buf)
            if taken is None:
                if self._frame(buf):
                    continue
                return
            size, delivery = taken
            del buf[:size]
            channel = channels.get(delivery.channel)
            if channel is not None:
                channel._deliver(delivery)

    def _frame(self, buf: bytearray) -> bool:
        if len(buf) >= 7 and buf[0] in (2, 3):
            size = _U32(buf, 3)[0] + 8
            if len(buf) < size:
                return False
            channel = self._channels.get(buf[1] << 8 | buf[2])
            payload = bytes(buf[7 : size - 1])
            ftype = buf[0]
            del buf[:size]
            if isinstance(channel, PeerChannel):
                channel.on_raw_content(ftype, payload)
            return True
        return super()._frame(buf)


class Relay:
    """One local consumer relayed from the owner (a
    :class:`~leveret.core.queues.remote.RelayHandle`): its own channel, basic.qos
    ``prefetch``, basic.consume with manual acks."""

    def __init__(
        self, link: PeerLink, queue: str, sink: RelaySink, prefetch: int, exclusive: bool, arguments: dict
    ) -> None:
        self.link = link
        self.queue = queue
        self.sink = sink
        self.prefetch = prefetch
        self.exclusive = exclusive
        self.arguments = arguments
        self.channel: PeerChannel | None = None
        self.consumer: ClientConsumer | None = None
        self.done = False  # closed
        self._ended = False  # the sink was told the relay ended
        self._cancelled = False
        self._acks: list[int] = []  # acknowledged this turn, not sent yet
        self._low = 1  # every delivery tag below is settled
        self._done: set[int] = set()  # settled tags above _low

    async def open(self, connection: PeerConnection) -> None:
        """Open the channel and consume; a failure ends the relay."""
        try:
            channel = await connection.channel()
            assert isinstance(channel, PeerChannel)
            self.channel = channel
            channel.relay = self
            if self.done:
                await channel.close()
                return
            await channel.qos(self.prefetch)
            self.consumer = await channel.consume(
                self.queue, False, self.exclusive, self.arguments, callback=self._delivered
            )
            if self._cancelled:
                await self.consumer.cancel()
            if self.done:  # closed while it opened
                await channel.close()
        except (AMQPError, OSError) as exc:
            log.info("relay of queue '%s' from node %s ended: %s", self.queue, self.link.node, exc)
            self.ended()
        except (TypeError, ValueError) as exc:  # arguments AMQP cannot carry
            log.warning("relay of queue '%s' from node %s refused: %s", self.queue, self.link.node, exc)
            self.ended()

    def _delivered(self, delivery: Delivery) -> None:
        assert isinstance(delivery, RawDelivery)
        message = self.link.restore(delivery)
        self.sink.delivered(delivery.delivery_tag, delivery.redelivered, message)

    def ended(self) -> None:
        """The owner cancelled the consumer, or the channel or link went: the sink
        hears of it once, and closes the relay (:meth:`close`) once its consumer
        settled the deliveries it holds (the channel stays open for them meanwhile,
        if it still is)."""
        if self.done or self._ended:
            return
        self._ended = True
        self._flush_acks()
        self.sink.ended()

    def ack(self, tag: int) -> None:
        """Acknowledge the owner's ``tag``: gathered for this turn, then sent as few
        frames as the order allows (:meth:`_flush_acks`)."""
        acks = self._acks
        acks.append(tag)
        if len(acks) == 1:
            asyncio.get_running_loop().call_soon(self._flush_acks)

    def _flush_acks(self) -> None:
        """One basic.ack ``multiple`` per run of consecutive tags that starts at the
        lowest unsettled one (the deliveries of a relay's channel are numbered 1, 2, …
        in order), single acks otherwise."""
        acks, self._acks = self._acks, []
        channel = self.channel
        if not acks or channel is None or not channel.is_open:
            return
        acks.sort()
        out: list[bytes] = []
        number, done = channel.number, self._done
        i, count = 0, len(acks)
        while i < count:
            j = i
            while j + 1 < count and acks[j + 1] == acks[j] + 1:
                j += 1
            if acks[i] == self._low:
                out.append(_settle_frame(number, _ACK, acks[j], 1))
                self._low = acks[j] + 1
                while self._low in done:
                    done.discard(self._low)
                    self._low += 1
            else:
                for tag in acks[i : j + 1]:
                    out.append(_settle_frame(number, _ACK, tag, 0))
                    done.add(tag)
            i = j + 1
        channel.connection._write(b"".join(out))

    def _settled_alone(self, tag: int) -> None:
        if tag == self._low:
            self._low += 1
            while self._low in self._done:
                self._done.discard(self._low)
                self._low += 1
        else:
            self._done.add(tag)

    def nack(self, tag: int, requeue: bool) -> None:
        """basic.nack (``requeue``) of the owner's ``tag``."""
        self._settle_one(_NACK, tag, 2 if requeue else 0)

    def reject(self, tag: int, requeue: bool) -> None:
        """basic.reject (``requeue``) of the owner's ``tag``."""
        self._settle_one(_REJECT, tag, 1 if requeue else 0)

    def _settle_one(self, method: int, tag: int, bits: int) -> None:
        """Write a basic.nack/reject of ``tag`` (after the pending acks, so that the owner
        sees them in order) when the channel is open."""
        channel = self.channel
        if channel is not None and channel.is_open:
            self._flush_acks()
            channel.connection._write(_settle_frame(channel.number, method, tag, bits))
            self._settled_alone(tag)

    def cancel(self) -> None:
        self._cancelled = True
        consumer = self.consumer
        if consumer is not None and not consumer.cancelled:
            self.link.spawn(consumer.cancel())

    def close(self) -> None:
        if self.done:
            return
        self.done = True
        self.link.relays.discard(self)
        self._flush_acks()
        channel = self.channel
        if channel is not None and channel.is_open:
            self.link.spawn(channel.close())


class _GetHandle:
    """Settles basic.get deliveries on the link's get channel."""

    def __init__(self, channel: PeerChannel) -> None:
        self.channel = channel

    def ack(self, tag: int) -> None:
        if self.channel.is_open:
            self.channel.ack(tag)

    def nack(self, tag: int, requeue: bool) -> None:
        if self.channel.is_open:
            self.channel.nack(tag, False, requeue)

    def reject(self, tag: int, requeue: bool) -> None:
        if self.channel.is_open:
            self.channel.reject(tag, requeue)

    def cancel(self) -> None:
        pass

    def close(self) -> None:
        pass


class PeerLink:
    """This node's link to ``node`` in ``vhost`` (an
    :class:`~leveret.core.queues.remote.OwnerLink`)."""

    def __init__(self, peers: Peers, node: str, vhost: str) -> None:
        self.peers = peers
        self.node = node
        self.vhost = vhost
        self.state = DOWN
        self.connection: PeerConnection | None = None
        self.relays: set[Relay] = set()
        self._channel: PeerChannel | None = None  # forwards, in confirm mode
        self._get_channel: PeerChannel | None = None
        self._held: list[tuple[str, str, bytes, bytes]] = []  # forwards made while connecting
        self._waiting_relays: list[Relay] = []
        self._last: Message | None = None
        # forward positions: 1, 2, … on this link; the channel's confirm seq + _base
        self.sent = 0
        self.settled = 0
        self._sealed = 0
        self._base = 0
        self._nacked: deque[int] = deque(maxlen=4096)
        self._waits: deque[list] = deque()  # [lo, hi, done, ok], by hi
        # (lo, hi]: forwards lost with a connection or channel before a seal covered
        # them; the seal that does fails its wait (a negative confirm)
        self._lost_ranges: deque[tuple[int, int]] = deque()
        #: this link holds the node's publishers (too many forwards unconfirmed)
        self.flowing = False
        self._down_at = -RETRY_SECONDS
        self._tasks: set[asyncio.Task] = set()
        self._gets: asyncio.Lock | None = None
        self._attempt = 0  # connection attempts: a late answer to an old one is dropped

    # -- the connection -----------------------------------------------------------------
    @property
    def alive(self) -> bool:
        """Up or connecting (or allowed to connect again)."""
        if self.state == DOWN:
            self._maybe_connect()
        return self.state != DOWN

    def _maybe_connect(self) -> None:
        loop = asyncio.get_running_loop()
        if self.state == DOWN and loop.time() - self._down_at >= RETRY_SECONDS and not self.peers.closed:
            self.state = CONNECTING
            self._base = self.settled = self.sent
            self._attempt += 1
            self.spawn(self._connect(self._attempt))

    def spawn(self, coroutine: Any) -> None:
        """Run ``coroutine`` as a task of this link (kept until done); a link that went
        meanwhile makes it fail quietly (its waits and relays were ended already)."""
        task = asyncio.get_running_loop().create_task(self._quietly(coroutine))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _quietly(self, coroutine: Any) -> None:
        try:
            await coroutine
        except (AMQPError, OSError) as exc:
            log.debug("cluster link to node %s: %s", self.node, exc)

    async def _connect(self, attempt: int) -> None:
        address = self.peers.address_of(self.node)
        try:
            if address is None and self.peers.resolve is not None:
                address = await self.peers.resolve(self.node)
            if address is None:
                raise OSError(f"no address known for node {self.node}")
            host, port = address
            url = (
                f"amqp://{quote(CLUSTER_USER, safe='')}:{quote(self.peers.secret, safe='')}"
                f"@{host}:{port}/{quote(self.vhost, safe='')}"
            )
            connection = await PeerConnection.connect(
                url, timeout=TIMEOUT, name=f"leveret-cluster {self.node}"
            )
            assert isinstance(connection, PeerConnection)
            channel = await self._forward_channel(connection)
            get_channel = await connection.channel()
            assert isinstance(get_channel, PeerChannel)
        except (AMQPError, OSError) as exc:
            log.warning("cluster link to node %s (vhost '%s') failed: %s", self.node, self.vhost, exc)
            if attempt == self._attempt:
                self._lost()
            return
        if self.state != CONNECTING or attempt != self._attempt:  # given up meanwhile
            await connection.close()
            return
        self.connection = connection
        self._get_channel = get_channel
        self._gets = asyncio.Lock()
        self.state = UP
        connection._closed_waiter.add_done_callback(lambda _: self._lost())
        self._forwarding(channel)
        relays, self._waiting_relays = self._waiting_relays, []
        for relay in relays:
            if not relay.done:
                self.spawn(relay.open(connection))

    async def _forward_channel(self, connection: PeerConnection) -> PeerChannel:
        channel = await connection.channel()
        assert isinstance(channel, PeerChannel)
        await channel.confirm_select(on_nack="record")
        return channel

    def _forwarding(self, channel: PeerChannel) -> None:
        """``channel`` carries the forwards from now on: the held ones first."""
        held, self._held = self._held, []
        self._base = self.sent - len(held)  # a position is its confirm seq + _base
        self._channel = channel
        channel.on_confirm = self._confirmed
        channel.on_closed = self._forward_channel_closed
        for exchange, routing_key, header, body in held:
            channel.publish_encoded(exchange, routing_key, header, body)

    def _forward_channel_closed(self, error: BaseException) -> None:
        """The owner closed the forward channel (an exchange deleted there a moment
        ago: 404): its unconfirmed forwards are lost (negative confirms); forwards wait
        for a new channel."""
        connection = self.connection
        self._channel = None
        if self.state != UP or connection is None or connection.error is not None:
            return  # the whole link went: _lost does the rest
        log.warning(
            "cluster link to node %s (vhost '%s'): forward channel closed: %s", self.node, self.vhost, error
        )
        self._fail_waits()
        self.spawn(self._reopen(connection))

    async def _reopen(self, connection: PeerConnection) -> None:
        try:
            channel = await self._forward_channel(connection)
        except (AMQPError, OSError):
            self._lost()
            raise
        if self.connection is connection and self.state == UP:
            self._forwarding(channel)

    def _fail_waits(self) -> None:
        """Every forward sent so far (the held ones aside) is lost: the waits fail now,
        and the seal that covers the forwards no seal covered yet fails too."""
        lost_to = self.sent - len(self._held)
        if lost_to > self._sealed:
            self._lost_ranges.append((self._sealed, lost_to))
        self.settled = lost_to
        if self.flowing:
            self.flowing = False
            self.peers.link_flow(self, False)
        waits, self._waits = self._waits, deque()
        for wait in waits:
            wait[2](False)

    def _lost(self) -> None:
        """The connection went (or never came): fail what waits, end the relays."""
        if self.state == DOWN:
            return
        self.state = DOWN
        self._down_at = asyncio.get_running_loop().time()
        self.connection = self._channel = self._get_channel = None
        self._held.clear()
        self._last = None
        self._fail_waits()
        relays = list(self.relays) + self._waiting_relays
        self.relays.clear()
        self._waiting_relays = []
        for relay in relays:
            relay.ended()

    async def close(self) -> None:
        """Close the connection (waits fail, relays end)."""
        connection = self.connection
        self._lost()
        if connection is not None:
            await connection.close()
        for task in list(self._tasks):
            task.cancel()

    # -- forwards -----------------------------------------------------------------------
    def forward(self, message: Message) -> bool:
        """See :meth:`OwnerLink.forward`."""
        if message is self._last:
            return True
        if not self.alive:
            return False
        if self._last is None:  # forgotten at the end of the turn: one publish's queues
            asyncio.get_running_loop().call_soon(self._forget_last)
        self._last = message
        header = self.peers.content_header(message)
        self.sent += 1
        if self.sent - self.settled > FLOW_HIGH and not self.flowing:
            self.flowing = True
            self.peers.link_flow(self, True)
        channel = self._channel
        if self.state == UP and channel is not None and channel.is_open:
            channel.publish_encoded(message.exchange, message.routing_key, header, message.body)
        else:  # connecting, or a new forward channel opening
            self._held.append((message.exchange, message.routing_key, header, message.body))
        return True

    def _forget_last(self) -> None:
        self._last = None

    def seal(self, done: Callable[[bool], None]) -> bool:
        """See :meth:`.confirms.ConfirmingLink.seal`."""
        lo, hi = self._sealed, self.sent
        self._sealed = hi
        lost = False
        if self._lost_ranges:
            ranges = self._lost_ranges
            lost = any(start < hi and lo < end for start, end in ranges)
            while ranges and ranges[0][1] <= hi:
                ranges.popleft()
        if hi <= self.settled:
            if not lost and not any(lo < seq <= hi for seq in self._nacked):
                return False
            done(False)
            return True
        self._waits.append([lo, hi, done, not lost])
        return True

    def _confirmed(self, tag: int, multiple: bool, acked: bool) -> None:
        channel = self._channel
        if channel is None:
            return
        base = self._base
        if not acked:
            for seq in channel.nacked:
                position = seq + base
                self._nacked.append(position)
                for wait in self._waits:
                    if wait[0] < position <= wait[1]:
                        wait[3] = False
            channel.nacked.clear()
        settled = channel.settled_below - 1 + base
        if settled <= self.settled:
            return
        self.settled = settled
        if self.flowing and self.sent - settled < FLOW_LOW:
            self.flowing = False
            self.peers.link_flow(self, False)
        waits = self._waits
        while waits and waits[0][1] <= settled:
            _, _, done, ok = waits.popleft()
            done(ok)

    # -- consumers, get, purge, figures ---------------------------------------------------
    def open_relay(
        self, queue: str, sink: RelaySink, prefetch: int, exclusive: bool, arguments: dict
    ) -> Relay:
        """See :meth:`OwnerLink.open_relay`."""
        relay = Relay(self, queue, sink, prefetch, exclusive, arguments)
        if not self.alive:
            asyncio.get_running_loop().call_soon(relay.ended)
            return relay
        self.relays.add(relay)
        if self.state == UP and self.connection is not None:
            self.spawn(relay.open(self.connection))
        else:
            self._waiting_relays.append(relay)
        return relay

    def get(self, queue: str, callback: Callable[[Any], None]) -> None:
        """See :meth:`OwnerLink.get` (a link still connecting is waited for, up to
        :data:`TIMEOUT` seconds)."""
        if not self.alive:  # (may start connecting)
            asyncio.get_running_loop().call_soon(callback, None)
            return
        self.spawn(self._get(queue, callback))

    async def _get(self, queue: str, callback: Callable[[Any], None]) -> None:
        answer = None
        await self._until_up()
        lock, connection = (self._gets, self.connection) if self.state == UP else (None, None)
        try:
            if lock is not None and connection is not None:
                async with lock:
                    channel = self._get_channel
                    if channel is None or not channel.is_open:  # the owner closed it (404)
                        channel = self._get_channel = await connection.channel()  # type: ignore[assignment]
                    assert isinstance(channel, PeerChannel)
                    delivery = await channel.get(queue)
                if isinstance(delivery, RawDelivery):
                    count = channel.get_count
                    answer = (
                        _GetHandle(channel),
                        delivery.delivery_tag,
                        delivery.redelivered,
                        self.restore(delivery),
                        count,
                    )
        except (AMQPError, OSError) as exc:
            log.info("basic.get of queue '%s' on node %s failed: %s", queue, self.node, exc)
        callback(answer)

    def purge(self, queue: str) -> None:
        """See :meth:`OwnerLink.purge` (a link still connecting is waited for, up to
        :data:`TIMEOUT` seconds; a purge is never dropped while the owner is reachable)."""
        if self.alive:
            self.spawn(self._purge(queue))

    async def _until_up(self) -> None:
        """Wait while the link is connecting, up to :data:`TIMEOUT` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + TIMEOUT
        while self.state == CONNECTING and loop.time() < deadline:
            await asyncio.sleep(0.01)

    async def _purge(self, queue: str) -> None:
        await self._until_up()
        if self.state == UP:
            await self._call(commands.Queue.Purge(queue=queue))

    def delete(
        self,
        queue: str,
        if_unused: bool,
        if_empty: bool,
        callback: Callable[[int, tuple[int, str] | None], None],
    ) -> None:
        """See :meth:`OwnerLink.delete` (a link still connecting is waited for, up to
        :data:`TIMEOUT` seconds)."""
        if not self.alive:
            asyncio.get_running_loop().call_soon(
                callback, 0, (404, f"NOT_FOUND - node {self.node} unreachable")
            )
            return
        self.spawn(self._delete(queue, if_unused, if_empty, callback))

    async def _delete(
        self,
        queue: str,
        if_unused: bool,
        if_empty: bool,
        callback: Callable[[int, tuple[int, str] | None], None],
    ) -> None:
        try:
            await self._until_up()
            connection = self.connection if self.state == UP else None
            if connection is None:
                raise OSError(f"node {self.node} unreachable")
            channel = await connection.default_channel()
            count = await channel.queue_delete(queue, if_unused, if_empty)
        except ChannelError as exc:
            callback(0, (exc.reply_code, exc.reply_text))
            return
        except (AMQPError, OSError) as exc:
            callback(0, (404, f"NOT_FOUND - {exc}"))
            return
        except asyncio.CancelledError:  # the link closed: the client's reply must still come
            callback(0, (404, f"NOT_FOUND - node {self.node} unreachable"))
            raise
        callback(count, None)

    def inspect(self, queue: str, callback: Callable[[int, int], None]) -> None:
        """See :meth:`OwnerLink.inspect`."""
        if self.alive:  # (starts a link that is down: the figures come once it is up)
            self.spawn(self._inspect(queue, callback))

    async def _inspect(self, queue: str, callback: Callable[[int, int], None]) -> None:
        await self._until_up()
        reply = await self._call(commands.Queue.Declare(queue=queue, passive=True))
        if reply is not None:
            callback(reply.message_count, reply.consumer_count)

    async def _call(self, method: Any) -> Any:
        connection = self.connection
        if connection is None:
            return None
        try:
            return await (await connection.default_channel()).call(method, timeout=TIMEOUT)
        except (AMQPError, OSError) as exc:
            log.info("%s on node %s failed: %s", type(method).__name__, self.node, exc)
            return None

    def restore(self, delivery: RawDelivery) -> Message:
        """The core message of a delivery, its header and body as received."""
        return FORMATS[AMQP_FORMAT].restore(
            delivery.exchange, delivery.routing_key, delivery.header, delivery.body
        )


class Peers:
    """This node's links: one :class:`PeerLink` per (node, vhost), made on first use.
    ``address_of(node)`` gives the ``(host, amqp_port)`` of a node (None: unknown),
    at once (it runs on the event loop: from what the node knows, never a query);
    ``secret`` is the cluster secret the peers' owner sides accept (ValueError if empty
    or None). ``resolve(node)``, when given, is asked (a coroutine: it may query) for a
    node ``address_of`` does not know yet: one that joined since the node last looked."""

    def __init__(
        self,
        secret: str | None,
        address_of: Callable[[str], tuple[str, int] | None],
        resolve: Callable[[str], Awaitable[tuple[str, int] | None]] | None = None,
    ) -> None:
        if not secret:
            raise ValueError("the cluster secret must not be empty")
        self.secret = secret
        self.address_of = address_of
        self.resolve = resolve
        self.links: dict[tuple[str, str], PeerLink] = {}
        self.closed = False
        self._content_header: Callable[[Message], bytes] | None = None
        #: called with True when a link starts holding publishers back, False when none
        #: does any more (see :class:`FlowGate`)
        self.on_flow: Callable[[bool], None] | None = None
        self._flowing: set[PeerLink] = set()

    def link_flow(self, link: PeerLink, active: bool) -> None:
        """``link`` has too many forwards unconfirmed (True) or no longer (False):
        :attr:`on_flow` hears when the first link starts or the last one stops."""
        before = bool(self._flowing)
        if active:
            self._flowing.add(link)
        else:
            self._flowing.discard(link)
        if bool(self._flowing) != before and self.on_flow is not None:
            self.on_flow(bool(self._flowing))

    def link(self, node: str, vhost: str) -> PeerLink:
        """The link to ``node`` in ``vhost`` (it connects when first used)."""
        link = self.links.get((node, vhost))
        if link is None:
            link = self.links[(node, vhost)] = PeerLink(self, node, vhost)
        return link

    def vhost_links(self, vhost: str) -> Callable[[], Iterator[PeerLink]]:
        """The links of ``vhost``, as :class:`.confirms.ClusterConfirms` asks for them."""
        return lambda: (link for (_, name), link in self.links.items() if name == vhost)

    def all_links(self) -> Iterator[PeerLink]:
        """Every link."""
        return iter(list(self.links.values()))

    def content_header(self, message: Message) -> bytes:
        """``message``'s AMQP 0-9-1 content header payload (its own for an AMQP
        message; rendered from its properties for another protocol's)."""
        render = self._content_header
        if render is None:
            from ..protocol.amqp.message import content_header  # the AMQP adapter's rendering

            render = self._content_header = content_header
        header = render(message)
        if message.cc:
            header = with_bcc(header, message.cc)
        return header

    def node_lost(self, node: str) -> None:
        """``node`` is gone: its links drop what waits on them."""
        for (name, _), link in list(self.links.items()):
            if name == node:
                connection = link.connection
                link._lost()
                if connection is not None:
                    connection._abort()

    async def close(self) -> None:
        """Close every link."""
        self.closed = True
        for link in list(self.links.values()):
            await link.close()


class FlowGate:
    """Publisher flow control from two sources: the store's backlog and the links'
    unconfirmed forwards. ``set_flow`` (``core.flow.set``) is told True while either
    holds, False once neither does. Wire it as ``store.on_flow = gate.store`` and
    ``peers.on_flow = gate.links``."""

    def __init__(self, set_flow: Callable[[bool], None]) -> None:
        self._set = set_flow
        self._store = self._links = False

    def store(self, active: bool) -> None:
        """The store's backlog passed its high mark (True) or its low mark (False)."""
        self._store = active
        self._set(self._store or self._links)

    def links(self, active: bool) -> None:
        """A link started holding publishers (True), or none does any more (False)."""
        self._links = active
        self._set(self._store or self._links)
