"""pika against leveret over TCP: SelectConnection (callbacks) and BlockingConnection
features, checked against RabbitMQ 3.10's behaviour."""

from __future__ import annotations

import datetime
import decimal

import pika
import pika.exceptions
import pytest
from eventually import eventually, pumping
from pika.adapters.select_connection import SelectConnection
from pika.spec import Basic


def connect(url: str) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(url))


def publish_all(channel, queue: str, bodies) -> None:
    for body in bodies:
        channel.basic_publish("", queue, body if isinstance(body, bytes) else body.encode())


def get_bodies(channel, queue: str) -> list[bytes]:
    """Everything ready in ``queue``, by basic.get with auto-ack."""
    bodies = []
    while True:
        method, _props, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            return bodies
        bodies.append(body)


def queue_exists(channel_factory, name: str) -> bool:
    """A passive declare on a fresh channel (a 404 closes the channel)."""
    channel = channel_factory()
    try:
        channel.queue_declare(name, passive=True)
    except pika.exceptions.ChannelClosedByBroker as exc:
        assert exc.reply_code == 404
        return False
    channel.close()
    return True


def exchange_exists(channel_factory, name: str) -> bool:
    channel = channel_factory()
    try:
        channel.exchange_declare(name, passive=True)
    except pika.exceptions.ChannelClosedByBroker as exc:
        assert exc.reply_code == 404
        return False
    channel.close()
    return True


def counts(channel, queue: str) -> tuple[int, int]:
    ok = channel.queue_declare(queue, passive=True).method
    return ok.message_count, ok.consumer_count


# -- SelectConnection ------------------------------------------------------------------

def test_select_connection_publish_consume_with_confirms(amqp_url):
    """Callback style: confirm.select, publish 100, consume and ack them all, close."""
    total = 100
    state = {"acked": set(), "nacked": 0, "received": [], "closed": False}

    def on_open(connection):
        connection.channel(on_open_callback=on_channel)

    def on_channel(channel):
        state["channel"] = channel
        channel.confirm_delivery(on_confirm, callback=lambda _: channel.queue_declare(
            "select-q", callback=on_declared))

    def on_confirm(frame):
        method = frame.method
        if isinstance(method, Basic.Nack):
            state["nacked"] += 1
            return
        upto = method.delivery_tag
        state["acked"].update(range(1, upto + 1) if method.multiple else [upto])
        maybe_done()

    def on_declared(_frame):
        channel = state["channel"]
        channel.basic_qos(prefetch_count=10, callback=lambda _: channel.basic_consume(
            "select-q", on_message, callback=lambda _: publish()))

    def publish():
        channel = state["channel"]
        for i in range(total):
            channel.basic_publish("", "select-q", b"msg-%d" % i,
                                  pika.BasicProperties(message_id=str(i)))

    def on_message(channel, method, properties, body):
        state["received"].append((int(properties.message_id), body))
        channel.basic_ack(method.delivery_tag)
        maybe_done()

    def maybe_done():
        if len(state["acked"]) == total and len(state["received"]) == total and not state["closed"]:
            state["closed"] = True
            connection.close()

    connection = SelectConnection(pika.URLParameters(amqp_url), on_open_callback=on_open,
                                  on_open_error_callback=lambda c, e: c.ioloop.stop(),
                                  on_close_callback=lambda c, e: c.ioloop.stop())
    connection.ioloop.call_later(15, connection.ioloop.stop)  # safety net
    connection.ioloop.start()

    assert state["closed"], (f"stopped early: {len(state['acked'])} confirms, "
                             f"{len(state['received'])} deliveries")
    assert state["acked"] == set(range(1, total + 1))
    assert state["nacked"] == 0
    assert state["received"] == [(i, b"msg-%d" % i) for i in range(total)]


def test_select_connection_channel_flow(amqp_url):
    """channel.flow active=true is answered with flow-ok (RabbitMQ 3.x refuses
    active=false with 540, see test_channel_flow_false_is_not_implemented)."""
    result = {}

    def on_channel(channel):
        channel.flow(True, callback=lambda active: (result.update(active=active), connection.close()))

    connection = SelectConnection(pika.URLParameters(amqp_url),
                                  on_open_callback=lambda c: c.channel(on_open_callback=on_channel),
                                  on_close_callback=lambda c, e: c.ioloop.stop())
    connection.ioloop.call_later(10, connection.ioloop.stop)
    connection.ioloop.start()
    assert result == {"active": True}


def test_blocking_confirms_report_unroutable_mandatory_publish(channel):
    """basic.return precedes the basic.ack of an unroutable mandatory publish, so pika
    raises UnroutableError; a routable one is simply confirmed."""
    channel.confirm_delivery()
    channel.queue_declare("confirm-target")
    channel.basic_publish("", "confirm-target", b"ok", mandatory=True)
    with pytest.raises(pika.exceptions.UnroutableError) as info:
        channel.basic_publish("", "no-such-queue", b"lost", mandatory=True)
    assert [m.body for m in info.value.messages] == [b"lost"]
    channel.basic_publish("", "no-such-queue", b"dropped")  # not mandatory: just acked
    assert counts(channel, "confirm-target") == (1, 0)


# -- basic properties ------------------------------------------------------------------

def test_all_14_basic_properties_and_header_types_round_trip(channel):
    headers = {
        "str": "ünïcode", "bytes": b"\x00\xffraw", "int": 42, "negative": -7,
        "long": 2 ** 40, "bool": True, "false": False, "decimal": decimal.Decimal("3.25"),
        "timestamp": datetime.datetime(2020, 1, 2, 3, 4, 5, tzinfo=datetime.UTC), "void": None,
        "table": {"nested": {"deeper": [1, "a"]}}, "array": [1, "two", None, [3], {"k": b"v"}],
    }
    sent = pika.BasicProperties(
        content_type="text/plain", content_encoding="utf-8", headers=headers, delivery_mode=2,
        priority=5, correlation_id="corr", reply_to="replies", expiration="60000",
        message_id="mid", timestamp=1700000000, type="kind", user_id="guest", app_id="tests",
        cluster_id="cluster")
    channel.queue_declare("props14")
    channel.basic_publish("", "props14", b"body", sent)
    _method, got, body = channel.basic_get("props14", auto_ack=True)
    assert body == b"body"
    for name in ("content_type", "content_encoding", "delivery_mode", "priority",
                 "correlation_id", "reply_to", "expiration", "message_id", "timestamp",
                 "type", "user_id", "app_id", "cluster_id"):
        assert getattr(got, name) == getattr(sent, name), name
    assert got.headers == headers


# -- headers exchange ------------------------------------------------------------------

def headers_routes(channel, binding: dict, message_headers: dict | None) -> bool:
    """Whether a message with ``message_headers`` reaches a queue bound with ``binding``."""
    channel.exchange_declare("hx", "headers", auto_delete=False)
    queue = channel.queue_declare("", exclusive=True).method.queue
    channel.queue_bind(queue, "hx", arguments=binding)
    channel.basic_publish("hx", "", b"m", pika.BasicProperties(headers=message_headers))
    routed = bool(get_bodies(channel, queue))
    channel.queue_delete(queue)
    return routed


@pytest.mark.parametrize("binding,headers,expected", [
    ({"x-match": "all", "a": 1, "b": "x"}, {"a": 1, "b": "x", "c": 3}, True),
    ({"x-match": "all", "a": 1, "b": "x"}, {"a": 1}, False),
    ({"x-match": "all", "a": 1, "b": "x"}, {"a": 1, "b": "y"}, False),
    ({"a": 1, "b": "x"}, {"a": 1, "b": "x"}, True),  # x-match defaults to all
    ({"x-match": "any", "a": 1, "b": "x"}, {"b": "x"}, True),
    ({"x-match": "any", "a": 1, "b": "x"}, {"a": 2, "b": "y"}, False),
    ({"x-match": "any", "a": 1}, None, False),
    ({"x-match": "all"}, {"anything": 1}, True),  # all of nothing
    ({"x-match": "any"}, {"anything": 1}, False),  # any of nothing
    # x- arguments are ignored by all/any ...
    ({"x-match": "all", "x-tenant": "t1", "a": 1}, {"a": 1}, True),
    ({"x-match": "any", "x-tenant": "t1"}, {"x-tenant": "t1"}, False),
    # ... and compared by all-with-x/any-with-x.
    ({"x-match": "all-with-x", "x-tenant": "t1", "a": 1}, {"a": 1}, False),
    ({"x-match": "all-with-x", "x-tenant": "t1", "a": 1}, {"a": 1, "x-tenant": "t1"}, True),
    ({"x-match": "any-with-x", "x-tenant": "t1", "a": 1}, {"x-tenant": "t1"}, True),
    ({"x-match": "any-with-x", "x-tenant": "t1"}, {"x-tenant": "t2"}, False),
    # A void binding value matches the key's presence, whatever its value.
    ({"x-match": "all", "present": None}, {"present": "anything"}, True),
    ({"x-match": "all", "present": None}, {"present": None}, True),
    ({"x-match": "all", "present": None}, {"other": 1}, False),
    ({"x-match": "any", "present": None, "a": 1}, {"present": 0}, True),
    # Values compare by value: the integer 1 is not the boolean true.
    ({"x-match": "all", "flag": True}, {"flag": True}, True),
    ({"x-match": "all", "flag": True}, {"flag": 1}, False),
])
def test_headers_exchange_matching(channel, binding, headers, expected):
    assert headers_routes(channel, binding, headers) is expected


def test_headers_binding_is_identified_by_its_arguments(channel):
    channel.exchange_declare("hx-unbind", "headers")
    queue = channel.queue_declare("", exclusive=True).method.queue
    channel.queue_bind(queue, "hx-unbind", arguments={"a": 1})
    channel.queue_bind(queue, "hx-unbind", arguments={"b": 2})
    channel.queue_unbind(queue, "hx-unbind", arguments={"a": 1})
    channel.basic_publish("hx-unbind", "", b"a", pika.BasicProperties(headers={"a": 1}))
    channel.basic_publish("hx-unbind", "", b"b", pika.BasicProperties(headers={"b": 2}))
    assert get_bodies(channel, queue) == [b"b"]


# -- exchange-to-exchange, alternate, internal, auto-delete -----------------------------

def test_exchange_to_exchange_bindings(channel):
    channel.exchange_declare("e2e-src", "topic")
    channel.exchange_declare("e2e-mid", "direct")
    channel.exchange_bind("e2e-mid", "e2e-src", "orders.#")
    queue = channel.queue_declare("", exclusive=True).method.queue
    channel.queue_bind(queue, "e2e-mid", "orders.eu")
    for key in ("orders.eu", "orders.us", "invoices.eu"):
        channel.basic_publish("e2e-src", key, key.encode())
    assert get_bodies(channel, queue) == [b"orders.eu"]
    channel.exchange_unbind("e2e-mid", "e2e-src", "orders.#")
    channel.basic_publish("e2e-src", "orders.eu", b"after unbind")
    assert get_bodies(channel, queue) == []


def test_exchange_binding_cycle_delivers_once(channel):
    channel.exchange_declare("ring-a", "fanout")
    channel.exchange_declare("ring-b", "fanout")
    channel.exchange_bind("ring-b", "ring-a")
    channel.exchange_bind("ring-a", "ring-b")
    qa = channel.queue_declare("", exclusive=True).method.queue
    qb = channel.queue_declare("", exclusive=True).method.queue
    channel.queue_bind(qa, "ring-a")
    channel.queue_bind(qb, "ring-b")
    channel.basic_publish("ring-a", "", b"round")
    channel.basic_publish("ring-b", "", b"trip")
    assert get_bodies(channel, qa) == [b"round", b"trip"]
    assert get_bodies(channel, qb) == [b"round", b"trip"]


def test_queue_reached_twice_gets_one_copy(channel):
    channel.exchange_declare("twice-src", "fanout")
    channel.exchange_declare("twice-mid", "fanout")
    channel.exchange_bind("twice-mid", "twice-src")
    queue = channel.queue_declare("", exclusive=True).method.queue
    channel.queue_bind(queue, "twice-src")
    channel.queue_bind(queue, "twice-mid")
    channel.basic_publish("twice-src", "", b"once")
    assert get_bodies(channel, queue) == [b"once"]


def test_alternate_exchange_receives_unroutable(channel):
    returned = []
    channel.add_on_return_callback(lambda ch, method, props, body: returned.append(body))
    channel.exchange_declare("unrouted", "fanout")
    channel.exchange_declare("main-x", "direct", arguments={"alternate-exchange": "unrouted"})
    q_main = channel.queue_declare("", exclusive=True).method.queue
    q_alt = channel.queue_declare("", exclusive=True).method.queue
    channel.queue_bind(q_main, "main-x", "known")
    channel.queue_bind(q_alt, "unrouted")
    channel.basic_publish("main-x", "known", b"routed")
    channel.basic_publish("main-x", "unknown", b"to-ae", mandatory=True)
    channel.connection.process_data_events(time_limit=0.1)
    assert get_bodies(channel, q_main) == [b"routed"]
    assert get_bodies(channel, q_alt) == [b"to-ae"]
    assert returned == []  # delivered through the AE, so not returned


def test_missing_alternate_exchange_returns_mandatory(channel):
    returned = []
    channel.add_on_return_callback(lambda ch, method, props, body: returned.append(method.reply_code))
    channel.exchange_declare("dangling-ae", "direct", arguments={"alternate-exchange": "nowhere"})
    channel.basic_publish("dangling-ae", "x", b"lost", mandatory=True)
    channel.connection.process_data_events(time_limit=0.2)
    assert returned == [312]


def test_internal_exchange_refuses_publish_but_routes_from_exchanges(connection):
    channel = connection.channel()
    channel.exchange_declare("public-x", "fanout")
    channel.exchange_declare("internal-x", "fanout", internal=True)
    channel.exchange_bind("internal-x", "public-x")
    queue = channel.queue_declare("", exclusive=True).method.queue
    channel.queue_bind(queue, "internal-x")
    channel.basic_publish("public-x", "", b"via public")
    assert get_bodies(channel, queue) == [b"via public"]

    other = connection.channel()
    other.basic_publish("internal-x", "", b"direct")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        other.basic_get(queue)  # the 403 arrives before this round trip completes
    assert info.value.reply_code == 403
    assert "internal" in info.value.reply_text


def test_auto_delete_exchange_removed_with_last_binding(connection):
    channel = connection.channel()
    channel.exchange_declare("ephemeral-x", "direct", auto_delete=True)
    q1 = channel.queue_declare("", exclusive=True).method.queue
    q2 = channel.queue_declare("", exclusive=True).method.queue
    channel.queue_bind(q1, "ephemeral-x", "k")
    channel.queue_bind(q2, "ephemeral-x", "k")
    channel.queue_unbind(q1, "ephemeral-x", "k")
    assert exchange_exists(connection.channel, "ephemeral-x")
    channel.queue_delete(q2)  # deleting the queue drops the last binding
    assert not exchange_exists(connection.channel, "ephemeral-x")


def test_auto_delete_exchange_survives_without_ever_having_bindings(connection):
    channel = connection.channel()
    channel.exchange_declare("never-bound", "fanout", auto_delete=True)
    assert exchange_exists(connection.channel, "never-bound")


def test_exchange_delete_if_unused(connection):
    channel = connection.channel()
    channel.exchange_declare("in-use", "fanout")
    queue = channel.queue_declare("", exclusive=True).method.queue
    channel.queue_bind(queue, "in-use")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        channel.exchange_delete("in-use", if_unused=True)
    assert info.value.reply_code == 406
    channel = connection.channel()
    channel.exchange_delete("in-use")
    assert not exchange_exists(connection.channel, "in-use")


# -- queue lifetimes and counts ------------------------------------------------------

def test_exclusive_queue_removed_when_connection_closes(amqp_url, connection):
    owner = connect(amqp_url)
    owner.channel().queue_declare("mine", exclusive=True)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        connection.channel().queue_declare("mine", passive=True)
    assert info.value.reply_code == 405  # locked to its owner
    owner.close()
    assert eventually(lambda: not queue_exists(connection.channel, "mine"))


def test_auto_delete_queue_removed_when_last_consumer_cancels(channel, connection):
    channel.queue_declare("fleeting", auto_delete=True)
    tag1 = channel.basic_consume("fleeting", lambda *a: None)
    tag2 = channel.basic_consume("fleeting", lambda *a: None)
    channel.basic_cancel(tag1)
    assert counts(channel, "fleeting") == (0, 1)
    channel.basic_cancel(tag2)
    assert not queue_exists(connection.channel, "fleeting")


def test_auto_delete_queue_removed_when_consumer_channel_closes(connection):
    channel = connection.channel()
    channel.queue_declare("fleeting-2", auto_delete=True)
    channel.basic_consume("fleeting-2", lambda *a: None)
    channel.close()
    assert not queue_exists(connection.channel, "fleeting-2")


def test_cancelled_consumer_keeps_its_unacked_messages(channel):
    """basic.cancel does not requeue: the deliveries stay unacked and ackable."""
    channel.queue_declare("cancel-keeps")
    publish_all(channel, "cancel-keeps", ["a", "b"])
    recorder = Recorder()
    tag = channel.basic_consume("cancel-keeps", recorder)
    assert eventually(lambda: len(recorder.deliveries) == 2, wait=pumping(channel.connection))
    channel.basic_cancel(tag)
    assert counts(channel, "cancel-keeps") == (0, 0)
    channel.basic_ack(recorder.deliveries[0][0])
    channel.basic_nack(recorder.deliveries[1][0], requeue=True)
    assert get_bodies(channel, "cancel-keeps") == [b"b"]


def test_auto_delete_queue_without_consumers_is_kept(channel, connection):
    channel.queue_declare("never-consumed", auto_delete=True)
    channel.basic_publish("", "never-consumed", b"x")
    assert queue_exists(connection.channel, "never-consumed")


def test_declare_ok_counts_ready_messages_and_consumers(channel, amqp_url):
    channel.queue_declare("counted")
    publish_all(channel, "counted", ["a", "b", "c"])
    ok = channel.queue_declare("counted").method
    assert (ok.queue, ok.message_count, ok.consumer_count) == ("counted", 3, 0)

    other = connect(amqp_url)
    consumer = other.channel()
    consumer.basic_qos(prefetch_count=1)
    consumer.basic_consume("counted", lambda *a: None)
    other.process_data_events(time_limit=0.1)
    # One delivered and unacked: not counted as ready.
    assert counts(channel, "counted") == (2, 1)
    other.close()
    # Closing requeues the unacked message and removes the consumer.
    assert counts(channel, "counted") == (3, 0)


def test_purge_returns_count(channel):
    channel.queue_declare("purgeable")
    publish_all(channel, "purgeable", ["1", "2", "3", "4"])
    assert channel.queue_purge("purgeable").method.message_count == 4
    assert channel.queue_purge("purgeable").method.message_count == 0
    assert counts(channel, "purgeable") == (0, 0)


def test_delete_returns_count_and_honours_if_empty_if_unused(connection):
    channel = connection.channel()
    channel.queue_declare("deletable")
    publish_all(channel, "deletable", ["1", "2"])
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        channel.queue_delete("deletable", if_empty=True)
    assert info.value.reply_code == 406
    channel = connection.channel()
    channel.basic_consume("deletable", lambda *a: None, auto_ack=False)
    other = connection.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        other.queue_delete("deletable", if_unused=True)
    assert info.value.reply_code == 406
    channel.close()  # the consumer goes, its unacked messages are requeued
    channel = connection.channel()
    assert channel.queue_delete("deletable").method.message_count == 2
    assert not queue_exists(connection.channel, "deletable")
    # Deleting a queue that does not exist is not an error.
    assert channel.queue_delete("deletable").method.message_count == 0


def test_basic_get_reports_remaining_message_count(channel):
    channel.queue_declare("gettable")
    publish_all(channel, "gettable", ["a", "b", "c"])
    seen = []
    for _ in range(3):
        method, _props, body = channel.basic_get("gettable")
        seen.append((body, method.message_count, method.redelivered))
        channel.basic_ack(method.delivery_tag)
    assert seen == [(b"a", 2, False), (b"b", 1, False), (b"c", 0, False)]
    assert channel.basic_get("gettable") == (None, None, None)


# -- transactions ---------------------------------------------------------------------

def test_tx_commit_and_rollback_of_publishes(channel):
    channel.queue_declare("tx-pub")
    channel.tx_select()
    channel.basic_publish("", "tx-pub", b"first")
    assert counts(channel, "tx-pub") == (0, 0)  # not before commit
    channel.tx_commit()
    assert counts(channel, "tx-pub") == (1, 0)
    channel.basic_publish("", "tx-pub", b"discarded")
    channel.tx_rollback()
    channel.basic_publish("", "tx-pub", b"second")
    channel.tx_commit()
    assert get_bodies(channel, "tx-pub") == [b"first", b"second"]


def test_tx_commit_and_rollback_of_acks(connection):
    channel = connection.channel()
    channel.queue_declare("tx-ack")
    publish_all(channel, "tx-ack", ["a", "b"])
    channel.tx_select()
    first, _, _ = channel.basic_get("tx-ack")
    second, _, _ = channel.basic_get("tx-ack")
    channel.basic_ack(first.delivery_tag)
    channel.basic_ack(second.delivery_tag)
    channel.tx_rollback()  # both acks undone: the messages are still unacked
    channel.basic_ack(first.delivery_tag)
    channel.tx_commit()
    channel.close()  # the second, never committed, returns to the queue
    probe = connection.channel()
    method, _props, body = probe.basic_get("tx-ack", auto_ack=True)
    assert (body, method.redelivered, method.message_count) == (b"b", True, 0)


def test_tx_and_confirm_modes_are_exclusive(connection):
    channel = connection.channel()
    channel.tx_select()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        channel.confirm_delivery()
    assert info.value.reply_code == 406


# -- nack, reject, recover ------------------------------------------------------------

def take(channel, queue: str, n: int) -> list:
    """``n`` deliveries by basic.get, unacknowledged: (method, body) pairs."""
    taken = []
    for _ in range(n):
        method, _props, body = channel.basic_get(queue)
        assert method is not None
        taken.append((method, body))
    return taken


def test_nack_and_reject_with_requeue_restore_original_order(channel):
    channel.queue_declare("requeue")
    publish_all(channel, "requeue", ["m0", "m1", "m2", "m3", "m4"])
    (m0, _), (m1, _), (m2, _) = take(channel, "requeue", 3)
    channel.basic_reject(m1.delivery_tag, requeue=True)
    channel.basic_nack(m0.delivery_tag, requeue=True)
    channel.basic_ack(m2.delivery_tag)
    again = []
    while True:
        method, _props, body = channel.basic_get("requeue", auto_ack=True)
        if method is None:
            break
        again.append((body, method.redelivered))
    assert again == [(b"m0", True), (b"m1", True), (b"m3", False), (b"m4", False)]


def test_nack_multiple_requeues_all_up_to_tag(channel):
    channel.queue_declare("nack-multi")
    publish_all(channel, "nack-multi", ["a", "b", "c"])
    taken = take(channel, "nack-multi", 3)
    channel.basic_nack(taken[1][0].delivery_tag, multiple=True, requeue=True)
    channel.basic_ack(taken[2][0].delivery_tag)
    assert get_bodies(channel, "nack-multi") == [b"a", b"b"]


def test_consumer_sees_requeued_messages_redelivered_in_order(channel):
    channel.queue_declare("consume-requeue")
    publish_all(channel, "consume-requeue", ["x", "y", "z"])
    first_round = []
    for method, _props, body in channel.consume("consume-requeue", inactivity_timeout=2):
        first_round.append((method.delivery_tag, body))
        if len(first_round) == 3:
            break
    channel.basic_nack(first_round[-1][0], multiple=True, requeue=True)
    second_round = []
    for method, _props, body in channel.consume("consume-requeue", inactivity_timeout=2):
        assert method is not None
        second_round.append((body, method.redelivered))
        channel.basic_ack(method.delivery_tag)
        if len(second_round) == 3:
            break
    channel.cancel()
    assert second_round == [(b"x", True), (b"y", True), (b"z", True)]


def test_nack_and_reject_without_requeue_drop_messages(channel):
    channel.queue_declare("dropped")
    publish_all(channel, "dropped", ["a", "b", "c"])
    (a, _), (_b, _), (c, _) = take(channel, "dropped", 3)
    channel.basic_reject(a.delivery_tag, requeue=False)
    channel.basic_nack(c.delivery_tag, multiple=True, requeue=False)
    assert counts(channel, "dropped") == (0, 0)
    channel.close()
    probe = channel.connection.channel()
    assert counts(probe, "dropped") == (0, 0)


def test_unknown_delivery_tag_is_precondition_failed(connection):
    channel = connection.channel()
    channel.basic_ack(999)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        channel.queue_declare("after-bad-ack")
    assert info.value.reply_code == 406


def test_basic_recover_redelivers_unacked(channel):
    channel.queue_declare("recover")
    publish_all(channel, "recover", ["r1", "r2"])
    deliveries = []
    channel.basic_consume("recover",
                          lambda ch, m, p, b: deliveries.append((b, m.redelivered, m.delivery_tag)))
    assert eventually(lambda: len(deliveries) == 2, wait=pumping(channel.connection))
    channel.basic_recover(requeue=True)
    assert eventually(lambda: len(deliveries) == 4, wait=pumping(channel.connection))
    assert [(b, r) for b, r, _ in deliveries] == [
        (b"r1", False), (b"r2", False), (b"r1", True), (b"r2", True)]
    # Fresh delivery tags for the redeliveries; the old ones are gone.
    assert [t for _, _, t in deliveries] == [1, 2, 3, 4]
    channel.basic_ack(4, multiple=True)


# -- consumer cancel notification --------------------------------------------------------

def test_queue_deletion_cancels_consumer_with_notification(connection):
    channel = connection.channel()
    channel.queue_declare("cancelled")
    cancels = []
    channel.add_on_cancel_callback(lambda frame: cancels.append(frame.method))
    tag = channel.basic_consume("cancelled", lambda *a: None)
    connection.channel().queue_delete("cancelled")
    assert eventually(lambda: cancels, wait=pumping(connection))
    assert isinstance(cancels[0], Basic.Cancel)
    assert cancels[0].consumer_tag == tag
    assert tag not in channel.consumer_tags
    assert channel.is_open


# -- prefetch ----------------------------------------------------------------------------

class Recorder:
    """A consumer callback that records and never acks."""

    def __init__(self) -> None:
        self.deliveries = []

    def __call__(self, channel, method, properties, body) -> None:
        self.deliveries.append((method.delivery_tag, body))


def settle(connection, seconds: float = 0.3) -> None:
    connection.process_data_events(time_limit=seconds)


def fill(channel, queue: str, n: int) -> None:
    channel.queue_declare(queue)
    publish_all(channel, queue, [f"{queue}-{i}" for i in range(n)])


def test_per_consumer_prefetch_limits_each_consumer(connection):
    channel = connection.channel()
    fill(channel, "pc-a", 5)
    fill(channel, "pc-b", 5)
    channel.basic_qos(prefetch_count=2)  # global=False: each new consumer gets 2
    a, b = Recorder(), Recorder()
    channel.basic_consume("pc-a", a)
    channel.basic_consume("pc-b", b)
    settle(connection)
    assert (len(a.deliveries), len(b.deliveries)) == (2, 2)
    channel.basic_ack(a.deliveries[0][0])
    settle(connection)
    assert (len(a.deliveries), len(b.deliveries)) == (3, 2)


def test_per_consumer_prefetch_applies_only_to_later_consumers(connection):
    channel = connection.channel()
    fill(channel, "pc-early", 5)
    fill(channel, "pc-late", 5)
    early = Recorder()
    channel.basic_consume("pc-early", early)  # before basic.qos: unlimited
    channel.basic_qos(prefetch_count=1)
    late = Recorder()
    channel.basic_consume("pc-late", late)
    settle(connection)
    assert (len(early.deliveries), len(late.deliveries)) == (5, 1)


def test_global_prefetch_limits_the_whole_channel(connection):
    channel = connection.channel()
    fill(channel, "g-a", 5)
    fill(channel, "g-b", 5)
    channel.basic_qos(prefetch_count=3, global_qos=True)
    a, b = Recorder(), Recorder()
    channel.basic_consume("g-a", a)
    channel.basic_consume("g-b", b)
    settle(connection)
    assert len(a.deliveries) + len(b.deliveries) == 3
    channel.basic_ack(a.deliveries[0][0])
    settle(connection)
    assert len(a.deliveries) + len(b.deliveries) == 4


def test_global_and_per_consumer_prefetch_combine(connection):
    channel = connection.channel()
    fill(channel, "gc-a", 5)
    fill(channel, "gc-b", 5)
    channel.basic_qos(prefetch_count=3, global_qos=True)
    channel.basic_qos(prefetch_count=1)
    a, b = Recorder(), Recorder()
    channel.basic_consume("gc-a", a)
    channel.basic_consume("gc-b", b)
    settle(connection)
    # Each consumer is held at 1 even though the channel allows 3.
    assert (len(a.deliveries), len(b.deliveries)) == (1, 1)


def test_prefetch_size_is_not_implemented(amqp_url):
    conn = connect(amqp_url)
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        conn.channel().basic_qos(prefetch_size=1024)
    assert info.value.reply_code == 540


def test_channel_flow_false_is_not_implemented(amqp_url):
    """RabbitMQ 3.x answers a client's channel.flow active=false with connection.close
    540 NOT_IMPLEMENTED (it throttles publishers with connection.blocked instead)."""
    conn = connect(amqp_url)
    channel = conn.channel()
    assert channel.flow(True) is True
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        channel.flow(False)
    assert info.value.reply_code == 540


# -- many connections and channels -------------------------------------------------------

def test_many_connections_and_channels_share_one_queue(amqp_url):
    n_connections, n_channels, per_consumer = 20, 5, 10
    consumers = []
    connections = [connect(amqp_url) for _ in range(n_connections)]
    try:
        connections[0].channel().queue_declare("shared")
        for conn in connections:
            for _ in range(n_channels):
                channel = conn.channel()
                recorder = Recorder()
                channel.basic_consume("shared", recorder, auto_ack=True)
                consumers.append(recorder)
        publisher = connections[0].channel()
        publisher.confirm_delivery()
        total = n_connections * n_channels * per_consumer
        for i in range(total):
            publisher.basic_publish("", "shared", b"%d" % i)

        def received() -> int:
            for conn in connections:
                conn.process_data_events(time_limit=0)
            return sum(len(c.deliveries) for c in consumers)

        assert eventually(lambda: received() == total, timeout=15)
        bodies = sorted(int(body) for c in consumers for _, body in c.deliveries)
        assert bodies == list(range(total))
        # One queue, 100 consumers able to take more: strict round robin.
        assert {len(c.deliveries) for c in consumers} == {per_consumer}
    finally:
        for conn in connections:
            if conn.is_open:
                conn.close()
