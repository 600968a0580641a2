"""One broker, three protocols: MQTT topics are routing keys on ``amq.topic`` (``/`` ↔
``.``, ``+`` ↔ ``*``), so paho-mqtt, pika and stomp.py clients reach each other, bodies
byte for byte and properties mapped both ways (docs/mqtt.md), as RabbitMQ's MQTT
plugin maps them."""

from __future__ import annotations

import queue
import uuid
from collections.abc import Iterator

import paho.mqtt.client as mqtt
import pika
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from stomp_clients import Client as StompClient

from leveret.server.broker import BlockingBroker

BODY = bytes(range(256)) * 4  # every byte value, NUL included


@pytest.fixture(scope="module")
def broker() -> Iterator[BlockingBroker]:
    with BlockingBroker(amqp_port=0, stomp_port=0, mqtt_port=0) as broker:
        yield broker


class Mqtt:
    """A paho-mqtt 2.x client whose messages land in a queue."""

    def __init__(self, port: int, protocol: int = mqtt.MQTTv5) -> None:
        self.messages: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
        self.client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2, f"interop-{uuid.uuid4().hex[:8]}", protocol=protocol
        )
        self.client.on_message = lambda client, userdata, message: self.messages.put(message)
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()

    def subscribe(self, topic: str, qos: int = 1) -> None:
        granted: queue.Queue[object] = queue.Queue()
        self.client.on_subscribe = lambda *args: granted.put(args)
        self.client.subscribe(topic, qos)
        granted.get(timeout=5)

    def message(self, timeout: float = 5.0) -> mqtt.MQTTMessage:
        return self.messages.get(timeout=timeout)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@pytest.fixture
def mqtt_client(broker) -> Iterator[Mqtt]:
    client = Mqtt(broker.mqtt_port)
    yield client
    client.close()


def test_an_mqtt_publish_reaches_an_amqp_queue_with_its_properties(broker, mqtt_client):
    connection = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
    channel = connection.channel()
    queue_name = channel.queue_declare("", exclusive=True).method.queue
    channel.queue_bind(queue_name, "amq.topic", "sensors.*.temp")
    properties = Properties(PacketTypes.PUBLISH)
    properties.ContentType = "application/octet-stream"
    properties.CorrelationData = b"corr-1"
    properties.ResponseTopic = "replies/here"
    properties.UserProperty = [("site", "lab")]
    properties.MessageExpiryInterval = 60
    mqtt_client.client.publish("sensors/kitchen/temp", BODY, qos=1, properties=properties).wait_for_publish(5)
    method, header, body = None, None, None
    for _ in range(50):
        method, header, body = channel.basic_get(queue_name, auto_ack=True)
        if method is not None:
            break
        connection.sleep(0.05)
    assert method is not None and body == BODY
    assert method.routing_key == "sensors.kitchen.temp"
    assert header.delivery_mode == 2  # QoS 1
    assert header.content_type == "application/octet-stream"
    assert header.correlation_id == "corr-1"
    assert header.reply_to == "replies/here"
    assert header.headers["site"] == "lab" and header.headers["x-mqtt-publish-qos"] == 1
    assert 0 < int(header.expiration) <= 60_000
    connection.close()


def test_an_amqp_publish_reaches_an_mqtt_subscriber_with_its_properties(broker, mqtt_client):
    mqtt_client.subscribe("orders/+/created", qos=1)
    connection = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
    channel = connection.channel()
    channel.basic_publish(
        "amq.topic",
        "orders.eu.created",
        BODY,
        pika.BasicProperties(
            delivery_mode=2,
            content_type="text/plain",
            correlation_id="c-9",
            reply_to="answers",
            headers={"tenant": "acme", "n": 7},
        ),
    )
    message = mqtt_client.message()
    assert message.topic == "orders/eu/created" and message.payload == BODY and message.qos == 1
    props = message.properties
    assert props.ContentType == "text/plain" and props.CorrelationData == b"c-9"
    assert props.ResponseTopic == "answers"
    assert ("tenant", "acme") in props.UserProperty and ("n", "7") in props.UserProperty
    channel.basic_publish("amq.topic", "orders.eu.created", b"transient")  # not persistent: QoS 0
    assert mqtt_client.message().qos == 0
    connection.close()


def test_stomp_and_mqtt_reach_each_other(broker, mqtt_client):
    with StompClient(broker.broker.stomp_port) as stomp_client:
        stomp_client.subscribe("/topic/alerts.#")
        mqtt_client.client.publish("alerts/disk", b"full", qos=1).wait_for_publish(5)
        frame = stomp_client.message()
        assert frame.body == b"full" and frame.headers["destination"] == "/topic/alerts.disk"
        assert frame.headers["x-mqtt-publish-qos"] == "1"
        mqtt_client.subscribe("alerts/#", qos=1)
        stomp_client.send("/topic/alerts.cpu", b"hot", persistent="true", **{"content-type": "text/plain"})
        message = mqtt_client.message()
        assert message.topic == "alerts/cpu" and message.payload == b"hot" and message.qos == 1
        assert message.properties.ContentType == "text/plain"


def test_dots_in_mqtt_topics_survive_the_round_trip(broker, mqtt_client):
    mqtt_client.subscribe("v1.2/+/x.y", qos=0)
    mqtt_client.client.publish("v1.2/a.b/x.y", b"dotted", qos=0)
    message = mqtt_client.message()
    assert message.topic == "v1.2/a.b/x.y" and message.payload == b"dotted"


def test_an_mqtt_311_client_gets_amqp_messages_without_properties(broker):
    client = Mqtt(broker.mqtt_port, mqtt.MQTTv311)
    try:
        client.subscribe("legacy/#", qos=2)
        connection = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
        connection.channel().basic_publish(
            "amq.topic", "legacy.x", b"hello", pika.BasicProperties(delivery_mode=2, headers={"a": "b"})
        )
        message = client.message()
        assert (message.topic, message.payload, message.qos) == ("legacy/x", b"hello", 1)
        connection.close()
    finally:
        client.close()
