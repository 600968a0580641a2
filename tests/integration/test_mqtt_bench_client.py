"""The MQTT benchmarks' lean client (bench/mqtt_client.py): the PUBLISH bytes it splices
decode as leveret's codec encodes them, its counting parser survives any split of the
stream, and it round-trips QoS 0 and QoS 1 (packet identifiers wrapping past 65,535)
through a private mosquitto and, once it has MQTT, leveret."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from brokers import Leveret, Mosquitto, mosquitto_installed
from mqtt_client import Client, Publishes, connect

from leveret.protocol.mqtt import packets as P

SRC = str(Path(__file__).resolve().parents[2] / "src")


@pytest.mark.parametrize("version", [P.MQTT_3_1_1, P.MQTT_5])
def test_spliced_qos1_publishes_decode_with_their_ids(version: int) -> None:
    pubs = Publishes("bench/t", b"x" * 100, qos=1, version=version)
    pubs._next_id = 65534  # the next batch wraps: 65534, 65535, 1, 2
    packets = P.PacketReader(version).feed(pubs.batch(4))
    assert [p.packet_id for p in packets] == [65534, 65535, 1, 2]
    for p in packets:
        assert p == P.Publish("bench/t", b"x" * 100, qos=1, packet_id=p.packet_id)


def test_counting_parser_survives_every_split() -> None:
    version = P.MQTT_3_1_1
    stream = (
        Publishes("a", b"y" * 200, 0, version).batch(2)  # remaining length > 127: a 2-byte varint
        + Publishes("a/b", b"z", 1, version).batch(3)
        + P.encode(P.PubAck(7), version) * 2
        + P.encode(P.PingResp(), version)
    )
    for cut in range(1, len(stream)):
        client = Client(version)
        client.data_received(stream[:cut])
        client.data_received(stream[cut:])
        assert (client.received, client.acked, client.pingresps) == (5, 2, 1), cut


async def _round_trip(port: int, version: int) -> None:
    sub = await connect("127.0.0.1", port, "bench-test-sub", version, receive_maximum=100)
    await sub.subscribe("bench/test", 1)
    pub = await connect("127.0.0.1", port, "bench-test-pub", version)
    qos0 = Publishes("bench/test", b"0" * 100, 0, version)
    qos1 = Publishes("bench/test", b"1" * 100, 1, version)
    qos1._next_id = 65500  # the identifiers wrap during the run
    pub.write(qos0.batch(500))
    for _ in range(10):  # 100 in flight at a time, as the bench does
        pub.write(qos1.batch(100))
        target = pub.acked + 100
        deadline = time.monotonic() + 10
        while pub.acked < target and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
    deadline = time.monotonic() + 10
    while sub.received < 1500 and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    pub.ping()
    await asyncio.sleep(0.2)
    assert (sub.received, pub.acked, pub.pingresps) == (1500, 1000, 1)
    assert not sub.closed and not pub.closed
    sub.disconnect()
    pub.disconnect()


@pytest.mark.skipif(not mosquitto_installed(), reason="mosquitto is not installed")
@pytest.mark.parametrize("version", [P.MQTT_3_1_1, P.MQTT_5])
def test_round_trip_through_mosquitto(version: int) -> None:
    with Mosquitto(max_inflight_messages=100) as broker:
        asyncio.run(_round_trip(broker.mqtt_port, version))


@pytest.mark.skipif(not Leveret(src=SRC).has_mqtt(), reason="leveret has no --mqtt-port yet")
@pytest.mark.parametrize("version", [P.MQTT_3_1_1, P.MQTT_5])
def test_round_trip_through_leveret(version: int) -> None:
    with Leveret(src=SRC, mqtt=True) as broker:
        asyncio.run(_round_trip(broker.mqtt_port, version))
