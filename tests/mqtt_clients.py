"""Clients for the MQTT behaviour tests: a raw-socket client on leveret's MQTT codec
(exact packets: reason codes, flags, packet ids, what the server does on a protocol
violation) and a paho-mqtt 2.x wrapper that collects what it receives.
"""

from __future__ import annotations

import queue
import socket
import time
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import paho.mqtt.client as paho
from mqtt_brokers import MqttBroker, unique

from leveret.protocol.mqtt import packets as p

V311, V5 = p.MQTT_3_1_1, p.MQTT_5
TIMEOUT = 5.0


class Closed(Exception):
    """The server closed the connection."""


class Raw:
    """One MQTT connection over a plain socket, packets through leveret's codec."""

    def __init__(self, broker: MqttBroker, version: int = V5) -> None:
        self.version = version
        self.sock = socket.create_connection((broker.host, broker.port), timeout=TIMEOUT)
        self.reader = p.PacketReader(version)
        self.pending: list[p.Packet] = []

    # -- sending ------------------------------------------------------------------------

    def send(self, packet: p.Packet) -> None:
        self.sock.sendall(p.encode(packet, self.version))

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def connect(
        self,
        client_id: str | None = None,
        clean_start: bool = True,
        keep_alive: int = 60,
        properties: p.Properties = (),
        **fields: Any,
    ) -> p.ConnAck:
        """CONNECT and the CONNACK (its return/reason code is not checked here)."""
        client_id = unique("raw") if client_id is None else client_id
        self.client_id = client_id
        self.send(p.Connect(client_id, clean_start, keep_alive, properties=properties, **fields))
        ack = self.recv()
        assert isinstance(ack, p.ConnAck), ack
        return ack

    def subscribe(
        self, *subs: p.Subscription | str, packet_id: int = 1, properties: p.Properties = ()
    ) -> p.SubAck:
        items = tuple(p.Subscription(s) if isinstance(s, str) else s for s in subs)
        self.send(p.Subscribe(packet_id, items, properties))
        ack = self.recv()
        assert isinstance(ack, p.SubAck) and ack.packet_id == packet_id, ack
        return ack

    def publish(
        self,
        topic: str,
        payload: bytes = b"",
        qos: int = 0,
        retain: bool = False,
        packet_id: int | None = None,
        properties: p.Properties = (),
    ) -> None:
        """PUBLISH (and the acknowledgement flow of its QoS: PUBACK, or PUBREC/PUBREL/PUBCOMP)."""
        if qos and packet_id is None:
            packet_id = 1
        self.send(p.Publish(topic, payload, qos, retain, packet_id=packet_id, properties=properties))
        if qos == 1:
            ack = self.recv()
            assert isinstance(ack, p.PubAck) and ack.packet_id == packet_id, ack
        elif qos == 2:
            rec = self.recv()
            assert isinstance(rec, p.PubRec) and rec.packet_id == packet_id, rec
            self.send(p.PubRel(packet_id))  # type: ignore[arg-type]
            comp = self.recv()
            assert isinstance(comp, p.PubComp) and comp.packet_id == packet_id, comp

    def disconnect(self, reason_code: int = 0) -> None:
        try:
            self.send(p.Disconnect(reason_code))
        except OSError:
            pass
        self.close()

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    # -- receiving ----------------------------------------------------------------------

    def recv(self, timeout: float = TIMEOUT) -> p.Packet:
        """The next packet; raises Closed at end of stream, TimeoutError after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while not self.pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no packet in {timeout} s")
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                raise TimeoutError(f"no packet in {timeout} s") from None
            except ConnectionResetError:
                raise Closed("reset") from None
            if not data:
                raise Closed("end of stream")
            self.pending.extend(self.reader.feed(data))
        return self.pending.pop(0)

    def expect(self, wanted: type, timeout: float = TIMEOUT) -> Any:
        """The first packet of type ``wanted``; packets of other types that arrive before
        it stay queued, in order, for the next :meth:`recv`."""
        deadline = time.monotonic() + timeout
        skipped: list[p.Packet] = []
        try:
            while True:
                packet = self.recv(max(0.0, deadline - time.monotonic()) or 0.001)
                if isinstance(packet, wanted):
                    return packet
                skipped.append(packet)
        finally:
            self.pending[:0] = skipped

    def recv_publish(self, timeout: float = TIMEOUT) -> p.Publish:
        packet = self.recv(timeout)
        assert isinstance(packet, p.Publish), packet
        return packet

    def nothing(self, within: float = 0.3) -> None:
        """Assert that no packet arrives within ``within`` s (and the connection stays)."""
        try:
            packet = self.recv(within)
        except TimeoutError:
            return
        raise AssertionError(f"unexpected {packet}")

    def closed_after(self, timeout: float = TIMEOUT) -> list[p.Packet]:
        """The packets the server sends before it closes the connection (asserting that
        it does within ``timeout`` s)."""
        got: list[p.Packet] = []
        deadline = time.monotonic() + timeout
        while True:
            try:
                got.append(self.recv(max(0.01, deadline - time.monotonic())))
            except Closed:
                return got
            except p.MalformedPacket:
                return got
            except TimeoutError:
                raise AssertionError(f"the server did not close the connection; got {got}") from None

    def disconnected_with(self, timeout: float = TIMEOUT) -> int | None:
        """The reason code of the DISCONNECT the server sends before closing (None if it
        closes without one, as 3.1.1 servers do)."""
        codes = [x.reason_code for x in self.closed_after(timeout) if isinstance(x, p.Disconnect)]
        return codes[-1] if codes else None

    def suback_or_disconnect(self, timeout: float = TIMEOUT) -> tuple[str, Any]:
        """After a SUBSCRIBE: ``("suback", reason codes)``, or ``("disconnect", reason
        code or None)`` when the server closes the connection instead."""
        try:
            packet = self.recv(timeout)
        except (Closed, p.MalformedPacket):
            return "disconnect", None
        if isinstance(packet, p.SubAck):
            return "suback", packet.reason_codes
        assert isinstance(packet, p.Disconnect), packet
        self.closed_after(timeout)
        return "disconnect", packet.reason_code

    def __enter__(self) -> Raw:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def raw_connected(broker: MqttBroker, version: int = V5, **connect: Any) -> Raw:
    raw = Raw(broker, version)
    ack = raw.connect(**connect)
    assert ack.reason_code == 0, ack
    return raw


@contextmanager
def subscriber_and_publisher(
    broker: MqttBroker, topic_filter: str, qos: int, version: int = V5, publisher_version: int = V5
) -> Iterator[tuple[Raw, Raw]]:
    """Two connections: a subscriber (MQTT ``version``) whose subscription to
    ``topic_filter`` at ``qos`` was granted, and a publisher; both closed after."""
    with raw_connected(broker, version) as subscriber, raw_connected(broker, publisher_version) as publisher:
        assert subscriber.subscribe(p.Subscription(topic_filter, qos)).reason_codes == (qos,)
        yield subscriber, publisher


def ack_publish(raw: Raw, publish: p.Publish) -> None:
    """Complete the client's side of a received QoS 1/2 PUBLISH."""
    if publish.qos == 1:
        raw.send(p.PubAck(publish.packet_id))  # type: ignore[arg-type]
    elif publish.qos == 2:
        raw.send(p.PubRec(publish.packet_id))  # type: ignore[arg-type]
        rel = raw.expect(p.PubRel)
        assert isinstance(rel, p.PubRel) and rel.packet_id == publish.packet_id, rel
        raw.send(p.PubComp(publish.packet_id))  # type: ignore[arg-type]


# -- paho-mqtt ---------------------------------------------------------------------------

API_VERSIONS = (paho.CallbackAPIVersion.VERSION1, paho.CallbackAPIVersion.VERSION2)
PROTOCOLS = (paho.MQTTv311, paho.MQTTv5)


class Paho:
    """A paho-mqtt 2.x client on its own network thread, with a queue of messages."""

    def __init__(
        self,
        broker: MqttBroker,
        api: paho.CallbackAPIVersion = paho.CallbackAPIVersion.VERSION2,
        protocol: int = paho.MQTTv5,
        client_id: str | None = None,
        clean: bool = True,
        credentials: tuple[str, str] | None = None,
        will: tuple[str, bytes, int, bool] | None = None,
        properties: Any = None,
        keepalive: int = 60,
    ) -> None:
        self.client_id = client_id or unique("paho")
        kwargs: dict[str, Any] = {"client_id": self.client_id, "protocol": protocol}
        if protocol != paho.MQTTv5:
            kwargs["clean_session"] = clean
        self.protocol = protocol
        with warnings.catch_warnings():  # "Callback API version 1 is deprecated": tested on purpose
            warnings.simplefilter("ignore", DeprecationWarning)
            self.client = paho.Client(api, **kwargs)
        self.messages: queue.Queue[paho.MQTTMessage] = queue.Queue()
        self.connack: queue.Queue[tuple[Any, Any]] = queue.Queue()
        self.subacks: queue.Queue[Any] = queue.Queue()
        self.disconnects: queue.Queue[Any] = queue.Queue()
        self.client.on_message = lambda _c, _u, msg: self.messages.put(msg)
        if api == paho.CallbackAPIVersion.VERSION1:
            if protocol == paho.MQTTv5:
                self.client.on_connect = lambda _c, _u, flags, rc, props=None: self.connack.put((flags, rc))
                self.client.on_subscribe = lambda _c, _u, _mid, granted, props=None: self.subacks.put(granted)
                self.client.on_disconnect = lambda _c, _u, rc, props=None: self.disconnects.put(rc)
            else:
                self.client.on_connect = lambda _c, _u, flags, rc: self.connack.put((flags, rc))
                self.client.on_subscribe = lambda _c, _u, _mid, granted: self.subacks.put(granted)
                self.client.on_disconnect = lambda _c, _u, rc: self.disconnects.put(rc)
        else:
            self.client.on_connect = lambda _c, _u, flags, rc, props: self.connack.put((flags, rc))
            self.client.on_subscribe = lambda _c, _u, _mid, codes, props: self.subacks.put(codes)
            self.client.on_disconnect = lambda _c, _u, _flags, rc, props: self.disconnects.put(rc)
        if credentials is not None:
            self.client.username_pw_set(*credentials)
        if will is not None:
            self.client.will_set(*will)
        connect_kwargs: dict[str, Any] = {"keepalive": keepalive}
        if protocol == paho.MQTTv5:
            connect_kwargs["clean_start"] = clean
            connect_kwargs["properties"] = properties
        self.client.connect(broker.host, broker.port, **connect_kwargs)
        self.client.loop_start()

    def connected(self) -> tuple[Any, Any]:
        """(flags, return/reason code) of the CONNACK."""
        return self.connack.get(timeout=TIMEOUT)

    def subscribe(self, topic: str, qos: int = 0, **kwargs: Any) -> Any:
        self.client.subscribe(topic, qos, **kwargs)
        return self.subacks.get(timeout=TIMEOUT)

    def publish(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False, **kwargs: Any) -> None:
        info = self.client.publish(topic, payload, qos, retain, **kwargs)
        info.wait_for_publish(TIMEOUT)
        assert info.is_published()

    def message(self, timeout: float = TIMEOUT) -> paho.MQTTMessage:
        return self.messages.get(timeout=timeout)

    def messages_within(self, seconds: float) -> list[paho.MQTTMessage]:
        time.sleep(seconds)
        out = []
        while not self.messages.empty():
            out.append(self.messages.get())
        return out

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()

    def __enter__(self) -> Paho:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def codes(values: Iterable[Any]) -> list[int]:
    """Reason codes / granted QoS of a paho callback as ints (ReasonCode or int)."""
    return [v.value if hasattr(v, "value") else int(v) for v in values]
