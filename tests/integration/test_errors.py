"""Bad input gets a clear error and loses nothing.

Reply codes are RabbitMQ 3.10's: soft errors (403, 404, 405, 406) close only the channel,
hard errors (5xx, 530) only the connection; everything else keeps working, and no
confirmed message is lost when a client misbehaves or vanishes.
"""

from __future__ import annotations

import struct
import threading
import time

import pika
import pytest
from amqp_raw import PROTOCOL_HEADER, RawClient, connected, raw_frame
from eventually import eventually, poll
from pamqp import commands, frame, header as pamqp_header
from pika.exceptions import (
    AuthenticationError,
    ChannelClosedByBroker,
    ConnectionClosedByBroker,
    ProbableAccessDeniedError,
    ProbableAuthenticationError,
)

Basic, Queue, Exchange, Tx = commands.Basic, commands.Queue, commands.Exchange, commands.Tx


# -- helpers ---------------------------------------------------------------------------
def connect(url: str) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(url))


def roundtrip(channel, body: bytes = b"ping") -> None:
    """A channel works: declare, publish, get back."""
    queue = channel.queue_declare("", exclusive=True).method.queue
    channel.basic_publish("", queue, body)
    method, _props, got = poll(lambda: channel.basic_get(queue, auto_ack=True),
                               lambda message: message[0] is not None, 5, 0.01)
    assert method is not None, "published message never arrived"
    assert got == body


@pytest.fixture
def bystander(connection):
    """Another channel on the same connection, open before the error."""
    return connection.channel()


def assert_channel_error(code: int, channel, bystander, action) -> ChannelClosedByBroker:
    """``action`` closes ``channel`` with ``code``; the connection, the channel opened
    beside it and a new channel all still work."""
    with pytest.raises(ChannelClosedByBroker) as info:
        action()
    assert info.value.reply_code == code, info.value.reply_text
    assert channel.is_closed
    connection = bystander.connection
    assert connection.is_open
    roundtrip(bystander)
    roundtrip(connection.channel())
    return info.value


def assert_connection_error(code: int, url: str, action) -> ConnectionClosedByBroker:
    """``action`` (given a fresh connection) gets it closed with ``code``; a connection
    opened before is unaffected."""
    other = connect(url)
    try:
        other_channel = other.channel()
        conn = connect(url)
        with pytest.raises(ConnectionClosedByBroker) as info:
            action(conn)
        assert info.value.reply_code == code, info.value.reply_text
        assert conn.is_closed
        roundtrip(other_channel)
        roundtrip(other.channel())
    finally:
        if other.is_open:
            other.close()
    return info.value


def raw_connection_error(port: int, code: int, bad: bytes, **handshake) -> commands.Connection.Close:
    """Send ``bad`` after a normal handshake (channel 1 open); the broker answers
    connection.close ``code`` and closes the socket after close-ok."""
    with connected(port, **handshake) as client:
        client.send(bad)
        close = client.expect_connection_close()
    assert close.reply_code == code, close.reply_text
    return close


def method(channel: int, value) -> bytes:
    return frame.marshal(value, channel)


@pytest.fixture
def port(leveret_broker) -> int:
    return leveret_broker.amqp_port


# -- 404 NOT_FOUND ------------------------------------------------------------------------
def test_publish_to_missing_exchange_is_404(channel, bystander):
    def action():
        channel.basic_publish("no-such-exchange", "rk", b"x")
        channel.queue_declare("", exclusive=True)  # the next synchronous call sees the close
    error = assert_channel_error(404, channel, bystander, action)
    assert "no exchange 'no-such-exchange'" in error.reply_text


def test_publish_to_missing_exchange_with_confirms_is_404(channel, bystander):
    channel.confirm_delivery()
    assert_channel_error(404, channel, bystander,
                         lambda: channel.basic_publish("no-such-exchange", "rk", b"x"))


def test_bind_to_missing_exchange_is_404(channel, bystander):
    channel.queue_declare("q")
    assert_channel_error(404, channel, bystander, lambda: channel.queue_bind("q", "no-such-exchange"))


def test_bind_missing_queue_is_404(channel, bystander):
    assert_channel_error(404, channel, bystander, lambda: channel.queue_bind("no-such-queue", "amq.direct"))


def test_exchange_bind_missing_source_is_404(channel, bystander):
    channel.exchange_declare("dest", "fanout")
    assert_channel_error(404, channel, bystander, lambda: channel.exchange_bind("dest", "no-such-exchange"))


def test_passive_declare_of_missing_exchange_is_404(channel, bystander):
    assert_channel_error(404, channel, bystander,
                         lambda: channel.exchange_declare("no-such-exchange", passive=True))


def test_passive_declare_of_missing_queue_is_404(channel, bystander):
    error = assert_channel_error(404, channel, bystander,
                                 lambda: channel.queue_declare("no-such-queue", passive=True))
    assert error.reply_text == "NOT_FOUND - no queue 'no-such-queue' in vhost '/'"


def test_consume_from_missing_queue_is_404(channel, bystander):
    assert_channel_error(404, channel, bystander,
                         lambda: channel.basic_consume("no-such-queue", lambda *a: None))


def test_get_from_missing_queue_is_404(channel, bystander):
    assert_channel_error(404, channel, bystander, lambda: channel.basic_get("no-such-queue"))


# -- 403 ACCESS_REFUSED -----------------------------------------------------------------
def test_declare_exchange_with_amq_prefix_is_403(channel, bystander):
    assert_channel_error(403, channel, bystander, lambda: channel.exchange_declare("amq.mine", "direct"))


def test_declare_queue_with_amq_prefix_is_403(channel, bystander):
    assert_channel_error(403, channel, bystander, lambda: channel.queue_declare("amq.mine"))


def test_bind_to_default_exchange_is_403(channel, bystander):
    channel.queue_declare("q")
    assert_channel_error(403, channel, bystander, lambda: channel.queue_bind("q", "", routing_key="q"))


def test_publish_to_internal_exchange_is_403(channel, bystander):
    channel.exchange_declare("inner", "fanout", internal=True)
    channel.confirm_delivery()
    assert_channel_error(403, channel, bystander, lambda: channel.basic_publish("inner", "", b"x"))


def test_exclusive_consume_on_queue_with_consumers_is_403(connection, channel, bystander):
    channel.queue_declare("shared")
    bystander.basic_consume("shared", lambda *a: None)
    victim = connection.channel()
    assert_channel_error(403, victim, bystander,
                         lambda: victim.basic_consume("shared", lambda *a: None, exclusive=True))


def test_consume_on_queue_with_exclusive_consumer_is_403(connection, channel, bystander):
    channel.queue_declare("shared")
    bystander.basic_consume("shared", lambda *a: None, exclusive=True)
    victim = connection.channel()
    assert_channel_error(403, victim, bystander,
                         lambda: victim.basic_consume("shared", lambda *a: None))


# -- 405 RESOURCE_LOCKED -------------------------------------------------------------------
@pytest.fixture
def owner(amqp_url):
    """A channel of another connection that holds queue 'mine' exclusively."""
    conn = connect(amqp_url)
    channel = conn.channel()
    channel.queue_declare("mine", exclusive=True)
    yield channel
    conn.close()


@pytest.fixture
def exclusive_queue(owner) -> str:
    return "mine"


@pytest.mark.parametrize("touch", [
    pytest.param(lambda ch, q: ch.queue_declare(q, exclusive=True), id="declare-exclusive"),
    pytest.param(lambda ch, q: ch.queue_declare(q), id="declare"),
    pytest.param(lambda ch, q: ch.queue_declare(q, passive=True), id="passive-declare"),
    pytest.param(lambda ch, q: ch.basic_consume(q, lambda *a: None), id="consume"),
    pytest.param(lambda ch, q: ch.basic_get(q), id="get"),
    pytest.param(lambda ch, q: ch.queue_bind(q, "amq.direct"), id="bind"),
    pytest.param(lambda ch, q: ch.queue_purge(q), id="purge"),
    pytest.param(lambda ch, q: ch.queue_delete(q), id="delete"),
])
def test_other_connection_touching_exclusive_queue_is_405(exclusive_queue, channel, bystander, touch):
    error = assert_channel_error(405, channel, bystander, lambda: touch(channel, exclusive_queue))
    assert "exclusive access to locked queue 'mine'" in error.reply_text


def test_exclusive_queue_is_untouched_by_other_connections_attempt(owner, channel, bystander):
    owner.basic_publish("", "mine", b"still here")
    assert_channel_error(405, channel, bystander, lambda: channel.queue_delete("mine"))
    _method, _, body = owner.basic_get("mine", auto_ack=True)
    assert body == b"still here"


def test_exclusive_queue_is_deleted_with_its_connection(amqp_url, channel):
    conn = connect(amqp_url)
    conn.channel().queue_declare("mine", exclusive=True)
    conn.close()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:  # gone with its owner
        channel.connection.channel().queue_declare("mine", passive=True)
    assert info.value.reply_code == 404
    declared = channel.queue_declare("mine", exclusive=True)  # free to take now
    assert declared.method.queue == "mine" and declared.method.message_count == 0


# -- 406 PRECONDITION_FAILED ---------------------------------------------------------------
def test_redeclare_exchange_with_other_type_is_406(channel, bystander):
    channel.exchange_declare("ex", "direct")
    error = assert_channel_error(406, channel, bystander, lambda: channel.exchange_declare("ex", "fanout"))
    assert error.reply_text == ("PRECONDITION_FAILED - inequivalent arg 'type' for exchange 'ex' "
                                "in vhost '/': received 'fanout' but current is 'direct'")


def test_redeclare_exchange_with_other_durability_is_406(channel, bystander):
    channel.exchange_declare("ex", "direct")
    assert_channel_error(406, channel, bystander,
                         lambda: channel.exchange_declare("ex", "direct", durable=True))


def test_redeclare_queue_with_other_durability_is_406(channel, bystander):
    channel.queue_declare("q")
    error = assert_channel_error(406, channel, bystander, lambda: channel.queue_declare("q", durable=True))
    assert "inequivalent arg 'durable'" in error.reply_text


def test_redeclare_queue_with_other_ttl_is_406(channel, bystander):
    channel.queue_declare("q", arguments={"x-message-ttl": 1000})
    error = assert_channel_error(406, channel, bystander,
                                 lambda: channel.queue_declare("q", arguments={"x-message-ttl": 2000}))
    assert "x-message-ttl" in error.reply_text


def test_redeclare_queue_without_ttl_is_406(channel, bystander):
    channel.queue_declare("q", arguments={"x-message-ttl": 1000})
    assert_channel_error(406, channel, bystander, lambda: channel.queue_declare("q"))


def test_equivalent_redeclare_is_fine(channel):
    channel.exchange_declare("ex", "topic", durable=True)
    channel.exchange_declare("ex", "topic", durable=True)
    channel.queue_declare("q", arguments={"x-message-ttl": 1000})
    channel.queue_declare("q", arguments={"x-message-ttl": 1000})
    roundtrip(channel)


def test_ack_of_unknown_delivery_tag_is_406(channel, bystander):
    def action():
        channel.basic_ack(12345)
        channel.queue_declare("", exclusive=True)
    error = assert_channel_error(406, channel, bystander, action)
    assert "unknown delivery tag 12345" in error.reply_text


def test_double_ack_is_406_and_message_stays_acked(channel, bystander):
    channel.queue_declare("q")
    channel.basic_publish("", "q", b"once")
    method, _, _ = channel.basic_get("q")

    def action():
        channel.basic_ack(method.delivery_tag)
        channel.basic_ack(method.delivery_tag)
        channel.queue_declare("", exclusive=True)
    assert_channel_error(406, channel, bystander, action)
    assert bystander.queue_declare("q", passive=True).method.message_count == 0


def test_unknown_tag_closes_channel_and_requeues_its_unacked(channel, bystander):
    channel.queue_declare("q")
    channel.basic_publish("", "q", b"keep me")
    channel.basic_get("q")  # unacknowledged

    def action():
        channel.basic_nack(999)
        channel.queue_declare("", exclusive=True)
    assert_channel_error(406, channel, bystander, action)
    method, _, body = bystander.basic_get("q", auto_ack=True)
    assert body == b"keep me" and method.redelivered


def test_delete_queue_if_unused_with_consumer_is_406(channel, bystander):
    channel.queue_declare("q")
    bystander.basic_consume("q", lambda *a: None)
    assert_channel_error(406, channel, bystander, lambda: channel.queue_delete("q", if_unused=True))
    assert bystander.queue_declare("q", passive=True).method.consumer_count == 1


def test_delete_queue_if_empty_with_messages_is_406(channel, bystander):
    channel.queue_declare("q")
    channel.basic_publish("", "q", b"x")
    assert_channel_error(406, channel, bystander, lambda: channel.queue_delete("q", if_empty=True))
    assert bystander.queue_declare("q", passive=True).method.message_count == 1


def test_delete_exchange_if_unused_with_binding_is_406(channel, bystander):
    channel.exchange_declare("ex", "fanout")
    channel.queue_declare("q")
    channel.queue_bind("q", "ex")
    assert_channel_error(406, channel, bystander, lambda: channel.exchange_delete("ex", if_unused=True))
    bystander.exchange_declare("ex", passive=True)


def test_confirm_select_on_tx_channel_is_406(channel, bystander):
    channel.tx_select()
    assert_channel_error(406, channel, bystander, channel.confirm_delivery)


def test_tx_select_on_confirm_channel_is_406(channel, bystander):
    channel.confirm_delivery()
    assert_channel_error(406, channel, bystander, channel.tx_select)


def test_tx_commit_without_select_is_406(channel, bystander):
    assert_channel_error(406, channel, bystander, channel.tx_commit)


def test_tx_rollback_without_select_is_406(channel, bystander):
    assert_channel_error(406, channel, bystander, channel.tx_rollback)


def test_message_larger_than_max_message_size_is_406(leveret_broker, channel, bystander):
    leveret_broker.core.limits.max_message_size = 1000
    channel.queue_declare("q")
    channel.confirm_delivery()
    channel.basic_publish("", "q", b"x" * 1000)  # at the limit: fine
    error = assert_channel_error(406, channel, bystander,
                                 lambda: channel.basic_publish("", "q", b"x" * 1001))
    assert "larger than configured max size 1000" in error.reply_text
    assert bystander.queue_declare("q", passive=True).method.message_count == 1


def test_oversized_message_in_many_frames_then_more_traffic(leveret_broker, port):
    """The rest of a refused message's body frames is ignored; the connection goes on."""
    leveret_broker.core.limits.max_message_size = 1000
    with connected(port) as client:
        client.open_channel(2)
        client.send_method(2, Queue.Declare(queue="q"))
        client.expect(Queue.DeclareOk, 2)
        publish = RawClient.publish_frames(1, "q", b"y" * 5000)
        client.send(publish)
        close = client.expect(commands.Channel.Close, 1)
        assert close.reply_code == 406 and (close.class_id, close.method_id) == (60, 40)
        client.send_method(1, commands.Channel.CloseOk())
        client.publish(2, "q", b"small")
        client.send_method(2, Queue.Declare(queue="q", passive=True))
        assert client.expect(Queue.DeclareOk, 2).message_count == 1


# -- connection errors through pika ---------------------------------------------------------
def test_unknown_vhost_is_530(amqp_url):
    """pika reports a close during connection.open as ProbableAccessDeniedError
    (as with RabbitMQ); the broker's connection.close 530 is inside it."""
    other = connect(amqp_url)
    with pytest.raises(ProbableAccessDeniedError) as info:
        connect(amqp_url.rsplit("/", 1)[0] + "/no-such-vhost")
    assert "(530)" in str(info.value) and "no-such-vhost" in str(info.value)
    roundtrip(other.channel())
    other.close()


def test_unknown_vhost_is_530_on_the_wire(port):
    with RawClient(port) as client:
        client.send(PROTOCOL_HEADER)
        client.expect(commands.Connection.Start)
        client.send_method(0, commands.Connection.StartOk(
            mechanism="PLAIN", response="\x00guest\x00guest", locale="en_US"))
        client.expect(commands.Connection.Tune)
        client.send_method(0, commands.Connection.TuneOk())
        client.send_method(0, commands.Connection.Open(virtual_host="no-such-vhost"))
        close = client.expect_connection_close()
    assert close.reply_code == 530
    assert close.reply_text == "NOT_ALLOWED - vhost no-such-vhost not found"  # RabbitMQ 3.10's words


def test_unknown_exchange_type_is_503(amqp_url):
    assert_connection_error(503, amqp_url,
                            lambda conn: conn.channel().exchange_declare("ex", "no-such-type"))


def test_qos_with_prefetch_size_is_540(amqp_url):
    assert_connection_error(540, amqp_url, lambda conn: conn.channel().basic_qos(prefetch_size=10))


def test_wrong_password_is_refused(amqp_url):
    other = connect(amqp_url)
    with pytest.raises((ProbableAuthenticationError, AuthenticationError)):
        connect(amqp_url.replace("guest:guest", "guest:wrong"))
    with pytest.raises((ProbableAuthenticationError, AuthenticationError)):
        connect(amqp_url.replace("guest:guest", "nobody:guest"))
    roundtrip(other.channel())
    other.close()


def test_wrong_password_is_403_on_the_wire(port):
    with RawClient(port) as client:
        client.send(PROTOCOL_HEADER)
        client.expect(commands.Connection.Start)
        client.send_method(0, commands.Connection.StartOk(
            mechanism="PLAIN", response="\x00guest\x00wrong", locale="en_US"))
        close = client.expect_connection_close()
    assert close.reply_code == 403
    assert "Login was refused" in close.reply_text


# -- connection errors on the wire -------------------------------------------------------
def test_unknown_auth_mechanism_is_503(port):
    with RawClient(port) as client:
        client.send(PROTOCOL_HEADER)
        client.expect(commands.Connection.Start)
        client.send_method(0, commands.Connection.StartOk(
            mechanism="EXTERNAL", response="", locale="en_US"))
        close = client.expect_connection_close()
    assert close.reply_code == 503
    assert "EXTERNAL" in close.reply_text


def test_reused_consumer_tag_is_530(port):
    with connected(port) as client:
        client.send_method(1, Queue.Declare(queue="q"))
        client.expect(Queue.DeclareOk)
        client.send_method(1, Basic.Consume(queue="q", consumer_tag="tag"))
        client.expect(Basic.ConsumeOk)
        client.send_method(1, Basic.Consume(queue="q", consumer_tag="tag"))
        close = client.expect_connection_close()
    assert close.reply_code == 530
    assert (close.class_id, close.method_id) == (60, 20)


def test_more_channels_than_negotiated_channel_max_is_530(port):
    # channel_max counts open channels (RabbitMQ's rule), whatever their numbers
    close = raw_connection_error(port, 530, method(3, commands.Channel.Open()), channel_max=1)
    assert close.reply_text == \
        "NOT_ALLOWED - number of channels opened (1) has reached the negotiated channel_max (1)"


def test_method_on_unopened_channel_is_504(port):
    raw_connection_error(port, 504, method(5, Queue.Declare(queue="q")))


def test_second_channel_open_is_504(port):
    close = raw_connection_error(port, 504, method(1, commands.Channel.Open()))
    assert (close.class_id, close.method_id) == (20, 10)


def test_content_body_without_publish_is_505(port):
    raw_connection_error(port, 505, raw_frame(3, 1, b"stray body"))


def test_content_header_without_publish_is_505(port):
    header = pamqp_header.ContentHeader(body_size=4, properties=Basic.Properties())
    raw_connection_error(port, 505, frame.marshal(header, 1))


def test_method_after_publish_before_header_is_505(port):
    raw_connection_error(port, 505, method(1, Basic.Publish(routing_key="q"))
                         + method(1, Queue.Declare(queue="q")))


def test_method_in_the_middle_of_a_body_is_505(port):
    content = RawClient.publish_frames(1, "q", b"0123456789")
    half_body = content[:-len(raw_frame(3, 1, b"0123456789"))] + raw_frame(3, 1, b"01234")
    raw_connection_error(port, 505, half_body + method(1, Queue.Declare(queue="q")))


def test_bad_frame_end_is_501(port):
    raw_connection_error(port, 501, method(1, Queue.Declare(queue="q"))[:-1] + b"\x00")


def test_absurd_frame_size_is_501(port):
    raw_connection_error(port, 501, struct.pack(">BHI", 1, 1, 0x7FFFFFF0))


def test_frame_larger_than_frame_max_is_501(port):
    raw_connection_error(port, 501, raw_frame(3, 1, b"x" * 8192), frame_max=4096)


def test_unknown_frame_type_is_501(port):
    raw_connection_error(port, 501, raw_frame(9, 0, b"???"))


def test_heartbeat_on_channel_1_is_501(port):
    raw_connection_error(port, 501, raw_frame(8, 1, b""))


def test_undecodable_method_arguments_is_502(port):
    # queue.declare whose queue name says 5 bytes but carries 2, and nothing after
    close = raw_connection_error(port, 502, raw_frame(1, 1, b"\x00\x32\x00\x0a\x00\x00\x05ab"))
    assert (close.class_id, close.method_id) == (50, 10)


@pytest.mark.parametrize("properties", [
    pytest.param(struct.pack(">H", 0x2000) + b"\x00\x00\x00\x10\x01aS", id="headers-table-overruns"),
    pytest.param(struct.pack(">H", 0x0040) + b"abc", id="timestamp-truncated"),
    pytest.param(struct.pack(">H", 0x8000) + b"\x05ab", id="short-string-truncated"),
])
def test_undecodable_content_properties_are_502_and_never_reach_consumers(port, channel, properties):
    """A client could not decode such a message: refused at the publisher, not
    queued for a consumer to choke on."""
    channel.queue_declare("q")
    header = struct.pack(">HHQ", 60, 0, 2) + properties
    bad = method(1, Basic.Publish(routing_key="q")) + raw_frame(2, 1, header) + raw_frame(3, 1, b"hi")
    close = raw_connection_error(port, 502, bad)
    assert "content properties" in close.reply_text
    assert channel.queue_declare("q", passive=True).method.message_count == 0
    roundtrip(channel)


def test_publish_immediate_is_540(port):
    close = raw_connection_error(port, 540, method(1, Basic.Publish(routing_key="q", immediate=True)))
    assert "immediate" in close.reply_text


@pytest.mark.parametrize("class_id,method_id", [(60, 99), (999, 1)])
def test_unknown_method_is_540(port, class_id, method_id):
    raw_connection_error(port, 540, raw_frame(1, 1, struct.pack(">HH", class_id, method_id)))


def test_connection_error_spares_other_connections(port, amqp_url):
    other = connect(amqp_url)
    other_channel = other.channel()
    raw_connection_error(port, 501, raw_frame(9, 0, b""))
    roundtrip(other_channel)
    other.close()


def test_connection_error_requeues_unacked_of_that_connection(port, channel):
    channel.queue_declare("q")
    channel.confirm_delivery()
    channel.basic_publish("", "q", b"precious")
    with connected(port) as client:
        client.send_method(1, Basic.Get(queue="q"))
        client.expect(Basic.GetOk)
        client.send(raw_frame(9, 0, b""))
        assert client.expect_connection_close().reply_code == 501
    method, _, body = channel.basic_get("q", auto_ack=True)
    assert body == b"precious" and method.redelivered


# -- protocol header -----------------------------------------------------------------------
@pytest.mark.parametrize("header", [
    b"HTTP/1.1", b"AMQP\x00\x00\x08\x00", b"AMQP\x01\x01\x00\x09", b"AMQP\x00\x00\x09\x00",
    b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
])
def test_wrong_protocol_header_gets_ours_and_a_close(port, header):
    with RawClient(port) as client:
        client.send(header)
        assert client.read_raw(8) == PROTOCOL_HEADER
        assert client.closed_within(3.0)
        assert client.buffer == b""


def test_protocol_header_in_pieces_is_accepted(port):
    with RawClient(port) as client:
        for byte in PROTOCOL_HEADER:
            client.send(bytes([byte]))
            time.sleep(0.01)
        client.expect(commands.Connection.Start)


# -- heartbeats ------------------------------------------------------------------------------
def test_silent_client_with_heartbeat_is_dropped(port, amqp_url):
    other = connect(amqp_url)
    with connected(port, heartbeat_interval=1) as client:
        start = time.monotonic()
        assert client.closed_within(5.0), "silent client was never dropped"
        elapsed = time.monotonic() - start
    assert 1.5 <= elapsed <= 4.0, elapsed
    roundtrip(other.channel())
    other.close()


def test_client_sending_heartbeats_is_kept_and_server_sends_heartbeats(port):
    with connected(port, heartbeat_interval=1) as client:
        client.sock.settimeout(0.3)
        deadline = time.monotonic() + 3.5
        while time.monotonic() < deadline:
            client.send_heartbeat()
            try:
                client.read_frame()
            except TimeoutError:
                pass
        assert client.heartbeats_received >= 3
        client.sock.settimeout(5)
        client.open_channel(2)  # still alive and answering


@pytest.fixture
def stall_broker(port, monkeypatch):
    """``stall_broker(seconds)`` blocks the broker's event loop for ``seconds`` inside
    a read, as a slow publish would: another connection sends a request whose handling
    sleeps (an extra operation of amq.leveret.api). Returns at once."""
    from leveret.core import api

    def stall(vhost, request, owner):
        time.sleep(request["seconds"])
        return {}

    monkeypatch.setitem(api.OPERATIONS, "test.stall", stall)
    staller = connected(port)

    def start(seconds: float) -> None:
        staller.publish(1, "test.stall", b'{"seconds": %f}' % seconds, exchange=api.API_EXCHANGE)
        time.sleep(0.1)  # the loop is now asleep

    yield start
    staller.close()


@pytest.mark.parametrize("probe", ["FIONREAD", "recheck"])
def test_heartbeats_sent_during_a_broker_stall_keep_the_client(port, stall_broker, monkeypatch,
                                                              probe):
    """The loop stalls for 3 heartbeat intervals while the client keeps sending
    heartbeats; they wait unread on the socket when the overdue heartbeat check runs
    (uvloop runs timers before reading), and they are a sign of life: kept. The server
    asks the kernel (FIONREAD); where it cannot, the check looks again after a poll."""
    if probe == "recheck":
        from leveret.server import listener
        monkeypatch.setattr(listener, "ioctl", None)  # as on Windows
    with connected(port, heartbeat_interval=1) as client:
        stall_broker(3.0)
        deadline = time.monotonic() + 4.5  # the stall, then two more intervals
        while time.monotonic() < deadline:
            client.send_heartbeat()
            time.sleep(0.25)
        client.sock.settimeout(5)
        client.open_channel(2)  # still open and answering
        client.publish(2, "", b"after the stall")
        client.send_method(2, Basic.Get(queue="", no_ack=True))  # no queue: 404 on ch 2
        assert client.expect(commands.Channel.Close, 2).reply_code == 404


def test_pika_client_with_heartbeats_survives_a_broker_stall(amqp_url, stall_broker):
    conn = connect(amqp_url + "?heartbeat=1")
    try:
        channel = conn.channel()
        stall_broker(3.0)
        conn.sleep(5.5)  # pika sends its heartbeats meanwhile; past the next checks
        assert conn.is_open
        roundtrip(channel)
    finally:
        if conn.is_open:
            conn.close()


def test_silent_client_is_dropped_after_a_broker_stall(port, stall_broker):
    """Unread data is what keeps a client: one that sent nothing during the stall is
    still dropped for missed heartbeats."""
    with connected(port, heartbeat_interval=1) as client:
        stall_broker(3.0)
        assert client.closed_within(6.0), "silent client was never dropped"


# -- clients that vanish --------------------------------------------------------------------
class Publisher(threading.Thread):
    """A pika client publishing with confirms into ``queue`` until stopped; ``sent``
    holds every confirmed body."""

    def __init__(self, url: str, queue: str) -> None:
        super().__init__(daemon=True)
        self.url, self.queue = url, queue
        self.sent: list[bytes] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            conn = connect(self.url)
            channel = conn.channel()
            channel.confirm_delivery()
            n = 0
            while not self.stop.is_set() or n < 20:
                body = b"confirmed %d" % n
                channel.basic_publish("", self.queue, body,
                                      pika.BasicProperties(delivery_mode=2), mandatory=True)
                self.sent.append(body)
                n += 1
            conn.close()
        except BaseException as exc:  # reported by finish()
            self.error = exc

    def finish(self) -> list[bytes]:
        self.stop.set()
        self.join(10)
        assert not self.is_alive()
        assert self.error is None, repr(self.error)
        return self.sent


def drain(channel, queue: str, timeout: float = 1.0) -> list[bytes]:
    bodies = []
    for method, _props, body in channel.consume(queue, inactivity_timeout=timeout):
        if method is None:
            break
        bodies.append(body)
        channel.basic_ack(method.delivery_tag)
    channel.cancel()
    return bodies


def test_client_vanishing_mid_message_loses_nothing_confirmed(port, amqp_url, channel):
    channel.queue_declare("work")
    publisher = Publisher(amqp_url, "work")
    publisher.start()
    content = RawClient.publish_frames(1, "work", b"half a message" * 100)
    with connected(port) as client:
        client.send(content[:len(content) - 700])
        time.sleep(0.1)
    sent = publisher.finish()
    assert drain(channel, "work") == sent  # every confirmed message, in order, no fragment
    roundtrip(channel)


def test_client_vanishing_mid_transaction_publishes_nothing(port, amqp_url, channel):
    channel.queue_declare("work")
    publisher = Publisher(amqp_url, "work")
    publisher.start()
    with connected(port) as client:
        client.send_method(1, Tx.Select())
        client.expect(Tx.SelectOk)
        for i in range(5):
            client.publish(1, "work", b"uncommitted %d" % i)
        client.send_method(1, Queue.Declare(queue="work", passive=True))
        client.expect(Queue.DeclareOk)  # the publishes were processed
    sent = publisher.finish()
    assert drain(channel, "work") == sent


def test_committed_transaction_survives_the_client_vanishing(port, channel):
    channel.queue_declare("work")
    with connected(port) as client:
        client.send_method(1, Tx.Select())
        client.expect(Tx.SelectOk)
        client.publish(1, "work", b"committed")
        client.send_method(1, Tx.Commit())
        client.expect(Tx.CommitOk)
        client.publish(1, "work", b"not committed")
    time.sleep(0.1)
    assert drain(channel, "work") == [b"committed"]


def test_unacked_deliveries_of_a_vanished_consumer_are_redelivered(port, channel):
    channel.queue_declare("work")
    channel.confirm_delivery()
    bodies = [b"task %d" % i for i in range(10)]
    for body in bodies:
        channel.basic_publish("", "work", body)
    with connected(port) as client:
        client.send_method(1, Basic.Qos(prefetch_count=4))
        client.expect(Basic.QosOk)
        client.send_method(1, Basic.Consume(queue="work", consumer_tag="doomed"))
        client.expect(Basic.ConsumeOk)
        first = client.expect(Basic.Deliver)
        client.send_method(1, Basic.Ack(delivery_tag=first.delivery_tag))
        # tasks 1-4 are now delivered and unacknowledged when the client vanishes
        client.send_method(1, Queue.Declare(queue="work", passive=True))
        client.skip_until(Queue.DeclareOk)
    assert eventually(lambda: channel.queue_declare("work", passive=True).method.consumer_count == 0)
    got, redelivered = [], []

    def nine() -> bool:
        while len(got) < 9 and (message := channel.basic_get("work", auto_ack=True))[0] is not None:
            got.append(message[2])
            redelivered.append(message[0].redelivered)
        return len(got) == 9

    eventually(nine)
    assert got == bodies[1:]  # task 0 was acked; the rest all there, in order
    assert redelivered == [True] * 4 + [False] * 5


def test_vanished_consumer_does_not_disturb_a_live_consumer(port, amqp_url):
    producer = connect(amqp_url)
    pch = producer.channel()
    pch.queue_declare("work")
    pch.confirm_delivery()
    consumer = connect(amqp_url)
    cch = consumer.channel()
    cch.basic_qos(prefetch_count=1)
    with connected(port) as client:
        client.send_method(1, Basic.Consume(queue="work", consumer_tag="doomed"))
        client.expect(Basic.ConsumeOk)
        for i in range(10):
            pch.basic_publish("", "work", b"m%d" % i)
        time.sleep(0.1)
    received = {}
    for method, _props, body in cch.consume("work", inactivity_timeout=1.0):
        if method is None:
            break
        received[body] = method.redelivered
        cch.basic_ack(method.delivery_tag)
    assert sorted(received) == sorted(b"m%d" % i for i in range(10))
    assert any(received.values())  # the vanished consumer's share came back redelivered
    producer.close()
    consumer.close()
