"""Defects found by a second reading of the MQTT adapter, each pinned by a test on the
sans-I/O connection (tests/sans_io.py's fake loop is the broker's clock too)."""

from __future__ import annotations

import asyncio
import sqlite3
import time

import pytest
from mqtt_sans_io import Client, publishes

from leveret.core.auth import Permission
from leveret.core.broker import BrokerCore
from leveret.core.message import Message, Properties
from leveret.protocol.mqtt import packets as p
from leveret.protocol.mqtt.sessions import session_queue_name
from leveret.protocol.mqtt.state import MqttState
from leveret.store.sqlite import SQLiteStore


def test_a_clean_start_cancels_the_expiry_of_the_session_it_replaces(core, loop):
    client = Client(core, loop)
    client.connect("c", properties=((p.SESSION_EXPIRY_INTERVAL, 100),))
    client.send(p.Disconnect())  # the old session expires at t=100
    loop.advance(10)
    again = Client(core, loop)
    again.connect("c", clean_start=True, properties=((p.SESSION_EXPIRY_INTERVAL, 1000),))
    again.subscribe("t", qos=1)
    again.send(p.Disconnect())  # the new session expires at t=1010
    publisher = Client(core, loop)
    publisher.connect("pub")
    publisher.send(p.Publish("t", b"kept", 1, packet_id=1))
    assert publisher.received() == [p.PubAck(1)]
    loop.advance(100)  # t=110: past the old session's expiry, not the new one's
    assert session_queue_name("c") in core.vhosts["/"].queues
    back = Client(core, loop)
    back.send(p.Connect("c", clean_start=False))
    connack, *rest = back.received()
    assert isinstance(connack, p.ConnAck) and connack.session_present
    assert [m.payload for m in publishes(rest)] == [b"kept"]


def _turn_until_received(writer: asyncio.AbstractEventLoop, client: Client) -> list[p.Packet]:
    """Turn the store's event loop, one turn at a time, until ``client`` gets packets."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        writer.call_soon(writer.stop)
        writer.run_forever()  # one turn of the loop
        got = client.received()
        if got:
            return got
        time.sleep(0.001)
    pytest.fail("nothing received")


def test_a_qos2_resend_before_its_pubrec_is_routed_once(loop, tmp_path):
    """The first PUBLISH waits for the store (a durable queue): a resend with DUP set
    in the meantime is not routed again (MQTT 3.1.1 §4.3.3, 5.0 §4.3.3)."""
    writer = asyncio.new_event_loop()
    store = SQLiteStore(tmp_path)
    core = BrokerCore(loop)
    core.attach_store(store)
    store.start(writer)
    try:
        subscriber = Client(core, loop)
        subscriber.connect("sub", properties=((p.SESSION_EXPIRY_INTERVAL, 60),))  # a durable queue
        subscriber.send(p.Subscribe(1, (p.Subscription("q2", 2),)))
        assert isinstance(_turn_until_received(writer, subscriber)[0], p.SubAck)
        publisher = Client(core, loop, p.MQTT_3_1_1)
        publisher.connect("pub")
        first = p.encode(p.Publish("q2", b"once", 2, packet_id=7), p.MQTT_3_1_1)
        again = p.encode(p.Publish("q2", b"once", 2, dup=True, packet_id=7), p.MQTT_3_1_1)
        publisher.connection.data_received(first + again)  # resent before the confirm came
        assert publisher.received() == []
        done = writer.create_future()
        MqttState.of(core).when_durable(done.set_result)
        writer.run_until_complete(asyncio.wait_for(done, 10))
        writer.run_until_complete(asyncio.sleep(0.05))
        assert publisher.received() == [p.PubRec(7)]
        publisher.send(p.PubRel(7))
        assert publisher.received() == [p.PubComp(7)]
        assert [m.payload for m in publishes(subscriber.received())] == [b"once"]
    finally:
        store.close()
        writer.close()


def test_a_message_in_flight_with_an_expiry_expires_once_back_in_its_queue(core, loop):
    """Requeued on disconnect, it was watched for expiry twice: the second removal
    raised IndexError inside the queue's TTL timer."""
    subscriber = Client(core, loop, p.MQTT_3_1_1)
    subscriber.connect("s", clean_start=False)
    subscriber.subscribe("a", qos=1)
    publisher = Client(core, loop)
    publisher.connect("p")
    publisher.send(p.Publish("a", b"x", 1, packet_id=1, properties=((p.MESSAGE_EXPIRY_INTERVAL, 1),)))
    assert len(publishes(subscriber.received())) == 1
    subscriber.connection.connection_lost()  # back in the queue, redelivered next time
    loop.advance(10)
    queue = core.vhosts["/"].queues[session_queue_name("s")]
    assert queue.message_count == 0


def _publish_as_amqp(client: Client, routing_key: str, properties: Properties) -> None:
    """Publish to amq.topic as an AMQP client can: any routing key and headers."""
    publisher = client.connection.publisher
    assert publisher is not None
    exchange = publisher.exchange("amq.topic", routing_key)
    publisher.publish(exchange, Message.build("amq.topic", routing_key, b"body", properties))


@pytest.mark.parametrize("version", [p.MQTT_3_1_1, p.MQTT_5])
def test_what_no_publish_packet_can_carry_is_dropped_not_raised_in_the_queue(core, loop, version):
    subscriber = Client(core, loop, version)
    subscriber.connect("s")
    subscriber.subscribe("#", qos=0)
    other = Client(core, loop)
    other.connect("o")
    _publish_as_amqp(other, "nul\x00key", Properties())  # no topic name holds U+0000
    odd = Properties(
        content_type="a\x00b",
        headers={"long": "x" * 70_000, "k\x00": "v", "ok": "1"},
        expiration=str(10**14),  # ms: more seconds than a Message Expiry Interval holds
    )
    _publish_as_amqp(other, "fine", odd)
    (got,) = publishes(subscriber.received())
    assert got.topic == "fine" and got.payload == b"body"
    if version == p.MQTT_5:
        assert got.properties == ((p.MESSAGE_EXPIRY_INTERVAL, 0xFFFFFFFF), (p.USER_PROPERTY, ("ok", "1")))
    assert not subscriber.closed


def test_retained_messages_sent_on_subscribe_keep_to_the_receive_maximum(core, loop):
    """MQTT 5.0 §4.9: no more unacknowledged QoS 1/2 PUBLISHes than the client's
    Receive Maximum, retained ones too; the rest follow as PUBACKs come."""
    publisher = Client(core, loop)
    publisher.connect("retainer")
    for i in range(3):
        publisher.send(p.Publish(f"r/{i}", b"%d" % i, 1, retain=True, packet_id=i + 1))
    publisher.received()
    subscriber = Client(core, loop)
    subscriber.connect("slow", properties=((p.RECEIVE_MAXIMUM, 1),))
    subscriber.send(p.Subscribe(1, (p.Subscription("r/#", 1),)))
    first = publishes(subscriber.received())
    assert len(first) == 1 and first[0].retain
    subscriber.send(p.PubAck(first[0].packet_id))
    second = publishes(subscriber.received())
    assert len(second) == 1
    subscriber.send(p.PubAck(second[0].packet_id))
    third = publishes(subscriber.received())
    assert sorted(m.payload for m in first + second + third) == [b"0", b"1", b"2"]


def test_a_persistent_sessions_pubrec_waits_for_its_packet_id_to_be_on_disk(loop, tmp_path):
    """Exactly once across kill -9: once the client has a PUBREC it never resends the
    PUBLISH, so the packet id must be durable before (else a crash between the two
    lets a resend be routed again)."""
    writer = asyncio.new_event_loop()
    store = SQLiteStore(tmp_path)
    core = BrokerCore(loop)
    core.attach_store(store)
    store.start(writer)
    try:
        subscriber = Client(core, loop)
        subscriber.connect("sub", properties=((p.SESSION_EXPIRY_INTERVAL, 60),))  # the message is stored
        subscriber.send(p.Subscribe(1, (p.Subscription("q2", 2),)))
        assert isinstance(_turn_until_received(writer, subscriber)[0], p.SubAck)
        publisher = Client(core, loop)
        publisher.connect("pub", properties=((p.SESSION_EXPIRY_INTERVAL, 60),))
        publisher.send(p.Publish("q2", b"once", 2, packet_id=7))
        assert _turn_until_received(writer, publisher) == [p.PubRec(7)]
        db = sqlite3.connect(store.path)
        try:
            rows = db.execute(
                "SELECT data FROM definitions WHERE kind='mqtt_packet_ids' AND name='pub'"
            ).fetchall()
        finally:
            db.close()
        assert len(rows) == 1 and b"\x07" in rows[0][0]
    finally:
        store.close()
        writer.close()


def test_an_expired_retained_message_nobody_asks_for_again_is_deleted(core, loop):
    client = Client(core, loop)
    client.connect("r")
    client.send(p.Publish("gone/soon", b"x", retain=True, properties=((p.MESSAGE_EXPIRY_INTERVAL, 5),)))
    client.send(p.Publish("gone/later", b"y", retain=True, properties=((p.MESSAGE_EXPIRY_INTERVAL, 50),)))
    state = MqttState.of(core)
    assert state.retained_count("/") == 2
    loop.advance(6)
    assert state.retained_count("/") == 1
    loop.advance(50)
    assert state.retained_count("/") == 0


def test_a_deleted_vhost_keeps_no_session_or_retained_will_of_its_clients(core, loop):
    state = MqttState.of(core)  # made at start-up, as the server does (SessionTimers.start)
    core.add_vhost("v")
    core.set_permission("guest", "v", Permission())
    will = p.Will("w", b"gone", 0, True)
    client = Client(core, loop, p.MQTT_3_1_1)
    connack = client.connect("kept", clean_start=False, username="v:guest", password=b"guest", will=will)
    assert connack.reason_code == 0
    client.subscribe("t", qos=1)
    core.delete_vhost("v")
    assert client.closed
    assert state.sessions("v") == [] and state.retained_count("v") == 0


def test_a_redelivery_does_not_reuse_a_packet_id_still_waiting_for_pubcomp(core, loop):
    """§2.2.1: a packet id is free again only after its PUBCOMP; the id a redelivered
    message was first sent with may have gone to a QoS 2 message meanwhile."""
    session = ((p.SESSION_EXPIRY_INTERVAL, 60), (p.RECEIVE_MAXIMUM, 2))
    client = Client(core, loop)
    client.connect("c", properties=session)
    client.subscribe("own", qos=2)
    client.subscribe("$share/g/s", qos=1, packet_id=2)
    publisher = Client(core, loop)
    publisher.connect("pub")
    publisher.send(p.Publish("s", b"X", 1, packet_id=1))
    assert [m.payload for m in publishes(client.received())] == [b"X"]
    client.connection.connection_lost()  # X goes back to its queue, with its packet id kept
    publisher.send(p.Publish("own", b"Y", 2, packet_id=2))
    publisher.send(p.Publish("own", b"Z", 1, packet_id=3))
    again = Client(core, loop)
    again.send(p.Connect("c", clean_start=False, properties=session))
    _, *sent = again.received()
    y, z = publishes(sent)
    assert y.payload == b"Y" and z.payload == b"Z"
    again.send(p.PubRec(y.packet_id))
    assert again.received() == [p.PubRel(y.packet_id)]  # y's id is busy until its PUBCOMP
    again.send(p.PubAck(z.packet_id))
    (x_again,) = publishes(again.received())
    assert x_again.payload == b"X" and x_again.dup
    assert x_again.packet_id != y.packet_id


def test_a_new_message_does_not_take_the_packet_id_a_redelivery_will_go_with(core, loop):
    """The client may still hold a QoS 2 id of the last connection (it sent PUBREC, the
    broker never read it): a new PUBLISH with that id would look like a resend to it."""
    session = ((p.SESSION_EXPIRY_INTERVAL, 60), (p.RECEIVE_MAXIMUM, 2))
    client = Client(core, loop)
    client.connect("c", properties=session)
    client.subscribe("own", qos=2)
    client.subscribe("$share/g/s", qos=2, packet_id=2)
    publisher = Client(core, loop)
    publisher.connect("pub")
    publisher.send(p.Publish("s", b"X", 2, packet_id=1))
    publisher.send(p.PubRel(1))
    (x,) = publishes(client.received())
    client.connection.connection_lost()  # its PUBREC for X never arrived
    publisher.send(p.Publish("own", b"Y", 2, packet_id=2))
    publisher.send(p.PubRel(2))
    again = Client(core, loop)
    again.send(p.Connect("c", clean_start=False, properties=session))
    _, *sent = again.received()
    got = {m.payload: m for m in publishes(sent)}
    assert got[b"X"].packet_id == x.packet_id and got[b"X"].dup
    assert got[b"Y"].packet_id != x.packet_id


def test_a_disconnect_leaves_its_reason_string_out_beyond_the_clients_maximum_packet_size(core, loop):
    """MQTT 5.0 §3.14.2.2.3: no Reason String that makes the DISCONNECT larger than the
    Maximum Packet Size the client set."""
    client = Client(core, loop)
    client.connect("tiny", properties=((p.MAXIMUM_PACKET_SIZE, 16),))
    client.send(p.Publish("", b"x", properties=((p.TOPIC_ALIAS, 3),)))  # an alias never set
    data = bytes(client.transport.output[client._read :])
    (disconnect,) = client.received()
    assert isinstance(disconnect, p.Disconnect) and disconnect.reason_code == 0x82
    assert len(data) <= 16 and disconnect.properties == ()


def test_a_topic_name_with_a_literal_star_reaches_its_subscribers(core, loop):
    """``*`` is an ordinary character of an MQTT topic name (§4.7.1): its routing key
    must come back as the same name, not as ``+`` (a wildcard, not deliverable), and a
    filter naming it must not share a binding with one using ``+``."""
    subscriber = Client(core, loop)
    subscriber.connect("s")
    subscriber.subscribe("#", qos=1)
    subscriber.subscribe("a/*", qos=1, packet_id=2)
    subscriber.subscribe("a/+", qos=1, packet_id=3)
    publisher = Client(core, loop)
    publisher.connect("p")
    publisher.send(p.Publish("a/*", b"star", 1, packet_id=1))
    assert publisher.received() == [p.PubAck(1)]
    (got,) = publishes(subscriber.received())
    assert got.topic == "a/*" and got.payload == b"star"
    subscriber.send(p.PubAck(got.packet_id))
    subscriber.send(p.Unsubscribe(4, ("#", "a/*")))
    subscriber.received()
    publisher.send(p.Publish("a/b", b"plus", 0))
    assert [m.payload for m in publishes(subscriber.received())] == [b"plus"]  # a/+ still bound


def test_a_retained_message_unacknowledged_at_disconnect_is_resent_with_its_packet_id(core, loop):
    """MQTT 5.0 §4.4 (3.1.1 §4.4): a resumed session gets every unacknowledged QoS 1/2
    PUBLISH again, with its original packet id (the retained one sent on SUBSCRIBE too)."""
    publisher = Client(core, loop)
    publisher.connect("retainer")
    publisher.send(p.Publish("r", b"kept", 1, retain=True, packet_id=1))
    session = ((p.SESSION_EXPIRY_INTERVAL, 60),)
    client = Client(core, loop)
    client.connect("c", properties=session)
    client.send(p.Subscribe(1, (p.Subscription("r", 1),)))
    (first,) = publishes(client.received())
    client.connection.connection_lost()  # never acknowledged
    again = Client(core, loop)
    again.send(p.Connect("c", clean_start=False, properties=session))
    _, *sent = again.received()
    (resent,) = publishes(sent)
    assert (resent.payload, resent.packet_id, resent.dup) == (b"kept", first.packet_id, True)
    again.send(p.PubAck(resent.packet_id))
    assert again.connection.inflight == {}
