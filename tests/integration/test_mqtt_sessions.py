"""Sessions: session present, clean session / clean start, session expiry interval,
persistent sessions keeping subscriptions and queued QoS 1/2 messages across reconnects
and broker restarts, session takeover, redelivery with DUP. Runs against leveret or
mosquitto (MQTT_BROKER, tests/mqtt_brokers.py). Sections are MQTT 5.0's unless marked."""

from __future__ import annotations

import time

import paho.mqtt.client as paho
import pytest
from mqtt_brokers import unique
from mqtt_clients import V5, V311, Paho, Raw, ack_publish, raw_connected

from leveret.protocol.mqtt import packets as p


def persistent(version: int, expiry: int = 300) -> dict:
    """CONNECT fields of a session that outlives the connection: 3.1.1 clean session 0;
    5.0 clean start 0 with a session expiry interval (seconds)."""
    if version == V311:
        return {"clean_start": False}
    return {"clean_start": False, "properties": ((p.SESSION_EXPIRY_INTERVAL, expiry),)}


def leave_session(broker, version: int, cid: str, topic: str, qos: int) -> tuple[int, ...]:
    """Connect a persistent session ``cid`` (see persistent), subscribe it to ``topic`` at
    ``qos``, disconnect: the session stays. Returns the SUBACK's reason codes."""
    first = raw_connected(broker, version, client_id=cid, **persistent(version))
    codes = first.subscribe(p.Subscription(topic, qos)).reason_codes
    first.disconnect()
    return codes


def resumed(broker, version: int, cid: str) -> Raw:
    """A new connection resuming the persistent session ``cid``: its CONNACK must say
    session present (3.1.1 §3.2.2.2 / 5.0 §3.2.2.1.1)."""
    raw = Raw(broker, version)
    try:
        assert raw.connect(client_id=cid, **persistent(version)).session_present
    except BaseException:
        raw.close()
        raise
    return raw


@pytest.mark.parametrize("version", [V311, V5])
def test_session_present_after_reconnect(mqtt_broker, version):
    # 3.1.1 §3.2.2.2 / 5.0 §3.2.2.1.1: session present is 1 when the server resumes a session.
    cid = unique("sp")
    assert leave_session(mqtt_broker, version, cid, unique("sp/t"), 1) == (1,)
    with Raw(mqtt_broker, version) as again:
        ack = again.connect(client_id=cid, **persistent(version))
        assert ack.reason_code == 0 and ack.session_present
        again.disconnect()
    with Raw(mqtt_broker, version) as clean:  # clean start: the old session is discarded
        ack = clean.connect(client_id=cid, clean_start=True)
        assert ack.reason_code == 0 and not ack.session_present


@pytest.mark.parametrize("version", [V311, V5])
def test_clean_start_drops_subscriptions(mqtt_broker, version):
    cid, topic = unique("cs"), unique("cs/t")
    leave_session(mqtt_broker, version, cid, topic, 1)
    with raw_connected(mqtt_broker, version, client_id=cid, clean_start=True) as clean:
        with raw_connected(mqtt_broker, V5) as publisher:
            publisher.publish(topic, b"x", qos=1)
        clean.nothing()


def test_v5_session_expiry_zero_ends_session_at_disconnect(mqtt_broker):
    # §3.1.2.11.2: no session expiry interval (0) → the session ends when the network
    # connection closes, even with clean start 0.
    cid = unique("se0")
    raw_connected(mqtt_broker, V5, client_id=cid, clean_start=False).disconnect()
    with Raw(mqtt_broker, V5) as again:
        assert not again.connect(client_id=cid, clean_start=False).session_present


def test_v5_session_expiry_interval_elapses(mqtt_broker):
    # §3.1.2.11.2: the server keeps the session for the interval (1 s here) after the
    # connection closes, then deletes it.
    cid = unique("se1")
    raw_connected(mqtt_broker, V5, client_id=cid, **persistent(V5, expiry=1)).disconnect()
    with Raw(mqtt_broker, V5) as again:  # within the interval: resumed
        assert again.connect(client_id=cid, **persistent(V5, expiry=1)).session_present
        again.disconnect()
    time.sleep(2.5)
    with Raw(mqtt_broker, V5) as late:
        assert not late.connect(client_id=cid, **persistent(V5, expiry=1)).session_present


def test_v5_disconnect_sets_session_expiry_to_zero(mqtt_broker):
    # §3.14.2.2.2: DISCONNECT may change the session expiry interval (not from 0).
    cid = unique("sed")
    raw = raw_connected(mqtt_broker, V5, client_id=cid, **persistent(V5))
    raw.send(p.Disconnect(0, ((p.SESSION_EXPIRY_INTERVAL, 0),)))
    raw.close()
    time.sleep(0.2)
    with Raw(mqtt_broker, V5) as again:
        assert not again.connect(client_id=cid, **persistent(V5)).session_present


def test_v5_disconnect_raising_expiry_from_zero_is_a_protocol_error(mqtt_broker):
    # §3.14.2.2.2 [MQTT-3.14.2-2]: a DISCONNECT with a non-zero session expiry interval
    # when CONNECT had 0 is a protocol error: DISCONNECT 0x82 from the server.
    raw = raw_connected(mqtt_broker, V5)
    raw.send(p.Disconnect(0, ((p.SESSION_EXPIRY_INTERVAL, 60),)))
    assert raw.disconnected_with() == 0x82
    raw.close()


@pytest.mark.parametrize("version", [V311, V5])
def test_persistent_session_queues_qos1_and_qos2(mqtt_broker, version):
    # 3.1.1 §4.1 / 5.0 §4.1: the session state keeps subscriptions and QoS 1 and 2
    # messages pending transmission while the client is disconnected.
    cid, topic = unique("ps"), unique("ps/t")
    assert leave_session(mqtt_broker, version, cid, topic, 2) == (2,)
    with raw_connected(mqtt_broker, V5) as publisher:
        publisher.publish(topic, b"one", qos=1, packet_id=1)
        publisher.publish(topic, b"two", qos=2, packet_id=2)
    with resumed(mqtt_broker, version, cid) as again:
        got = []
        for _ in range(2):
            message = again.recv_publish()
            got.append((message.payload, message.qos, message.dup))
            ack_publish(again, message)
        assert got == [(b"one", 1, False), (b"two", 2, False)]
        again.nothing()


def test_paho_persistent_session_v311_api1(mqtt_broker):
    cid, topic = unique("pp"), unique("pp/t")
    api = paho.CallbackAPIVersion.VERSION1
    with Paho(mqtt_broker, api, paho.MQTTv311, client_id=cid, clean=False) as client:
        client.connected()
        assert client.subscribe(topic, 1) == (1,)
    with Paho(mqtt_broker, paho.CallbackAPIVersion.VERSION2, paho.MQTTv5) as publisher:
        publisher.connected()
        publisher.publish(topic, b"while away", qos=1)
    with Paho(mqtt_broker, api, paho.MQTTv311, client_id=cid, clean=False) as client:
        flags, rc = client.connected()
        assert rc == 0 and flags["session present"] == 1
        message = client.message()
        assert (message.topic, message.payload, message.qos) == (topic, b"while away", 1)


def test_persistent_session_survives_broker_restart(mqtt_own_broker):
    # The issue: persistent sessions keep subscriptions and queued QoS 1/2 messages across
    # broker restarts (mosquitto: with persistence on, saved at shutdown).
    broker = mqtt_own_broker
    cid, topic = unique("rs"), unique("rs/t")
    leave_session(broker, V5, cid, topic, 2)
    with raw_connected(broker, V5) as publisher:
        publisher.publish(topic, b"queued-1", qos=1)
        publisher.publish(topic, b"queued-2", qos=2)
        publisher.publish(topic + "/retained", b"kept", qos=1, retain=True)
    broker.restart()
    with resumed(broker, V5, cid) as again:
        got = []
        for _ in range(2):
            message = again.recv_publish()
            got.append((message.payload, message.qos))
            ack_publish(again, message)
        assert got == [(b"queued-1", 1), (b"queued-2", 2)]
        with raw_connected(broker, V5) as publisher:  # the subscription is still there
            publisher.publish(topic, b"after", qos=1)
        after = again.recv_publish()
        assert after.payload == b"after"
        ack_publish(again, after)
        again.subscribe(topic + "/retained", packet_id=7)
        retained = again.recv_publish()
        assert (retained.payload, retained.retain) == (b"kept", True)


#: What the old 5.0 connection gets on session takeover before it is closed: §3.1.4
#: step 3 says the server sends DISCONNECT 0x8E session taken over (leveret does, as
#: RabbitMQ 3.13); mosquitto 2.0.11 only closes the socket.
TAKEOVER_V5 = {"leveret": 0x8E, "mosquitto": None}


@pytest.mark.parametrize("version", [V311, V5])
def test_session_takeover_closes_old_connection(mqtt_broker, version):
    # 3.1.1 §3.1.4 [MQTT-3.1.4-2] / 5.0 [MQTT-3.1.4-3]: the server MUST close the
    # existing client's network connection (5.0: see TAKEOVER_V5).
    cid = unique("to")
    old = raw_connected(mqtt_broker, version, client_id=cid, **persistent(version))
    topic = unique("to/t")
    old.subscribe(p.Subscription(topic, 1))
    new = Raw(mqtt_broker, version)
    try:
        ack = new.connect(client_id=cid, **persistent(version))
        assert ack.reason_code == 0 and ack.session_present
        assert old.disconnected_with() == (TAKEOVER_V5[mqtt_broker.name] if version == V5 else None)
        with raw_connected(mqtt_broker, V5) as publisher:  # the new connection has the session
            publisher.publish(topic, b"to-new", qos=1)
        assert new.recv_publish().payload == b"to-new"
    finally:
        old.close()
        new.close()


@pytest.mark.parametrize("qos", [1, 2])
@pytest.mark.parametrize("version", [V311, V5])
def test_unacknowledged_publish_is_redelivered_with_dup(mqtt_broker, version, qos):
    # 3.1.1 §4.4 / 5.0 §4.4 [MQTT-4.4.0-1]: on reconnect with a session the server resends
    # unacknowledged PUBLISH packets with DUP set and their original packet identifiers.
    # Of three messages the client completes the first and third, so the resent one had
    # the second identifier the server gave.
    cid, topic = unique("dup"), unique("dup/t")
    first = raw_connected(mqtt_broker, version, client_id=cid, **persistent(version))
    first.subscribe(p.Subscription(topic, qos))
    with raw_connected(mqtt_broker, V5) as publisher:
        for i in range(3):
            publisher.publish(topic, b"m%d" % i, qos=qos, packet_id=i + 1)
    got = [first.recv_publish() for _ in range(3)]
    assert [(m.payload, m.dup, m.qos) for m in got] == [(b"m%d" % i, False, qos) for i in range(3)]
    ack_publish(first, got[0])
    ack_publish(first, got[2])
    first.nothing(0.2)
    first.close()  # m1 neither PUBACKed nor PUBRECed
    with resumed(mqtt_broker, version, cid) as again:
        resent = again.recv_publish()
        assert (resent.payload, resent.qos, resent.dup, resent.packet_id) == (
            b"m1",
            qos,
            True,
            got[1].packet_id,
        )
        ack_publish(again, resent)
        again.nothing()


def test_qos2_after_pubrec_the_server_resends_pubrel(mqtt_broker):
    # §4.4: after PUBREC the server resends PUBREL (not the PUBLISH) on reconnect.
    cid, topic = unique("rel"), unique("rel/t")
    first = raw_connected(mqtt_broker, V5, client_id=cid, **persistent(V5))
    first.subscribe(p.Subscription(topic, 2))
    with raw_connected(mqtt_broker, V5) as publisher:
        publisher.publish(topic, b"exactly once", qos=2)
    message = first.recv_publish()
    first.send(p.PubRec(message.packet_id))  # type: ignore[arg-type]
    rel = first.recv()
    assert rel == p.PubRel(message.packet_id)  # type: ignore[arg-type]
    first.close()  # no PUBCOMP
    with resumed(mqtt_broker, V5, cid) as again:
        assert again.recv() == p.PubRel(message.packet_id)  # type: ignore[arg-type]
        again.send(p.PubComp(message.packet_id))  # type: ignore[arg-type]
        again.nothing()


def test_qos2_inbound_is_delivered_once_across_reconnect(mqtt_broker):
    # §4.3.3: the receiver of a QoS 2 PUBLISH delivers it once; a resent PUBLISH (DUP)
    # before PUBREL is not delivered again, and PUBREL after reconnect gets PUBCOMP.
    cid, topic = unique("in2"), unique("in2/t")
    with raw_connected(mqtt_broker, V5) as subscriber:
        subscriber.subscribe(p.Subscription(topic, 2))
        sender = raw_connected(mqtt_broker, V5, client_id=cid, **persistent(V5))
        sender.send(p.Publish(topic, b"once", 2, packet_id=9))
        assert sender.recv() == p.PubRec(9)
        sender.close()
        with resumed(mqtt_broker, V5, cid) as again:
            again.send(p.Publish(topic, b"once", 2, dup=True, packet_id=9))
            assert again.recv() == p.PubRec(9)
            again.send(p.PubRel(9))
            assert again.recv() == p.PubComp(9)
        delivered = [subscriber.recv_publish()]
        ack_publish(subscriber, delivered[0])
        subscriber.nothing(0.5)
        assert [m.payload for m in delivered] == [b"once"]


#: Seconds the test waits between the broker's acknowledgement and kill -9. leveret
#: writes an accepted QoS 1 message and the session state to its store before PUBACK
#: (0); mosquitto 2.0.11 keeps them in memory and saves them on its next loop turn
#: (autosave_on_changes in the test config), so it is given 0.5 s.
SAVED_AFTER = {"leveret": 0.0, "mosquitto": 0.5}


def test_persistent_session_survives_kill_9(mqtt_own_broker):
    broker = mqtt_own_broker
    cid, topic = unique("k9"), unique("k9/t")
    leave_session(broker, V5, cid, topic, 1)
    with raw_connected(broker, V5) as publisher:
        publisher.publish(topic, b"acknowledged", qos=1)
    time.sleep(SAVED_AFTER[broker.name])
    broker.kill()
    broker.start()
    with resumed(broker, V5, cid) as again:
        message = again.recv_publish()
        assert (message.payload, message.qos) == (b"acknowledged", 1)
