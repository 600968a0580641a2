"""Edge cases found in review, each once a real defect."""

from __future__ import annotations

import json

import pika
import pytest
from amqp_raw import RawClient
from eventually import eventually, pumping
from pamqp import body, commands, frame
from pamqp.header import ContentHeader


def test_reject_publish_refuses_empty_bodies_too(channel):
    channel.queue_declare("full", arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    channel.confirm_delivery()
    channel.basic_publish("", "full", b"")
    with pytest.raises(pika.exceptions.NackError):
        channel.basic_publish("", "full", b"")
    assert channel.queue_declare("full", passive=True).method.message_count == 1


def test_uncommitted_tx_ack_is_undone_when_the_channel_closes(connection):
    ch = connection.channel()
    ch.queue_declare("txq")
    ch.basic_publish("", "txq", b"keep me")
    ch.tx_select()
    method, _, _ = ch.basic_get("txq")
    ch.basic_ack(method.delivery_tag)
    ch.close()  # no commit: the ack never happened
    other = connection.channel()
    method, _, body = other.basic_get("txq", auto_ack=True)
    assert body == b"keep me" and method.redelivered


def test_x_match_must_be_a_known_value(channel):
    channel.queue_declare("hq")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        channel.queue_bind("hq", "amq.headers", arguments={"x-match": 1, "k": "v"})
    assert info.value.reply_code == 406


def test_max_length_zero_still_feeds_a_waiting_consumer(connection):
    ch = connection.channel()
    ch.queue_declare("zero", arguments={"x-max-length": 0})
    got = []
    ch.basic_consume("zero", lambda c, m, p, b: got.append(b), auto_ack=True)
    ch.basic_publish("", "zero", b"straight through")
    eventually(lambda: got, 3, 0.05, pumping(connection))
    assert got == [b"straight through"]


def test_api_survives_odd_numbers(connection):
    ch = connection.channel()
    ch.queue_declare("leased")
    replies = []
    ch.basic_consume("amq.rabbitmq.reply-to", lambda c, m, p, b: replies.append(json.loads(b)),
                     auto_ack=True)
    ch.basic_publish("amq.leveret.api", "lease.ack", '{"queue": "leased", "group": "g", "seqs": [1e999]}',
                     pika.BasicProperties(reply_to="amq.rabbitmq.reply-to"))
    while not replies:
        connection.process_data_events(time_limit=0.05)
    assert replies[0]["ok"] is False and connection.is_open


def test_properties_that_are_not_utf8_are_refused_at_publish(leveret_broker):
    client = RawClient(leveret_broker.amqp_port)
    client.handshake()
    client.open_channel(1)
    bad = bytearray(ContentHeader(body_size=1, properties=commands.Basic.Properties(
        content_type="x")).marshal())
    bad[-1] = 0xFF  # content_type "x" -> b"\xff"
    client.send(frame.marshal(commands.Basic.Publish(routing_key="q"), 1)
                + frame._marshal(2, 1, bytes(bad)) + frame.marshal(body.ContentBody(b"x"), 1))
    assert client.expect_connection_close().reply_code == 502
