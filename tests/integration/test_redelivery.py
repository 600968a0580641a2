"""ActiveMQ's redelivery policy and dead-letter strategies over AMQP, end to end.

Real clients (pika's BlockingConnection, aio-pika) over TCP against a real broker, in
real time: back-off delays of 100-400 ms are checked with a tolerance. Covers every way
a message comes back (nack/reject with requeue, channel or connection closed with it
unacked, basic.recover), ``x-delivery-count``, poison messages, the shared / individual
/ discard strategies, ``x-dead-letter-expired`` and ``x-dead-letter-non-persistent``,
advisories on ``amq.leveret.event``, 406 for bad arguments, policies, and a restart of
a ``leveret server`` subprocess with the delivery count kept.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import aio_pika
import pika
import pytest
from eventually import eventually, poll
from pika.exceptions import ChannelClosedByBroker
from servers import ServerProcess

import leveret
from leveret.core.policy import Policy
from leveret.server.broker import BlockingBroker

PERSISTENT = pika.BasicProperties(delivery_mode=2)
TRANSIENT = pika.BasicProperties(delivery_mode=1)
EARLY = 0.015  # a redelivery may not come more than this before its delay (s)
LATE = 0.2  # nor more than this after it


# -- helpers ---------------------------------------------------------------------------
def args(**kw) -> dict:
    return {"x-" + k.replace("_", "-"): v for k, v in kw.items()}


def publish(ch, queue: str, body: str, props=PERSISTENT) -> None:
    ch.basic_publish("", queue, body.encode(), props)


class Recorder:
    """A pika consumer that records (time, body, x-delivery-count, redelivered, tag)."""

    def __init__(self, conn: pika.BlockingConnection, ch, queue: str, prefetch: int = 0) -> None:
        self.conn, self.ch = conn, ch
        self.log: list[dict] = []
        if prefetch:
            ch.basic_qos(prefetch_count=prefetch)
        self.tag = ch.basic_consume(queue, self._on_message)

    def _on_message(self, ch, method, props, body) -> None:
        self.log.append({"time": time.monotonic(), "body": body.decode(),
                         "count": (props.headers or {}).get("x-delivery-count"),
                         "redelivered": method.redelivered, "tag": method.delivery_tag,
                         "headers": props.headers or {}})

    def wait(self, n: int, timeout: float = 3.0) -> dict:
        """Until ``n`` deliveries are recorded; returns the n-th."""
        deadline = time.monotonic() + timeout
        while len(self.log) < n:
            left = deadline - time.monotonic()
            assert left > 0, f"only {len(self.log)} of {n} deliveries: {self.log}"
            self.conn.process_data_events(time_limit=min(left, 0.02))
        return self.log[n - 1]

    def quiet(self, seconds: float) -> None:
        """Process events for ``seconds``."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            self.conn.process_data_events(time_limit=min(left, 0.02))

    def reject(self, entry: dict, requeue: bool = True) -> float:
        self.ch.basic_reject(entry["tag"], requeue=requeue)
        return time.monotonic()

    def recover(self) -> float:
        """basic.recover: every unacked delivery of the channel returns (not a failure)."""
        self.ch.basic_recover(requeue=True)
        return time.monotonic()


def assert_delay(returned_at: float, delivered_at: float, expected_ms: float) -> None:
    waited = delivered_at - returned_at
    assert expected_ms / 1000 - EARLY <= waited <= expected_ms / 1000 + LATE, \
        f"waited {waited * 1000:.0f} ms, expected {expected_ms} ms"


def get(ch, queue: str, timeout: float = 3.0):
    """basic.get until a message comes (or None after ``timeout``)."""

    def message():
        got = ch.basic_get(queue)
        return got if got[0] is not None else None

    return eventually(message, timeout, 0.01) or (None, None, None)


def depth(conn: pika.BlockingConnection, queue: str) -> int | None:
    """Ready messages (None if the queue does not exist), on a throwaway channel."""
    ch = conn.channel()
    try:
        return ch.queue_declare(queue, passive=True).method.message_count
    except ChannelClosedByBroker as exc:
        assert exc.reply_code == 404
        return None
    finally:
        if ch.is_open:
            ch.close()


def bind_events(ch) -> str:
    queue = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(queue, "amq.leveret.event", "message.dead_lettered")
    return queue


def text(value):
    return value.decode() if isinstance(value, bytes) else value


@pytest.fixture
def broker():
    with BlockingBroker(amqp_port=0) as b:
        yield b


@pytest.fixture
def conn(broker):
    c = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
    yield c
    if c.is_open:
        c.close()


@pytest.fixture
def ch(conn):
    return conn.channel()


# -- back-off -----------------------------------------------------------------------------
def test_exponential_backoff_with_reject_and_delivery_count(conn, ch):
    ch.queue_declare("backoff", arguments=args(
        max_redeliveries=5, redelivery_delay=100, redelivery_exponential=True,
        redelivery_backoff_multiplier=2, redelivery_max_delay=300))
    publish(ch, "backoff", "m")
    rec = Recorder(conn, ch, "backoff")
    first = rec.wait(1)
    assert first["count"] == 0 and not first["redelivered"]
    for n, expected in enumerate((100, 200, 300, 300), start=2):
        returned = rec.reject(rec.log[-1])
        entry = rec.wait(n)
        assert_delay(returned, entry["time"], expected)
        assert entry["count"] == n - 1 and entry["redelivered"]
    ch.basic_ack(rec.log[-1]["tag"])


def test_constant_delay_with_reject(conn, ch):
    ch.queue_declare("constant", arguments=args(redelivery_delay=250))
    publish(ch, "constant", "m")
    rec = Recorder(conn, ch, "constant")
    rec.wait(1)
    for n in (2, 3):
        returned = rec.reject(rec.log[-1])
        assert_delay(returned, rec.wait(n)["time"], 250)
    assert [e["count"] for e in rec.log] == [0, 1, 2]


def test_delayed_message_does_not_hold_up_the_ones_behind(conn, ch):
    ch.queue_declare("fifo", arguments=args(redelivery_delay=400))
    for body in "ABC":
        publish(ch, "fifo", body)
    rec = Recorder(conn, ch, "fifo", prefetch=1)
    a = rec.wait(1)
    assert a["body"] == "A"
    returned = rec.reject(a)
    b = rec.wait(2)
    assert b["body"] == "B" and b["time"] - returned < 0.2
    ch.basic_ack(b["tag"])
    c = rec.wait(3)
    assert c["body"] == "C" and c["time"] - returned < 0.3
    assert depth(conn, "fifo") == 1  # A, waiting, is counted
    ch.basic_ack(c["tag"])
    a2 = rec.wait(4)
    assert a2["body"] == "A" and a2["count"] == 1 and a2["redelivered"]
    assert_delay(returned, a2["time"], 400)
    ch.basic_ack(a2["tag"])


def test_short_delay_not_held_up_by_a_longer_one(conn, ch):
    """The redelivery timer follows the earliest due message: B's 100 ms wait is not
    stretched to A's 400 ms."""
    ch.queue_declare("mixed", arguments=args(
        redelivery_delay=100, redelivery_exponential=True, redelivery_backoff_multiplier=4))
    publish(ch, "mixed", "A")
    rec = Recorder(conn, ch, "mixed")
    rec.reject(rec.wait(1))
    a_returned = rec.reject(rec.wait(2))  # A's 2nd redelivery: 400 ms
    publish(ch, "mixed", "B")
    b_returned = rec.reject(rec.wait(3))  # B's 1st: 100 ms
    b = rec.wait(4)
    assert b["body"] == "B" and b["count"] == 1
    assert_delay(b_returned, b["time"], 100)
    a = rec.wait(5)
    assert a["body"] == "A" and a["count"] == 2
    assert_delay(a_returned, a["time"], 400)
    ch.basic_ack(0, multiple=True)


def test_message_expiring_while_delayed_is_dead_lettered_not_delivered(conn, ch):
    ch.queue_declare("late", arguments=args(
        message_ttl=150, redelivery_delay=300, dead_letter_strategy="individual"))
    publish(ch, "late", "m")
    rec = Recorder(conn, ch, "late")
    rec.reject(rec.wait(1))
    rec.quiet(0.5)
    assert len(rec.log) == 1, rec.log
    assert depth(conn, "late") == 0
    _, props, body = get(ch, "DLQ.late")
    assert body == b"m" and text(props.headers["x-death"][0]["reason"]) == "expired"


def test_channel_close_returns_at_once_uncounted(conn, ch):
    """A closed channel's messages are returns, not failures (RabbitMQ 4.3's acquired
    count): no back-off, ``x-delivery-count`` stays 0, ``x-acquired-count`` counts it."""
    ch.queue_declare("closing", arguments=args(redelivery_delay=300, max_redeliveries=3))
    publish(ch, "closing", "m")
    other = conn.channel()
    rec = Recorder(conn, other, "closing")
    rec.wait(1)
    other.close()
    closed = time.monotonic()
    method, props, _ = get(ch, "closing")
    assert method is not None and method.redelivered
    assert time.monotonic() - closed < 0.2
    assert (props.headers["x-delivery-count"], props.headers["x-acquired-count"]) == (0, 1)
    ch.basic_ack(method.delivery_tag)


def test_connection_close_returns_at_once_uncounted(broker, conn, ch):
    ch.queue_declare("dropped", arguments=args(redelivery_delay=300))
    publish(ch, "dropped", "m")
    other_conn = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
    rec = Recorder(other_conn, other_conn.channel(), "dropped")
    rec.wait(1)
    other_conn.close()
    closed = time.monotonic()
    method, props, _ = get(ch, "dropped")
    assert time.monotonic() - closed < 0.2
    assert method.redelivered and props.headers["x-delivery-count"] == 0
    assert props.headers["x-acquired-count"] == 1


def test_basic_recover_returns_at_once_uncounted(conn, ch):
    ch.queue_declare("recovering", arguments=args(redelivery_delay=200))
    for body in "AB":
        publish(ch, "recovering", body)
    rec = Recorder(conn, ch, "recovering")
    rec.wait(2)
    ch.basic_recover(requeue=True)
    recovered = time.monotonic()
    rec.wait(3)
    fourth = rec.wait(4)
    assert fourth["time"] - recovered < 0.15
    assert [(e["body"], e["count"], e["redelivered"]) for e in rec.log] == [
        ("A", 0, False), ("B", 0, False), ("A", 0, True), ("B", 0, True)]
    ch.basic_ack(0, multiple=True)


def test_no_policy_headers_as_rabbitmq_4_3(conn, ch):
    """No header on a first delivery; ``basic.recover`` returns the message
    (``x-acquired-count``), ``basic.reject`` with requeue fails it (``x-delivery-count``
    too), as RabbitMQ 4.3 maps them; so does ``basic.nack`` with requeue in leveret
    (RabbitMQ 4.3 counts it as a return: a client nacking to retry would loop forever)."""
    ch.queue_declare("plain")
    publish(ch, "plain", "m")
    method, props, _ = get(ch, "plain")
    assert props.headers is None or not {"x-delivery-count", "x-acquired-count"} & set(props.headers)
    ch.basic_recover(requeue=True)
    method, props, _ = get(ch, "plain")
    assert method.redelivered and props.headers == {"x-acquired-count": 1}
    ch.basic_reject(method.delivery_tag, requeue=True)
    method, props, _ = get(ch, "plain")
    assert props.headers == {"x-delivery-count": 1, "x-acquired-count": 2}
    ch.basic_nack(method.delivery_tag, requeue=True)
    method, props, _ = get(ch, "plain")
    assert props.headers == {"x-delivery-count": 2, "x-acquired-count": 3}
    ch.basic_ack(method.delivery_tag)


def test_returns_never_reach_the_delivery_limit_failures_do(broker, conn, ch):
    """x-delivery-limit 1: recovers, cancels, channel and connection closes return the
    message as often as they like; the second failure (reject, then nack) dead-letters it."""
    ch.queue_declare("limited", arguments={"x-delivery-limit": 1, "x-dead-letter-strategy": "individual"})
    publish(ch, "limited", "m")
    for _ in range(2):
        get(ch, "limited")
        ch.basic_recover(requeue=True)
    other = conn.channel()  # a consumer cancelled with it unacked
    other.basic_qos(prefetch_count=1)
    got = []
    tag = other.basic_consume("limited", lambda c, m, p, b: got.append(m))
    eventually(lambda: conn.process_data_events(0.02) or got)
    other.basic_cancel(tag)
    other.close()  # ... whose channel then closes
    lost = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))  # a connection dropped
    method, _, _ = get(lost.channel(), "limited")
    assert method is not None
    lost.close()
    method, props, _ = get(ch, "limited")
    assert props.headers == {"x-delivery-count": 0, "x-acquired-count": 4}
    ch.basic_reject(method.delivery_tag, requeue=True)  # 1st failure: within the limit
    method, props, _ = get(ch, "limited")
    assert props.headers == {"x-delivery-count": 1, "x-acquired-count": 5}
    ch.basic_nack(method.delivery_tag, requeue=True)  # 2nd: poison
    assert depth(conn, "limited") == 0
    _, props, body = get(ch, "DLQ.limited")
    assert body == b"m" and text(props.headers["x-death"][0]["reason"]) == "delivery_limit"


def test_delayed_retry_arguments_back_off_failures(conn, ch):
    """RabbitMQ 4.3's ``x-delayed-retry-*``: type ``failed`` delays rejects by
    min x failures (capped at max), returns (basic.recover) come back at once."""
    ch.queue_declare("retrying", durable=True, arguments={
        "x-queue-type": "quorum", "x-delayed-retry-type": "failed",
        "x-delayed-retry-min": 100, "x-delayed-retry-max": 150})
    publish(ch, "retrying", "m")
    rec = Recorder(conn, ch, "retrying")
    rec.wait(1)
    for n, expected in ((2, 100), (3, 150)):
        returned = rec.reject(rec.log[-1])
        assert_delay(returned, rec.wait(n)["time"], expected)
    returned = rec.recover()
    assert rec.wait(4)["time"] - returned < 0.08
    ch.basic_ack(rec.log[-1]["tag"])


def test_delayed_retry_bad_argument_406(conn):
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as caught:
        ch.queue_declare("bad-retry", durable=True, arguments={
            "x-queue-type": "quorum", "x-delayed-retry-type": "failed"})
    assert caught.value.reply_code == 406
    assert caught.value.reply_text == (
        "PRECONDITION_FAILED - invalid arg 'x-delayed-retry-type' for queue 'bad-retry' in vhost '/': "
        "delayed-retry-min is required when delayed-retry-type is failed")


# -- poison messages and strategies ---------------------------------------------------
def test_poison_to_shared_dlq_with_advisory(conn, ch):
    events = bind_events(ch)
    ch.queue_declare("orders", arguments=args(
        max_redeliveries=2, redelivery_delay=100, dead_letter_strategy="shared"))
    ch.basic_publish("", "orders", b"poison", pika.BasicProperties(delivery_mode=2,
                                                                   message_id="msg-1"))
    rec = Recorder(conn, ch, "orders")
    rec.wait(1)
    for n in (2, 3):
        rec.reject(rec.log[-1])
        rec.wait(n)
    assert [e["count"] for e in rec.log] == [0, 1, 2]  # 1 + max_redeliveries deliveries
    assert depth(conn, "leveret.DLQ") is None  # created on demand
    rec.reject(rec.log[-1])  # the 3rd return: poison
    rec.quiet(0.3)
    assert len(rec.log) == 3
    method, props, body = get(ch, "leveret.DLQ")
    assert body == b"poison"
    death = props.headers["x-death"][0]
    assert text(death["reason"]) == "delivery_limit" and text(death["queue"]) == "orders"
    assert props.message_id == "msg-1"
    ch.basic_ack(method.delivery_tag)
    # the DLQ is durable: redeclaring it transient is inequivalent
    probe = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as err:
        probe.queue_declare("leveret.DLQ", durable=False)
    assert err.value.reply_code == 406
    method, props, body = get(ch, events)
    expected = {"vhost": "/", "queue": "orders", "reason": "delivery_limit",
                "target": "queue 'leveret.DLQ'", "message_id": "msg-1"}
    assert {k: text(v) for k, v in props.headers.items()} == expected
    assert json.loads(body) == expected
    assert method.routing_key == "message.dead_lettered" and method.exchange == "amq.leveret.event"


def test_delivery_limit_with_reject_to_individual_dlq(conn, ch):
    ch.queue_declare("jobs", arguments={"x-delivery-limit": 1,
                                        "x-dead-letter-strategy": "individual"})
    publish(ch, "jobs", "j")
    for _ in range(2):
        method, _, _ = get(ch, "jobs")
        ch.basic_reject(method.delivery_tag, requeue=True)
    assert depth(conn, "jobs") == 0
    _, props, body = get(ch, "DLQ.jobs")
    assert body == b"j" and text(props.headers["x-death"][0]["reason"]) == "delivery_limit"
    assert depth(conn, "leveret.DLQ") is None


def test_custom_dlq_names(conn, ch):
    ch.queue_declare("a", arguments=args(max_redeliveries=0, dead_letter_strategy="individual",
                                         dead_letter_queue_prefix="dead."))
    ch.queue_declare("b", arguments=args(max_redeliveries=0, dead_letter_strategy="shared",
                                         dead_letter_queue="graveyard"))
    for name in "ab":
        publish(ch, name, name)
        method, _, _ = get(ch, name)
        ch.basic_reject(method.delivery_tag, requeue=True)
    assert get(ch, "dead.a")[2] == b"a"
    assert get(ch, "graveyard")[2] == b"b"


def test_discard_strategy(conn, ch):
    events = bind_events(ch)
    ch.queue_declare("drop", arguments=args(max_redeliveries=0, dead_letter_strategy="discard"))
    publish(ch, "drop", "x")
    method, _, _ = get(ch, "drop")
    ch.basic_reject(method.delivery_tag, requeue=True)
    assert depth(conn, "drop") == 0
    assert depth(conn, "leveret.DLQ") is None and depth(conn, "DLQ.drop") is None
    _, props, _ = get(ch, events)
    assert text(props.headers["target"]) == "discarded"
    assert text(props.headers["reason"]) == "delivery_limit"


def test_rejected_without_requeue_goes_to_dlq(conn, ch):
    ch.queue_declare("nope", arguments=args(dead_letter_strategy="individual"))
    publish(ch, "nope", "n")
    method, _, _ = get(ch, "nope")
    ch.basic_reject(method.delivery_tag, requeue=False)
    _, props, _ = get(ch, "DLQ.nope")
    assert text(props.headers["x-death"][0]["reason"]) == "rejected"


def test_poison_to_dead_letter_exchange(conn, ch):
    ch.exchange_declare("dlx", "fanout")
    ch.queue_declare("dead")
    ch.queue_bind("dead", "dlx")
    ch.queue_declare("work", arguments={"x-dead-letter-exchange": "dlx",
                                        "x-max-redeliveries": 1, "x-redelivery-delay": 100})
    publish(ch, "work", "w")
    rec = Recorder(conn, ch, "work")
    rec.wait(1)
    rec.reject(rec.log[-1])
    rec.wait(2)
    rec.reject(rec.log[-1])
    _, props, body = get(ch, "dead")
    death = props.headers["x-death"][0]
    assert body == b"w" and text(death["reason"]) == "delivery_limit"
    assert text(death["queue"]) == "work" and death["count"] == 1
    assert text(props.headers["x-first-death-reason"]) == "delivery_limit"
    assert depth(conn, "leveret.DLQ") is None


@pytest.mark.parametrize("process_expired", [None, True, False])
def test_expired_and_process_expired(conn, ch, process_expired):
    arguments = args(dead_letter_strategy="shared", message_ttl=100)
    if process_expired is not None:
        arguments["x-dead-letter-expired"] = process_expired
    ch.queue_declare("ttl", arguments=arguments)
    publish(ch, "ttl", "old")
    time.sleep(0.25)
    assert depth(conn, "ttl") == 0
    if process_expired is False:
        assert not depth(conn, "leveret.DLQ")
    else:
        _, props, body = get(ch, "leveret.DLQ")
        assert body == b"old" and text(props.headers["x-death"][0]["reason"]) == "expired"
        assert text(props.headers["x-death"][0].get("original-expiration", "")) in ("", "100")


@pytest.mark.parametrize("flag", [None, False, True])
def test_non_persistent_and_dlq(conn, ch, flag):
    arguments = args(dead_letter_strategy="individual", max_redeliveries=0)
    if flag is not None:
        arguments["x-dead-letter-non-persistent"] = flag
    ch.queue_declare("np", arguments=arguments)
    publish(ch, "np", "transient", TRANSIENT)
    publish(ch, "np", "persistent", PERSISTENT)
    for _ in range(2):
        method, _, _ = get(ch, "np")
        ch.basic_reject(method.delivery_tag, requeue=True)
    assert depth(conn, "np") == 0
    expected = [b"transient", b"persistent"] if flag else [b"persistent"]
    got = [get(ch, "DLQ.np", timeout=0.2)[2] for _ in range(len(expected) + 1)]
    assert got == [*expected, None]


# -- configuration ----------------------------------------------------------------------
@pytest.mark.parametrize("arguments", [
    {"x-dead-letter-exchange": "dlx", "x-dead-letter-strategy": "shared"},
    {"x-dead-letter-strategy": "sometimes"},
    {"x-max-redeliveries": -1},
    {"x-delivery-limit": "five"},
    {"x-redelivery-delay": -100},
    {"x-redelivery-exponential": "true"},
    {"x-redelivery-backoff-multiplier": 0},
    {"x-redelivery-max-delay": -5},
    {"x-dead-letter-expired": "no"},
    {"x-dead-letter-non-persistent": 1},
    {"x-dead-letter-queue": 3},
])
def test_invalid_arguments_406(conn, arguments):
    channel = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as err:
        channel.queue_declare("bad", arguments=arguments)
    assert err.value.reply_code == 406
    assert depth(conn, "bad") is None


def test_policy_sets_redelivery_policy():
    policy = Policy("retry", r"^mail\.", {
        "max-redeliveries": 1, "redelivery-delay": 200, "dead-letter-strategy": "individual"},
        apply_to="queues")
    with BlockingBroker(amqp_port=0, policies=[policy]) as broker:
        conn = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
        ch = conn.channel()
        ch.queue_declare("mail.out")
        publish(ch, "mail.out", "m")
        rec = Recorder(conn, ch, "mail.out")
        assert rec.wait(1)["count"] == 0
        returned = rec.reject(rec.log[-1])
        second = rec.wait(2)
        assert_delay(returned, second["time"], 200)
        assert second["count"] == 1
        rec.reject(second)
        _, props, body = get(ch, "DLQ.mail.out")
        assert body == b"m" and text(props.headers["x-death"][0]["reason"]) == "delivery_limit"
        ch.queue_declare("other")  # not matched: no header
        publish(ch, "other", "o")
        assert "x-delivery-count" not in (get(ch, "other")[1].headers or {})
        conn.close()


def test_policy_from_config_file(tmp_path: Path):
    config = tmp_path / "leveret.toml"
    config.write_text(
        '[[policies]]\nname = "retry"\npattern = "^q$"\napply_to = "queues"\n'
        'definition = { max-redeliveries = 1, redelivery-delay = 150, '
        'dead-letter-strategy = "shared", dead-letter-queue = "failed" }\n')
    server = ServerProcess(tmp_path / "data", "--config", str(config))
    try:
        conn = pika.BlockingConnection(pika.URLParameters(server.url))
        ch = conn.channel()
        ch.queue_declare("q", durable=True)
        publish(ch, "q", "m")
        rec = Recorder(conn, ch, "q")
        rec.wait(1)
        returned = rec.reject(rec.log[-1])
        assert_delay(returned, rec.wait(2)["time"], 150)
        rec.reject(rec.log[-1])
        _, props, body = get(ch, "failed")
        assert body == b"m" and text(props.headers["x-death"][0]["reason"]) == "delivery_limit"
        conn.close()
    finally:
        server.kill()


# -- restart -----------------------------------------------------------------------------
def test_delivery_count_survives_restart(tmp_path: Path):
    data = tmp_path / "data"
    arguments = args(max_redeliveries=2, redelivery_delay=100, dead_letter_strategy="individual")
    server = ServerProcess(data)
    try:
        conn = pika.BlockingConnection(pika.URLParameters(server.url))
        ch = conn.channel()
        ch.queue_declare("durable.q", durable=True, arguments=arguments)
        publish(ch, "durable.q", "survivor")
        counts = []
        for _ in range(2):
            method, props, body = get(ch, "durable.q")
            assert body == b"survivor"
            counts.append(props.headers["x-delivery-count"])
            ch.basic_reject(method.delivery_tag, requeue=True)
        assert counts == [0, 1]
        time.sleep(0.2)  # let the last redelivery delay pass
        conn.close()
        assert server.terminate() == 0
    finally:
        server.kill()
    server = ServerProcess(data)
    try:
        conn = pika.BlockingConnection(pika.URLParameters(server.url))
        ch = conn.channel()
        assert ch.queue_declare("durable.q", durable=True, arguments=arguments) \
            .method.message_count == 1
        publish(ch, "durable.q", "fresh")
        method, props, body = get(ch, "durable.q")
        assert body == b"survivor" and method.redelivered
        assert props.headers["x-delivery-count"] == 2
        ch.basic_reject(method.delivery_tag, requeue=True)  # 3 deliveries = 1 + max: poison
        method, props, body = get(ch, "durable.q")
        assert body == b"fresh" and props.headers["x-delivery-count"] == 0
        ch.basic_ack(method.delivery_tag)
        _, props, body = get(ch, "DLQ.durable.q")
        assert body == b"survivor"
        assert text(props.headers["x-death"][0]["reason"]) == "delivery_limit"
        conn.close()
        assert server.terminate() == 0
    finally:
        server.kill()


def test_a_redelivery_back_off_outlives_a_kill(tmp_path: Path):
    """A message nacked into a 3 s back-off, then kill -9: after the restart it waits out
    the rest of its back-off (not redelivered at once); the messages behind it are not
    held up."""
    data = tmp_path / "data"
    arguments = args(redelivery_delay=3000)
    server = ServerProcess(data)
    try:
        conn = pika.BlockingConnection(pika.URLParameters(server.url))
        ch = conn.channel()
        ch.queue_declare("backoff.q", durable=True, arguments=arguments)
        publish(ch, "backoff.q", "retry-me")
        method, _, body = get(ch, "backoff.q")
        assert body == b"retry-me"
        ch.basic_reject(method.delivery_tag, requeue=True)
        nacked = time.monotonic()
        publish(ch, "backoff.q", "behind")  # a confirmed round trip: the nack is in too
        time.sleep(0.2)  # the back-off reaches the disk with the next write
        server.kill()
        server = ServerProcess(data)
        conn = pika.BlockingConnection(pika.URLParameters(server.url))
        ch = conn.channel()
        assert ch.queue_declare("backoff.q", durable=True, arguments=arguments).method.message_count == 2
        method, _, body = get(ch, "backoff.q")
        assert body == b"behind"  # the other message is not held up
        ch.basic_ack(method.delivery_tag)
        assert ch.basic_get("backoff.q")[0] is None  # still in its back-off
        got = poll(lambda: ch.basic_get("backoff.q"), lambda got: got[0] is not None, 10, 0.05)
        waited = time.monotonic() - nacked
        assert got[2] == b"retry-me" and got[0].redelivered
        assert 3.0 <= waited <= 3.0 + 2.0  # when its back-off ends, not at the restart
        conn.close()
    finally:
        server.kill()


# -- aio-pika -----------------------------------------------------------------------------
def run(test) -> None:
    async def main() -> None:
        async with leveret.Broker(amqp_port=0) as broker:
            await asyncio.wait_for(test(broker.amqp_url), 15)

    asyncio.run(main())


def test_aio_pika_backoff_and_poison():
    async def body(url: str) -> None:
        connection = await aio_pika.connect_robust(url)
        async with connection:
            channel = await connection.channel()
            events = await channel.declare_queue("", exclusive=True)
            await events.bind("amq.leveret.event", "message.dead_lettered")
            queue = await channel.declare_queue("aio", arguments=args(
                max_redeliveries=3, redelivery_delay=100, redelivery_exponential=True,
                redelivery_backoff_multiplier=2, dead_letter_strategy="individual"))
            await channel.default_exchange.publish(
                aio_pika.Message(b"hello", message_id="aio-1",
                                 delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                routing_key="aio")
            seen = []
            returned = None
            async with queue.iterator() as messages:
                async for message in messages:
                    now = time.monotonic()
                    seen.append((message.headers.get("x-delivery-count"), message.redelivered,
                                 None if returned is None else now - returned))
                    await message.reject(requeue=True)  # a failure (RabbitMQ 4.3's mapping)
                    returned = time.monotonic()
                    if len(seen) == 4:
                        break
            assert [s[0] for s in seen] == [0, 1, 2, 3]
            assert [s[1] for s in seen] == [False, True, True, True]
            for (_, _, waited), expected in zip(seen[1:], (0.1, 0.2, 0.4)):
                assert expected - EARLY <= waited <= expected + LATE, (waited, expected)
            dlq = await channel.declare_queue("DLQ.aio", durable=True, passive=True)
            dead = await dlq.get(timeout=3)
            assert dead.body == b"hello"
            assert dead.headers["x-death"][0]["reason"] == "delivery_limit"
            await dead.ack()
            event = await events.get(timeout=3)
            assert event.headers["reason"] == "delivery_limit"
            assert event.headers["queue"] == "aio" and event.headers["message_id"] == "aio-1"
            assert event.headers["target"] == "queue 'DLQ.aio'"
            assert json.loads(event.body)["vhost"] == "/"

    run(body)


def test_aio_pika_process_context_requeue_and_406():
    async def body(url: str) -> None:
        connection = await aio_pika.connect(url)
        async with connection:
            channel = await connection.channel()
            queue = await channel.declare_queue("ctx", arguments=args(redelivery_delay=150))
            await channel.default_exchange.publish(aio_pika.Message(b"x"), routing_key="ctx")
            first = await queue.get(timeout=3)
            assert first.headers["x-delivery-count"] == 0
            await first.reject(requeue=True)
            returned = time.monotonic()
            assert await queue.get(fail=False) is None  # still waiting
            async with queue.iterator() as messages:
                async for message in messages:
                    async with message.process():  # acks
                        waited = time.monotonic() - returned
                        assert 0.15 - EARLY <= waited <= 0.15 + LATE
                        assert message.headers["x-delivery-count"] == 1
                    break
            bad = await connection.channel()
            with pytest.raises(aio_pika.exceptions.ChannelPreconditionFailed):
                await bad.declare_queue("bad", arguments={
                    "x-dead-letter-exchange": "dlx", "x-dead-letter-strategy": "discard"})

    run(body)
