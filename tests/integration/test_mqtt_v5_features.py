"""MQTT 5.0 features: message properties forwarded, message expiry, topic aliases, maximum
packet size (both ways), subscription identifiers, no local, shared subscriptions. Runs
against leveret or mosquitto (MQTT_BROKER, tests/mqtt_brokers.py)."""

from __future__ import annotations

import time
from collections import Counter

import paho.mqtt.client as paho
import pytest
from mqtt_brokers import unique
from mqtt_clients import V5, Paho, Raw, ack_publish, raw_connected, subscriber_and_publisher
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from leveret.protocol.mqtt import packets as p

# -- properties ---------------------------------------------------------------------------

MESSAGE_PROPERTIES = (
    (p.PAYLOAD_FORMAT_INDICATOR, 1),
    (p.CONTENT_TYPE, "application/json"),
    (p.RESPONSE_TOPIC, "replies/here"),
    (p.CORRELATION_DATA, b"\x00\x01corr"),
    (p.USER_PROPERTY, ("b", "2")),
    (p.USER_PROPERTY, ("a", "1")),
    (p.USER_PROPERTY, ("b", "3")),
)


def test_message_properties_are_forwarded_unchanged(mqtt_broker):
    # §3.3.2.3: payload format indicator, content type, response topic, correlation data
    # and user properties (order kept, [MQTT-3.3.2-18]) reach the subscriber unaltered.
    topic = unique("props/t")
    with subscriber_and_publisher(mqtt_broker, topic, 1) as (subscriber, publisher):
        publisher.publish(topic, b'{"k": 1}', qos=1, properties=MESSAGE_PROPERTIES)
        message = subscriber.recv_publish()
        assert message.payload == b'{"k": 1}'
        assert tuple(x for x in message.properties if x[0] != p.SUBSCRIPTION_IDENTIFIER) == MESSAGE_PROPERTIES


def test_message_expiry_interval_counts_down(mqtt_broker):
    # §3.3.2.3.3: the server forwards the expiry interval less the time the message waited.
    topic, cid = unique("exp/t"), unique("exp")
    session = ((p.SESSION_EXPIRY_INTERVAL, 60),)
    raw_connected(mqtt_broker, V5, client_id=cid, clean_start=False, properties=session).subscribe(
        p.Subscription(topic, 1)
    )
    with raw_connected(mqtt_broker, V5) as publisher:
        publisher.publish(topic, b"lives", qos=1, properties=((p.MESSAGE_EXPIRY_INTERVAL, 60),))
        publisher.publish(topic, b"dies", qos=1, properties=((p.MESSAGE_EXPIRY_INTERVAL, 1),))
    time.sleep(2.1)
    with Raw(mqtt_broker, V5) as again:
        assert again.connect(client_id=cid, clean_start=False, properties=session).session_present
        message = again.recv_publish()
        assert message.payload == b"lives"
        left = p.get_property(message.properties, p.MESSAGE_EXPIRY_INTERVAL)
        assert isinstance(left, int) and 55 <= left <= 59
        ack_publish(again, message)
        again.nothing()  # the expired one is not sent [MQTT-3.3.2-5]


def test_paho_v5_properties_round_trip(mqtt_broker):
    topic = unique("pprops/t")
    with Paho(mqtt_broker) as subscriber, Paho(mqtt_broker) as publisher:
        subscriber.connected()
        publisher.connected()
        subscriber.subscribe(topic, 1)
        props = Properties(PacketTypes.PUBLISH)
        props.ContentType = "text/plain"
        props.ResponseTopic = "r/t"
        props.CorrelationData = b"c-1"
        props.UserProperty = [("x", "1"), ("y", "2")]
        publisher.publish(topic, b"body", 1, properties=props)
        message = subscriber.message()
        got = message.properties
        assert (got.ContentType, got.ResponseTopic, got.CorrelationData) == ("text/plain", "r/t", b"c-1")
        assert got.UserProperty == [("x", "1"), ("y", "2")]


# -- topic aliases ------------------------------------------------------------------------


def _alias_maximum(raw: Raw, ack: p.ConnAck) -> int:
    value = p.get_property(ack.properties, p.TOPIC_ALIAS_MAXIMUM)
    return int(value) if value else 0


def test_client_topic_alias(mqtt_broker):
    # §3.3.2.3.4: a PUBLISH with topic name and alias sets the alias; later PUBLISHes may
    # carry an empty topic name and the alias. The subscriber sees the full topic name.
    topic = unique("alias/t")
    with Raw(mqtt_broker, V5) as publisher, raw_connected(mqtt_broker, V5) as subscriber:
        maximum = _alias_maximum(publisher, publisher.connect())
        if not maximum:
            pytest.skip(f"{mqtt_broker.name} advertises no topic alias maximum")
        subscriber.subscribe(p.Subscription(topic, 0))
        publisher.publish(topic, b"set", properties=((p.TOPIC_ALIAS, 1),))
        publisher.publish("", b"used", properties=((p.TOPIC_ALIAS, 1),))
        got = [subscriber.recv_publish(), subscriber.recv_publish()]
        assert [(m.topic, m.payload) for m in got] == [(topic, b"set"), (topic, b"used")]
        assert all(p.get_property(m.properties, p.TOPIC_ALIAS) is None for m in got)


def test_topic_alias_above_maximum_is_refused(mqtt_broker):
    # §3.3.2.3.4 [MQTT-3.3.2-9]: an alias of 0 or above the server's topic alias maximum
    # → DISCONNECT 0x94 topic alias invalid.
    with Raw(mqtt_broker, V5) as publisher:
        maximum = _alias_maximum(publisher, publisher.connect())
        publisher.publish(unique("alias/t"), b"x", properties=((p.TOPIC_ALIAS, maximum + 1),))
        assert publisher.disconnected_with() == 0x94


def test_unknown_topic_alias_is_a_protocol_error(mqtt_broker):
    # §3.3.4 / §4.13: an empty topic name with an alias never set is a protocol error.
    with Raw(mqtt_broker, V5) as publisher:
        if not _alias_maximum(publisher, publisher.connect()):
            pytest.skip(f"{mqtt_broker.name} advertises no topic alias maximum")
        publisher.publish("", b"x", properties=((p.TOPIC_ALIAS, 1),))
        assert publisher.disconnected_with() == 0x82


def test_server_aliases_only_within_the_clients_maximum(mqtt_broker):
    # §3.1.2.11.5 [MQTT-3.1.2-26/27]: the server sends no topic alias to a client that
    # set no topic alias maximum, and none above it otherwise; any alias it uses maps
    # back to the topic it was set with.
    topic = unique("salias/t")
    with (
        raw_connected(mqtt_broker, V5) as plain,
        raw_connected(mqtt_broker, V5, properties=((p.TOPIC_ALIAS_MAXIMUM, 2),)) as aliased,
        raw_connected(mqtt_broker, V5) as publisher,
    ):
        plain.subscribe(p.Subscription(topic, 0))
        aliased.subscribe(p.Subscription(topic, 0))
        for i in range(3):
            publisher.publish(topic, b"%d" % i)
        aliases: dict[int, str] = {}
        for i in range(3):
            message = plain.recv_publish()
            assert (message.topic, p.get_property(message.properties, p.TOPIC_ALIAS)) == (topic, None)
            message = aliased.recv_publish()
            alias = p.get_property(message.properties, p.TOPIC_ALIAS)
            if alias is not None:
                assert isinstance(alias, int) and 1 <= alias <= 2
                if message.topic:
                    aliases[alias] = message.topic
                assert aliases[alias] == topic
            else:
                assert message.topic == topic
            assert message.payload == b"%d" % i


# -- maximum packet size ------------------------------------------------------------------


def test_server_drops_messages_larger_than_the_clients_maximum_packet_size(mqtt_broker):
    # §3.1.2.11.4 [MQTT-3.1.2-25]: the server does not send a packet larger than the
    # client's maximum packet size; it discards the message as if delivered.
    topic = unique("mps/t")
    with (
        raw_connected(mqtt_broker, V5, properties=((p.MAXIMUM_PACKET_SIZE, 200),)) as small,
        raw_connected(mqtt_broker, V5) as publisher,
    ):
        small.subscribe(p.Subscription(topic, 1))
        publisher.publish(topic, b"x" * 500, qos=1)
        publisher.publish(topic, b"fits", qos=1)
        message = small.recv_publish()
        assert message.payload == b"fits"
        ack_publish(small, message)
        small.nothing()


def test_packet_larger_than_the_servers_maximum_is_refused(mqtt_broker):
    # §3.2.2.3.6 [MQTT-3.2.2-15]: a packet larger than the server's maximum packet size
    # is a protocol violation: DISCONNECT 0x95 packet too large; others carry on.
    with Raw(mqtt_broker, V5) as raw, raw_connected(mqtt_broker, V5) as bystander:
        ack = raw.connect()
        limit = p.get_property(ack.properties, p.MAXIMUM_PACKET_SIZE)
        if limit is None:
            pytest.skip(f"{mqtt_broker.name} advertises no maximum packet size")
        assert isinstance(limit, int)
        topic = unique("big/t")
        bystander.subscribe(p.Subscription(topic, 1))
        overhead = len(p.encode(p.Publish(topic, b"", 1, packet_id=1, properties=()), V5))
        try:
            raw.send(p.Publish(topic, b"x" * (limit - overhead + 10), 1, packet_id=1))
        except OSError:
            pass  # the server may close while we are still sending
        assert raw.disconnected_with() == 0x95
        bystander.nothing(0.2)
        with raw_connected(mqtt_broker, V5) as publisher:
            publisher.publish(topic, b"still here", qos=1)
        assert bystander.recv_publish().payload == b"still here"


# -- subscription identifiers -------------------------------------------------------------


def test_subscription_identifier_is_sent_with_matching_messages(mqtt_broker):
    # §3.8.2.1.2, §3.3.4 [MQTT-3.3.4-3]: a PUBLISH carries the identifier of the
    # subscription it matched; none for a subscription made without one.
    base = unique("sid")
    with raw_connected(mqtt_broker, V5) as subscriber, raw_connected(mqtt_broker, V5) as publisher:
        subscriber.subscribe(
            p.Subscription(f"{base}/a", 0), packet_id=1, properties=((p.SUBSCRIPTION_IDENTIFIER, 7),)
        )
        subscriber.subscribe(p.Subscription(f"{base}/b", 0), packet_id=2)
        publisher.publish(f"{base}/a", b"a")
        publisher.publish(f"{base}/b", b"b")
        a, b = subscriber.recv_publish(), subscriber.recv_publish()
        assert p.get_property(a.properties, p.SUBSCRIPTION_IDENTIFIER) == 7
        assert p.get_property(b.properties, p.SUBSCRIPTION_IDENTIFIER) is None


def test_overlapping_subscriptions_deliver_each_identifier(mqtt_broker):
    # §3.3.4 [MQTT-3.3.4-4/5]: with overlapping subscriptions the server either sends one
    # PUBLISH per subscription, each with its identifier, or one with all identifiers.
    base = unique("sido")
    with raw_connected(mqtt_broker, V5) as subscriber, raw_connected(mqtt_broker, V5) as publisher:
        subscriber.subscribe(
            p.Subscription(f"{base}/+", 0), packet_id=1, properties=((p.SUBSCRIPTION_IDENTIFIER, 1),)
        )
        subscriber.subscribe(
            p.Subscription(f"{base}/#", 0), packet_id=2, properties=((p.SUBSCRIPTION_IDENTIFIER, 300),)
        )
        publisher.publish(f"{base}/x", b"both")
        first = subscriber.recv_publish()
        ids = [v for k, v in first.properties if k == p.SUBSCRIPTION_IDENTIFIER]
        if len(ids) == 1:
            second = subscriber.recv_publish()
            ids += [v for k, v in second.properties if k == p.SUBSCRIPTION_IDENTIFIER]
        assert sorted(ids) == [1, 300]  # type: ignore[type-var]
        subscriber.nothing(0.2)


# -- no local -----------------------------------------------------------------------------


def test_no_local(mqtt_broker):
    # §3.8.3.1 [MQTT-3.8.3-3]: no local 1 → the server does not forward a connection's own
    # publishes to it; others' still arrive.
    topic = unique("nolocal/t")
    with raw_connected(mqtt_broker, V5) as me, raw_connected(mqtt_broker, V5) as other:
        me.subscribe(p.Subscription(topic, 1, no_local=True))
        me.publish(topic, b"mine", qos=1)
        other.publish(topic, b"theirs", qos=1)
        message = me.recv_publish()
        assert message.payload == b"theirs"
        ack_publish(me, message)
        me.nothing(0.3)


def test_paho_no_local(mqtt_broker):
    from paho.mqtt.subscribeoptions import SubscribeOptions

    topic = unique("pnolocal/t")
    with Paho(mqtt_broker, paho.CallbackAPIVersion.VERSION1) as client:
        client.connected()
        client.subscribe(topic, options=SubscribeOptions(qos=1, noLocal=True))
        client.publish(topic, b"echo?", 1)
        assert client.messages_within(0.3) == []


# -- shared subscriptions -----------------------------------------------------------------


def test_shared_subscription_gives_each_message_to_one_member(mqtt_broker):
    # §4.8.2: each message matching a shared subscription goes to one of its sessions;
    # a non-shared subscription on the same topic still gets every message.
    topic, group = unique("shared/t"), unique("g")
    with (
        raw_connected(mqtt_broker, V5) as m1,
        raw_connected(mqtt_broker, V5) as m2,
        raw_connected(mqtt_broker, V5) as everyone,
        raw_connected(mqtt_broker, V5) as publisher,
    ):
        for member in (m1, m2):
            assert member.subscribe(p.Subscription(f"$share/{group}/{topic}", 1)).reason_codes == (1,)
        everyone.subscribe(p.Subscription(topic, 0))
        for i in range(10):
            publisher.publish(topic, b"%d" % i, qos=1, packet_id=i + 1)
        got: Counter = Counter()
        for member, name in ((m1, "m1"), (m2, "m2")):
            try:
                while True:
                    message = member.recv_publish(timeout=0.5)
                    assert message.topic == topic
                    got[message.payload] += 1
                    got[name] += 1
                    ack_publish(member, message)
            except TimeoutError:
                pass
        assert all(got[b"%d" % i] == 1 for i in range(10)), got
        assert got["m1"] + got["m2"] == 10 and got["m1"] and got["m2"], got
        assert sorted(everyone.recv_publish().payload for _ in range(10)) == sorted(
            b"%d" % i for i in range(10)
        )


#: Whether a new shared subscription gets the retained messages of its filter. §4.8.2:
#: retained messages are not sent to the session when it establishes a new shared
#: subscription (leveret); mosquitto 2.0.11 sends them (as for any subscription).
SHARED_GETS_RETAINED = {"leveret": False, "mosquitto": True}


def test_shared_subscription_and_retained_messages(mqtt_broker):
    topic = unique("sharedret/t")
    with raw_connected(mqtt_broker, V5) as publisher:
        publisher.publish(topic, b"r", qos=1, retain=True)
    with raw_connected(mqtt_broker, V5) as member:
        member.subscribe(p.Subscription(f"$share/{unique('g')}/{topic}", 1))
        if SHARED_GETS_RETAINED[mqtt_broker.name]:
            assert member.recv_publish().payload == b"r"
        else:
            member.nothing()


#: What SUBSCRIBE to a shared subscription with no local gets. [MQTT-3.8.3-4]: a
#: protocol error, DISCONNECT 0x82 (leveret); mosquitto 2.0.11 grants it (SUBACK 0x00).
SHARED_NO_LOCAL = {"leveret": ("disconnect", 0x82), "mosquitto": ("suback", (0,))}


def test_shared_subscription_with_no_local(mqtt_broker):
    with raw_connected(mqtt_broker, V5) as raw:
        raw.send(p.Subscribe(1, (p.Subscription(f"$share/g/{unique('t')}", 0, no_local=True),)))
        assert raw.suback_or_disconnect() == SHARED_NO_LOCAL[mqtt_broker.name]


#: What SUBSCRIBE to a bad shared subscription filter gets. [MQTT-4.8.2-1/2]: the share
#: name is at least one character without "/", "+" or "#", then "/" and a topic filter;
#: leveret answers SUBACK 0x8F topic filter invalid for any other. mosquitto 2.0.11
#: takes "$share/g" and "$share//t" as ordinary filters (granted), and closes with
#: DISCONNECT 0x81 malformed packet for a wildcard in the share name.
BAD_SHARED = {
    "leveret": dict.fromkeys(["$share/g", "$share//t", "$share/g+/t", "$share/g#/t"], ("suback", (0x8F,))),
    "mosquitto": {
        "$share/g": ("suback", (0,)),
        "$share//t": ("suback", (0,)),
        "$share/g+/t": ("disconnect", 0x81),
        "$share/g#/t": ("disconnect", 0x81),
    },
}


@pytest.mark.parametrize("bad", ["$share/g", "$share//t", "$share/g+/t", "$share/g#/t"])
def test_bad_shared_subscription_filters(mqtt_broker, bad):
    with raw_connected(mqtt_broker, V5) as raw:
        raw.send(p.Subscribe(1, (p.Subscription(bad, 0),)))
        assert raw.suback_or_disconnect() == BAD_SHARED[mqtt_broker.name][bad]
