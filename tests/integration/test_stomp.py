"""STOMP 1.0-1.2 with stomp.py against a real leveret over TCP: sending and
subscribing, ack modes, receipts, transactions, topics with wildcards, AMQP clients on
the same queues and exchanges, and the errors (an ERROR frame, the connection closed,
other clients undisturbed)."""

from __future__ import annotations

import json
import re
import socket
import time

import pika
import pytest
from stomp_clients import Client, read_raw_frame

from leveret import BlockingBroker
from leveret.core.auth import Permission, User

VERSIONS = ("1.0", "1.1", "1.2")
UNESCAPE = {"n": "\n", "r": "\r", "c": ":", "\\": "\\"}


@pytest.fixture
def broker():
    with BlockingBroker(amqp_port=0, stomp_port=0) as running:
        yield running


@pytest.fixture
def port(broker) -> int:
    return broker.broker.stomp_port


def amqp(broker) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(broker.amqp_url))


# -- the basics, in every version --------------------------------------------------------
@pytest.mark.parametrize("version", VERSIONS)
def test_send_subscribe_and_ack_in_each_version(port, version):
    with Client(port, version) as client:
        client.subscribe("/queue/basics", ack="client-individual" if version != "1.0" else "client")
        client.send("/queue/basics", "hello", color="red", persistent="true", priority="7")
        frame = client.message()
        assert frame.body == b"hello"
        headers = frame.headers
        assert headers["destination"] == "/queue/basics"
        assert headers["color"] == "red" and headers["persistent"] == "true" and headers["priority"] == "7"
        assert headers["message-id"].startswith("ID:") and headers["expires"] == "0"
        assert int(headers["timestamp"]) > 1_600_000_000_000  # epoch milliseconds
        assert "redelivered" not in headers
        assert ("ack" in headers) == (version == "1.2")
        client.ack(frame)
        client.send("/queue/basics", "second")  # the receipt proves the ACK was taken first
    with Client(port, version) as again:
        again.subscribe("/queue/basics")
        assert again.message().body == b"second"  # the first was acknowledged: gone


def test_connected_frame_negotiates_the_highest_common_version(port):
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"CONNECT\naccept-version:1.0,1.1,1.2\nhost:/\nlogin:guest\npasscode:guest\n"
                     b"heart-beat:0,2000\n\n\x00")
        reply = read_raw_frame(sock)
    command, headers, _ = parse(reply)
    assert command == "CONNECTED"
    assert headers["version"] == "1.2" and headers["server"].startswith("leveret/")
    assert headers["heart-beat"] == "2000,0" and headers["session"]


def test_a_binary_body_with_nul_bytes_passes_through_with_content_length(port):
    body = bytes(range(256)) * 4
    with Client(port) as client:
        client.subscribe("/queue/binary")
        client.send("/queue/binary", body)
        frame = client.message()
        assert frame.body == body and frame.headers["content-length"] == str(len(body))


# -- acknowledgement ------------------------------------------------------------------------
def test_client_ack_is_cumulative_and_client_individual_is_not(port):
    with Client(port) as client:
        for i in range(3):
            client.send("/queue/cumulative", f"c{i}")
            client.send("/queue/individual", f"i{i}")
        client.subscribe("/queue/cumulative", ack="client")
        client.subscribe("/queue/individual", ack="client-individual")
        frames = {}
        for _ in range(6):
            frame = client.message()
            frames[frame.body.decode()] = frame
        client.ack(frames["c1"])  # c0 and c1
        client.ack(frames["i1"])  # i1 only
        client.send("/queue/other", "sync")
    with Client(port) as again:  # the rest came back when the first client left
        again.subscribe("/queue/cumulative")
        again.subscribe("/queue/individual")
        bodies = sorted(again.message().body for _ in range(3))
        again.no_message()
    assert bodies == [b"c2", b"i0", b"i2"]


def test_unacknowledged_messages_come_back_redelivered_when_the_client_leaves(port):
    with Client(port) as first:
        first.subscribe("/queue/comeback", ack="client-individual")
        first.send("/queue/comeback", "once")
        assert "redelivered" not in first.message().headers
    with Client(port) as second:
        second.subscribe("/queue/comeback", ack="client-individual")
        frame = second.message()
        assert frame.body == b"once" and frame.headers["redelivered"] == "true"


def test_prefetch_size_bounds_unacknowledged_deliveries(port):
    with Client(port) as client:
        for i in range(5):
            client.send("/queue/prefetch", str(i))
        client.subscribe("/queue/prefetch", ack="client-individual", **{"activemq.prefetchSize": "2"})
        first, second = client.message(), client.message()
        client.no_message()
        client.ack(first)
        assert client.message().body == b"2"
        client.no_message()
        client.ack(second)
        assert client.message().body == b"3"


def test_auto_ack_messages_are_gone_once_sent(port):
    with Client(port) as client:
        client.subscribe("/queue/auto")
        client.send("/queue/auto", "x")
        client.message()
    with Client(port) as again:
        again.subscribe("/queue/auto")
        again.no_message()


# -- NACK and dead letters --------------------------------------------------------------
def test_nack_with_requeue_false_dead_letters_with_activemqs_headers(port):
    with Client(port) as client:
        client.subscribe("/queue/poison", ack="client-individual")
        client.send("/queue/poison", "bad", expires=str(int(time.time() * 1000) + 60_000))
        client.nack(client.message(), requeue="false")
        client.subscribe("/queue/ActiveMQ.DLQ")
        dead = client.message()
    assert dead.body == b"bad"
    assert dead.headers["original-destination"] == "/queue/poison"
    assert dead.headers["dlqDeliveryFailureCause"] == "rejected"
    assert dead.headers["expires"] == "0" and int(dead.headers["originalExpiration"]) > 0


def test_nack_follows_the_queues_redelivery_policy_then_dead_letters(broker, port):
    """A queue declared over AMQP with ActiveMQ's policy words: two redeliveries, then
    the shared DLQ (never a silent drop, even for a non-persistent message)."""
    with amqp(broker) as connection:
        connection.channel().queue_declare("retry", durable=True, arguments={
            "x-max-redeliveries": 2, "x-dead-letter-strategy": "shared",
            "x-dead-letter-non-persistent": True})
    with Client(port) as client:
        client.subscribe("/queue/retry", ack="client-individual")
        client.send("/queue/retry", "flaky")
        counts = []
        for _ in range(3):
            frame = client.message()
            counts.append((frame.headers.get("redelivered"), frame.headers["x-delivery-count"]))
            client.nack(frame)
        client.subscribe("/queue/leveret.DLQ")
        dead = client.message()
    assert counts == [(None, "0"), ("true", "1"), ("true", "2")]
    assert dead.body == b"flaky" and dead.headers["dlqDeliveryFailureCause"] == "delivery_limit"


def test_unsubscribe_and_disconnect_return_uncounted_nacks_fail(broker, port):
    """RabbitMQ 4.3's counts over STOMP: an UNSUBSCRIBE or a DISCONNECT with the message
    unacknowledged returns it (``x-acquired-count`` grows, ``x-delivery-count`` does
    not); a NACK fails it (as ActiveMQ counts a redelivery): with x-delivery-limit 1,
    the second NACK dead-letters it."""
    with amqp(broker) as connection:
        connection.channel().queue_declare("limited", durable=True, arguments={
            "x-delivery-limit": 1, "x-dead-letter-strategy": "individual"})
    with Client(port) as client:
        client.send("/queue/limited", "flaky", persistent="true")
        for _ in range(2):
            sub_id = client.subscribe("/queue/limited", ack="client-individual")
            client.message()
            client.conn.unsubscribe(sub_id)
    with Client(port) as client:
        client.subscribe("/queue/limited", ack="client-individual")
        client.message()
    seen = []
    with Client(port) as client:  # the one before left with DISCONNECT
        client.subscribe("/queue/limited", ack="client-individual")
        for _ in range(2):
            frame = client.message()
            seen.append((frame.headers["x-delivery-count"], frame.headers["x-acquired-count"]))
            client.nack(frame)
        client.subscribe("/queue/DLQ.limited")
        dead = client.message()
    assert seen == [("0", "3"), ("1", "4")]
    assert dead.body == b"flaky" and dead.headers["dlqDeliveryFailureCause"] == "delivery_limit"


# -- transactions -------------------------------------------------------------------------
def test_sends_in_a_transaction_arrive_on_commit_and_not_on_abort(port):
    with Client(port) as client:
        client.subscribe("/queue/tx")
        client.conn.begin("t1")
        client.send("/queue/tx", "aborted", transaction="t1")
        client.conn.abort("t1")
        client.conn.begin("t2")
        client.send("/queue/tx", "one", transaction="t2")
        client.send("/queue/tx", "two", transaction="t2")
        client.no_message()
        client.conn.commit("t2", receipt="commit-t2")
        client.wait_receipt("commit-t2")
        assert [client.message().body, client.message().body] == [b"one", b"two"]
        client.no_message()


def test_an_ack_in_an_aborted_transaction_never_happened(port):
    with Client(port) as client:
        client.subscribe("/queue/txack", ack="client-individual")
        client.send("/queue/txack", "keep")
        frame = client.message()
        client.conn.begin("t")
        client.ack(frame, transaction="t")
        client.conn.abort("t")
        client.send("/queue/sync", "x")
    with Client(port) as again:  # still unacknowledged when the first left: redelivered
        again.subscribe("/queue/txack")
        assert again.message().headers["redelivered"] == "true"


# -- topics and the AMQP side -----------------------------------------------------------------
def test_topic_wildcards_star_and_greater_than(port):
    with Client(port) as client:
        client.subscribe("/topic/orders.*", id="star")
        client.subscribe("/topic/orders.>", id="rest")
        client.send("/topic/orders.eu", "one word")
        client.send("/topic/orders.eu.paris", "two words")
        got = sorted((f.headers["subscription"], f.body) for f in (client.message(), client.message(),
                                                                    client.message()))
        client.no_message()
    assert got == [("rest", b"one word"), ("rest", b"two words"), ("star", b"one word")]


def test_a_topic_message_reaches_only_subscribers_present_when_sent(port):
    with Client(port) as client:
        client.send("/topic/news", "nobody listens")
        client.subscribe("/topic/news")
        client.send("/topic/news", "heard")
        assert client.message().body == b"heard"
        client.no_message()


def test_stomp_to_amqp_keeps_body_and_properties(broker, port):
    body = b"\x00binary\xffbody"
    with amqp(broker) as connection:
        channel = connection.channel()
        channel.queue_declare("to-amqp", durable=True)
        with Client(port) as client:
            client.send("/queue/to-amqp", body, persistent="true", priority="6", type="order",
                        **{"correlation-id": "c-1", "reply-to": "/queue/replies", "color": "blue",
                           "content-type": "application/octet-stream"})
        _method, properties, got = channel.basic_get("to-amqp", auto_ack=True)
    assert got == body
    assert properties.delivery_mode == 2 and properties.priority == 6
    assert properties.correlation_id == "c-1" and properties.reply_to == "/queue/replies"
    assert properties.type == "order" and properties.content_type == "application/octet-stream"
    assert properties.message_id.startswith("ID:") and properties.timestamp is not None
    assert properties.headers["color"] == "blue"


def test_amqp_to_stomp_keeps_body_and_properties(broker, port):
    with Client(port) as client:
        client.subscribe("/queue/from-amqp")
        with amqp(broker) as connection:
            connection.channel().basic_publish("", "from-amqp", b"\x00raw\x01", pika.BasicProperties(
                delivery_mode=2, priority=3, correlation_id="c-9", reply_to="answers", type="t",
                message_id="m-1", timestamp=1_700_000_000, expiration="60000",
                headers={"color": "green", "count": 5, "flag": True}))
        frame = client.message()
    headers = frame.headers
    assert frame.body == b"\x00raw\x01"
    assert headers["persistent"] == "true" and headers["priority"] == "3"
    assert headers["correlation-id"] == "c-9" and headers["reply-to"] == "answers"
    assert headers["type"] == "t" and headers["message-id"] == "m-1"
    assert headers["timestamp"] == "1700000000000"
    assert int(headers["expires"]) > time.time() * 1000
    assert (headers["color"], headers["count"], headers["flag"]) == ("green", "5", "true")


def test_amqp_publishes_to_amq_topic_reach_stomp_topic_subscribers(broker, port):
    with Client(port) as client:
        client.subscribe("/topic/prices.>")
        with amqp(broker) as connection:
            connection.channel().basic_publish("amq.topic", "prices.eu.fx", b"1.08")
        frame = client.message()
    assert frame.body == b"1.08" and frame.headers["destination"] == "/topic/prices.eu.fx"


def test_composite_destination_sends_to_each(port):
    with Client(port) as client:
        client.subscribe("/queue/comp-a")
        client.subscribe("/topic/comp-b")
        client.send("/queue/comp-a,/topic/comp-b", "both")
        frames = [client.message(), client.message()]
    assert sorted(f.headers["destination"] for f in frames) == ["/queue/comp-a", "/topic/comp-b"]
    assert frames[0].headers["message-id"] == frames[1].headers["message-id"]


# -- errors ----------------------------------------------------------------------------------
def parse(raw: bytes) -> tuple[str, dict[str, str], bytes]:
    """(command, headers unescaped as STOMP 1.2 does, body) of one frame."""
    head, _, body = raw.partition(b"\n\n")
    lines = head.decode().lstrip("\n").split("\n")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers.setdefault(name, re.sub(r"\\(.)", lambda m: UNESCAPE[m.group(1)], value))
    return lines[0], headers, body.rstrip(b"\x00")


def error_for(port: int, frames: bytes, connect: bool = True) -> tuple[dict[str, str], bool]:
    """Send ``frames`` (after a CONNECT); the ERROR's headers and whether the broker
    then closed the socket."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        if connect:
            sock.sendall(b"CONNECT\naccept-version:1.2\nlogin:guest\npasscode:guest\n\n\x00")
            assert parse(read_raw_frame(sock))[0] == "CONNECTED"
        sock.sendall(frames)
        data = read_raw_frame(sock)
        command, headers, _ = parse(data)
        assert command == "ERROR", data
        sock.settimeout(5)
        try:
            closed = sock.recv(65536) == b""
        except ConnectionResetError:
            closed = True
    return headers, closed


@pytest.mark.parametrize(("frames", "connect", "message"), [
    (b"SEND\ndestination:/queue/x\n\nhi\x00", False, "Not connected"),
    (b"CONNECT\naccept-version:2.0\n\n\x00", False, "Invalid Protocol version"),
    (b"CONNECT\naccept-version:1.2\nlogin:guest\npasscode:wrong\n\n\x00", False, "Authentication failed"),
    (b"SEND\ndestination:/nowhere/x\n\nhi\x00", True,
     "unknown destination prefix '/nowhere/' in '/nowhere/x'"),
    (b"ACK\nid:999\n\n\x00", True, "Unexpected ACK received for message-id [999]"),
    (b"SUBSCRIBE\ndestination:/queue/x\n\n\x00", True, "Subscription id missing"),
    (b"SUBSCRIBE\nid:1\ndestination:/queue/x\nack:sometimes\n\n\x00", True, "Invalid ack mode"),
    (b"COMMIT\ntransaction:never\n\n\x00", True, "Invalid transaction id"),
    (b"SEND\ndestination:/queue/x\ncontent-length:999999999999\n\n\x00", True,
     "the body is longer than 104857600 bytes"),
    (b"SEND\ndestination:/queue/x\ncontent-length:\xc2\xb2\n\n\x00", True, "invalid content-length '\u00b2'"),
    (b"SEND\ndestination:/queue/x\ncontent-length:2\n\nhello\x00", True,
     "the body is not followed by a NUL byte (content-length is wrong)"),
    (b"SEND\ndestination:/queue/x\nbad\\escape:1\n\n\x00", True, "invalid escape sequence '\\e' in a header"),
    (b"FLY\n\n\x00", True, "Unknown STOMP action: FLY"),
], ids=["before-connect", "version", "password", "prefix", "ack-id", "sub-id", "ack-mode", "tx", "oversized",
        "superscript-length",
        "content-length", "escape", "command"])
def test_a_bad_frame_gets_an_error_and_the_connection_closes(port, frames, connect, message):
    with Client(port) as bystander:
        bystander.subscribe("/queue/bystander")
        headers, closed = error_for(port, frames, connect)
        assert headers["message"] == message and closed
        bystander.send("/queue/bystander", "still here")
        assert bystander.message().body == b"still here"


def test_an_error_names_the_receipt_of_the_frame_that_failed(port):
    headers, closed = error_for(port, b"SEND\ndestination:/bad/x\nreceipt:r-7\n\nhi\x00")
    assert headers["receipt-id"] == "r-7" and closed


def test_permissions_apply_to_stomp_as_to_amqp(broker, port):
    """As with RabbitMQ's STOMP plugin: a SEND to /queue/X publishes through the default
    exchange (write on ``amq.default``), a SUBSCRIBE reads the queue; a queue STOMP
    creates needs configure on it (not on the DLQ its broker-chosen defaults name)."""
    core = broker.core
    broker.call(lambda: core.add_user(User.with_password("limited", "pw")))
    broker.call(lambda: core.set_permission("limited", "/",
                                            Permission("^mine", r"^(mine|amq\.default)$", "^mine")))
    with Client(port) as admin:
        admin.send("/queue/theirs", "private")
    with Client(port, login="limited", passcode="pw") as client:
        client.send("/queue/mine", "ok")
        client.conn.subscribe("/queue/theirs", "1")
        error = client.error()
    assert error.headers["message"] == (
        "access to queue 'theirs' in vhost '/' refused for user 'limited'")


def test_heart_beats_are_sent_and_a_silent_client_is_dropped(port):
    """Intervals under 1 s are raised to it (RabbitMQ's floor, protocol/prelogin.py)."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"CONNECT\naccept-version:1.2\nlogin:guest\npasscode:guest\nheart-beat:200,100\n\n\x00")
        command, headers, _ = parse(read_raw_frame(sock))
        assert command == "CONNECTED" and headers["heart-beat"] == "1000,1000"
        started = time.monotonic()
        sock.settimeout(3)
        received = b""
        while time.monotonic() - started < 3:
            chunk = sock.recv(100)
            if not chunk:
                break
            received += chunk
        elapsed = time.monotonic() - started
    assert received.count(b"\n") >= 1  # the broker's heart-beats, every second
    assert 1.25 <= elapsed < 2.5  # silent for 1 s × 1.5 grace: dropped


# -- one port, both protocols ---------------------------------------------------------------
@pytest.mark.parametrize("version", VERSIONS)
def test_the_amqp_port_also_speaks_stomp(broker, version):
    """ActiveMQ's "auto" transport: the first bytes tell STOMP from AMQP, so one port
    (and one firewall rule) serves both."""
    with Client(broker.amqp_port, version) as client, amqp(broker) as connection:
        client.subscribe("/queue/shared-port")
        connection.channel().basic_publish("", "shared-port", b"from amqp")
        assert client.message().body == b"from amqp"
        client.send("/queue/shared-port", "from stomp")
        assert client.message().body == b"from stomp"


# -- selectors ---------------------------------------------------------------------------
def test_selectors_pick_messages_and_compare_header_strings_as_numbers(port):
    """ActiveMQ's STOMP selectors: header values are strings, compared with a number as
    numbers (``count:5`` matches ``count > 3``)."""
    with Client(port) as client:
        for i, (color, count) in enumerate([("red", 5), ("blue", 1), ("red", 2), ("red", 9)]):
            client.send("/queue/selected", f"m{i}", color=color, count=str(count))
        client.subscribe("/queue/selected", id="big-red", selector="color = 'red' AND count > 3")
        got = sorted(client.message().body for _ in range(2))
        client.no_message()
    assert got == [b"m0", b"m3"]


def test_a_selector_consumer_is_not_starved_by_a_backlog_it_does_not_want(port):
    with Client(port) as client:
        for i in range(3000):
            client.send("/queue/haystack", f"hay{i}", receipt=(i == 2999), kind="hay")
        client.send("/queue/haystack", "needle", kind="needle")
        client.subscribe("/queue/haystack", selector="kind = 'needle'")
        assert client.message().body == b"needle"


def test_an_invalid_selector_gets_an_error(port):
    headers, closed = error_for(port, b"SUBSCRIBE\nid:1\ndestination:/queue/x\nselector:color = \n\n\x00")
    assert headers["message"] == "Invalid selector" and closed


def test_amqp_consumers_use_selectors_too(broker):
    with amqp(broker) as connection:
        channel = connection.channel()
        channel.queue_declare("amqp-selected")
        for i, region in enumerate(["eu", "us", "eu"]):
            channel.basic_publish("", "amqp-selected", f"m{i}".encode(),
                                  pika.BasicProperties(headers={"region": region}, priority=i))
        got = []
        channel.basic_consume("amqp-selected", lambda ch, method, props, body: got.append(body),
                              auto_ack=True, arguments={"x-selector": "region = 'eu' AND JMSPriority >= 1"})
        connection.process_data_events(0.3)
        assert got == [b"m2"]
        with pytest.raises(pika.exceptions.ChannelClosedByBroker, match="406"):
            channel.basic_consume("amqp-selected", lambda *a: None, arguments={"x-selector": "region ="})


# -- temporary destinations and durable subscriptions --------------------------------------
def test_reply_to_a_temporary_queue_works_across_connections(port):
    """Request/reply as ActiveMQ programs do it: the requester's reply-to names its
    /temp-queue/, the responder sends to the reply-to it got, the queue goes with the
    requester's connection."""
    with Client(port) as responder, Client(port) as requester:
        responder.subscribe("/queue/service")
        requester.subscribe("/temp-queue/replies")
        requester.send("/queue/service", "what time is it?", **{"reply-to": "/temp-queue/replies"})
        request = responder.message()
        reply_to = request.headers["reply-to"]
        assert reply_to.startswith("/remote-temp-queue/")
        responder.send(reply_to, "noon")
        reply = requester.message()
        assert reply.body == b"noon"
    with Client(port) as late:  # the requester is gone: so is its queue
        late.conn.send(reply_to, "too late", headers={"receipt": "r"})
        assert "no queue" in late.error().headers["message"]


def test_a_temporary_topic_reaches_the_subscribers_of_its_connection(port):
    with Client(port) as owner, Client(port) as other:
        owner.subscribe("/temp-topic/events")
        other.subscribe("/queue/ask")
        owner.send("/queue/ask", "tell me", **{"reply-to": "/temp-topic/events"})
        other.send(other.message().headers["reply-to"], "told")
        assert owner.message().body == b"told"


def test_a_durable_subscriber_gets_what_was_published_while_it_was_away(tmp_path):
    """Identity is client-id + activemq.subscriptionName; persistent messages wait
    across a broker restart, and UNSUBSCRIBE with the name ends the subscription."""
    durable = {"activemq.subscriptionName": "audit"}
    with BlockingBroker(amqp_port=0, stomp_port=0, data_dir=str(tmp_path)) as broker:
        port = broker.broker.stomp_port
        with Client(port, **{"client-id": "auditor"}) as subscriber:
            subscriber.subscribe("/topic/ledger.>", **durable)
        with Client(port) as publisher:
            publisher.send("/topic/ledger.eu", "kept", persistent="true")
            publisher.send("/topic/ledger.us", "kept too", persistent="true")
    with BlockingBroker(amqp_port=0, stomp_port=0, data_dir=str(tmp_path)) as broker:
        port = broker.broker.stomp_port
        with Client(port, **{"client-id": "auditor"}) as subscriber:
            subscriber.subscribe("/topic/ledger.>", ack="client-individual", **durable)
            frames = [subscriber.message(), subscriber.message()]
            assert [f.body for f in frames] == [b"kept", b"kept too"]
            assert frames[0].headers["destination"] == "/topic/ledger.eu"
            for frame in frames:
                subscriber.ack(frame)
            with Client(port, **{"client-id": "intruder"}) as other:  # another identity
                other.subscribe("/topic/ledger.>", **durable)
                other.no_message()
            subscriber.conn.unsubscribe("1", headers=durable)
            subscriber.send("/topic/ledger.eu", "after the end")
            subscriber.no_message()
        with Client(port, **{"client-id": "auditor"}) as again:  # a new subscription: empty
            again.subscribe("/topic/ledger.>", **durable)
            again.no_message()


def test_a_durable_subscription_has_one_consumer_at_a_time(port):
    with Client(port, **{"client-id": "one"}) as first:
        first.subscribe("/topic/single", **{"activemq.subscriptionName": "s"})
        with Client(port, **{"client-id": "one-bis"}) as second:
            second.subscribe("/topic/single", **{"activemq.subscriptionName": "s"})  # another client-id
        # the same client-id twice is refused at CONNECT
        headers, closed = error_for(port, b"CONNECT\naccept-version:1.2\nlogin:guest\npasscode:guest\n"
                                          b"client-id:one\n\n\x00", connect=False)
        assert headers["message"] == "Client ID in use" and closed
        # and a second SUBSCRIBE to the same subscription while it has its consumer
        first.conn.subscribe("/topic/single", "again", headers={"activemq.subscriptionName": "s"})
        assert first.error().headers["message"] == "Durable consumer is in use"


def test_virtual_topics_give_each_consumer_group_its_own_copy(port):
    """ActiveMQ's virtual topics: a publisher sends to a topic, each group of consumers
    reads its own queue Consumer.<group>.VirtualTopic.<name> (copies go only to groups
    that exist); the copy names its queue and the topic it was sent to."""
    with Client(port) as billing, Client(port) as shipping, Client(port) as publisher:
        publisher.send("/topic/VirtualTopic.Orders", "before anyone")
        billing.subscribe("/queue/Consumer.Billing.VirtualTopic.Orders")
        shipping.subscribe("/queue/Consumer.Shipping.VirtualTopic.Orders")
        publisher.send("/topic/VirtualTopic.Orders", "order 1")
        for client, group in ((billing, "Billing"), (shipping, "Shipping")):
            frame = client.message()
            assert frame.body == b"order 1"
            assert frame.headers["destination"] == f"/queue/Consumer.{group}.VirtualTopic.Orders"
            assert frame.headers["original-destination"] == "/topic/VirtualTopic.Orders"
            client.no_message()


# -- advisories --------------------------------------------------------------------------
def test_advisory_topics_tell_of_connections_queues_consumers_and_dead_letters(port):
    """ActiveMQ's advisory topics with JSON bodies, to any subscriber."""
    with Client(port) as watcher:
        watcher.subscribe("/topic/ActiveMQ.Advisory.>")
        with Client(port, **{"client-id": "watched"}) as client:
            client.subscribe("/queue/advised", ack="client-individual")
            client.send("/queue/advised", "doomed")
            client.nack(client.message(), requeue="false")
            client.send("/queue/sync", "x")
        events = []
        while True:
            try:
                frame = watcher.message(timeout=1)
            except AssertionError:
                break
            events.append((frame.headers["destination"], json.loads(frame.body)))
    topics = [(destination.removeprefix("/topic/ActiveMQ.Advisory."), body["type"], body["event"])
              for destination, body in events]
    assert topics[0] == ("Connection", "ConnectionInfo", "added")
    assert ("Queue", "DestinationInfo", "added") in topics
    assert ("Consumer.Queue.advised", "ConsumerInfo", "added") in topics
    assert ("MessageDLQd.Queue.advised", "Message", "rejected") in topics
    assert ("Consumer.Queue.advised", "ConsumerInfo", "removed") in topics
    assert topics[-1] == ("Connection", "ConnectionInfo", "removed")
    connected = events[0][1]
    assert connected["clientId"] == "watched" and connected["userName"] == "guest"
    assert connected["protocol"] == "STOMP 1.2"
    created = [body for destination, body in events if destination.endswith(".Queue")]
    assert {body["destination"] for body in created} >= {"/queue/advised", "/queue/ActiveMQ.DLQ"}


def test_text_and_bytes_messages_as_activemq_tells_them_apart(port):
    """A SEND without content-length is a JMS text message (MESSAGE without
    content-length), with it a bytes message; amq-msg-type forces either."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"CONNECT\naccept-version:1.2\nlogin:guest\npasscode:guest\n\n\x00")
        read_raw_frame(sock)
        sock.sendall(b"SUBSCRIBE\nid:1\ndestination:/queue/kinds\n\n\x00"
                     b"SEND\ndestination:/queue/kinds\n\ntext body\x00"
                     b"SEND\ndestination:/queue/kinds\ncontent-length:5\n\nbytes\x00"
                     b"SEND\ndestination:/queue/kinds\ncontent-length:4\namq-msg-type:text\n\ntext\x00")
        frames = []
        buffer = b""
        while len(frames) < 3:
            buffer += sock.recv(65536)
            while b"\x00" in buffer:
                frame, _, buffer = buffer.partition(b"\x00")
                frames.append(parse(frame + b"\x00"))
    assert [(body, "content-length" in headers) for _, headers, body in frames] == [
        (b"text body", False), (b"bytes", True), (b"text", False)]


def test_a_queue_browser_sees_the_messages_and_leaves_them(port):
    with Client(port) as client:
        for i in range(3):
            client.send("/queue/browsed", f"b{i}")
        client.subscribe("/queue/browsed", id="look", browser="true")
        frames = [client.message() for _ in range(4)]
        assert [f.body for f in frames[:3]] == [b"b0", b"b1", b"b2"]
        assert frames[3].headers["browser"] == "end" and frames[3].body == b""
        client.subscribe("/queue/browsed", id="take")
        assert [client.message().body for _ in range(3)] == [b"b0", b"b1", b"b2"]  # still there


def test_no_local_subscribers_do_not_get_their_own_messages(port):
    with Client(port) as me, Client(port) as other:
        me.subscribe("/topic/chat", **{"activemq.noLocal": "true"})
        me.send("/topic/chat", "mine")
        other.send("/topic/chat", "theirs")
        assert me.message().body == b"theirs"
        me.no_message()


def test_message_groups_keep_a_groups_messages_on_one_consumer(port):
    with Client(port) as one, Client(port) as two, Client(port) as producer:
        one.subscribe("/queue/grouped", ack="client-individual")
        two.subscribe("/queue/grouped", ack="client-individual")
        for i in range(8):
            producer.send("/queue/grouped", f"{'xy'[i % 2]}{i}", JMSXGroupID="xy"[i % 2])
        got = {name: [client.message() for _ in range(4)] for name, client in (("one", one), ("two", two))}
    groups = {name: {f.headers["JMSXGroupID"] for f in frames} for name, frames in got.items()}
    assert sorted(map(sorted, groups.values())) == [["x"], ["y"]]
    for frames in got.values():
        bodies = [int(f.body[1:]) for f in frames]
        assert bodies == sorted(bodies)  # in order within the group


# -- found by review ------------------------------------------------------------------------
def test_message_ids_stay_unique_when_a_client_id_reconnects(port):
    ids = []
    for _ in range(2):
        with Client(port, **{"client-id": "billing"}) as client:
            client.subscribe("/queue/ids")
            client.send("/queue/ids", "x")
            ids.append(client.message().headers["message-id"])
    assert ids[0] != ids[1]


def test_frames_behind_a_connect_from_a_throttled_address_are_handled_at_once(port):
    from leveret.core.login_throttle import ThrottleSettings

    for _ in range(ThrottleSettings().address_burst + 1):
        headers, _ = error_for(port, b"CONNECT\naccept-version:1.2\nlogin:guest\npasscode:wrong\n\n\x00",
                               connect=False)
        assert headers["message"] == "Authentication failed"
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"CONNECT\naccept-version:1.2\nlogin:guest\npasscode:guest\n\n\x00"
                     b"SEND\ndestination:/queue/pipelined\nreceipt:s1\n\nhi\x00")
        data = b""
        while data.count(b"\x00") < 2:
            chunk = sock.recv(65536)
            assert chunk, data
            data += chunk
    assert data.startswith(b"CONNECTED") and b"RECEIPT\nreceipt-id:s1" in data


def test_a_subscribe_receipt_comes_before_the_first_message_even_behind_a_disk_write(tmp_path):
    with BlockingBroker(amqp_port=0, stomp_port=0, data_dir=str(tmp_path)) as broker, \
            socket.create_connection(("127.0.0.1", broker.broker.stomp_port)) as sock:
        sock.sendall(b"CONNECT\naccept-version:1.2\nlogin:guest\npasscode:guest\n\n\x00")
        read_raw_frame(sock)
        sock.sendall(b"SEND\ndestination:/queue/early\npersistent:true\n\nx\x00"
                     b"SUBSCRIBE\nid:1\ndestination:/queue/early\nreceipt:sub\n\n\x00")
        data = b""
        while data.count(b"\x00") < 2:
            data += sock.recv(65536)
    assert data.index(b"RECEIPT") < data.index(b"MESSAGE")


def test_a_queue_browser_applies_its_selector(port):
    with Client(port) as client:
        client.send("/queue/browse-sel", "red", color="red")
        client.send("/queue/browse-sel", "blue", color="blue")
        client.subscribe("/queue/browse-sel", browser="true", selector="color = 'red'")
        assert client.message().body == b"red"
        assert client.message().headers["browser"] == "end"


def test_no_local_on_a_queue_leaves_the_message_for_other_consumers(port):
    with Client(port) as me, Client(port) as other:
        me.subscribe("/queue/work", **{"activemq.noLocal": "true"})
        me.send("/queue/work", "for someone else")
        me.no_message()
        other.subscribe("/queue/work")
        assert other.message().body == b"for someone else"


def test_a_topic_subscription_keeps_only_what_its_selector_matches(broker, port):
    with Client(port) as client:
        client.subscribe("/topic/prices", selector="sym = 'ACME'")
        for _ in range(50):
            client.send("/topic/prices", "other", receipt=False, sym="OTHER")
        client.send("/topic/prices", "acme", sym="ACME")
        assert client.message().body == b"acme"
        held = broker.call(lambda: sum(q.message_count for q in broker.core.vhosts["/"].queues.values()))
        assert held == 0  # nothing piles up in the subscription's queue


def test_exclusive_subscriptions_stand_by_and_take_over(port):
    """ActiveMQ's exclusive consumer: the first gets everything, a second one waits
    and takes over when the first leaves."""
    with Client(port) as standby:
        first = Client(port)
        first.subscribe("/queue/exclusive", ack="client-individual", **{"activemq.exclusive": "true"})
        standby.subscribe("/queue/exclusive", **{"activemq.exclusive": "true"})
        first.send("/queue/exclusive", "one")
        assert first.message().body == b"one"
        standby.no_message()
        first.close()
        assert standby.message().body == b"one"  # redelivered to the one that took over
        standby.send("/queue/exclusive", "two")
        assert standby.message().body == b"two"


def test_a_1_1_ack_names_its_subscription_when_one_message_reaches_two(port):
    with Client(port, "1.1") as client:
        client.subscribe("/topic/twice", id="s1", ack="client-individual")
        client.subscribe("/topic/twice", id="s2", ack="client-individual")
        client.send("/topic/twice", "x")
        frames = {f.headers["subscription"]: f for f in (client.message(), client.message())}
        assert frames["s1"].headers["message-id"] == frames["s2"].headers["message-id"]
        client.ack(frames["s1"])
        client.ack(frames["s2"])
        client.send("/queue/sync", "x")  # its receipt: both ACKs were taken, no ERROR
        assert client.events.errors.empty()


def test_a_1_0_unsubscribe_by_destination_finds_a_subscription_with_an_id(port):
    with Client(port, "1.0") as client:
        client.subscribe("/queue/by-destination", id="mine")
        client.conn.unsubscribe(destination="/queue/by-destination", headers={"receipt": "u"})
        client.wait_receipt("u")
        client.send("/queue/by-destination", "after")
        client.no_message()
