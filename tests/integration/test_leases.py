"""Leased consumption over amq.leveret.api: acknowledgement by sequence number from any
connection, range re-reads, expiry back to the queue (see leveret.core.queues.features.leases)."""

from __future__ import annotations

import json
import time

import pika
import pytest
from eventually import eventually, pumping


class Api:
    """A tiny client of amq.leveret.api over direct reply-to."""

    def __init__(self, url: str) -> None:
        self.connection = pika.BlockingConnection(pika.URLParameters(url))
        self.channel = self.connection.channel()
        self._replies: list[dict] = []
        self.channel.basic_consume("amq.rabbitmq.reply-to",
                                   lambda c, m, p, b: self._replies.append(json.loads(b)),
                                   auto_ack=True)

    def __call__(self, operation: str, **request) -> dict:
        self.channel.basic_publish("amq.leveret.api", operation, json.dumps(request),
                                   pika.BasicProperties(reply_to="amq.rabbitmq.reply-to"))
        eventually(lambda: self._replies, 5, 0.05, pumping(self.connection))
        return self._replies.pop(0)

    def read(self, queue: str, group: str, start: int, end: int) -> list[tuple[int, bytes, bool]]:
        """A leased read on a fresh channel: (seq, body, redelivered) until the cancel."""
        ch = self.connection.channel()
        got = []
        for method, props, body in ch.consume(queue, auto_ack=True, inactivity_timeout=3, arguments={
                "x-lease-group": group, "x-lease-from": start, "x-lease-to": end}):
            if method is None:
                break
            got.append((props.headers["x-lease-seq"], body, method.redelivered))
        ch.close()
        return got


@pytest.fixture
def api(amqp_url):
    client = Api(amqp_url)
    yield client
    client.connection.close()


def fill(channel, queue: str, n: int, arguments: dict | None = None) -> None:
    channel.queue_declare(queue, arguments=arguments)
    for i in range(n):
        channel.basic_publish("", queue, b"m%d" % i)


def test_acquire_read_from_another_connection_and_ack(api, channel, amqp_url):
    fill(channel, "work", 10)
    assert api("lease.acquire", queue="work", group="g", max=4) == {"ok": True, "start": 1, "end": 5}
    assert channel.queue_declare("work", passive=True).method.message_count == 6

    other = Api(amqp_url)  # a different process would do the same
    rows = other.read("work", "g", 1, 5)
    assert [(s, b) for s, b, _ in rows] == [(1, b"m0"), (2, b"m1"), (3, b"m2"), (4, b"m3")]
    assert other.read("work", "g", 2, 4) == rows[1:3]  # re-readable, deterministic
    other.connection.close()

    assert api("lease.ack", queue="work", group="g", upto=2) == {"ok": True, "acked": 2}
    assert api("lease.info", queue="work", group="g") == {"ok": True, "next": 5, "held": 2}
    assert api("lease.acquire", queue="work", group="g", max=100)["end"] == 11
    assert api("lease.ack", queue="work", group="g", seqs=[3, 4, 9]) == {"ok": True, "acked": 3}
    # a range with a lower bound leaves the leases below it held
    assert api("lease.ack", queue="work", group="g", upto=8, **{"from": 7}) == \
        {"ok": True, "acked": 2}
    assert api("lease.info", queue="work", group="g") == {"ok": True, "next": 11, "held": 3}


def test_release_and_expiry_return_messages_redelivered(api, channel):
    fill(channel, "slow", 3, {"x-max-redeliveries": 1, "x-dead-letter-strategy": "individual",
                              "x-dead-letter-non-persistent": True})
    assert api("lease.acquire", queue="slow", group="g", max=3, ttl_ms=300)["end"] == 4
    assert api("lease.release", queue="slow", group="g", seqs=[1]) == {"ok": True, "released": 1}
    method, props, body = channel.basic_get("slow", auto_ack=True)
    # a release counts as a failed delivery unless it says otherwise; so does an expiry
    assert (body, method.redelivered, props.headers["x-delivery-count"]) == (b"m0", True, 1)
    assert props.headers["x-acquired-count"] == 1

    time.sleep(0.6)  # the other two expire: back in the queue, redelivered
    api("lease.info", queue="slow", group="g")
    assert channel.queue_declare("slow", passive=True).method.message_count == 2
    # leased again and left to expire: past x-max-redeliveries they are poison messages
    assert api("lease.acquire", queue="slow", group="g", max=5, ttl_ms=200) == {"ok": True, "start": 4,
                                                                              "end": 6}
    time.sleep(0.5)
    api("lease.info", queue="slow", group="g")
    assert channel.queue_declare("DLQ.slow", passive=True).method.message_count == 2


def test_a_release_that_is_no_failure_is_not_counted(api, channel):
    fill(channel, "kind", 1, {"x-max-redeliveries": 0, "x-dead-letter-strategy": "individual"})
    for _ in range(3):  # returns: never the limit's business (RabbitMQ 4.3's acquired count)
        start = api("lease.acquire", queue="kind", group="g", max=1)["start"]
        assert api("lease.release", queue="kind", group="g", seqs=[start], failed=False)["released"] == 1
    _, props, body = channel.basic_get("kind", auto_ack=True)
    assert (body, props.headers["x-delivery-count"], props.headers["x-acquired-count"]) == (b"m0", 0, 3)
    assert api("lease.release", queue="kind", group="g", seqs=[9], failed="no") == {
        "ok": False, "error": "'failed' must be a boolean"}


@pytest.mark.parametrize("operation,request_,error", [
    ("lease.acquire", {"queue": "nope", "group": "g", "max": 1}, "NOT_FOUND"),
    ("lease.acquire", {"queue": "work2", "group": "g"}, "'max' must be an integer"),
    ("lease.launch", {}, "unknown operation"),
    ("lease.ack", {"queue": "work2", "group": "g", "upto": 3, "from": "1"},
     "'from' must be an integer"),
    ("stream.info", {"stream": "work2"}, "not a stream"),
])
def test_bad_requests_get_an_error_reply(api, channel, operation, request_, error):
    channel.queue_declare("work2")
    reply = api(operation, **request_)
    assert reply["ok"] is False and error in reply["error"]


def test_a_bug_in_an_operation_closes_only_that_connection_with_541(amqp_url, monkeypatch, caplog):
    """A programming error is not answered as a bad request: the server logs it and
    closes the requesting connection with 541 INTERNAL_ERROR; others keep working."""
    from leveret.core import api as core_api

    def broken(session, request):
        raise AttributeError("'Lease' object has no attribute 'helt'")

    monkeypatch.setitem(core_api.OPERATIONS, "lease.info", broken)
    client, other = Api(amqp_url), Api(amqp_url)
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        client("lease.info", queue="work", group="g")
    assert info.value.reply_code == 541
    assert any(r.name == "leveret.server" and r.exc_info and r.exc_info[0] is AttributeError
               for r in caplog.records), "the bug was not logged with its traceback"
    assert other("lease.launch")["ok"] is False  # another connection is unaffected
    other.connection.close()


def test_leased_read_needs_no_ack(api, channel):
    fill(channel, "strict", 1)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        channel.basic_consume("strict", lambda *a: None, arguments={
            "x-lease-group": "g", "x-lease-from": 1, "x-lease-to": 2})
    assert info.value.reply_code == 406


@pytest.mark.parametrize("bounds", [(True, 2), (1, False), ("1", 2)])
def test_leased_read_bounds_must_be_integers(api, channel, bounds):
    fill(channel, "bounded", 1)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        channel.basic_consume("bounded", lambda *a: None, auto_ack=True, arguments={
            "x-lease-group": "g", "x-lease-from": bounds[0], "x-lease-to": bounds[1]})
    assert info.value.reply_code == 406 and "integers" in info.value.reply_text
