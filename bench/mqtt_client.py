"""A lean asyncio MQTT client for the benchmarks (``mqtt_bench.py``, ``mqtt_connections.py``).

paho-mqtt spends tens of µs of Python per message, so it would measure itself rather than
the broker. This client writes packets encoded once with leveret's codec
(:func:`leveret.protocol.mqtt.packets.encode`) and reads with a counting parser of its
own: it walks the fixed headers (MQTT 3.1.1 / 5.0 §2.1), counts PUBLISH and PUBACK
packets without decoding them, answers a QoS 1 PUBLISH with a PUBACK built from its
packet identifier (all the PUBACKs of one read in one write), and hands every other
packet (CONNACK, SUBACK, PINGRESP, DISCONNECT) to leveret's :class:`PacketReader`.

Runs on uvloop when :func:`install_uvloop` finds it. Sizes are in bytes, times in seconds.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

from leveret.protocol.mqtt import packets as P

PUBLISH, PUBACK, CONNACK, SUBACK, PINGRESP, DISCONNECT = (
    P.PUBLISH,
    P.PUBACK,
    P.CONNACK,
    P.SUBACK,
    P.PINGRESP,
    P.DISCONNECT,
)
PINGREQ_BYTES = P.encode(P.PingReq(), P.MQTT_3_1_1)
#: The 2-byte packet identifiers 0-65535 (index = identifier), for building PUBLISH/PUBACK.
PACKET_IDS = [i.to_bytes(2, "big") for i in range(65536)]


class MqttError(RuntimeError):
    """The broker refused (CONNACK or SUBACK code) or closed the connection."""


def install_uvloop() -> bool:
    """Use uvloop's event loop policy when it is installed; True if it is."""
    try:
        import uvloop
    except ImportError:
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True


class Publishes:
    """The bytes of PUBLISH packets to one topic with one payload, encoded once.

    QoS 0: :meth:`batch` is ``n`` copies of one packet. QoS 1 (and 2): every packet has
    its own identifier (1-65535, then around again), spliced between the bytes before
    and after it in the encoded packet (§3.3.2.2), so a batch costs a join, not an
    encode per message."""

    def __init__(self, topic: str, payload: bytes, qos: int = 0, version: int = P.MQTT_3_1_1) -> None:
        self.qos = qos
        packet = P.encode(P.Publish(topic, payload, qos=qos, packet_id=1 if qos else None), version)
        self.one = packet
        self._next_id = 1
        if qos:
            # fixed header: 1 byte + the remaining length's varint; then the topic name
            header = 2
            while packet[header - 1] & 0x80:
                header += 1
            at = header + 2 + len(topic.encode())
            assert packet[at : at + 2] == b"\x00\x01"
            self._before, self._after = packet[:at], packet[at + 2 :]

    def batch(self, n: int) -> bytes:
        """``n`` PUBLISH packets in one ``bytes``."""
        if not self.qos:
            return self.one * n
        before, after, ids = self._before, self._after, PACKET_IDS
        i = self._next_id
        parts: list[bytes] = []
        for _ in range(n):
            parts += (before, ids[i], after)
            i = i + 1 if i < 65535 else 1
        self._next_id = i
        return b"".join(parts)


class Client(asyncio.Protocol):
    """One MQTT connection. Counters: ``received`` (PUBLISH packets), ``acked`` (PUBACKs),
    ``pingresps``; ``last_rx`` is the ``time.monotonic()`` of the last read that held a
    PUBLISH. ``shared`` (a ``multiprocessing`` RawArray of ``q``) and ``slot``: the
    PUBLISH count is also added there, so another process can follow it. ``wake``: called
    when PUBACKs arrive (a publisher waiting for its window).

    ``read_pause`` (seconds, 0: off): after a read of less than 32 KiB, stop reading for
    that long, so the next read takes what arrived meanwhile in one go. A broker that
    writes every packet on its own (mosquitto, RabbitMQ) would otherwise cost the
    subscriber a read, and ~8 µs, per delivery; 1 ms adds at most 1 ms of latency."""

    def __init__(self, version: int = P.MQTT_3_1_1) -> None:
        self.version = version
        self.transport: asyncio.WriteTransport | None = None
        self._rest = b""
        self._reader = P.PacketReader(version)
        self._waiters: dict[int, asyncio.Future] = {}
        self.received = 0
        self.acked = 0
        self.pingresps = 0
        self.last_rx = 0.0
        self.shared = None
        self.slot = 0
        self.wake: Callable[[], None] | None = None
        self.closed = False
        self.close_reason: str | None = None
        self._paused: asyncio.Future | None = None
        self.read_pause = 0.0

    # -- asyncio.Protocol --------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a TCP transport

    def data_received(self, data: bytes) -> None:
        if self._rest:
            data = self._rest + data
        pos, end = 0, len(data)
        publishes = pubacks = 0
        acks: list[bytes] = []
        while pos + 2 <= end:
            first = data[pos]
            length = data[pos + 1]
            header = 2
            if length & 0x80:  # a longer variable byte integer (§1.5.5)
                length &= 0x7F
                shift = 7
                while True:
                    if pos + header >= end:
                        length = -1
                        break
                    digit = data[pos + header]
                    header += 1
                    length |= (digit & 0x7F) << shift
                    shift += 7
                    if not digit & 0x80:
                        break
                if length < 0:
                    break
            stop = pos + header + length
            if stop > end:
                break
            kind = first >> 4
            if kind == PUBLISH:
                publishes += 1
                if first & 0x06:  # QoS 1 (2 is not used here): PUBACK its identifier
                    at = pos + header + 2 + (data[pos + header] << 8 | data[pos + header + 1])
                    acks.append(b"\x40\x02" + data[at : at + 2])
            elif kind == PUBACK:
                pubacks += 1
            else:
                self._control(data[pos:stop])
            pos = stop
        self._rest = data[pos:]
        if publishes:
            self.received += publishes
            self.last_rx = time.monotonic()
            if self.shared is not None:
                self.shared[self.slot] += publishes
            if acks and self.transport is not None:
                self.transport.write(b"".join(acks))
        if pubacks:
            self.acked += pubacks
            if self.wake is not None:
                self.wake()
        if self.read_pause and end < 32768 and self.transport is not None and not self.closed:
            self.transport.pause_reading()  # type: ignore[attr-defined]
            asyncio.get_running_loop().call_later(self.read_pause, self._resume_reading)

    def _resume_reading(self) -> None:
        if self.transport is not None and not self.closed and not self.transport.is_closing():
            self.transport.resume_reading()  # type: ignore[attr-defined]

    def _control(self, raw: bytes) -> None:
        try:
            packets = self._reader.feed(raw)
        except P.MalformedPacket as exc:
            self.close_reason = f"malformed packet from the broker: {exc}"
            if self.transport is not None:
                self.transport.abort()
            return
        for packet in packets:
            if isinstance(packet, P.PingResp):
                self.pingresps += 1
            elif isinstance(packet, P.Disconnect):
                self.close_reason = f"DISCONNECT reason code {packet.reason_code:#04x}"
            kind = P._TYPES[type(packet)]
            waiter = self._waiters.pop(kind, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(packet)

    def pause_writing(self) -> None:
        self._paused = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._paused is not None and not self._paused.done():
            self._paused.set_result(None)
        self._paused = None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.close_reason is None:
            self.close_reason = f"connection lost: {exc}" if exc else "closed by the broker"
        for waiter in self._waiters.values():
            if not waiter.done():
                waiter.set_exception(MqttError(self.close_reason))
        self._waiters.clear()
        if self._paused is not None and not self._paused.done():
            self._paused.set_result(None)
        if self.wake is not None:
            self.wake()

    # -- use ------------------------------------------------------------------------------
    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(data)

    @property
    def paused(self) -> bool:
        return self._paused is not None

    async def drain(self) -> None:
        """Wait while the transport's buffer is above its high-water mark."""
        if self._paused is not None:
            await self._paused

    async def request(self, packet: P.Packet, answer: int, timeout: float = 30.0) -> P.Packet:
        """Write ``packet`` and wait for the next packet of type ``answer``."""
        if self.closed:
            raise MqttError(self.close_reason or "closed")
        waiter = asyncio.get_running_loop().create_future()
        self._waiters[answer] = waiter
        self.write(P.encode(packet, self.version))
        return await asyncio.wait_for(waiter, timeout)

    async def subscribe(self, topic_filter: str, qos: int = 0, packet_id: int = 1) -> None:
        """SUBSCRIBE to one filter; raises MqttError if the SUBACK refuses it (≥ 0x80)."""
        sub = P.Subscribe(packet_id, (P.Subscription(topic_filter, qos),))
        suback = await self.request(sub, SUBACK)
        assert isinstance(suback, P.SubAck)
        if suback.reason_codes[0] >= 0x80:
            raise MqttError(f"SUBSCRIBE {topic_filter!r} refused: {suback.reason_codes[0]:#04x}")

    def ping(self) -> None:
        self.write(PINGREQ_BYTES)

    def disconnect(self) -> None:
        """DISCONNECT (normal) and close."""
        if self.transport is not None and not self.closed:
            self.transport.write(P.encode(P.Disconnect(), self.version))
            self.transport.close()


async def connect(
    host: str,
    port: int,
    client_id: str = "",
    version: int = P.MQTT_3_1_1,
    keep_alive: int = 0,
    clean: bool = True,
    receive_maximum: int | None = None,
    timeout: float = 30.0,
) -> Client:
    """Open a connection and CONNECT (anonymous; ``keep_alive`` in seconds, 0: none);
    ``receive_maximum`` (MQTT 5 only): QoS 1/2 deliveries the broker may leave
    unacknowledged. Raises MqttError if the CONNACK refuses (its code) or the broker
    closes, OSError if the port does not accept."""
    loop = asyncio.get_running_loop()
    _, client = await asyncio.wait_for(loop.create_connection(lambda: Client(version), host, port), timeout)
    properties: P.Properties = ()
    if version == P.MQTT_5 and receive_maximum:
        properties = ((P.RECEIVE_MAXIMUM, receive_maximum),)
    connect_packet = P.Connect(
        client_id=client_id, clean_start=clean, keep_alive=keep_alive, properties=properties
    )
    try:
        connack = await client.request(connect_packet, CONNACK, timeout)
    except (TimeoutError, MqttError):
        if client.transport is not None:
            client.transport.abort()
        raise
    assert isinstance(connack, P.ConnAck)
    if connack.reason_code != 0:
        client.disconnect()
        raise MqttError(f"CONNACK refused the connection: code {connack.reason_code:#04x}")
    return client


async def connect_many(
    host: str, port: int, ids: Sequence[str], version: int = P.MQTT_3_1_1, parallel: int = 100, **kwargs
) -> list[Client]:
    """``connect`` once per client id, at most ``parallel`` handshakes at a time."""
    gate = asyncio.Semaphore(parallel)

    async def one(client_id: str) -> Client:
        async with gate:
            return await connect(host, port, client_id, version, **kwargs)

    return list(await asyncio.gather(*(one(i) for i in ids)))
