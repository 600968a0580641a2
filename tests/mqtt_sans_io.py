"""An MQTT client on a sans-I/O :class:`~leveret.protocol.mqtt.connection.MqttConnection`
(tests/sans_io.py's fake loop is the broker's clock too), for the unit tests of the
MQTT adapter."""

from __future__ import annotations

from sans_io import FakeLoop, FakeTransport

from leveret.core.broker import BrokerCore
from leveret.protocol.mqtt import packets as p
from leveret.protocol.mqtt.connection import MqttConnection


class Client:
    """One MQTT client on a sans-I/O MqttConnection: sends packets, reads the answers."""

    def __init__(self, core: BrokerCore, loop: FakeLoop, version: int = p.MQTT_5) -> None:
        self.loop, self.version = loop, version
        self.transport = FakeTransport()
        self.pending: set[MqttConnection] = set()
        self.connection = MqttConnection(core, self.transport, loop, self.pending.add, "127.0.0.1:5000")
        self.reader = p.PacketReader(version)
        self._read = 0

    def send(self, packet: p.Packet) -> None:
        self.connection.data_received(p.encode(packet, self.version))
        self.flush()

    def flush(self) -> None:
        while self.pending:  # as the server's flusher: a flush may ask for another
            self.pending.pop().flush()

    def received(self) -> list[p.Packet]:
        """Packets written since the last call (after the loop turns due now: confirms)."""
        self.loop.advance(0)
        self.flush()
        data = bytes(self.transport.output[self._read :])
        self._read = len(self.transport.output)
        return self.reader.feed(data)

    def connect(self, client_id: str, **kwargs) -> p.ConnAck:
        self.send(p.Connect(client_id, **kwargs))
        (connack,) = self.received()
        assert isinstance(connack, p.ConnAck)
        return connack

    def subscribe(self, topic_filter: str, qos: int = 1, packet_id: int = 1, **props) -> p.SubAck:
        self.send(p.Subscribe(packet_id, (p.Subscription(topic_filter, qos),), **props))
        suback = self.received()[0]
        assert isinstance(suback, p.SubAck)
        return suback

    @property
    def closed(self) -> bool:
        return self.transport.closed or self.transport.aborted


def publishes(packets: list[p.Packet]) -> list[p.Publish]:
    return [packet for packet in packets if isinstance(packet, p.Publish)]
