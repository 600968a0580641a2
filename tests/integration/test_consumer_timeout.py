"""Consumer timeouts with pika over TCP, against leveret and (where RabbitMQ 3.10 has the
behaviour: the broker-wide ``consumer_timeout``) a private RabbitMQ 3.10 node.

leveret runs on a :class:`~stepped_clock.SteppedClock` with RabbitMQ's default 30-minute
timeout, and the tests move its clock past the deadline; RabbitMQ runs with
``consumer_timeout = 1000`` and ``channel_tick_interval = 100`` (advanced.config), and
the tests wait out that second. The per-queue argument, the policy and the graceful
mode (RabbitMQ 3.12 and 4.3) run on leveret only.
"""

from __future__ import annotations

import time
import uuid

import pika
import pytest
import stepped_clock
from pika.exceptions import ChannelClosedByBroker
from targets import RabbitMQ, rabbitmq_installed

from leveret.core.broker import Limits
from leveret.core.policy import Policy
from leveret.server.broker import BlockingBroker


class Target:
    """A broker and how to get past its consumer timeout."""

    def __init__(self, name: str, port: int, timeout_ms: int, step, broker=None) -> None:
        self.name, self.port, self.timeout_ms, self._step, self.broker = name, port, timeout_ms, step, broker

    def connect(self, **client_properties) -> pika.BlockingConnection:
        params = pika.ConnectionParameters("127.0.0.1", self.port, heartbeat=0,
                                           client_properties=client_properties or None)
        return pika.BlockingConnection(params)

    def past(self, seconds: float | None = None) -> None:
        """Let ``seconds`` (default: the broker's timeout and a little) go by."""
        self._step(self.timeout_ms / 1000 * 1.05 + 0.2 if seconds is None else seconds)


@pytest.fixture(scope="module", params=["leveret", "rabbitmq"])
def target(request):
    if request.param == "leveret":
        with BlockingBroker(amqp_port=0, limits=Limits(consumer_timeout=1_800_000)) as broker:
            clock = stepped_clock.install(broker)
            yield Target("leveret", broker.amqp_port, 1_800_000,
                         lambda s: broker.call(clock.advance, s), broker)
        return
    if not rabbitmq_installed():
        pytest.skip("RabbitMQ is not installed")
    node = RabbitMQ(conf="consumer_timeout = 1000\n",
                    advanced_config="{rabbit, [{channel_tick_interval, 100}]}")
    node.start()
    try:
        yield Target("rabbitmq", node.port, 1000, time.sleep)
    finally:
        node.stop()


@pytest.fixture
def leveret(target):
    if target.name != "leveret":
        pytest.skip("RabbitMQ 3.10 has no x-consumer-timeout argument, policy key or graceful mode")
    return target


def text(channel: int, timeout_ms: int) -> str:
    return (f"PRECONDITION_FAILED - delivery acknowledgement on channel {channel} timed out. "
            f"Timeout value used: {timeout_ms} ms. This timeout value can be configured, see "
            "consumers doc guide to learn more")


def closed_by_broker(connection: pika.BlockingConnection, ch) -> ChannelClosedByBroker:
    """The reason the broker gave for closing ``ch`` (waits up to 5 s for it; pika's
    BlockingChannel keeps it, raising it only from its consume loops)."""
    deadline = time.monotonic() + 5
    while ch.is_open and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.05)
    reason = ch._closing_reason
    assert isinstance(reason, ChannelClosedByBroker), reason
    return reason


def assert_timed_out(connection: pika.BlockingConnection, ch, timeout_ms: int) -> None:
    """``ch`` is closed by the broker with RabbitMQ's 406 for a delivery not acked within
    ``timeout_ms`` milliseconds."""
    error = closed_by_broker(connection, ch)
    assert (error.reply_code, error.reply_text) == (406, text(ch.channel_number, timeout_ms))


def name() -> str:
    return "ct-" + uuid.uuid4().hex[:10]


def held_consumer(ch, queue: str, count: int) -> list:
    """Consume ``count`` deliveries of ``queue`` on ``ch`` without acking them."""
    got: list = []
    ch.basic_consume(queue, lambda c, m, p, b: got.append((m, b)))
    deadline = time.monotonic() + 5
    while len(got) < count and time.monotonic() < deadline:
        ch.connection.process_data_events(time_limit=0.05)
    assert len(got) == count
    return got


def test_a_delivery_past_the_timeout_closes_its_channel_and_every_unacked_returns(target):
    q, other = name(), name()
    conn = target.connect()
    try:
        a, b = conn.channel(), conn.channel()
        a.queue_declare(q)
        b.queue_declare(other, auto_delete=True)
        for body in (b"m1", b"m2", b"m3"):
            a.basic_publish("", q, body)
        b.basic_publish("", other, b"o1")
        got = held_consumer(a, q, 3)
        a.basic_ack(got[0][0].delivery_tag)  # m1 settled in time
        b_got = held_consumer(b, other, 1)
        b.basic_ack(b_got[0][0].delivery_tag)  # channel b holds nothing: it stays open
        target.past()
        assert_timed_out(conn, a, target.timeout_ms)
        assert b.is_open and a.is_closed
        returned = [b.basic_get(q, auto_ack=True) for _ in range(3)]
        assert [(m.redelivered, body) for m, _, body in returned[:2]] == [(True, b"m2"), (True, b"m3")]
        assert returned[2][0] is None  # m1 does not come back
        b.queue_delete(q)
    finally:
        conn.close()


def test_acked_in_time_nothing_happens(target):
    q = name()
    conn = target.connect()
    try:
        ch = conn.channel()
        ch.queue_declare(q, auto_delete=True)
        ch.basic_publish("", q, b"x")
        got = held_consumer(ch, q, 1)
        target.past(target.timeout_ms / 1000 * 0.5)
        ch.basic_ack(got[0][0].delivery_tag)
        target.past()
        conn.process_data_events(time_limit=0.3)
        assert ch.is_open
        ch.basic_qos(prefetch_count=5)  # a round trip on the channel
    finally:
        conn.close()


def test_queue_argument_and_policy_the_lower_wins_other_channels_unaffected(leveret):
    q, pq, plain = name(), "ctpol-" + uuid.uuid4().hex[:8], name()
    broker = leveret.broker
    broker.call(broker.core.set_policy, Policy("ct-pol", "^ctpol-", {"consumer-timeout": 3000}, "queues"))
    conn = leveret.connect()
    try:
        a, b, c = conn.channel(), conn.channel(), conn.channel()
        a.queue_declare(q, auto_delete=True, arguments={"x-consumer-timeout": 5000})
        c.queue_declare(pq, auto_delete=True, arguments={"x-consumer-timeout": 9000})
        b.queue_declare(plain, auto_delete=True)
        for ch, queue in ((a, q), (b, plain), (c, pq)):
            ch.basic_publish("", queue, b"x")
            held_consumer(ch, queue, 1)
        leveret.past(3.1)  # the policy's 3000 beats the argument's 9000
        assert_timed_out(conn, c, 3000)
        leveret.past(2)  # the argument's 5000
        assert_timed_out(conn, a, 5000)
        conn.process_data_events(time_limit=0.2)
        assert b.is_open  # the broker's 30 minutes are not up
    finally:
        conn.close()
        broker.call(broker.core.clear_policy, "/", "ct-pol")


def test_graceful_mode_returns_only_the_timed_out_and_cancels_that_consumer(leveret):
    slow, fast = name(), name()
    conn = leveret.connect()
    try:
        ch = conn.channel()
        ch.queue_declare(slow, arguments={"x-consumer-timeout": 2000, "x-consumer-timeout-mode": "graceful"})
        ch.queue_declare(fast, auto_delete=True)
        cancelled = []
        ch.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
        ch.basic_publish("", slow, b"held")
        held = held_consumer(ch, slow, 1)
        slow_tag = held[0][0].consumer_tag
        ch.basic_publish("", fast, b"f1")
        fast_got = held_consumer(ch, fast, 1)
        leveret.past(1.5)
        ch.basic_ack(fast_got[0][0].delivery_tag)
        leveret.past(1.0)
        deadline = time.monotonic() + 5
        while not cancelled and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.05)
        assert cancelled == [slow_tag]
        assert ch.is_open
        ch.basic_ack(held[0][0].delivery_tag)  # too late: ignored, not a 406
        ch.basic_publish("", fast, b"f2")
        conn.process_data_events(time_limit=0.3)
        assert [body for _, body in fast_got] == [b"f1", b"f2"]  # the other consumer carries on
        method, _, body = ch.basic_get(slow, auto_ack=True)
        assert (method.redelivered, body) == (True, b"held")
        ch.queue_delete(slow)
    finally:
        conn.close()


def test_graceful_mode_closes_the_channel_of_a_client_without_cancel_notify(leveret):
    q = name()
    conn = leveret.connect(capabilities={"consumer_cancel_notify": False, "publisher_confirms": True,
                                         "basic.nack": True})
    try:
        ch = conn.channel()
        ch.queue_declare(q, arguments={"x-consumer-timeout": 1000, "x-consumer-timeout-mode": "graceful"})
        ch.basic_publish("", q, b"x")
        held_consumer(ch, q, 1)
        leveret.past(1.1)
        assert_timed_out(conn, ch, 1000)
        conn.channel().queue_delete(q)
    finally:
        conn.close()


def got_by_basic_get(ch, queue: str) -> None:
    method, _, _ = ch.basic_get(queue)
    assert method is not None


def held_by_a_cancelled_consumer(ch, queue: str) -> None:
    """basic.cancel leaves the consumer's deliveries on the channel, to be acked: they
    keep their deadline (the channel holds them, as RabbitMQ's does)."""
    held = held_consumer(ch, queue, 1)
    ch.basic_cancel(held[0][0].consumer_tag)


@pytest.mark.parametrize("hold", [got_by_basic_get, held_by_a_cancelled_consumer])
def test_a_delivery_held_past_the_timeout_closes_the_channel(target, hold):
    """Deliveries of basic.get, and of a consumer since cancelled, time out too."""
    q = name()
    conn = target.connect()
    try:
        ch = conn.channel()
        ch.queue_declare(q)
        ch.basic_publish("", q, b"kept")
        hold(ch, q)
        target.past()
        assert_timed_out(conn, ch, target.timeout_ms)
        again = conn.channel()
        method, _, body = again.basic_get(q, auto_ack=True)
        assert (method.redelivered, body) == (True, b"kept")
        again.queue_delete(q)
    finally:
        conn.close()


@pytest.mark.parametrize("mode", ["graceful", "close"])
def test_timed_out_deliveries_are_returns_not_failures(leveret, mode):
    """A consumer timeout gives messages back as plain returns (RabbitMQ 4.3's acquired
    count): with x-delivery-limit 1, three timeouts in a row leave the message alive,
    ``x-delivery-count`` 0 and ``x-acquired-count`` 3."""
    queue = name()
    conn = leveret.connect()
    try:
        ch = conn.channel()
        arguments = {"x-consumer-timeout": 2000, "x-delivery-limit": 1}
        if mode == "graceful":
            arguments["x-consumer-timeout-mode"] = "graceful"
        ch.queue_declare(queue, arguments=arguments)
        ch.basic_publish("", queue, b"slow")
        for _ in range(3):
            consumer = conn.channel()
            consumer.basic_qos(prefetch_count=1)
            held_consumer(consumer, queue, 1)
            leveret.past(2.5)
            deadline = time.monotonic() + 5
            while ch.queue_declare(queue, passive=True).method.message_count != 1:
                assert time.monotonic() < deadline
                conn.process_data_events(time_limit=0.05)
            if consumer.is_open:
                consumer.close()
        method, props, body = ch.basic_get(queue, auto_ack=True)
        assert (body, method.redelivered) == (b"slow", True)
        assert (props.headers["x-delivery-count"], props.headers["x-acquired-count"]) == (0, 3)
        ch.queue_delete(queue)
    finally:
        conn.close()
