"""Retained messages: set, replace, clear with an empty payload, delivered on subscribe
with the retain flag, retain as published, retain handling 0/1/2. Runs against leveret
or mosquitto (MQTT_BROKER, tests/mqtt_brokers.py). Sections are MQTT 5.0's unless marked."""

from __future__ import annotations

import paho.mqtt.client as paho
import pytest
from mqtt_brokers import unique
from mqtt_clients import V5, V311, Paho, ack_publish, raw_connected, subscriber_and_publisher

from leveret.protocol.mqtt import packets as p


@pytest.mark.parametrize("version", [V311, V5])
def test_retained_message_is_delivered_on_subscribe(mqtt_broker, version):
    # 3.1.1 §3.3.1.3 / 5.0 §3.3.1.3: the server keeps the last retained message of a topic
    # and sends it to new subscriptions with RETAIN 1.
    topic = unique("ret/t")
    with raw_connected(mqtt_broker, version) as publisher:
        publisher.publish(topic, b"first", qos=1, retain=True)
        publisher.publish(topic, b"second", qos=1, retain=True)  # replaces
    with raw_connected(mqtt_broker, version) as subscriber:
        subscriber.subscribe(p.Subscription(topic, 1))
        message = subscriber.recv_publish()
        assert (message.topic, message.payload, message.retain, message.qos) == (topic, b"second", True, 1)
        ack_publish(subscriber, message)
        subscriber.nothing()


def test_retained_message_qos_is_the_lower_of_both(mqtt_broker):
    topic = unique("retq/t")
    with raw_connected(mqtt_broker, V5) as publisher:
        publisher.publish(topic, b"q2", qos=2, retain=True)
    with raw_connected(mqtt_broker, V5) as subscriber:
        subscriber.subscribe(p.Subscription(topic, 1))
        message = subscriber.recv_publish()
        assert (message.payload, message.qos, message.retain) == (b"q2", 1, True)


def test_empty_retained_payload_clears(mqtt_broker):
    # §3.3.1.3 [MQTT-3.3.1-6/7]: a retained PUBLISH with an empty payload removes the
    # retained message and is not itself retained; it still goes to current subscribers.
    topic = unique("clr/t")
    with subscriber_and_publisher(mqtt_broker, topic, 0) as (live, publisher):
        publisher.publish(topic, b"kept", qos=1, retain=True)
        assert live.recv_publish().payload == b"kept"
        publisher.publish(topic, b"", qos=1, retain=True)
        cleared = live.recv_publish()
        assert cleared.payload == b""
    with raw_connected(mqtt_broker, V5) as subscriber:
        subscriber.subscribe(p.Subscription(topic, 1))
        subscriber.nothing()


@pytest.mark.parametrize("version", [V311, V5])
def test_live_delivery_clears_retain_flag(mqtt_broker, version):
    # 3.1.1 [MQTT-3.3.1-9] / 5.0 retain as published 0 [MQTT-3.3.1-12]: a retained message
    # forwarded to an existing subscription has RETAIN 0.
    topic = unique("live/t")
    with subscriber_and_publisher(mqtt_broker, topic, 0, version, version) as (subscriber, publisher):
        publisher.publish(topic, b"now", retain=True)
        message = subscriber.recv_publish()
        assert (message.payload, message.retain) == (b"now", False)


def test_retain_as_published_keeps_the_flag(mqtt_broker):
    # §3.8.3.1 [MQTT-3.3.1-13]: retain as published 1 → RETAIN as the publisher set it.
    topic = unique("rap/t")
    with raw_connected(mqtt_broker, V5) as subscriber, raw_connected(mqtt_broker, V5) as publisher:
        subscriber.subscribe(p.Subscription(topic, 0, retain_as_published=True))
        publisher.publish(topic, b"r", retain=True)
        publisher.publish(topic, b"n", retain=False)
        got = [subscriber.recv_publish(), subscriber.recv_publish()]
        assert [(m.payload, m.retain) for m in got] == [(b"r", True), (b"n", False)]


def test_retain_handling(mqtt_broker):
    # §3.8.3.1: retain handling 0 sends retained messages at every subscribe; 1 only if
    # the subscription did not exist; 2 never [MQTT-3.3.1-9..11].
    topic = unique("rh/t")
    with raw_connected(mqtt_broker, V5) as publisher:
        publisher.publish(topic, b"r", qos=1, retain=True)
    with raw_connected(mqtt_broker, V5) as subscriber:
        for handling, packet_id in ((0, 1), (0, 2)):  # 0: at every subscribe
            subscriber.subscribe(p.Subscription(topic, 0, retain_handling=handling), packet_id=packet_id)
            assert subscriber.recv_publish().payload == b"r"
        subscriber.subscribe(p.Subscription(topic, 0, retain_handling=1), packet_id=3)  # exists
        subscriber.nothing()
    with raw_connected(mqtt_broker, V5) as subscriber:
        subscriber.subscribe(p.Subscription(topic, 0, retain_handling=1), packet_id=4)  # new
        assert subscriber.recv_publish().payload == b"r"
    with raw_connected(mqtt_broker, V5) as subscriber:
        subscriber.subscribe(p.Subscription(topic, 0, retain_handling=2), packet_id=5)  # never
        subscriber.nothing()


def test_wildcard_subscription_gets_each_matching_retained_message(mqtt_broker):
    base = unique("retw")
    with raw_connected(mqtt_broker, V5) as publisher:
        for leaf in ("a", "b", "c/d"):
            publisher.publish(f"{base}/{leaf}", leaf.encode(), qos=1, retain=True)
    with raw_connected(mqtt_broker, V5) as subscriber:
        subscriber.subscribe(p.Subscription(f"{base}/+", 0))
        got = {subscriber.recv_publish().topic for _ in range(2)}
        assert got == {f"{base}/a", f"{base}/b"}
        subscriber.nothing()
        subscriber.subscribe(p.Subscription(f"{base}/#", 0), packet_id=2)
        got = {subscriber.recv_publish().topic for _ in range(3)}
        assert got == {f"{base}/a", f"{base}/b", f"{base}/c/d"}


@pytest.mark.parametrize("api", [paho.CallbackAPIVersion.VERSION1, paho.CallbackAPIVersion.VERSION2])
def test_paho_sees_retained_flag(mqtt_broker, api):
    topic = unique("pret/t")
    with Paho(mqtt_broker, api, paho.MQTTv311) as publisher:
        publisher.connected()
        publisher.publish(topic, b"retained body", qos=1, retain=True)
    with Paho(mqtt_broker, api, paho.MQTTv5) as subscriber:
        subscriber.connected()
        subscriber.subscribe(topic, 1)
        message = subscriber.message()
        assert (message.payload, message.retain) == (b"retained body", True)
