"""Failed deliveries apart from returns (RabbitMQ 4.3's delivery-count and acquired
count), driven through core alone on a manual clock: what counts toward the delivery
limit and the back-off, the headers a delivery carries, and RabbitMQ 4.3's
``x-delayed-retry-*`` arguments as a spelling of the back-off."""

from __future__ import annotations

import pytest

from leveret.core import BrokerCore, Message
from leveret.core.clock import ManualClock
from leveret.core.errors import PreconditionFailed
from leveret.core.message import Properties
from leveret.core.policy import Policy
from leveret.core.queues import Queue
from leveret.core.redelivery import RedeliveryPolicy


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def vhost(clock: ManualClock):
    return BrokerCore(clock=clock).vhosts["/"]


def publish(queue: Queue, body: str = "m") -> None:
    queue.enqueue(Message.build("", queue.name, body.encode(), Properties(delivery_mode=2)))


def headers(queue: Queue, entry) -> dict:
    return dict(queue.delivery_headers(entry))


def test_returns_never_reach_the_delivery_limit(vhost):
    queue = vhost.declare_queue("q", None, arguments={"x-delivery-limit": 1})
    publish(queue)
    for _ in range(10):  # basic.nack, cancel, close, timeout: plain returns
        entry = queue.get()
        assert entry is not None
        queue.requeue([entry])
    entry = queue.get()
    assert (entry.delivery_count, entry.failed_count) == (11, 0)
    assert headers(queue, entry) == {"x-delivery-count": 0, "x-acquired-count": 10}


def test_failures_reach_the_delivery_limit_whatever_the_returns_between(vhost):
    queue = vhost.declare_queue("q", None, arguments={"x-delivery-limit": 1})
    publish(queue)
    queue.requeue([queue.get()], failed=True)  # 1st failure: allowed (limit 1)
    queue.requeue([queue.get()])  # a return between: not counted
    entry = queue.get()
    assert headers(queue, entry) == {"x-delivery-count": 1, "x-acquired-count": 2}
    queue.requeue([entry], failed=True)  # 2nd failure: over the limit, poison
    assert queue.get() is None and queue.message_count == 0


def test_quorum_headers_as_rabbitmq_4_3(vhost):
    queue = vhost.declare_queue("qq", None, durable=True, arguments={"x-queue-type": "quorum"})
    publish(queue)
    entry = queue.get()
    assert headers(queue, entry) == {}  # the first delivery: none
    queue.requeue([entry])
    entry = queue.get()
    assert headers(queue, entry) == {"x-acquired-count": 1}  # returned, never failed
    queue.requeue([entry], failed=True)
    entry = queue.get()
    assert headers(queue, entry) == {"x-delivery-count": 1, "x-acquired-count": 2}


def test_activemq_back_off_applies_to_failures_only(vhost, clock):
    queue = vhost.declare_queue("q", None, arguments={"x-redelivery-delay": 1000})
    publish(queue)
    queue.requeue([queue.get()])  # a return: back at once
    entry = queue.get()
    assert entry is not None
    queue.requeue([entry], failed=True)  # a failure: waits 1 s
    assert queue.get() is None
    clock.advance(0.999)
    assert queue.get() is None
    clock.advance(0.002)
    assert queue.get() is not None


@pytest.mark.parametrize(
    ("kind", "failed_waits", "returned_waits"),
    [("failed", True, False), ("returned", False, True), ("all", True, True)],
)
def test_delayed_retry_type_says_which_come_backs_wait(vhost, clock, kind, failed_waits, returned_waits):
    queue = vhost.declare_queue(
        "q", None, arguments={"x-delayed-retry-type": kind, "x-delayed-retry-min": 500}
    )
    publish(queue)
    queue.requeue([queue.get()], failed=True)
    if failed_waits:
        assert queue.get() is None
        clock.advance(0.501)  # min x 1 failure
    entry = queue.get()
    assert entry is not None
    queue.requeue([entry])  # a return
    if returned_waits:
        assert queue.get() is None
        clock.advance(0.501)  # min x 1 failure so far
    assert queue.get() is not None


def test_delayed_retry_is_linear_and_capped():
    policy = RedeliveryPolicy(initial_delay=100, max_delay=250, linear=True, delayed="all")
    # RabbitMQ 4.3: min(min x failures, max), failures at least 1
    assert [policy.return_delay(True, k) for k in (1, 2, 3, 4)] == [100, 200, 250, 250]
    assert policy.return_delay(False, 0) == 100


def test_delayed_retry_max_defaults_to_the_min_and_policy_keys_apply(vhost):
    queue = vhost.declare_queue(
        "q", None, arguments={"x-delayed-retry-type": "failed", "x-delayed-retry-min": 300}
    )
    assert queue.config.redelivery == RedeliveryPolicy(
        initial_delay=300, max_delay=300, linear=True, delayed="failed"
    )
    policy = Policy("retry", "^p$", {"delayed-retry-type": "all", "delayed-retry-min": 50})
    vhost = BrokerCore(clock=ManualClock(), policies=[policy]).vhosts["/"]
    queue = vhost.declare_queue(
        "p", None, arguments={"x-delayed-retry-type": "returned", "x-delayed-retry-min": 80})
    # the type: the policy's (RabbitMQ's precedence); min: the lower of both
    assert (queue.config.redelivery.delayed, queue.config.redelivery.initial_delay) == ("all", 50)


def test_delayed_retry_disabled_leaves_the_activemq_spelling(vhost):
    queue = vhost.declare_queue(
        "q", None, arguments={"x-delayed-retry-type": "disabled", "x-redelivery-delay": 70}
    )
    assert queue.config.redelivery.initial_delay == 70 and not queue.config.redelivery.linear


@pytest.mark.parametrize(
    ("arguments", "text"),
    [
        ({"x-delayed-retry-type": "sometimes", "x-delayed-retry-min": 1},
         "invalid arg 'x-delayed-retry-type' for queue 'bad' in vhost '/': 'sometimes' is not a valid "
         "delayed retry type. Must be one of: all, failed, returned, disabled"),
        ({"x-delayed-retry-type": "all"},
         "invalid arg 'x-delayed-retry-type' for queue 'bad' in vhost '/': "
         "delayed-retry-min is required when delayed-retry-type is all"),
        ({"x-delayed-retry-type": "all", "x-delayed-retry-min": 0},
         "invalid arg 'x-delayed-retry-min' for queue 'bad' in vhost '/': {value_zero,0}"),
        ({"x-delayed-retry-type": "all", "x-delayed-retry-min": 10, "x-delayed-retry-max": -5},
         "invalid arg 'x-delayed-retry-max' for queue 'bad' in vhost '/': {value_negative,-5}"),
        ({"x-delayed-retry-type": "all", "x-delayed-retry-min": 10, "x-delayed-retry-max": 5},
         "invalid arg 'x-delayed-retry-max' for queue 'bad' in vhost '/': "
         "delayed-retry-max (5) must not be smaller than delayed-retry-min (10)"),
        ({"x-delayed-retry-type": "all", "x-delayed-retry-min": "ten"},
         "invalid arg 'x-delayed-retry-min' for queue 'bad' in vhost '/': \"expected integer, got longstr\""),
        ({"x-delayed-retry-type": 1, "x-delayed-retry-min": 1},
         "invalid type 'signedint' for arg 'x-delayed-retry-type' in queue 'bad' in vhost '/'"),
    ],
)
def test_delayed_retry_arguments_are_checked_with_406(vhost, arguments, text):
    with pytest.raises(PreconditionFailed) as caught:
        vhost.declare_queue("bad", None, arguments=arguments)
    assert caught.value.text == text
