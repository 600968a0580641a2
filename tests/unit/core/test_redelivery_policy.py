"""ActiveMQ's redelivery policy and dead-letter strategies, driven through core alone.

A sans-I/O unit test: a :class:`BrokerCore` with a :class:`ManualClock`, queues declared
on its virtual host, and a tiny in-memory consumer; time moves only when a test says so,
so back-off delays, TTL and ``x-expires`` are checked to the millisecond.
"""

from __future__ import annotations

import json

import pytest

from leveret.amqp import properties as wire
from leveret.core import BrokerCore, Message
from leveret.core.clock import ManualClock
from leveret.core.dead_letter import DEAD_LETTERED, EVENT_EXCHANGE, discarded
from leveret.core.errors import PreconditionFailed
from leveret.core.message import Properties
from leveret.core.policy import Policy
from leveret.core.queues import Queue, QueuedMessage
from leveret.protocol.amqp.message import content_header, with_delivery_headers

EPS = 0.001  # one millisecond


def amqp_headers(message: Message, extra: tuple = ()) -> dict:
    """The headers an AMQP consumer gets: annotations (deaths) and per-delivery headers
    rendered by the AMQP adapter, decoded again."""
    return wire.decode(with_delivery_headers(content_header(message), extra)).headers or {}


# -- harness -----------------------------------------------------------------------------
class Consumer:
    """Takes up to ``prefetch`` messages (0: unlimited) and keeps them until the test
    acks or requeues them; records every delivery with the clock's time."""

    def __init__(self, clock: ManualClock, prefetch: int = 0, tag: str = "c1") -> None:
        self.clock = clock
        self.prefetch = prefetch
        self.tag = tag
        self.exclusive = False
        self.selector = None
        self.priority = 0
        self.held: list[tuple[Queue, QueuedMessage]] = []
        self.log: list[dict] = []
        self.cancelled = False

    def can_accept(self) -> bool:
        return not self.prefetch or len(self.held) < self.prefetch

    def deliver(self, queue: Queue, entry: QueuedMessage) -> None:
        message = entry.message
        headers = amqp_headers(message, queue.delivery_headers(entry))
        self.held.append((queue, entry))
        self.log.append({"body": message.body.decode(), "time": self.clock.time(),
                         "count": headers.get("x-delivery-count"),
                         "redelivered": entry.redelivered})

    def cancel_by_broker(self) -> None:
        self.cancelled = True

    # settling, as the channel would on basic.ack / basic.nack(requeue) / close
    def _pop(self, body: str | None) -> tuple[Queue, QueuedMessage]:
        for i, (_queue, entry) in enumerate(self.held):
            if body is None or entry.message.body.decode() == body:
                return self.held.pop(i)
        raise AssertionError(f"not held: {body}")

    def ack(self, body: str | None = None) -> None:
        queue, entry = self._pop(body)
        queue.ack(entry)
        queue.drain()

    def requeue(self, body: str | None = None) -> None:
        queue, entry = self._pop(body)
        queue.requeue([entry], failed=True)
        queue.drain()

    def reject(self, body: str | None = None) -> None:
        queue, entry = self._pop(body)
        queue.discard(entry, "rejected")
        queue.drain()

    def requeue_all(self) -> None:
        """Channel closed / basic.recover: every held message comes back at once."""
        held, self.held = self.held, []
        by_queue: dict[Queue, list[QueuedMessage]] = {}
        for queue, entry in held:
            by_queue.setdefault(queue, []).append(entry)
        for queue, entries in by_queue.items():
            queue.requeue(entries, failed=True)
            queue.drain()

    def bodies(self) -> list[str]:
        return [d["body"] for d in self.log]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def core(clock: ManualClock) -> BrokerCore:
    return BrokerCore(clock=clock)


@pytest.fixture
def vhost(core: BrokerCore):
    return core.vhosts["/"]


def publish(queue: Queue, body: str, persistent: bool = True, **props) -> None:
    properties = Properties(delivery_mode=2 if persistent else 1, message_id=f"id-{body}", **props)
    queue.enqueue(Message.build("", queue.name, body.encode(), properties))


def drain_get(queue: Queue) -> list[QueuedMessage]:
    """Everything basic.get would return now, acknowledged."""
    out = []
    while (entry := queue.get()) is not None:
        out.append(entry)
        queue.ack(entry)
    return out


def bodies(entries: list[QueuedMessage]) -> list[str]:
    return [e.message.body.decode() for e in entries]


def events_queue(vhost) -> Queue:
    queue = vhost.declare_queue("events", None)
    vhost.bind(EVENT_EXCHANGE, queue, DEAD_LETTERED)
    return queue


def advance_to(clock: ManualClock, when: float) -> None:
    """Move the clock to an absolute time (exact: no sum of rounded steps)."""
    clock.advance(when - clock.time())


def policy_args(**kw) -> dict:
    return {"x-" + k.replace("_", "-"): v for k, v in kw.items()}


# -- back-off timing -----------------------------------------------------------------------
def _redelivery_times(clock, queue, consumer, redeliveries):
    """Requeue the held message ``redeliveries`` times; return each wait in ms."""
    waits = []
    for _ in range(redeliveries):
        consumer.requeue()
        start = clock.time()
        seen = len(consumer.log)
        # step one millisecond at a time to find the exact moment it comes back
        for _step in range(1, 100_000):
            clock.advance(EPS)
            if len(consumer.log) > seen:
                waits.append(round((consumer.log[-1]["time"] - start) * 1000))
                break
    return waits


def test_exponential_backoff_exact_and_capped(vhost, clock):
    queue = vhost.declare_queue("q", None, arguments=policy_args(
        max_redeliveries=10, redelivery_delay=1000, redelivery_exponential=True,
        redelivery_backoff_multiplier=2, redelivery_max_delay=5000))
    consumer = Consumer(clock)
    queue.add_consumer(consumer)
    publish(queue, "m")
    assert consumer.log[0]["count"] == 0 and not consumer.log[0]["redelivered"]
    assert _redelivery_times(clock, queue, consumer, 5) == [1000, 2000, 4000, 5000, 5000]
    assert [d["count"] for d in consumer.log] == [0, 1, 2, 3, 4, 5]
    assert all(d["redelivered"] for d in consumer.log[1:])


def test_exponential_backoff_boundaries_to_the_millisecond(vhost, clock):
    queue = vhost.declare_queue("q", None, arguments=policy_args(
        redelivery_delay=1000, redelivery_exponential=True,
        redelivery_backoff_multiplier=2, redelivery_max_delay=5000))
    consumer = Consumer(clock)
    queue.add_consumer(consumer)
    publish(queue, "m")
    for expected in (1.0, 2.0, 4.0, 5.0):
        consumer.requeue()
        assert queue.message_count == 1  # waiting, counted
        clock.advance(expected - EPS)
        assert len(consumer.held) == 0, f"early for a delay of {expected}s"
        clock.advance(EPS)
        assert len(consumer.held) == 1, f"late for a delay of {expected}s"
        assert queue.message_count == 0


def test_default_multiplier_is_five(vhost, clock):
    queue = vhost.declare_queue("q", None, arguments=policy_args(
        redelivery_delay=100, redelivery_exponential=True))
    consumer = Consumer(clock)
    queue.add_consumer(consumer)
    publish(queue, "m")
    assert _redelivery_times(clock, queue, consumer, 3) == [100, 500, 2500]


def test_constant_delay_and_cap(vhost, clock):
    queue = vhost.declare_queue("q", None, arguments=policy_args(redelivery_delay=300))
    consumer = Consumer(clock)
    queue.add_consumer(consumer)
    publish(queue, "m")
    assert _redelivery_times(clock, queue, consumer, 3) == [300, 300, 300]
    capped = vhost.declare_queue("capped", None, arguments=policy_args(
        redelivery_delay=800, redelivery_max_delay=200))
    consumer2 = Consumer(clock)
    capped.add_consumer(consumer2)
    publish(capped, "m")
    assert _redelivery_times(clock, capped, consumer2, 2) == [200, 200]


def test_no_delay_requeues_at_once_with_count(vhost, clock):
    queue = vhost.declare_queue("q", None, arguments=policy_args(max_redeliveries=5))
    consumer = Consumer(clock)
    queue.add_consumer(consumer)
    publish(queue, "m")
    consumer.requeue()
    consumer.requeue()
    assert [d["count"] for d in consumer.log] == [0, 1, 2]
    assert [d["time"] for d in consumer.log] == [clock.time()] * 3


def test_delayed_message_does_not_hold_up_the_ones_behind(vhost, clock):
    queue = vhost.declare_queue("q", None, arguments=policy_args(redelivery_delay=1000))
    consumer = Consumer(clock, prefetch=1)
    queue.add_consumer(consumer)
    for body in "ABC":
        publish(queue, body)
    assert consumer.bodies() == ["A"]
    consumer.requeue("A")
    assert consumer.bodies() == ["A", "B"]  # B at once, A waits
    clock.advance(0.2)
    consumer.ack("B")
    assert consumer.bodies() == ["A", "B", "C"]
    clock.advance(0.5)
    consumer.ack("C")
    assert consumer.bodies() == ["A", "B", "C"]  # A still waiting (0.7 s)
    assert queue.message_count == 1
    clock.advance(0.3 - EPS)
    assert consumer.bodies() == ["A", "B", "C"]
    clock.advance(EPS)
    assert consumer.bodies() == ["A", "B", "C", "A"]
    assert consumer.log[-1]["count"] == 1 and consumer.log[-1]["redelivered"]


def test_delayed_message_returns_to_its_original_position(vhost, clock):
    queue = vhost.declare_queue("q", None, arguments=policy_args(redelivery_delay=1000))
    for body in "ABCD":
        publish(queue, body)
    a = queue.get()
    queue.requeue([a], failed=True)
    b = queue.get()
    assert bodies([b]) == ["B"]
    queue.ack(b)  # (an acknowledged entry lets go of its message)
    clock.advance(1.0)
    assert bodies(drain_get(queue)) == ["A", "C", "D"]


def test_earlier_due_redelivery_is_not_held_up_by_a_later_one(vhost, clock):
    """A message on its 3rd redelivery (4 s) must not make a newly requeued message on
    its 1st (1 s) wait 4 s: the redelivery timer follows the earliest due message."""
    queue = vhost.declare_queue("q", None, arguments=policy_args(
        redelivery_delay=1000, redelivery_exponential=True, redelivery_backoff_multiplier=2))
    consumer = Consumer(clock)
    queue.add_consumer(consumer)
    publish(queue, "A")
    for _ in range(2):  # A delivered 3 times
        consumer.requeue("A")
        clock.advance(10)
    consumer.requeue("A")  # 3rd redelivery: 4 s
    start = clock.time()
    publish(queue, "B")
    consumer.requeue("B")  # 1st redelivery: 1 s
    assert len(consumer.log) == 4
    advance_to(clock, start + 1.0 - EPS)
    assert len(consumer.log) == 4
    advance_to(clock, start + 1.0)
    assert len(consumer.log) == 5, "B waited for A's longer delay"
    assert consumer.log[-1]["body"] == "B" and consumer.log[-1]["count"] == 1
    advance_to(clock, start + 4.0 - EPS)
    assert len(consumer.log) == 5
    advance_to(clock, start + 4.0)
    assert consumer.log[-1]["body"] == "A" and consumer.log[-1]["count"] == 3
    assert consumer.log[-1]["time"] == start + 4.0


class LateClock(ManualClock):
    """A clock whose timers run late, as on a busy event loop: ``jump`` moves time
    first and only then runs every due timer."""

    def jump(self, seconds: float) -> None:
        end = self.now + seconds
        self.now = end
        self.advance(0)


def test_redeliveries_due_together_keep_queue_order():
    clock = LateClock()
    core = BrokerCore(clock=clock)
    vhost = core.vhosts["/"]
    queue = vhost.declare_queue("q", None, arguments=policy_args(
        redelivery_delay=1000, redelivery_exponential=True, redelivery_backoff_multiplier=2))
    for body in "ABC":
        publish(queue, body)
    a = queue.get()
    queue.requeue([a], failed=True)
    clock.jump(1.0)
    a = queue.get()  # A's 2nd delivery: next wait 2 s
    b = queue.get()  # B's 1st: next wait 1 s
    assert bodies([a, b]) == ["A", "B"]
    queue.requeue([a], failed=True)
    queue.requeue([b], failed=True)
    clock.jump(5.0)  # both due when the loop gets round to it
    assert bodies(drain_get(queue)) == ["A", "B", "C"]


def test_requeue_of_several_each_with_its_own_delay(vhost, clock):
    """Channel close / basic.recover requeues everything unacked at once."""
    queue = vhost.declare_queue("q", None, arguments=policy_args(
        redelivery_delay=100, redelivery_exponential=True, redelivery_backoff_multiplier=10))
    consumer = Consumer(clock)
    queue.add_consumer(consumer)
    publish(queue, "A")
    consumer.requeue("A")
    clock.advance(0.1)  # A delivered twice
    publish(queue, "B")
    start = clock.time()
    consumer.requeue_all()  # A: 2nd redelivery (1 s), B: 1st (100 ms)
    advance_to(clock, start + 0.1 - EPS)
    assert not consumer.held
    advance_to(clock, start + 0.1)
    assert [d["body"] for d in consumer.log[3:]] == ["B"]
    advance_to(clock, start + 1.0 - EPS)
    assert len(consumer.log) == 4
    advance_to(clock, start + 1.0)
    assert consumer.log[-1]["body"] == "A" and consumer.log[-1]["count"] == 2


def test_get_carries_delivery_count(vhost, clock):
    queue = vhost.declare_queue("q", None, arguments=policy_args(max_redeliveries=3))
    publish(queue, "m")
    counts = []
    for _ in range(3):
        entry = queue.get()
        counts.append(amqp_headers(entry.message, queue.delivery_headers(entry))["x-delivery-count"])
        queue.requeue([entry], failed=True)
    assert counts == [0, 1, 2]


def test_no_policy_no_header_on_first_delivery(vhost, clock):
    queue = vhost.declare_queue("plain", None)
    publish(queue, "m")
    entry = queue.get()
    assert "x-delivery-count" not in (amqp_headers(entry.message, queue.delivery_headers(entry)))
    queue.requeue([entry], failed=True)
    entry = queue.get()
    assert amqp_headers(entry.message, queue.delivery_headers(entry))["x-delivery-count"] == 1
    assert entry.redelivered


# -- poison messages and strategies -----------------------------------------------------
def _exhaust(clock, queue, consumer, deliveries):
    for _ in range(deliveries):
        consumer.requeue()
        clock.advance(60)


def test_poison_after_max_redeliveries_goes_to_shared_dlq(vhost, clock):
    events = events_queue(vhost)
    queue = vhost.declare_queue("orders", None, arguments=policy_args(
        max_redeliveries=2, redelivery_delay=100, dead_letter_strategy="shared"))
    consumer = Consumer(clock)
    queue.add_consumer(consumer)
    publish(queue, "m")
    _exhaust(clock, queue, consumer, 2)
    assert [d["count"] for d in consumer.log] == [0, 1, 2]  # 1 + max deliveries
    assert "leveret.DLQ" not in vhost.queues
    consumer.requeue()  # the 3rd return: poison
    assert queue.message_count == 0
    clock.advance(60)
    assert len(consumer.log) == 3
    dlq = vhost.queues["leveret.DLQ"]
    assert dlq.durable
    dead = drain_get(dlq)
    assert bodies(dead) == ["m"]
    death = amqp_headers(dead[0].message)["x-death"][0]
    assert death["reason"] == "delivery_limit" and death["queue"] == "orders"
    assert amqp_headers(dead[0].message)["x-first-death-reason"] == "delivery_limit"
    event = drain_get(events)[0].message
    assert event.routing_key == DEAD_LETTERED and event.exchange == EVENT_EXCHANGE
    expected = {"vhost": "/", "queue": "orders", "reason": "delivery_limit",
                "target": "queue 'leveret.DLQ'", "message_id": "id-m"}
    assert dict(event.properties.headers) == expected
    assert json.loads(event.body) == expected


def test_max_redeliveries_zero_dead_on_first_return(vhost, clock):
    queue = vhost.declare_queue("q", None, arguments=policy_args(
        max_redeliveries=0, dead_letter_strategy="individual"))
    publish(queue, "m")
    entry = queue.get()
    queue.requeue([entry], failed=True)
    assert queue.get() is None
    assert bodies(drain_get(vhost.queues["DLQ.q"])) == ["m"]


def test_delivery_limit_alias_and_lower_wins(vhost, clock):
    queue = vhost.declare_queue("q", None, arguments={
        "x-delivery-limit": 1, "x-max-redeliveries": 4, "x-dead-letter-strategy": "individual"})
    assert queue.config.redelivery.max_redeliveries == 1
    publish(queue, "m")
    for _ in range(2):
        queue.requeue([queue.get()], failed=True)
    assert queue.get() is None
    assert bodies(drain_get(vhost.queues["DLQ.q"])) == ["m"]


def test_individual_strategy_with_prefix_and_named_shared_queue(vhost, clock):
    q1 = vhost.declare_queue("a", None, arguments=policy_args(
        max_redeliveries=0, dead_letter_strategy="individual", dead_letter_queue_prefix="dead-"))
    q2 = vhost.declare_queue("b", None, arguments=policy_args(
        max_redeliveries=0, dead_letter_strategy="shared", dead_letter_queue="all.dead"))
    q3 = vhost.declare_queue("c", None, arguments=policy_args(
        max_redeliveries=0, dead_letter_strategy="individual"))
    for queue in (q1, q2, q3):
        publish(queue, queue.name)
        queue.requeue([queue.get()], failed=True)
    assert bodies(drain_get(vhost.queues["dead-a"])) == ["a"]
    assert bodies(drain_get(vhost.queues["all.dead"])) == ["b"]
    assert bodies(drain_get(vhost.queues["DLQ.c"])) == ["c"]
    assert all(vhost.queues[n].durable for n in ("dead-a", "all.dead", "DLQ.c"))
    assert "leveret.DLQ" not in vhost.queues


def test_rejected_without_requeue_uses_strategy(vhost, clock):
    queue = vhost.declare_queue("q", None, arguments=policy_args(dead_letter_strategy="shared"))
    publish(queue, "m")
    queue.discard(queue.get(), "rejected")
    dead = drain_get(vhost.queues["leveret.DLQ"])
    assert amqp_headers(dead[0].message)["x-death"][0]["reason"] == "rejected"


def test_discard_strategy(vhost, clock):
    events = events_queue(vhost)
    queue = vhost.declare_queue("q", None, arguments=policy_args(
        max_redeliveries=0, dead_letter_strategy="discard"))
    before = discarded.total
    publish(queue, "m")
    queue.requeue([queue.get()], failed=True)
    assert queue.message_count == 0
    assert discarded.total == before + 1
    assert not any(name.startswith("DLQ") or name == "leveret.DLQ" for name in vhost.queues)
    event = drain_get(events)[0].message.properties.headers
    assert event["reason"] == "delivery_limit" and event["target"] == "discarded"


@pytest.mark.parametrize("process_expired", [True, False, None])
def test_expired_messages_and_process_expired(vhost, clock, process_expired):
    args = policy_args(dead_letter_strategy="shared", message_ttl=1000)
    if process_expired is not None:
        args["x-dead-letter-expired"] = process_expired
    events = events_queue(vhost)
    queue = vhost.declare_queue("q", None, arguments=args)
    publish(queue, "m")
    clock.advance(1.0)
    assert queue.message_count == 0
    dlq = vhost.queues.get("leveret.DLQ")
    if process_expired is False:
        assert dlq is None or dlq.message_count == 0
        target = "discarded"
    else:
        dead = drain_get(dlq)
        assert amqp_headers(dead[0].message)["x-death"][0]["reason"] == "expired"
        target = "queue 'leveret.DLQ'"
    event = drain_get(events)[0].message.properties.headers
    assert event["reason"] == "expired" and event["target"] == target


def test_process_expired_false_still_takes_poison(vhost, clock):
    queue = vhost.declare_queue("q", None, arguments={
        "x-dead-letter-strategy": "shared", "x-dead-letter-expired": False,
        "x-max-redeliveries": 0})
    publish(queue, "m")
    queue.requeue([queue.get()], failed=True)
    assert bodies(drain_get(vhost.queues["leveret.DLQ"])) == ["m"]


@pytest.mark.parametrize("flag", [None, False, True])
def test_non_persistent_skip_dlq_unless_flag(vhost, clock, flag):
    args = policy_args(dead_letter_strategy="individual", max_redeliveries=0)
    if flag is not None:
        args["x-dead-letter-non-persistent"] = flag
    queue = vhost.declare_queue("q", None, arguments=args)
    publish(queue, "transient", persistent=False)
    publish(queue, "persistent", persistent=True)
    for _ in range(2):
        queue.requeue([queue.get()], failed=True)
    expected = ["transient", "persistent"] if flag else ["persistent"]
    assert bodies(drain_get(vhost.queues["DLQ.q"])) == expected


def test_poison_to_dead_letter_exchange_with_x_death(vhost, clock):
    vhost.declare_exchange("dlx", "fanout")
    dead_q = vhost.declare_queue("dead", None)
    vhost.bind("dlx", dead_q, "")
    queue = vhost.declare_queue("q", None, arguments={
        "x-dead-letter-exchange": "dlx", "x-max-redeliveries": 1})
    publish(queue, "m")
    for _ in range(2):
        queue.requeue([queue.get()], failed=True)
    dead = drain_get(dead_q)
    headers = amqp_headers(dead[0].message)
    assert headers["x-death"][0]["reason"] == "delivery_limit"
    assert headers["x-death"][0]["queue"] == "q"
    assert headers["x-death"][0]["count"] == 1
    assert "leveret.DLQ" not in vhost.queues


def test_dlq_created_on_demand_and_reused(vhost, clock):
    queue = vhost.declare_queue("q", None, arguments=policy_args(
        dead_letter_strategy="shared", max_redeliveries=0))
    assert "leveret.DLQ" not in vhost.queues
    for body in ("1", "2"):
        publish(queue, body)
        queue.requeue([queue.get()], failed=True)
    assert bodies(drain_get(vhost.queues["leveret.DLQ"])) == ["1", "2"]


# -- TTL and the delay heap ---------------------------------------------------------------
def test_ttl_expiry_not_at_head_at_exact_time(vhost, clock):
    queue = vhost.declare_queue("q", None, arguments=policy_args(dead_letter_strategy="shared"))
    publish(queue, "A")
    publish(queue, "B", expiration="500")
    publish(queue, "C", expiration="1500")
    publish(queue, "D")
    clock.advance(0.5 - EPS)
    assert queue.message_count == 4
    clock.advance(EPS)
    assert queue.message_count == 3
    assert bodies(drain_get(vhost.queues["leveret.DLQ"])) == ["B"]
    clock.advance(1.0 - EPS)
    assert queue.message_count == 3
    clock.advance(EPS)
    assert queue.message_count == 2
    assert bodies(drain_get(queue)) == ["A", "D"]
    assert bodies(drain_get(vhost.queues["leveret.DLQ"])) == ["C"]


def test_message_expiring_during_its_redelivery_delay_is_not_delivered(vhost, clock):
    queue = vhost.declare_queue("q", None, arguments=policy_args(
        message_ttl=1500, redelivery_delay=2000, dead_letter_strategy="shared"))
    consumer = Consumer(clock)
    queue.add_consumer(consumer)
    publish(queue, "m")
    consumer.requeue()
    clock.advance(2.0)
    assert consumer.bodies() == ["m"], "delivered after it expired"
    assert queue.message_count == 0
    dead = drain_get(vhost.queues["leveret.DLQ"])
    assert amqp_headers(dead[0].message)["x-death"][0]["reason"] == "expired"


def test_expired_when_requeued_dies_at_once(vhost, clock):
    queue = vhost.declare_queue("q", None, arguments=policy_args(
        message_ttl=500, redelivery_delay=100, dead_letter_strategy="shared"))
    publish(queue, "m")
    entry = queue.get()
    clock.advance(0.6)
    queue.requeue([entry], failed=True)
    assert queue.message_count == 0
    assert bodies(drain_get(vhost.queues["leveret.DLQ"])) == ["m"]


def test_purge_drops_delayed_messages(vhost, clock):
    queue = vhost.declare_queue("q", None, arguments=policy_args(redelivery_delay=1000))
    publish(queue, "A")
    publish(queue, "B")
    queue.requeue([queue.get()], failed=True)
    assert queue.message_count == 2
    assert queue.purge() == 2
    clock.advance(2.0)
    assert queue.message_count == 0 and queue.get() is None


def test_delete_with_delayed_message(vhost, clock):
    queue = vhost.declare_queue("q", None, arguments=policy_args(redelivery_delay=1000))
    publish(queue, "A")
    queue.requeue([queue.get()], failed=True)
    assert vhost.delete_queue("q") == 1
    clock.advance(2.0)  # the redelivery timer must not resurrect anything
    assert "q" not in vhost.queues


def test_delete_if_empty_counts_delayed_messages(vhost, clock):
    queue = vhost.declare_queue("q", None, arguments=policy_args(redelivery_delay=1000))
    publish(queue, "A")
    queue.requeue([queue.get()], failed=True)
    with pytest.raises(PreconditionFailed) as err:
        vhost.delete_queue("q", if_empty=True)
    assert err.value.condition == "precondition_failed"


# -- x-expires ---------------------------------------------------------------------------
def test_x_expires_deletes_unused_queue_at_exact_time(vhost, clock):
    vhost.declare_queue("q", None, arguments={"x-expires": 2000})
    clock.advance(2.0 - EPS)
    assert "q" in vhost.queues
    clock.advance(EPS)
    assert "q" not in vhost.queues


def test_x_expires_restarted_by_use_and_held_off_by_consumers(vhost, clock):
    queue = vhost.declare_queue("q", None, arguments={"x-expires": 1000})
    clock.advance(0.6)
    queue.get()  # use restarts the timer
    clock.advance(0.6)
    assert "q" in vhost.queues
    vhost.declare_queue("q", None, arguments={"x-expires": 1000})  # so does a redeclare
    clock.advance(0.9)
    assert "q" in vhost.queues
    consumer = Consumer(clock)
    queue.add_consumer(consumer)
    clock.advance(10)
    assert "q" in vhost.queues and not consumer.cancelled
    queue.remove_consumer(consumer)
    clock.advance(1.0 - EPS)
    assert "q" in vhost.queues
    clock.advance(EPS + 0.001)  # within the next check
    assert "q" not in vhost.queues


def test_x_expires_with_delayed_redelivery_and_consumer(vhost, clock):
    queue = vhost.declare_queue("q", None, arguments={
        "x-expires": 5000, "x-redelivery-delay": 1000})
    consumer = Consumer(clock)
    queue.add_consumer(consumer)
    publish(queue, "m")
    consumer.requeue()
    clock.advance(1.0)
    assert consumer.bodies() == ["m", "m"]
    consumer.cancelled = False
    clock.advance(20)
    assert "q" in vhost.queues


# -- configuration ----------------------------------------------------------------------
@pytest.mark.parametrize("arguments", [
    {"x-dead-letter-exchange": "dlx", "x-dead-letter-strategy": "shared"},
    {"x-dead-letter-strategy": "everything"},
    {"x-dead-letter-strategy": 1},
    {"x-max-redeliveries": -1},
    {"x-max-redeliveries": "3"},
    {"x-delivery-limit": -2},
    {"x-redelivery-delay": -1},
    {"x-redelivery-delay": 1.5},
    {"x-redelivery-exponential": "yes"},
    {"x-redelivery-exponential": 1},
    {"x-redelivery-backoff-multiplier": 0.5},
    {"x-redelivery-backoff-multiplier": "2"},
    {"x-redelivery-max-delay": -1},
    {"x-dead-letter-queue": 7},
    {"x-dead-letter-queue-prefix": False},
    {"x-dead-letter-expired": "false"},
    {"x-dead-letter-non-persistent": 0},
    {"x-dead-letter-strategy": "shared", "x-dead-letter-queue": "amq.dlq"},
    {"x-dead-letter-strategy": "individual", "x-dead-letter-queue-prefix": "amq."},
])
def test_invalid_arguments_are_406(vhost, arguments):
    with pytest.raises(PreconditionFailed) as err:
        vhost.declare_queue("q", None, arguments=arguments)
    assert err.value.condition == "precondition_failed"
    assert "q" not in vhost.queues


def test_defaults(vhost):
    config = vhost.declare_queue("q", None).config
    assert config.redelivery.max_redeliveries == -1 and not config.redelivery.active
    assert config.redelivery.multiplier == 5.0
    assert config.dead_letter.strategy is None
    assert config.dead_letter.queue == "leveret.DLQ"
    assert config.dead_letter.prefix == "DLQ."
    assert config.dead_letter.process_expired is True
    assert config.dead_letter.process_non_persistent is False


def test_float_multiplier_accepted(vhost, clock):
    queue = vhost.declare_queue("q", None, arguments=policy_args(
        redelivery_delay=100, redelivery_exponential=True, redelivery_backoff_multiplier=1.5))
    consumer = Consumer(clock)
    queue.add_consumer(consumer)
    publish(queue, "m")
    assert _redelivery_times(clock, queue, consumer, 3) == [100, 150, 225]


def test_policy_sets_redelivery_and_strategy(clock):
    policy = Policy("redeliver", r"^jobs\.", {
        "max-redeliveries": 1, "redelivery-delay": 500, "redelivery-exponential": True,
        "redelivery-backoff-multiplier": 3, "dead-letter-strategy": "individual"},
        apply_to="queues")
    core = BrokerCore(clock=clock, policies=[policy])
    vhost = core.vhosts["/"]
    queue = vhost.declare_queue("jobs.mail", None)
    other = vhost.declare_queue("other", None)
    assert not other.config.redelivery.active
    consumer = Consumer(clock)
    queue.add_consumer(consumer)
    publish(queue, "m")
    consumer.requeue()
    clock.advance(0.5 - EPS)
    assert len(consumer.log) == 1
    clock.advance(EPS)
    assert [d["count"] for d in consumer.log] == [0, 1]
    consumer.requeue()  # delivered twice = 1 + max: poison
    assert bodies(drain_get(vhost.queues["DLQ.jobs.mail"])) == ["m"]


def test_policy_and_argument_lower_limit_wins_argument_wins_otherwise(clock):
    policy = Policy("p", ".*", {"max-redeliveries": 2, "redelivery-delay": 500,
                                "dead-letter-strategy": "individual"})
    core = BrokerCore(clock=clock, policies=[policy])
    vhost = core.vhosts["/"]
    queue = vhost.declare_queue("q", None, arguments={
        "x-max-redeliveries": 5, "x-redelivery-delay": 100, "x-dead-letter-strategy": "shared"})
    assert queue.config.redelivery.max_redeliveries == 2
    assert queue.config.redelivery.initial_delay == 100
    assert queue.config.dead_letter.strategy == "shared"


def test_invalid_policy_value_is_406(clock):
    core = BrokerCore(clock=clock, policies=[Policy("p", ".*", {"redelivery-delay": -5})])
    with pytest.raises(PreconditionFailed) as err:
        core.vhosts["/"].declare_queue("q", None)
    assert err.value.condition == "precondition_failed"
