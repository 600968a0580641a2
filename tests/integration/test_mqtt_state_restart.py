"""MQTT's durable state through the real server: paho-mqtt 2.x clients (MQTT 5) against
``leveret server`` on a data directory, killed with SIGKILL and started again. A
persistent session comes back (session present, its queued QoS 1 message delivered)
and a retained message is sent to a new subscriber, byte for byte."""

from __future__ import annotations

import queue
import threading
from pathlib import Path

import pytest
from servers import ServerProcess

mqtt = pytest.importorskip("paho.mqtt.client")
from paho.mqtt.packettypes import PacketTypes  # noqa: E402
from paho.mqtt.properties import Properties  # noqa: E402

TIMEOUT = 10.0


class Client:
    """A paho-mqtt 2.x client (VERSION2 callbacks, MQTT 5) on its own network thread;
    what it receives goes to :attr:`messages`."""

    def __init__(self, port: int, client_id: str, clean_start: bool, expiry: int | None = None) -> None:
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id, protocol=mqtt.MQTTv5)
        self.messages: queue.Queue = queue.Queue()
        self.connack: queue.Queue = queue.Queue()
        self.subscribed = threading.Event()
        self.client.on_connect = lambda c, u, flags, rc, props: self.connack.put((flags.session_present, rc))
        self.client.on_message = lambda c, u, m: self.messages.put((m.topic, m.payload, m.qos, m.retain))
        self.client.on_subscribe = lambda *args: self.subscribed.set()
        properties = None
        if expiry is not None:
            properties = Properties(PacketTypes.CONNECT)
            properties.SessionExpiryInterval = expiry
        self.client.connect("127.0.0.1", port, keepalive=30, clean_start=clean_start, properties=properties)
        self.client.loop_start()
        present, reason = self.connack.get(timeout=TIMEOUT)
        assert not reason.is_failure, reason
        self.session_present = present

    def subscribe(self, topic_filter: str, qos: int) -> None:
        self.subscribed.clear()
        self.client.subscribe(topic_filter, qos)
        assert self.subscribed.wait(TIMEOUT)

    def publish(self, topic: str, payload: bytes, qos: int, retain: bool = False) -> None:
        self.client.publish(topic, payload, qos, retain).wait_for_publish(TIMEOUT)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def test_a_persistent_session_and_a_retained_message_survive_kill_9(tmp_path: Path):
    server = ServerProcess(tmp_path / "data")
    try:
        assert server.mqtt_port is not None
        device = Client(server.mqtt_port, "device-7", clean_start=False, expiry=3600)
        device.subscribe("fleet/+/cmd", 1)
        device.close()
        sender = Client(server.mqtt_port, "sender", clean_start=True)
        # routed to device-7's durable queue: the PUBACK waits for the store
        sender.publish("fleet/7/cmd", b"\x00retained\xff", 1, retain=True)
        sender.publish("fleet/8/cmd", b"queued", 1)
        sender.close()
    finally:
        server.kill()  # SIGKILL: no clean shutdown
    server = ServerProcess(tmp_path / "data")
    try:
        assert server.mqtt_port is not None
        device = Client(server.mqtt_port, "device-7", clean_start=False, expiry=3600)
        assert device.session_present
        received = sorted([device.messages.get(timeout=TIMEOUT), device.messages.get(timeout=TIMEOUT)])
        assert [(topic, payload, qos) for topic, payload, qos, _ in received] == [
            ("fleet/7/cmd", b"\x00retained\xff", 1),
            ("fleet/8/cmd", b"queued", 1),
        ]
        device.close()
        newcomer = Client(server.mqtt_port, "newcomer", clean_start=True)
        newcomer.subscribe("fleet/#", 1)
        assert newcomer.messages.get(timeout=TIMEOUT) == ("fleet/7/cmd", b"\x00retained\xff", 1, True)
        assert newcomer.messages.empty()
        newcomer.close()
    finally:
        server.kill()
