"""The MQTT connection driven without sockets (tests/sans_io.py's fake loop is the
broker's clock too): keep alive, will delay, session expiry, QoS 2 duplicates, receive
maximum and topic aliases, with time stepped rather than waited for."""

from __future__ import annotations

from mqtt_sans_io import Client, publishes
from sans_io import FakeLoop

from leveret.core.broker import BrokerCore
from leveret.protocol.mqtt import packets as p
from leveret.protocol.mqtt.sessions import session_queue_name


def connected(core: BrokerCore, loop: FakeLoop, client_id: str, **connect) -> Client:
    """A Client whose CONNECT (``connect``: its other fields) was accepted."""
    client = Client(core, loop)
    assert client.connect(client_id, **connect).reason_code == 0
    return client


def subscribed(
    core: BrokerCore, loop: FakeLoop, client_id: str, topic_filter: str, qos: int, **connect
) -> Client:
    """A connected Client subscribed to ``topic_filter`` at ``qos`` (granted)."""
    client = connected(core, loop, client_id, **connect)
    assert client.subscribe(topic_filter, qos=qos).reason_codes == (qos,)
    return client


def test_a_silent_client_is_dropped_after_one_and_a_half_keep_alives(core, loop):
    client = Client(core, loop)
    client.connect("silent", keep_alive=10)
    loop.advance(14)
    assert not client.closed
    loop.advance(1.1)
    (disconnect,) = client.received()
    assert isinstance(disconnect, p.Disconnect) and disconnect.reason_code == 0x8D
    assert client.closed


def test_a_will_waits_for_its_delay_and_a_reconnect_cancels_it(core, loop):
    watcher = Client(core, loop)
    watcher.connect("watcher")
    watcher.subscribe("wills/#")
    will = p.Will("wills/a", b"gone", 1, False, ((p.WILL_DELAY_INTERVAL, 5),))
    expiry = ((p.SESSION_EXPIRY_INTERVAL, 60),)
    first = Client(core, loop)
    first.connect("device", will=will, properties=expiry)
    first.connection.connection_lost()  # no DISCONNECT: the will is due after 5 s
    loop.advance(4)
    assert publishes(watcher.received()) == []
    back = Client(core, loop)
    assert back.connect("device", clean_start=False, will=will, properties=expiry).session_present
    loop.advance(10)
    assert publishes(watcher.received()) == []  # it came back in time
    back.connection.connection_lost()
    loop.advance(5)
    (sent,) = publishes(watcher.received())
    assert sent.topic == "wills/a" and sent.payload == b"gone"


def test_a_session_expires_with_its_queue_after_its_interval(core, loop):
    client = Client(core, loop)
    client.connect("sleepy", properties=((p.SESSION_EXPIRY_INTERVAL, 30),))
    client.subscribe("t/#")
    client.send(p.Disconnect())
    vhost = core.vhosts["/"]
    name = session_queue_name("sleepy")
    assert name in vhost.queues and vhost.queues[name].durable
    loop.advance(29)
    assert name in vhost.queues
    loop.advance(2)
    assert name not in vhost.queues
    again = Client(core, loop)
    assert not again.connect("sleepy", clean_start=False).session_present


def test_a_resent_qos2_publish_is_routed_once(core, loop):
    subscriber = subscribed(core, loop, "sub", "q2", 2)
    publisher = connected(core, loop, "pub")
    publisher.send(p.Publish("q2", b"once", 2, packet_id=7))
    assert publisher.received() == [p.PubRec(7)]
    publisher.send(p.Publish("q2", b"once", 2, dup=True, packet_id=7))  # PUBREC was lost
    assert publisher.received() == [p.PubRec(7)]
    publisher.send(p.PubRel(7))
    assert publisher.received() == [p.PubComp(7)]
    got = publishes(subscriber.received())
    assert [(m.payload, m.qos) for m in got] == [(b"once", 2)]
    subscriber.send(p.PubRec(got[0].packet_id))
    assert subscriber.received() == [p.PubRel(got[0].packet_id)]
    subscriber.send(p.PubComp(got[0].packet_id))
    publisher.send(p.PubRel(99))  # unknown: 0x92 Packet Identifier not found
    assert publisher.received() == [p.PubComp(99, 0x92)]


def test_the_clients_receive_maximum_bounds_what_is_in_flight(core, loop):
    subscriber = subscribed(core, loop, "slow", "r", 1, properties=((p.RECEIVE_MAXIMUM, 2),))
    publisher = connected(core, loop, "fast")
    for i in range(5):
        publisher.send(p.Publish("r", b"%d" % i, 1, packet_id=i + 1))
    first = publishes(subscriber.received())
    assert [m.payload for m in first] == [b"0", b"1"]
    subscriber.send(p.PubAck(first[0].packet_id))
    assert [m.payload for m in publishes(subscriber.received())] == [b"2"]


def test_topic_aliases_from_the_client(core, loop):
    subscriber = subscribed(core, loop, "s", "long/topic/name", 0)
    publisher = connected(core, loop, "p")
    publisher.send(p.Publish("long/topic/name", b"1", properties=((p.TOPIC_ALIAS, 3),)))
    publisher.send(p.Publish("", b"2", properties=((p.TOPIC_ALIAS, 3),)))
    got = publishes(subscriber.received())
    assert [(m.topic, m.payload) for m in got] == [("long/topic/name", b"1"), ("long/topic/name", b"2")]
    publisher.send(p.Publish("", b"3", properties=((p.TOPIC_ALIAS, 11),)))  # over the maximum (10)
    (disconnect,) = publisher.received()
    assert isinstance(disconnect, p.Disconnect) and disconnect.reason_code == 0x94
    assert publisher.closed
    assert not subscriber.closed


def test_no_local_and_subscription_identifiers(core, loop):
    client = Client(core, loop)
    client.connect("self")
    mine = p.Subscription("echo", 1, no_local=True)
    client.send(p.Subscribe(1, (mine,), ((p.SUBSCRIPTION_IDENTIFIER, 9),)))
    client.send(p.Subscribe(2, (p.Subscription("echo/#", 0),), ((p.SUBSCRIPTION_IDENTIFIER, 4),)))
    client.received()
    client.send(p.Publish("echo", b"mine"))
    (got,) = publishes(client.received())  # only through echo/#, the one without no local
    assert got.qos == 0 and p.get_property(got.properties, p.SUBSCRIPTION_IDENTIFIER) == 4
    other = Client(core, loop)
    other.connect("other")
    other.send(p.Publish("echo", b"theirs", 1, packet_id=1))
    (got,) = publishes(client.received())
    ids = sorted(v for k, v in got.properties if k == p.SUBSCRIPTION_IDENTIFIER)
    assert got.qos == 1 and ids == [4, 9]


def test_a_session_taken_over_is_disconnected_with_0x8e(core, loop):
    first = Client(core, loop)
    first.connect("same")
    second = Client(core, loop)
    second.connect("same")
    (disconnect,) = first.received()
    assert isinstance(disconnect, p.Disconnect) and disconnect.reason_code == 0x8E
    assert first.closed and not second.closed


def test_shared_subscriptions_share_the_messages(core, loop):
    members = [Client(core, loop) for _ in range(2)]
    for i, member in enumerate(members):
        member.connect(f"m{i}")
        member.subscribe("$share/g/jobs/+", qos=1)
    publisher = Client(core, loop)
    publisher.connect("producer")
    for i in range(6):
        publisher.send(p.Publish("jobs/x", b"%d" % i, 1, packet_id=i + 1))
    counts = [len(publishes(member.received())) for member in members]
    assert sum(counts) == 6 and all(counts)


def test_server_keep_alive_response_information_and_plain_authentication(core, loop):
    from leveret.protocol.mqtt.settings import settings_of

    settings_of(core).max_keep_alive = 30
    client = Client(core, loop)
    connack = client.connect(
        "auth",
        keep_alive=0,
        properties=(
            (p.AUTHENTICATION_METHOD, "PLAIN"),
            (p.AUTHENTICATION_DATA, b"\0guest\0guest"),
            (p.REQUEST_RESPONSE_INFORMATION, 1),
        ),
    )
    assert connack.reason_code == 0
    assert p.get_property(connack.properties, p.SERVER_KEEP_ALIVE) == 30
    assert p.get_property(connack.properties, p.AUTHENTICATION_METHOD) == "PLAIN"
    assert p.get_property(connack.properties, p.RESPONSE_INFORMATION) == "response/auth/"
    again = ((p.AUTHENTICATION_METHOD, "PLAIN"), (p.AUTHENTICATION_DATA, b"\0guest\0guest"))
    client.send(p.Auth(0x19, again))
    assert client.received() == [p.Auth(0, ((p.AUTHENTICATION_METHOD, "PLAIN"),))]
    client.send(p.Auth(0x19, ((p.AUTHENTICATION_METHOD, "PLAIN"), (p.AUTHENTICATION_DATA, b"\0guest\0nope"))))
    (disconnect,) = client.received()
    assert isinstance(disconnect, p.Disconnect) and disconnect.reason_code == 0x87
    loop.advance(45.1)  # (no keep alive check left: the connection is gone)
    other = Client(core, loop)
    assert other.connect("other", properties=((p.AUTHENTICATION_METHOD, "SCRAM-SHA-1"),)).reason_code == 0x8C


def test_the_granted_keep_alive_is_the_one_enforced(core, loop):
    from leveret.protocol.mqtt.settings import settings_of

    settings_of(core).max_keep_alive = 10
    client = Client(core, loop)
    client.connect("ka", keep_alive=600)
    loop.advance(16)
    (disconnect,) = client.received()
    assert isinstance(disconnect, p.Disconnect) and disconnect.reason_code == 0x8D
