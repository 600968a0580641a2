"""Queues hand work back to their host (:mod:`leveret.core.queues.host`): a queue
records what its virtual host must do (dead-letter, delete it unused, advise) and the
vhost's driver carries it out once the queue's entry point has returned, so routing a
dead copy never runs inside the dying queue's own method. Driven through core alone."""

from __future__ import annotations

from leveret.core import BrokerCore, Message
from leveret.core.clock import ManualClock
from leveret.core.message import Properties
from leveret.core.queues import GONE, REJECTED, Queue, QueuedMessage
from leveret.core.queues.host import DeadLetter


class Consumer:
    def __init__(self, tag: str, on_deliver=None) -> None:
        self.tag, self.prefetch, self.exclusive, self.no_ack, self.arguments = tag, 0, False, False, {}
        self.priority = 0
        self.global_prefetch = 0
        self.selector = None
        self.examined = 0
        self.held: list[QueuedMessage] = []
        self.on_deliver = on_deliver

    def can_accept(self) -> bool:
        return True

    def deliver(self, queue: Queue, entry: QueuedMessage) -> None:
        self.held.append(entry)
        if self.on_deliver is not None:
            self.on_deliver(entry)

    def cancel_by_broker(self) -> None:
        pass


def message(body: str = "m") -> Message:
    return Message.build("", "work", body.encode(), Properties())


def vhost_with_dlx(**arguments):
    core = BrokerCore(ManualClock())
    vhost = core.vhosts["/"]
    dead = vhost.declare_queue("dead", None)
    dlx = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"}
    work = vhost.declare_queue("work", None, arguments={**dlx, **arguments})
    return vhost, work, dead


def test_a_rejected_message_is_dead_lettered_after_the_queue_let_go_of_it():
    vhost, work, dead = vhost_with_dlx()
    seen = []
    # what the dying queue looks like when its dead copy arrives: already settled
    watcher = Consumer("watch", lambda entry: seen.append((work.unacked_count, original.state)))
    dead.add_consumer(watcher)
    consumer = Consumer("c")
    work.add_consumer(consumer)
    work.enqueue(message())
    original = consumer.held[0]
    work.discard(original, "rejected")
    assert seen == [(0, GONE)]  # before: the copy was routed while the original was still unacked
    assert [d.reason for d in watcher.held[0].message.deaths] == ["rejected"]
    assert vhost.actions == []


def test_enqueue_records_the_dead_letter_and_the_driver_routes_it():
    vhost, work, dead = vhost_with_dlx(**{"x-max-length": 1, "x-overflow": "reject-publish-dlx"})
    work.enqueue(message("kept"))
    refused = message("refused")
    assert work.enqueue(refused) == REJECTED
    assert vhost.actions == [DeadLetter(work, refused, "maxlen")]
    assert dead.message_count == 0  # recorded, not routed
    vhost.carry_out()
    assert vhost.actions == []
    assert dead.message_count == 1
    assert work.counters.dead_lettered["maxlen"] == 1


def test_an_expired_queue_is_reported_unused_and_deleted_by_its_host():
    core = BrokerCore(ManualClock())
    vhost = core.vhosts["/"]
    queue = vhost.declare_queue("idle", None, arguments={"x-expires": 1000})
    core.clock.advance(1.5)
    assert "idle" not in vhost.queues
    assert queue.deleted
    assert vhost.actions == []


def test_an_auto_delete_queue_goes_once_its_entry_point_returns():
    core = BrokerCore(ManualClock())
    vhost = core.vhosts["/"]
    queue = vhost.declare_queue("auto", None, auto_delete=True)
    consumer = Consumer("c")
    queue.add_consumer(consumer)
    queue.remove_consumer(consumer)
    assert "auto" not in vhost.queues
    assert vhost.actions == []
