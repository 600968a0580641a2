"""Answers real clients got from RabbitMQ 3.10 and not from leveret, now the same. Every
test runs against leveret and against a RabbitMQ node (when installed, see targets.py)
over TCP with the same calls, and expects the same reply codes and texts, read from
RabbitMQ 3.10.8:

- unbinding what is not there (a missing queue, exchange or binding) is unbind-ok, so
  aio-pika's RPC helper and test teardowns can unbind from an auto-deleted queue;
  bindings naming the default exchange get 403, missing ends of a bind 404 (the
  source first), another connection's exclusive queue 405 (after existence);
- ``exchange.declare`` of the default exchange is 403, even passive; an existing
  ``amq.`` exchange may be redeclared; deleting one is 403 with RabbitMQ's words;
- ``channel_max`` bounds how many channels are open, not their numbers;
- ``connection.update-secret`` is accepted whatever the secret, and changes nothing;
- kombu with prefetch 1, acks from a second thread and the queue deleted at the end
  while still consumed: delete-ok comes before that channel's own basic.cancel.
"""

from __future__ import annotations

import asyncio
import queue as queue_module
import threading
import time
from collections.abc import Callable
from pathlib import Path

import aio_pika
import kombu
import pika
import pytest
from amqp_raw import PLAIN_GUEST, RawClient
from pamqp import commands
from pika.adapters.blocking_connection import BlockingChannel
from pika.exceptions import ChannelClosedByBroker, ConnectionClosedByBroker, ProbableAuthenticationError
from targets import Target, unique

from leveret import BlockingBroker

Outcome = tuple[int, str] | None


def outcome(target: Target, operation: Callable[[BlockingChannel], object]) -> Outcome:
    """Run ``operation`` on a fresh channel: None if it worked, else the reply code and
    text that closed the channel or the connection."""
    connection = target.amqp()
    try:
        operation(connection.channel())
    except (ChannelClosedByBroker, ConnectionClosedByBroker) as exc:
        return exc.reply_code, exc.reply_text
    finally:
        if connection.is_open:
            connection.close()
    return None


DEFAULT_REFUSED = (403, "ACCESS_REFUSED - operation not permitted on the default exchange")


@pytest.fixture
def names(target: Target):
    """A queue ``q`` and two direct exchanges ``x``/``x2`` that exist, and names that
    do not; all unique on the shared RabbitMQ node and deleted after."""
    created = {"q": unique("fq"), "x": unique("fx"), "x2": unique("fx2")}
    missing = {"no_q": unique("missing-q"), "no_x": unique("missing-x"), "no_x2": unique("missing-x2")}
    with target.amqp() as connection:
        channel = connection.channel()
        channel.queue_declare(created["q"])
        channel.exchange_declare(created["x"], "direct")
        channel.exchange_declare(created["x2"], "direct")
        yield {**created, **missing}
        channel.queue_delete(created["q"])
        channel.exchange_delete(created["x"])
        channel.exchange_delete(created["x2"])


def not_found(kind: str, name: str) -> tuple[int, str]:
    return 404, f"NOT_FOUND - no {kind} '{name}' in vhost '/'"


# -- unbind -----------------------------------------------------------------------------
def test_unbinding_what_does_not_exist_is_unbind_ok(target: Target, names):
    n = names
    cases: dict[str, Callable] = {
        "queue missing": lambda ch: ch.queue_unbind(n["no_q"], n["x"], "k"),
        "exchange missing": lambda ch: ch.queue_unbind(n["q"], n["no_x"], "k"),
        "both missing": lambda ch: ch.queue_unbind(n["no_q"], n["no_x"], "k"),
        "no such binding": lambda ch: ch.queue_unbind(n["q"], n["x"], "k"),
        "no such binding (arguments)": lambda ch: ch.queue_unbind(n["q"], n["x"], "k", {"a": 1}),
        "server-named queue missing": lambda ch: ch.queue_unbind("amq.gen-" + "A" * 22, n["x"], "k"),
        "destination exchange missing": lambda ch: ch.exchange_unbind(n["no_x"], n["x"], "k"),
        "source exchange missing": lambda ch: ch.exchange_unbind(n["x"], n["no_x"], "k"),
        "both exchanges missing": lambda ch: ch.exchange_unbind(n["no_x"], n["no_x2"], "k"),
        "no such exchange binding": lambda ch: ch.exchange_unbind(n["x2"], n["x"], "k"),
    }
    assert {case: outcome(target, op) for case, op in cases.items()} == dict.fromkeys(cases)


def test_an_unbind_that_works_still_removes_the_binding(target: Target, names):
    with target.amqp() as connection:
        channel = connection.channel()
        channel.queue_bind(names["q"], names["x"], "k")
        channel.queue_unbind(names["q"], names["x"], "k")
        channel.basic_publish(names["x"], "k", b"after unbind")
        time.sleep(0.2)
        assert channel.queue_declare(names["q"], passive=True).method.message_count == 0


def test_unbind_and_bind_refusals_in_rabbitmqs_order(target: Target, names):
    n = names
    cases: dict[str, tuple[Callable, Outcome]] = {
        "unbind from the default exchange": (lambda ch: ch.queue_unbind(n["q"], "", n["q"]), DEFAULT_REFUSED),
        "unbind a missing queue from it": (lambda ch: ch.queue_unbind(n["no_q"], "", "k"), DEFAULT_REFUSED),
        "exchange unbind, default source": (lambda ch: ch.exchange_unbind(n["x"], "", "k"), DEFAULT_REFUSED),
        "exchange unbind, default destination": (lambda ch: ch.exchange_unbind("", n["x"], "k"),
                                                 DEFAULT_REFUSED),
        "exchange bind, default destination": (lambda ch: ch.exchange_bind("", n["no_x"], "k"),
                                               DEFAULT_REFUSED),
        "bind a missing queue to the default": (lambda ch: ch.queue_bind(n["no_q"], "", "k"),
                                                DEFAULT_REFUSED),
        "unbind with no queue declared": (lambda ch: ch.queue_unbind("", n["x"], "k"),
                                          (404, "NOT_FOUND - no previously declared queue")),
        "bind, queue missing": (lambda ch: ch.queue_bind(n["no_q"], n["x"], "k"),
                                not_found("queue", n["no_q"])),
        "bind, exchange missing": (lambda ch: ch.queue_bind(n["q"], n["no_x"], "k"),
                                   not_found("exchange", n["no_x"])),
        "bind, both missing: the source": (lambda ch: ch.queue_bind(n["no_q"], n["no_x"], "k"),
                                           not_found("exchange", n["no_x"])),
        "exchange bind, both missing: the source": (lambda ch: ch.exchange_bind(n["no_x"], n["no_x2"], "k"),
                                                    not_found("exchange", n["no_x2"])),
    }
    assert {case: outcome(target, op) for case, (op, _) in cases.items()} == \
        {case: expected for case, (_, expected) in cases.items()}


def test_another_connections_exclusive_queue_is_405_only_where_a_binding_exists(target: Target, names):
    with target.amqp() as owner:
        mine = owner.channel().queue_declare("", exclusive=True).method.queue
        owner.channel().queue_bind(mine, names["x"], "bound")
        locked = (405, f"RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '{mine}' in vhost "
                       "'/'. It could be originally declared on another connection or the exclusive property "
                       "value does not match that of the original declaration.")
        assert outcome(target, lambda ch: ch.queue_unbind(mine, names["x"], "bound")) == locked
        assert outcome(target, lambda ch: ch.queue_unbind(mine, names["x"], "unbound")) is None
        assert outcome(target, lambda ch: ch.queue_unbind(mine, names["no_x"], "bound")) is None
        assert outcome(target, lambda ch: ch.queue_bind(mine, names["no_x"], "k")) == \
            not_found("exchange", names["no_x"])
        assert outcome(target, lambda ch: ch.queue_bind(mine, names["x"], "k")) == locked


def test_unbinding_an_auto_deleted_queue_with_pika(target: Target, names):
    with target.amqp() as connection:
        channel = connection.channel()
        queue = channel.queue_declare("", auto_delete=True).method.queue
        channel.queue_bind(queue, names["x"], "rpc")
        channel.basic_cancel(channel.basic_consume(queue, lambda *_: None))  # the queue goes
        with pytest.raises(ChannelClosedByBroker):
            connection.channel().queue_declare(queue, passive=True)
        channel.queue_unbind(queue, names["x"], "rpc")  # a teardown's unbind: still fine


def test_aio_pika_rpc_closes_after_its_auto_deleted_queue_is_gone(target: Target):
    """aio_pika.patterns.RPC's result queue is auto-delete: close() cancels its consumer
    (the queue goes, and its headers exchange with it), then unbinds and deletes it."""
    from aio_pika.patterns import RPC

    async def body() -> None:
        connection = await aio_pika.connect(target.url())
        async with connection:
            channel = await connection.channel()
            rpc = await RPC.create(channel)
            method = unique("multiply")

            async def multiply(*, x: int, y: int) -> int:
                return x * y

            await rpc.register(method, multiply, auto_delete=True)
            assert await asyncio.wait_for(rpc.call(method, kwargs={"x": 6, "y": 7}), 10) == 42
            await rpc.close()
            assert not channel.is_closed
            await channel.declare_queue(unique("after"), auto_delete=True)  # still usable

    asyncio.run(body())


# -- exchange.declare / delete and the default and amq. exchanges ----------------------------
def test_the_default_exchange_is_refused_even_to_a_passive_declare(target: Target):
    cases: dict[str, tuple[Callable, Outcome]] = {
        "passive": (lambda ch: ch.exchange_declare("", "direct", passive=True), DEFAULT_REFUSED),
        "passive, another type": (lambda ch: ch.exchange_declare("", "fanout", passive=True),
                                  DEFAULT_REFUSED),
        "passive, unknown type": (lambda ch: ch.exchange_declare("", "nope", passive=True), DEFAULT_REFUSED),
        "active": (lambda ch: ch.exchange_declare("", "direct"), DEFAULT_REFUSED),
        "active, unknown type: the type first": (lambda ch: ch.exchange_declare("", "nope"),
                                                 (503, "COMMAND_INVALID - unknown exchange type 'nope'")),
        "delete": (lambda ch: ch.exchange_delete(""), DEFAULT_REFUSED),
    }
    assert {case: outcome(target, op) for case, (op, _) in cases.items()} == \
        {case: expected for case, (_, expected) in cases.items()}


def test_amq_exchanges_as_rabbitmq_answers(target: Target):
    name = unique("amq.x")
    cases: dict[str, tuple[Callable, Outcome]] = {
        "passive, existing": (lambda ch: ch.exchange_declare("amq.direct", "direct", passive=True), None),
        "redeclared as it is": (lambda ch: ch.exchange_declare("amq.topic", "topic", durable=True), None),
        "redeclared otherwise": (lambda ch: ch.exchange_declare("amq.topic", "topic"), (
            406, "PRECONDITION_FAILED - inequivalent arg 'durable' for exchange 'amq.topic' in vhost '/': "
                 "received 'false' but current is 'true'")),
        "a new amq. name": (lambda ch: ch.exchange_declare(name, "direct"),
                            (403, f"ACCESS_REFUSED - exchange name '{name}' contains reserved prefix "
                                  "'amq.*'")),
        "a new amq. name, unknown type": (lambda ch: ch.exchange_declare(name, "nope"),
                                          (503, "COMMAND_INVALID - unknown exchange type 'nope'")),
        "passive, missing": (lambda ch: ch.exchange_declare(name, "direct", passive=True),
                             not_found("exchange", name)),
        "delete amq.direct": (lambda ch: ch.exchange_delete("amq.direct"), (
            403, "ACCESS_REFUSED - deletion of system exchange 'amq.direct' in vhost '/' not allowed")),
        "delete a missing amq. name": (lambda ch: ch.exchange_delete(name), (
            403, f"ACCESS_REFUSED - deletion of system exchange '{name}' in vhost '/' not allowed")),
    }
    assert {case: outcome(target, op) for case, (op, _) in cases.items()} == \
        {case: expected for case, (_, expected) in cases.items()}


# -- channel_max ------------------------------------------------------------------------
def raw_client(host: str, port: int, channel_max: int = 2047, capabilities: dict | None = None) -> RawClient:
    """A raw client past connection.open (no channel open), with ``channel_max``."""
    client = RawClient(port, host)
    client.send(b"AMQP\x00\x00\x09\x01")
    client.expect(commands.Connection.Start, 0)
    properties = {"product": "raw test client", "capabilities": capabilities or {}}
    client.send_method(0, commands.Connection.StartOk(
        client_properties=properties, mechanism="PLAIN", response=PLAIN_GUEST, locale="en_US"))
    client.expect(commands.Connection.Tune, 0)
    client.send_method(0, commands.Connection.TuneOk(channel_max=channel_max, frame_max=131072, heartbeat=0))
    client.send_method(0, commands.Connection.Open(virtual_host="/"))
    client.expect(commands.Connection.OpenOk, 0)
    return client


def test_channel_max_counts_open_channels_not_their_numbers(target: Target):
    with target.amqp() as connection:  # pika: channel_max 2047 negotiated
        channel = connection.channel(65535)
        channel.queue_declare(unique("high"), auto_delete=True)
    with raw_client(target.host, target.amqp_port, channel_max=3) as client:
        for number in (100, 65535, 7):
            client.open_channel(number)
        client.send_method(100, commands.Channel.Close(reply_code=200, class_id=0, method_id=0))
        client.expect(commands.Channel.CloseOk, 100)
        client.open_channel(2047)  # three open again
        client.send_method(1, commands.Channel.Open())
        close = client.expect_connection_close()
    assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (
        530, "NOT_ALLOWED - number of channels opened (3) has reached the negotiated channel_max (3)", 0, 0)


def test_pika_gets_530_when_its_channels_exceed_channel_max(target: Target):
    connection = pika.BlockingConnection(pika.URLParameters(target.url() + "?channel_max=2"))
    connection.channel()
    connection.channel()
    with pytest.raises(ConnectionClosedByBroker) as caught:
        connection.channel(10)  # pika itself refuses a third without a number
    assert (caught.value.reply_code, caught.value.reply_text) == (
        530, "NOT_ALLOWED - number of channels opened (2) has reached the negotiated channel_max (2)")


# -- connection.update-secret -------------------------------------------------------------
def test_update_secret_is_accepted_whatever_the_secret_and_changes_nothing(target: Target):
    with target.amqp() as connection:
        channel = connection.channel()
        connection.update_secret("not the password", "token refresh")  # update-secret-ok
        channel.queue_declare(unique("still"), auto_delete=True)
        connection.update_secret("", "")
        connection.channel().queue_declare(unique("still"), auto_delete=True)
    with target.amqp() as connection:  # the password is what it was
        connection.channel()
    with pytest.raises(ProbableAuthenticationError):
        target.amqp(password="not the password")


def test_update_secret_on_a_channel_is_503(target: Target):
    with raw_client(target.host, target.amqp_port) as client:
        client.open_channel(1)
        client.send_method(1, commands.Connection.UpdateSecret(new_secret="x", reason="r"))
        close = client.expect_connection_close()
    assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (
        503, "COMMAND_INVALID - unimplemented method", 10, 70)


# -- queue.delete: delete-ok, then its own consumers' basic.cancel ------------------------------
def test_kombu_acks_from_another_thread_then_deletes_the_consumed_queue(target: Target):
    """kombu (py-amqp) with prefetch 1: a worker thread acknowledges each message, and at
    the end the main thread deletes the queue while its consumer is still subscribed.
    py-amqp raises ConsumerCancelled from queue_delete if the broker's basic.cancel comes
    before delete-ok; RabbitMQ sends delete-ok first."""
    name, count = unique("kombu-thread"), 20
    url = f"amqp://guest:guest@{target.host}:{target.amqp_port}//"
    with kombu.Connection(url) as connection:
        queue = kombu.Queue(name, routing_key=name)
        with connection.Producer() as producer:
            for i in range(count):
                producer.publish({"i": i}, routing_key=name, declare=[queue], serializer="json")
        work: queue_module.Queue = queue_module.Queue()
        received: list[int] = []
        acked: list[int] = []

        def acknowledge() -> None:
            while (message := work.get()) is not None:
                message.ack()
                acked.append(message.payload["i"])

        worker = threading.Thread(target=acknowledge)
        worker.start()
        try:
            def on_message(body: dict, message: kombu.Message) -> None:
                received.append(body["i"])
                work.put(message)

            consumer = connection.Consumer([queue], callbacks=[on_message], accept=["json"])
            consumer.qos(prefetch_count=1)
            consumer.consume()
            deadline = time.monotonic() + 20
            while len(received) < count and time.monotonic() < deadline:
                try:
                    connection.drain_events(timeout=1)
                except TimeoutError:
                    pass
        finally:
            work.put(None)
            worker.join()
        assert received == list(range(count)) and acked == received  # one at a time, in order
        assert queue.bind(connection.default_channel).delete() == 0  # still consumed


@pytest.mark.parametrize("durable", [False, True])
def test_delete_ok_comes_before_the_deleting_channels_own_cancel(target: Target, durable: bool):
    order = delete_order(target.amqp_port, target.host, durable)
    # The deleting channel's delete-ok comes before its own cancel; the other channel's
    # cancel may come anywhere among them (RabbitMQ 3.10 was seen sending it before,
    # between and after them).
    assert [method for number, method in order if number == 1] == ["Queue.DeleteOk", "Basic.Cancel"]
    assert [method for number, method in order if number == 2] == ["Basic.Cancel"]
    assert len(order) == 3


def test_delete_ok_comes_first_when_the_removal_is_written_to_the_store(tmp_path: Path):
    """leveret with a store: a durable queue's delete-ok waits for the disk, and the
    cancel waits with it."""
    with BlockingBroker(amqp_port=0, data_dir=tmp_path) as broker:
        order = delete_order(broker.amqp_port, broker.broker.host, durable=True)
    assert order == [(2, "Basic.Cancel"), (1, "Queue.DeleteOk"), (1, "Basic.Cancel")]


def delete_order(port: int, host: str, durable: bool) -> list[tuple[int, str]]:
    """Consumers of one queue on channels 1 and 2, channel 1 deletes it: the frames that
    follow, in order (a client that announced consumer_cancel_notify)."""
    name = unique("delete-order")
    with raw_client(host, port, capabilities={"consumer_cancel_notify": True}) as client:
        client.open_channel(1)
        client.open_channel(2)
        client.send_method(1, commands.Queue.Declare(queue=name, durable=durable))
        client.expect(commands.Queue.DeclareOk, 1)
        for number in (1, 2):
            client.send_method(number, commands.Basic.Consume(queue=name, consumer_tag=f"c{number}"))
            client.expect(commands.Basic.ConsumeOk, number)
        client.send_method(1, commands.Queue.Delete(queue=name))
        frames = [client.read_frame() for _ in range(3)]
    return [(number, method.name) for number, method in frames]  # type: ignore[attr-defined]
