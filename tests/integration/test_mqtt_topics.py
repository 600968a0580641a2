"""Topic names and filters: wildcard matching (§4.7), topics starting with "$", topic
filters that are not allowed, SUBSCRIBE / UNSUBSCRIBE acknowledgements. Runs against
leveret or mosquitto (MQTT_BROKER, tests/mqtt_brokers.py). Sections are MQTT 5.0's
unless marked."""

from __future__ import annotations

import pytest
from mqtt_brokers import unique
from mqtt_clients import V5, V311, ack_publish, raw_connected, subscriber_and_publisher

from leveret.protocol.mqtt import packets as p

# (filter, topic, matches) under a per-test prefix; §4.7.1's examples and more.
MATCHING = [
    ("sport/tennis/player1/#", "sport/tennis/player1", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/ranking", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/score/wimbledon", True),
    ("sport/#", "sport", True),
    ("sport/tennis/+", "sport/tennis/player1", True),
    ("sport/tennis/+", "sport/tennis/player1/ranking", False),
    ("sport/+", "sport", False),
    ("sport/+", "sport/", True),
    ("+/+", "/finance", True),
    ("/+", "/finance", True),
    ("+", "/finance", False),
    ("+/tennis/#", "sport/tennis/x", True),
    ("a/b", "a/B", False),  # case sensitive (§4.7.3)
    ("a b/c", "a b/c", True),  # spaces are allowed
    ("дом/温度", "дом/温度", True),
    ("a//b", "a/b", False),  # a zero-length level is a level
    ("a/+/b", "a//b", True),
]


@pytest.mark.parametrize(("topic_filter", "topic", "matches"), MATCHING)
def test_wildcard_matching(mqtt_broker, topic_filter, topic, matches):
    # A control message on another subscription, published after the one under test,
    # marks the end: what matched has arrived before it (one connection, one queue).
    prefix, control = unique("w"), unique("ctl")
    with raw_connected(mqtt_broker, V5) as subscriber, raw_connected(mqtt_broker, V5) as publisher:
        assert subscriber.subscribe(p.Subscription(f"{prefix}/{topic_filter}", 1)).reason_codes == (1,)
        subscriber.subscribe(p.Subscription(control, 1), packet_id=2)
        publisher.publish(f"{prefix}/{topic}", b"m", qos=1)
        publisher.publish(control, b"end", qos=1)
        seen = []
        while (message := subscriber.recv_publish()).topic != control:
            seen.append(message.topic)
            ack_publish(subscriber, message)
        assert seen == ([f"{prefix}/{topic}"] if matches else [])


#: The 5.0 PUBACK reason code for a client's PUBLISH to a topic starting with "$".
#: §4.7.2 reserves such topics for the server; leveret refuses them with 0x87 not
#: authorized (the message is dropped); mosquitto 2.0.11 routes them like any topic.
DOLLAR_PUBLISH = {"leveret": 0x87, "mosquitto": 0x00}


def test_dollar_topics_are_not_matched_by_leading_wildcards(mqtt_broker):
    # §4.7.2 [MQTT-4.7.2-1]: "#" and "+/..." do not match topics starting with "$"; a
    # filter starting with "$" does (where clients may publish there at all).
    name = "$" + unique("dollar")
    with (
        raw_connected(mqtt_broker, V5) as everything,
        raw_connected(mqtt_broker, V5) as plus,
        raw_connected(mqtt_broker, V5) as explicit,
        raw_connected(mqtt_broker, V5) as publisher,
    ):
        everything.subscribe(p.Subscription("#", 0))
        plus.subscribe(p.Subscription("+/x", 0))
        explicit.subscribe(p.Subscription(f"{name}/#", 0))
        publisher.send(p.Publish(f"{name}/x", b"dollar", 1, packet_id=1))
        code = DOLLAR_PUBLISH[mqtt_broker.name]
        assert publisher.recv() == p.PubAck(1, code)
        if code == 0:
            assert explicit.recv_publish().topic == f"{name}/x"
        marker = unique("marker")
        publisher.publish(f"{marker}/x", b"marker", qos=1, packet_id=2)
        for subscriber in (everything, plus):
            while True:  # "#" also sees other tests' retained messages: skip those
                message = subscriber.recv_publish()
                assert not message.topic.startswith("$"), message
                if message.topic == f"{marker}/x":
                    break
        explicit.nothing(0.1)


#: What SUBSCRIBE to a filter §4.7.1 does not allow gets. 3.1.1 [MQTT-4.7.1-1/2] leaves
#: the answer to the server; 5.0 §3.9.3 has SUBACK 0x8F topic filter invalid. leveret
#: answers SUBACK 0x80 failure (3.1.1) / 0x8F (5.0), as RabbitMQ; mosquitto 2.0.11 closes
#: the connection (5.0: after DISCONNECT 0x81 malformed packet).
BAD_FILTER = {
    "leveret": {V311: ("suback", (0x80,)), V5: ("suback", (0x8F,))},
    "mosquitto": {V311: ("disconnect", None), V5: ("disconnect", 0x81)},
}


@pytest.mark.parametrize("bad", ["a/#/b", "a+", "a/b#", "#/a", "+a/b", "a/+b"])
@pytest.mark.parametrize("version", [V311, V5])
def test_bad_topic_filters_are_refused(mqtt_broker, version, bad):
    # §4.7.1: "#" only last and alone in its level, "+" alone in its level.
    with raw_connected(mqtt_broker, version) as raw:
        raw.send(p.Subscribe(1, (p.Subscription(bad, 0),)))
        assert raw.suback_or_disconnect() == BAD_FILTER[mqtt_broker.name][version]
        if BAD_FILTER[mqtt_broker.name][version][0] == "suback":  # the connection carries on
            raw.send(p.PingReq())
            assert raw.recv() == p.PingResp()


@pytest.mark.parametrize("version", [V311, V5])
def test_empty_topic_filter_is_refused(mqtt_broker, version):
    # §4.7.3 [MQTT-4.7.3-1]: topic filters are at least one character long. Both close
    # the connection; in 5.0 leveret's DISCONNECT says 0x82 protocol error (its codec's,
    # as §4.7.3 words it a rule, not a parse failure), mosquitto 2.0.11's 0x81.
    with raw_connected(mqtt_broker, version) as raw:
        raw.send(p.Subscribe(1, (p.Subscription("", 0),)))
        code = {"leveret": 0x82, "mosquitto": 0x81}[mqtt_broker.name] if version == V5 else None
        assert raw.suback_or_disconnect() == ("disconnect", code)


def test_subscribe_with_several_filters_answers_each(mqtt_broker):
    # §3.9.3 [MQTT-3.8.4-6]: one reason code per filter, in order (the granted QoS).
    base = unique("multi")
    with raw_connected(mqtt_broker, V5) as raw:
        ack = raw.subscribe(
            p.Subscription(f"{base}/a", 2), p.Subscription(f"{base}/b", 0), p.Subscription(f"{base}/c", 1)
        )
        assert ack.reason_codes == (2, 0, 1)


def test_resubscribe_replaces_the_subscription(mqtt_broker):
    # §3.8.4 [MQTT-3.8.4-3]: a SUBSCRIBE with the filter of an existing subscription
    # replaces it (new maximum QoS); a message is then delivered once.
    topic = unique("resub/t")
    with raw_connected(mqtt_broker, V5) as subscriber, raw_connected(mqtt_broker, V5) as publisher:
        subscriber.subscribe(p.Subscription(topic, 0), packet_id=1)
        subscriber.subscribe(p.Subscription(topic, 2), packet_id=2)
        publisher.publish(topic, b"once", qos=2)
        message = subscriber.recv_publish()
        assert (message.payload, message.qos) == (b"once", 2)
        subscriber.send(p.PubRec(message.packet_id))  # type: ignore[arg-type]
        assert subscriber.recv() == p.PubRel(message.packet_id)  # type: ignore[arg-type]
        subscriber.send(p.PubComp(message.packet_id))  # type: ignore[arg-type]
        subscriber.nothing()


@pytest.mark.parametrize("version", [V311, V5])
def test_unsubscribe(mqtt_broker, version):
    # §3.10.4, §3.11.3: UNSUBACK with 0x00 success / 0x11 no subscription existed (5.0);
    # 3.1.1's UNSUBACK has no payload. Afterwards no message arrives for the filter.
    topic = unique("unsub/t")
    with subscriber_and_publisher(mqtt_broker, topic, 1, version) as (subscriber, publisher):
        subscriber.send(p.Unsubscribe(2, (topic, topic + "/never")))
        ack = subscriber.recv()
        assert ack == p.UnsubAck(2, (0x00, 0x11) if version == V5 else ())
        publisher.publish(topic, b"gone", qos=1)
        subscriber.nothing()
