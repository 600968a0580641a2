"""A burst of messages falling due at once (kombu's native delayed delivery: every task
of one second expires together from each ``celery_delayed_N`` queue) is dead-lettered
a bounded batch per event-loop turn, not all in one timer callback that would hold the
loop while clients wait. Sans-I/O: a :class:`BrokerCore` on a :class:`ManualClock`
whose timer callbacks are counted."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from leveret.core import BrokerCore, Message
from leveret.core.clock import ManualClock, Timer
from leveret.core.message import Properties
from leveret.core.queues.classic import EXPIRY_BATCH


class CountingClock(ManualClock):
    """Calls ``after_timer()`` after each timer callback (one event-loop turn each)."""

    after_timer: Callable[[], Any] = staticmethod(lambda: None)

    def call_later(self, delay: float, callback: Callable[[], Any]) -> Timer:
        def turn() -> None:
            callback()
            self.after_timer()

        return super().call_later(delay, turn)


def test_a_burst_of_expiries_is_spread_over_turns():
    clock = CountingClock()
    vhost = BrokerCore(clock=clock).vhosts["/"]
    dead = vhost.declare_queue("dead", None)
    for queue_type in ("classic", "quorum"):
        delayed = vhost.declare_queue(f"delayed-{queue_type}", None, durable=True, arguments={
            "x-queue-type": queue_type, "x-message-ttl": 1000, "x-overflow": "reject-publish",
            "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"})
        burst = 3 * EXPIRY_BATCH + 5
        for i in range(burst):
            delayed.enqueue(Message.build("", delayed.name, str(i).encode(), Properties(delivery_mode=2)))
        counts: list[int] = []
        clock.after_timer = lambda: counts.append(dead.message_count)  # noqa: B023
        start = dead.message_count
        clock.advance(1.0)  # exactly the due time: the later batches go in the next turns
        assert dead.message_count == start + burst
        assert delayed.message_count == 0
        steps = [b - a for a, b in zip([start, *counts], counts)]
        assert max(steps) <= EXPIRY_BATCH, steps
        assert sum(steps) == burst
    bodies = []
    while (entry := dead.get()) is not None:
        bodies.append(int(entry.message.body))
        dead.ack(entry)
    assert bodies == list(range(burst)) * 2  # in order
