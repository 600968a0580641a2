"""Fuzzing the MQTT connection's state machine (sans-I/O, on a real core): any sequence
of well-formed packets from two clients, in 3.1.1 or 5.0, is answered or refused with a
DISCONNECT, never an exception (the server would log an internal error); and what the
broker sends stays within what the client allowed (Receive Maximum)."""

from __future__ import annotations

from hypothesis import given, strategies as st
from sans_io import FUZZ, FakeLoop, FakeTransport

from leveret.core.broker import BrokerCore
from leveret.protocol.mqtt import packets as p
from leveret.protocol.mqtt.connection import MqttConnection

TOPICS = ["a", "a/b", "a/b/c", "$x/y", "b"]
FILTERS = [*TOPICS, "a/+", "#", "+/b", "$share/g/a/#", "$share/g/#", "a/#/b", "+a"]
pid = st.integers(1, 6)
props = st.sampled_from(
    [(), ((p.TOPIC_ALIAS, 1),), ((p.TOPIC_ALIAS, 12),), ((p.MESSAGE_EXPIRY_INTERVAL, 1),),
     ((p.USER_PROPERTY, ("k", "v")), (p.CONTENT_TYPE, "t"))]
)
packet = st.one_of(
    st.builds(
        lambda topic, qos, retain, dup, packet_id, properties: p.Publish(
            topic, b"x", qos, retain, dup and qos > 0, packet_id if qos else None, properties
        ),
        st.sampled_from([*TOPICS, ""]), st.integers(0, 2), st.booleans(), st.booleans(), pid, props,
    ),
    st.builds(
        lambda packet_id, filters, qos, no_local, handling: p.Subscribe(
            packet_id, tuple(p.Subscription(f, qos, no_local, False, handling) for f in filters)
        ),
        pid, st.lists(st.sampled_from(FILTERS), min_size=1, max_size=3), st.integers(0, 2), st.booleans(),
        st.integers(0, 2),
    ),
    st.builds(lambda packet_id, filters: p.Unsubscribe(packet_id, tuple(filters)), pid,
              st.lists(st.sampled_from(FILTERS), min_size=1, max_size=2)),
    st.builds(p.PubAck, pid), st.builds(p.PubRec, pid), st.builds(p.PubRel, pid), st.builds(p.PubComp, pid),
    st.just(p.PingReq()),
    st.builds(p.Disconnect, st.sampled_from([0, 4])),
)


class _Client:
    def __init__(
        self, core: BrokerCore, loop: FakeLoop, client_id: str, version: int, receive_max: int
    ) -> None:
        self.transport = FakeTransport()
        self.version = version
        self.pending: set[MqttConnection] = set()
        self.connection = MqttConnection(core, self.transport, loop, self.pending.add, "127.0.0.1:1")
        self.reader = p.PacketReader(version)
        self.read = 0
        self.in_flight: set[int] = set()
        self.receive_max = receive_max
        properties: tuple = ()
        if version == 5:
            properties = ((p.RECEIVE_MAXIMUM, receive_max), (p.SESSION_EXPIRY_INTERVAL, 5))
        self.feed(p.Connect(client_id, clean_start=False, properties=properties))

    def feed(self, packet: p.Packet) -> None:
        if self.connection.state == "closed":
            return
        if isinstance(packet, (p.PubAck, p.PubComp)):
            self.in_flight.discard(packet.packet_id)
        self.connection.data_received(p.encode(packet, self.version))
        self.check()

    def check(self) -> None:
        while self.pending:  # as the server's flusher: a flush may ask for another
            self.pending.pop().flush()
        data = bytes(self.transport.output[self.read :])
        self.read = len(self.transport.output)
        for sent in self.reader.feed(data):
            if isinstance(sent, p.Publish) and sent.qos and not sent.dup:
                self.in_flight.add(sent.packet_id)  # type: ignore[arg-type]
        if self.version == 5:
            assert len(self.in_flight) <= self.receive_max


@FUZZ
@given(
    st.sampled_from([4, 5]),
    st.sampled_from([4, 5]),
    st.lists(st.tuples(st.booleans(), packet), max_size=25),
)
def test_any_packet_sequence_is_handled(version_a, version_b, steps):
    loop = FakeLoop()
    core = BrokerCore(loop)
    clients = [_Client(core, loop, "fuzz-a", version_a, 2), _Client(core, loop, "fuzz-b", version_b, 3)]
    for second, step in steps:
        client = clients[second]
        if client.version == 4 and isinstance(step, p.Disconnect):
            step = p.Disconnect()
        client.feed(step)  # raises if the connection let an exception out
        loop.advance(0.4)
        for each in clients:
            each.check()
    for client in clients:
        client.connection.connection_lost()
    loop.advance(10)  # wills, session expiry
