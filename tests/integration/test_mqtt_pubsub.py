"""PUBLISH / SUBSCRIBE with QoS 0, 1 and 2 in both directions: exact packet flows, QoS
downgrade, packet identifiers, ordering, receive maximum; paho-mqtt (both callback APIs,
3.1.1 and 5), aiomqtt and gmqtt. Runs against leveret or mosquitto (MQTT_BROKER,
tests/mqtt_brokers.py). Sections are MQTT 5.0's unless marked."""

from __future__ import annotations

import asyncio

import pytest
from mqtt_brokers import unique
from mqtt_clients import (
    API_VERSIONS,
    PROTOCOLS,
    V5,
    V311,
    Paho,
    Raw,
    ack_publish,
    raw_connected,
    subscriber_and_publisher,
)

from leveret.protocol.mqtt import packets as p


@pytest.mark.parametrize("version", [V311, V5])
@pytest.mark.parametrize("sub_qos", [0, 1, 2])
@pytest.mark.parametrize("pub_qos", [0, 1, 2])
def test_qos_flows_and_downgrade(mqtt_broker, version, pub_qos, sub_qos):
    # §4.3: QoS 0 no ack; QoS 1 PUBLISH/PUBACK; QoS 2 PUBLISH/PUBREC/PUBREL/PUBCOMP, in
    # both directions. §3.8.4: delivered at min(published QoS, subscription's maximum).
    topic = unique("qos/t")
    with raw_connected(mqtt_broker, version) as subscriber, raw_connected(mqtt_broker, version) as publisher:
        assert subscriber.subscribe(p.Subscription(topic, sub_qos)).reason_codes == (sub_qos,)
        publisher.publish(topic, b"payload", qos=pub_qos, packet_id=77 if pub_qos else None)
        message = subscriber.recv_publish()
        qos = min(pub_qos, sub_qos)
        assert (message.topic, message.payload, message.qos, message.dup, message.retain) == (
            topic,
            b"payload",
            qos,
            False,
            False,
        )
        assert (message.packet_id is None) == (qos == 0)
        ack_publish(subscriber, message)
        subscriber.nothing(0.2)
        publisher.nothing(0.05)


def test_in_flight_packet_ids_are_distinct(mqtt_broker):
    # §2.2.1: a packet identifier is not reused while its exchange is in flight.
    topic = unique("ids/t")
    with subscriber_and_publisher(mqtt_broker, topic, 1) as (subscriber, publisher):
        for i in range(1, 6):
            publisher.publish(topic, b"%d" % i, qos=1, packet_id=i)
        messages = [subscriber.recv_publish() for _ in range(5)]
        ids = [m.packet_id for m in messages]
        assert len(set(ids)) == 5 and all(ids)


@pytest.mark.parametrize("qos", [0, 1, 2])
def test_order_is_kept_per_topic(mqtt_broker, qos):
    # §4.6: messages published to one topic at one QoS are delivered in that order.
    topic = unique("ord/t")
    with subscriber_and_publisher(mqtt_broker, topic, qos) as (subscriber, publisher):
        for i in range(1, 21):
            publisher.publish(topic, b"%d" % i, qos=qos, packet_id=i if qos else None)
        got = []
        for _ in range(20):
            message = subscriber.recv_publish()
            got.append(int(message.payload))
            ack_publish(subscriber, message)
        assert got == list(range(1, 21))


#: The 5.0 PUBACK reason code for a QoS 1 PUBLISH no subscription matched. §3.4.2.1 allows
#: 0x00 or 0x10 no matching subscribers: mosquitto 2.0.11 says 0x10, leveret 0x00 (an
#: AMQP binding may still take the message; docs/mqtt.md, Differences). For QoS 2 both
#: answer PUBREC 0x00.
PUBACK_NO_SUBSCRIBERS = {"leveret": 0x00, "mosquitto": 0x10}


def test_v5_puback_without_subscribers(mqtt_broker):
    with raw_connected(mqtt_broker, V5) as publisher:
        topic = unique("nobody/t")
        publisher.send(p.Publish(topic, b"x", 1, packet_id=3))
        assert publisher.recv() == p.PubAck(3, PUBACK_NO_SUBSCRIBERS[mqtt_broker.name])
        publisher.send(p.Publish(topic, b"x", 2, packet_id=4))
        assert publisher.recv() == p.PubRec(4, 0x00)
        publisher.send(p.PubRel(4))
        assert publisher.recv() == p.PubComp(4)


#: Whether the broker holds the receive maximum after the first window. [MQTT-3.3.4-9]
#: says it must (leveret does); mosquitto 2.0.11 sends the first 2 and then, for each
#: acknowledgement, up to 2 more (4 unacknowledged with receive maximum 2, QoS 1 and 2).
RECEIVE_MAXIMUM_HELD = {"leveret": True, "mosquitto": False}


@pytest.mark.parametrize("qos", [1, 2])
def test_receive_maximum_limits_unacknowledged_publishes(mqtt_broker, qos):
    # §3.1.2.11.3 [MQTT-3.3.4-9]: the server sends no more QoS 1/2 PUBLISH packets than
    # the client's receive maximum (2 here) without acknowledgement (PUBACK, or PUBCOMP
    # for QoS 2). The client lets the window fill, then completes the oldest exchange.
    topic = unique("rm/t")
    with raw_connected(mqtt_broker, V5, properties=((p.RECEIVE_MAXIMUM, 2),)) as subscriber:
        subscriber.subscribe(p.Subscription(topic, qos))
        with raw_connected(mqtt_broker, V5) as publisher:
            for i in range(1, 7):
                publisher.publish(topic, b"%d" % i, qos=qos, packet_id=i)
        in_flight: list[p.Publish] = []
        seen: list[bytes] = []
        windows = []
        while len(seen) < 6:
            try:
                while True:
                    message = subscriber.recv(0.3)
                    assert isinstance(message, p.Publish), message
                    in_flight.append(message)
                    seen.append(message.payload)
            except TimeoutError:
                pass
            windows.append(len(in_flight))
            assert in_flight, f"nothing in flight and only {seen} received"
            ack_publish(subscriber, in_flight.pop(0))
        assert seen == [b"%d" % i for i in range(1, 7)]
        assert windows[0] == 2, windows
        if RECEIVE_MAXIMUM_HELD[mqtt_broker.name]:
            assert max(windows) == 2, windows


@pytest.mark.parametrize("api", API_VERSIONS, ids=["api1", "api2"])
@pytest.mark.parametrize("protocol", PROTOCOLS, ids=["v311", "v5"])
@pytest.mark.parametrize("qos", [0, 1, 2])
def test_paho_round_trip(mqtt_broker, api, protocol, qos):
    topic = unique("paho/t")
    with Paho(mqtt_broker, api, protocol) as subscriber, Paho(mqtt_broker, api, protocol) as publisher:
        subscriber.connected()
        publisher.connected()
        granted = subscriber.subscribe(topic, qos)
        assert [getattr(g, "value", g) for g in granted] == [qos]
        publisher.publish(topic, b"\x00binary\xff", qos)
        message = subscriber.message()
        assert (message.topic, message.payload, message.qos) == (topic, b"\x00binary\xff", qos)


def test_aiomqtt_round_trip_v311_and_v5(mqtt_broker):
    aiomqtt = pytest.importorskip("aiomqtt")

    async def main() -> None:
        for version in (aiomqtt.ProtocolVersion.V311, aiomqtt.ProtocolVersion.V5):
            topic = unique("aio/t")
            async with (
                aiomqtt.Client(mqtt_broker.host, mqtt_broker.port, protocol=version) as subscriber,
                aiomqtt.Client(mqtt_broker.host, mqtt_broker.port, protocol=version) as publisher,
            ):
                await subscriber.subscribe(topic, qos=1)
                for i in range(3):
                    await publisher.publish(topic, b"m%d" % i, qos=i % 3)
                got = []
                async for message in subscriber.messages:
                    got.append((str(message.topic), message.payload, message.qos))
                    if len(got) == 3:
                        break
                assert got == [(topic, b"m0", 0), (topic, b"m1", 1), (topic, b"m2", 1)]

    asyncio.run(asyncio.wait_for(main(), 20))


def test_aiomqtt_credentials(mqtt_broker):
    aiomqtt = pytest.importorskip("aiomqtt")
    user, password = mqtt_broker.credentials()
    bad_user, bad_password = mqtt_broker.bad_credentials()

    async def main() -> None:
        async with aiomqtt.Client(mqtt_broker.host, mqtt_broker.port, username=user, password=password):
            pass
        with pytest.raises(aiomqtt.MqttError):
            async with aiomqtt.Client(
                mqtt_broker.host, mqtt_broker.port, username=bad_user, password=bad_password
            ):
                pass

    asyncio.run(asyncio.wait_for(main(), 20))


async def gmqtt_connected(gmqtt, broker, name: str, received: asyncio.Queue | None = None, **connect):
    """A gmqtt client (client id ``name`` made unique) connected to ``broker`` (``connect``:
    gmqtt's connect options); with ``received``, each message it gets is put there as
    (topic, payload, qos, properties)."""
    client = gmqtt.Client(unique(name))
    if received is not None:

        def on_message(_client, topic_name, payload, qos, properties):
            received.put_nowait((topic_name, payload, qos, properties))
            return 0

        client.on_message = on_message
    await client.connect(broker.host, broker.port, **connect)
    return client


def test_gmqtt_round_trip_with_user_properties(mqtt_broker):
    gmqtt = pytest.importorskip("gmqtt")
    topic = unique("gmqtt/t")

    async def main() -> None:
        received: asyncio.Queue = asyncio.Queue()
        subscriber = await gmqtt_connected(gmqtt, mqtt_broker, "gsub", received)
        publisher = await gmqtt_connected(gmqtt, mqtt_broker, "gpub")
        subscriber.subscribe(topic, qos=2)
        await asyncio.sleep(0.2)
        publisher.publish(
            topic,
            b"gmqtt body",
            qos=2,
            user_property=[("k", "v"), ("k", "w")],
            content_type="text/plain",
        )
        topic_name, payload, qos, properties = await asyncio.wait_for(received.get(), 5)
        assert (topic_name, payload, qos) == (topic, b"gmqtt body", 2)
        assert properties["user_property"] == [("k", "v"), ("k", "w")]
        assert properties["content_type"] == ["text/plain"]
        await publisher.disconnect()
        await subscriber.disconnect()

    asyncio.run(asyncio.wait_for(main(), 20))


def test_gmqtt_v311(mqtt_broker):
    gmqtt = pytest.importorskip("gmqtt")
    topic = unique("gmqtt311/t")

    async def main() -> None:
        received: asyncio.Queue = asyncio.Queue()
        client = await gmqtt_connected(gmqtt, mqtt_broker, "g311", received, version=gmqtt.constants.MQTTv311)
        client.subscribe(topic, qos=1)
        await asyncio.sleep(0.2)
        client.publish(topic, b"self", qos=1)
        assert (await asyncio.wait_for(received.get(), 5))[:3] == (topic, b"self", 1)
        await client.disconnect()

    asyncio.run(asyncio.wait_for(main(), 20))


def test_v311_publish_gets_plain_acks(mqtt_broker):
    # 3.1.1 §3.4-3.7: the acknowledgements are exactly 4 bytes (no reason code).
    with Raw(mqtt_broker, V311) as raw:
        raw.connect()
        raw.send(p.Publish(unique("plain/t"), b"x", 1, packet_id=5))
        raw.sock.settimeout(5)
        assert raw.sock.recv(10) == b"\x40\x02\x00\x05"
        raw.send(p.Publish(unique("plain/t"), b"x", 2, packet_id=6))
        assert raw.sock.recv(10) == b"\x50\x02\x00\x06"
        raw.send(p.PubRel(6))
        assert raw.sock.recv(10) == b"\x70\x02\x00\x06"


#: The PUBCOMP reason code for a PUBREL whose packet identifier the server does not know.
#: §3.7.2.1 has 0x92 packet identifier not found for it (leveret); it is not a MUST, and
#: mosquitto 2.0.11 answers 0x00.
PUBCOMP_UNKNOWN_ID = {"leveret": 0x92, "mosquitto": 0x00}


def test_v5_pubrel_for_unknown_packet_id_gets_pubcomp(mqtt_broker):
    with raw_connected(mqtt_broker, V5) as raw:
        raw.send(p.PubRel(999))
        assert raw.recv() == p.PubComp(999, PUBCOMP_UNKNOWN_ID[mqtt_broker.name])
