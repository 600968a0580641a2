"""The core hook of queue federation (:meth:`leveret.core.queues.base.Queue.has_demand`,
``VirtualHost.consumer_watchers``): a queue wants messages from an upstream only while
it is empty and a consumer of priority >= 0 has room, as RabbitMQ's
``rabbit_federation_queue:consumer_state_changed/3`` decides. Driven through core alone."""

from __future__ import annotations

from leveret.core import BrokerCore, Message
from leveret.core.clock import ManualClock
from leveret.core.message import Properties
from leveret.core.queues import Queue, QueuedMessage


class Consumer:
    def __init__(self, tag: str, prefetch: int = 0, priority: int = 0) -> None:
        self.tag, self.prefetch, self.exclusive, self.no_ack, self.arguments = tag, prefetch, False, False, {}
        self.priority = priority
        self.global_prefetch = 0
        self.selector = None
        self.examined = 0
        self.held: list[QueuedMessage] = []

    def can_accept(self) -> bool:
        return not self.prefetch or len(self.held) < self.prefetch

    def deliver(self, queue: Queue, entry: QueuedMessage) -> None:
        self.held.append(entry)

    def cancel_by_broker(self) -> None:
        pass


def message(body: str = "m") -> Message:
    return Message.build("", "fq", body.encode(), Properties())


def test_demand_needs_an_empty_queue_and_a_consumer_with_room():
    core = BrokerCore(ManualClock())
    queue = core.vhosts["/"].declare_queue("fq", None)
    assert not queue.has_demand()  # no consumer
    consumer = Consumer("c", prefetch=1)
    queue.add_consumer(consumer)
    assert queue.has_demand()
    queue.enqueue(message())
    assert not queue.has_demand()  # its window is full
    queue.enqueue(message())
    assert queue.message_count == 1 and not queue.has_demand()
    queue.ack(consumer.held.pop(0))
    queue.drain()  # the waiting one goes out: window full again
    assert queue.message_count == 0 and not queue.has_demand()
    queue.ack(consumer.held.pop(0))
    assert queue.has_demand()


def test_a_consumer_of_negative_priority_is_no_demand():
    core = BrokerCore(ManualClock())
    queue = core.vhosts["/"].declare_queue("fq", None)
    queue.add_consumer(Consumer("low", priority=-1))
    assert not queue.has_demand()
    queue.add_consumer(Consumer("normal", priority=0))
    assert queue.has_demand()


def test_consumer_watchers_hear_consume_and_cancel_of_their_queue_only():
    core = BrokerCore(ManualClock())
    vhost = core.vhosts["/"]
    queue = vhost.declare_queue("fq", None)
    other = vhost.declare_queue("other", None)
    heard: list[int] = []
    vhost.consumer_watchers["fq"] = [lambda: heard.append(len(queue.consumers))]
    consumer = Consumer("c")
    queue.add_consumer(consumer)
    other.add_consumer(Consumer("o"))
    queue.remove_consumer(consumer)
    assert heard == [1, 0]
