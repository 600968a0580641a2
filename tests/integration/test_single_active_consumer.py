"""Single active consumer (``x-single-active-consumer``), checked against RabbitMQ 3.10
when it is installed: of a queue's consumers only the oldest gets messages; when it
goes, the next oldest takes over, with what the old one left unacknowledged."""

from __future__ import annotations

import urllib.parse

import pika
import pytest
from eventually import eventually, poll, pumping
from pika.exceptions import ChannelClosedByBroker
from targets import Target, unique

SAC = {"x-single-active-consumer": True}


def wait(connection: pika.BlockingConnection, done, timeout: float = 5.0) -> None:
    eventually(done, timeout, 0.05, pumping(connection))
    connection.process_data_events(time_limit=0.2)  # and nothing more comes


def consumer(connection: pika.BlockingConnection, queue: str, tag: str, got: list, **arguments):
    ch = connection.channel()
    ch.basic_consume(
        queue,
        lambda _ch, method, _p, body: got.append((tag, body, method.redelivered)),
        consumer_tag=tag,
        arguments=arguments or None,
    )
    return ch


def publish(connection: pika.BlockingConnection, queue: str, bodies: list[bytes]) -> None:
    ch = connection.channel()
    ch.confirm_delivery()
    for body in bodies:
        ch.basic_publish("", queue, body)
    ch.close()


@pytest.mark.parametrize(("value", "type_name"), [("yes", "longstr"), (1, "signedint")])
def test_the_argument_must_be_a_boolean(target: Target, value, type_name):
    queue = unique("sac")
    with target.amqp() as connection:
        with pytest.raises(ChannelClosedByBroker) as refused:
            connection.channel().queue_declare(queue, arguments={"x-single-active-consumer": value})
        assert refused.value.reply_code == 406
        assert refused.value.reply_text == (
            f"PRECONDITION_FAILED - invalid arg 'x-single-active-consumer' for queue '{queue}' "
            f"in vhost '/': {{unacceptable_type,{type_name}}}"
        )


def test_only_the_oldest_consumer_gets_messages_and_the_next_takes_over(target: Target):
    queue = unique("sac")
    with target.amqp() as connection:
        connection.channel().queue_declare(queue, auto_delete=True, arguments=SAC)
        got: list = []
        first = consumer(connection, queue, "first", got)
        consumer(connection, queue, "second", got, **{"x-priority": 10})  # priority does not matter
        consumer(connection, queue, "third", got)
        publish(connection, queue, [b"1", b"2", b"3"])
        wait(connection, lambda: len(got) >= 3)
        assert got == [("first", b"1", False), ("first", b"2", False), ("first", b"3", False)]
        first.basic_cancel("first")
        publish(connection, queue, [b"4", b"5"])
        wait(connection, lambda: len(got) >= 5)
        assert got[3:] == [("second", b"4", False), ("second", b"5", False)]


def test_what_the_active_consumer_left_unacked_goes_to_the_next(target: Target):
    queue = unique("sac")
    with target.amqp() as connection, target.amqp() as other:
        connection.channel().queue_declare(queue, auto_delete=True, arguments=SAC)
        got: list = []
        first = other.channel()
        first.basic_qos(prefetch_count=2)
        first.basic_consume(queue, lambda *a: None, consumer_tag="first")
        consumer(connection, queue, "second", got)
        publish(connection, queue, [b"1", b"2", b"3"])
        wait(connection, lambda: False, timeout=0.3)
        assert got == []  # the first one has them (two unacked, one waiting for room)
        other.close()  # its unacked messages come back, redelivered
        wait(connection, lambda: len(got) >= 3)
        assert sorted(got) == [("second", b"1", True), ("second", b"2", True), ("second", b"3", False)]


def test_an_exclusive_consume_is_refused_while_another_consumer_exists(target: Target):
    queue = unique("sac")
    with target.amqp() as connection:
        connection.channel().queue_declare(queue, auto_delete=True, arguments=SAC)
        consumer(connection, queue, "first", [])
        ch = connection.channel()
        with pytest.raises(ChannelClosedByBroker) as refused:
            ch.basic_consume(queue, lambda *a: None, exclusive=True)
        assert refused.value.reply_code == 403
        assert refused.value.reply_text == f"ACCESS_REFUSED - queue '{queue}' in vhost '/' in exclusive use"


def test_the_management_api_names_the_active_consumer(target: Target):
    queue = unique("sac")
    with target.amqp() as connection:
        connection.channel().queue_declare(queue, auto_delete=True, arguments=SAC)
        consumer(connection, queue, "first", [])
        consumer(connection, queue, "second", [])
        path = f"/api/queues/%2F/{urllib.parse.quote(queue)}"
        status, info = poll(lambda: target.http("GET", path),  # RabbitMQ's statistics come every 5 s
                            lambda answer: answer[0] != 200 or answer[1].get("consumers") == 2, 15, 0.5)
        assert status == 200
        assert info["consumers"] == 2
        assert info["single_active_consumer_tag"] == "first"
