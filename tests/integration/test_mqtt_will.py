"""Will messages: sent when the connection ends abnormally, not on DISCONNECT 0x00, sent on
DISCONNECT 0x04 (5.0), will delay interval, will retain, will QoS and properties. Runs
against leveret or mosquitto (MQTT_BROKER, tests/mqtt_brokers.py). Sections are MQTT
5.0's unless marked."""

from __future__ import annotations

import time

import paho.mqtt.client as paho
import pytest
from mqtt_brokers import unique
from mqtt_clients import V5, V311, Paho, Raw, raw_connected

from leveret.protocol.mqtt import packets as p


def with_will(broker, version, topic, payload=b"gone", qos=0, retain=False, properties=(), **connect):
    return raw_connected(broker, version, will=p.Will(topic, payload, qos, retain, properties), **connect)


@pytest.mark.parametrize("version", [V311, V5])
def test_will_is_sent_when_connection_drops(mqtt_broker, version):
    # 3.1.1 §3.1.2.5 / 5.0 §3.1.2.5: the network connection closed without DISCONNECT.
    topic = unique("will/t")
    with raw_connected(mqtt_broker, V5) as watcher:
        watcher.subscribe(p.Subscription(topic, 1))
        with_will(mqtt_broker, version, topic, b"dropped", qos=1).close()
        message = watcher.recv_publish()
        assert (message.topic, message.payload, message.qos, message.retain) == (topic, b"dropped", 1, False)


@pytest.mark.parametrize("version", [V311, V5])
def test_will_is_not_sent_after_normal_disconnect(mqtt_broker, version):
    # 3.1.1 [MQTT-3.1.2-10] / 5.0 [MQTT-3.1.2-10]: DISCONNECT (reason 0x00) deletes the will.
    topic = unique("nowill/t")
    with raw_connected(mqtt_broker, V5) as watcher:
        watcher.subscribe(p.Subscription(topic, 1))
        with_will(mqtt_broker, version, topic).disconnect(0x00)
        watcher.nothing(0.5)


def test_v5_disconnect_with_will_message_sends_the_will(mqtt_broker):
    # §3.14.2.1: DISCONNECT 0x04 disconnect with will message.
    topic = unique("will04/t")
    with raw_connected(mqtt_broker, V5) as watcher:
        watcher.subscribe(p.Subscription(topic, 0))
        with_will(mqtt_broker, V5, topic, b"asked for").disconnect(0x04)
        assert watcher.recv_publish().payload == b"asked for"


def test_will_is_sent_when_the_server_closes_on_a_protocol_error(mqtt_broker):
    # §3.1.2.5: the server closes the connection because of a protocol error.
    topic = unique("willerr/t")
    with raw_connected(mqtt_broker, V5) as watcher:
        watcher.subscribe(p.Subscription(topic, 0))
        client = with_will(mqtt_broker, V5, topic, b"malformed")
        client.send_bytes(b"\x00\x00")  # packet type 0 is reserved
        client.closed_after()
        assert watcher.recv_publish().payload == b"malformed"


def test_will_retain_and_properties(mqtt_broker):
    # §3.1.2.7: will retain 1 → published as a retained message; §3.1.3.2: the will
    # properties travel with it (content type, user properties, response topic).
    topic = unique("willr/t")
    properties = (
        (p.CONTENT_TYPE, "text/plain"),
        (p.RESPONSE_TOPIC, "reply/here"),
        (p.USER_PROPERTY, ("device", "d-1")),
    )
    with_will(mqtt_broker, V5, topic, b"last words", qos=1, retain=True, properties=properties).close()
    time.sleep(0.2)
    with raw_connected(mqtt_broker, V5) as late:
        late.subscribe(p.Subscription(topic, 1))
        message = late.recv_publish()
        assert (message.payload, message.retain, message.qos) == (b"last words", True, 1)
        assert p.get_property(message.properties, p.CONTENT_TYPE) == "text/plain"
        assert p.get_property(message.properties, p.RESPONSE_TOPIC) == "reply/here"
        assert p.get_property(message.properties, p.USER_PROPERTY) == ("device", "d-1")


def test_will_delay_interval(mqtt_broker):
    # §3.1.3.2.2: the will is published after the will delay interval (1 s) once the
    # connection is closed, not at once (the session, expiry 60 s, outlives the delay).
    topic = unique("willd/t")
    with raw_connected(mqtt_broker, V5) as watcher:
        watcher.subscribe(p.Subscription(topic, 0))
        client = raw_connected(
            mqtt_broker,
            V5,
            will=p.Will(topic, b"delayed", 0, False, ((p.WILL_DELAY_INTERVAL, 1),)),
            clean_start=False,
            properties=((p.SESSION_EXPIRY_INTERVAL, 60),),
        )
        closed_at = time.monotonic()
        client.close()
        watcher.nothing(0.6)
        assert watcher.recv_publish(timeout=4).payload == b"delayed"
        assert time.monotonic() - closed_at >= 0.9


def test_will_delay_is_cancelled_by_reconnecting(mqtt_broker):
    # §3.1.3.2.2: if a new connection takes the session before the delay ends, the will
    # is not sent.
    topic, cid = unique("willc/t"), unique("willc")
    session = ((p.SESSION_EXPIRY_INTERVAL, 60),)
    with raw_connected(mqtt_broker, V5) as watcher:
        watcher.subscribe(p.Subscription(topic, 0))
        raw_connected(
            mqtt_broker,
            V5,
            client_id=cid,
            will=p.Will(topic, b"cancelled", 0, False, ((p.WILL_DELAY_INTERVAL, 1),)),
            clean_start=False,
            properties=session,
        ).close()
        with Raw(mqtt_broker, V5) as again:
            assert again.connect(client_id=cid, clean_start=False, properties=session).session_present
            watcher.nothing(1.5)
            again.disconnect()


#: Seconds until the will of a client with session expiry 0 and will delay 2 s arrives.
#: [MQTT-3.1.3-9]: when the will delay ends or the session ends, whichever is first, so
#: at once (leveret); mosquitto 2.0.11 waits the whole will delay.
WILL_AT_SESSION_END_WITHIN = {"leveret": 1.0, "mosquitto": 3.5}


def test_will_is_sent_when_the_session_ends_before_the_delay(mqtt_broker):
    # §3.1.3.2.2: session expiry 0 (the session ends with the connection), will delay 2 s.
    topic = unique("willse/t")
    with raw_connected(mqtt_broker, V5) as watcher:
        watcher.subscribe(p.Subscription(topic, 0))
        raw_connected(
            mqtt_broker, V5, will=p.Will(topic, b"session over", 0, False, ((p.WILL_DELAY_INTERVAL, 2),))
        ).close()
        within = WILL_AT_SESSION_END_WITHIN[mqtt_broker.name]
        assert watcher.recv_publish(timeout=within).payload == b"session over"


@pytest.mark.parametrize("protocol", [paho.MQTTv311, paho.MQTTv5], ids=["v311", "v5"])
def test_paho_will(mqtt_broker, protocol):
    topic = unique("pwill/t")
    with Paho(mqtt_broker) as watcher:
        watcher.connected()
        watcher.subscribe(topic, 1)
        client = Paho(mqtt_broker, protocol=protocol, will=(topic, b"paho gone", 1, False))
        client.connected()
        client.client.socket().close()  # no DISCONNECT
        message = watcher.message()
        assert (message.payload, message.qos) == (b"paho gone", 1)
        client.client.loop_stop()


#: Whether the old connection's will is published on session takeover, by (protocol
#: level, the new connection's clean start, will delay in seconds). 5.0 §3.1.3.2.2: it is,
#: unless the new connection has clean start 0 and the will delay is above 0 (clean
#: start 1 ends the session, which publishes a delayed will at once). 3.1.1 is silent:
#: leveret applies 5.0's rule for will delay 0 (published); mosquitto 2.0.11 publishes
#: it only when the new connection starts clean. In 5.0 mosquitto publishes it only for
#: clean start 1 and will delay 0.
#: Each value: (leveret's answer, mosquitto's).
TAKEOVER_WILL = {
    (V311, True, 0): (True, True),
    (V311, False, 0): (True, False),
    (V5, True, 0): (True, True),
    (V5, True, 5): (True, False),
    (V5, False, 0): (True, False),
    (V5, False, 5): (False, False),
}
BROKER_COLUMN = {"leveret": 0, "mosquitto": 1}


@pytest.mark.parametrize(("version", "clean_start", "delay"), list(TAKEOVER_WILL))
def test_will_on_session_takeover(mqtt_broker, version, clean_start, delay):
    topic, cid = unique("willto/t"), unique("willto")
    session = ((p.SESSION_EXPIRY_INTERVAL, 60),) if version == V5 else ()
    will_properties = ((p.WILL_DELAY_INTERVAL, delay),) if delay else ()
    with raw_connected(mqtt_broker, V5) as watcher:
        watcher.subscribe(p.Subscription(topic, 0))
        old = raw_connected(
            mqtt_broker,
            version,
            client_id=cid,
            clean_start=False,
            properties=session,
            will=p.Will(topic, b"taken over", 0, False, will_properties),
        )
        new = raw_connected(mqtt_broker, version, client_id=cid, clean_start=clean_start, properties=session)
        try:
            if TAKEOVER_WILL[version, clean_start, delay][BROKER_COLUMN[mqtt_broker.name]]:
                assert watcher.recv_publish(timeout=2).payload == b"taken over"
            else:
                watcher.nothing(0.6)
        finally:
            old.close()
            new.disconnect()
