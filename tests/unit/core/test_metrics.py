"""core's counters (leveret.core.metrics) driven through core alone: a BrokerCore on a
ManualClock, a Publisher with a recording adapter, no sockets."""

from __future__ import annotations

import bisect

from leveret.core import BrokerCore, Message
from leveret.core.access import Access
from leveret.core.auth import UserDatabase
from leveret.core.clock import ManualClock
from leveret.core.message import Properties
from leveret.core.metrics import MESSAGE_SIZE_BUCKETS, size_bucket
from leveret.core.publish import Publisher
from leveret.core.session import Session

USERS = UserDatabase()


class Events:
    def __init__(self) -> None:
        self.returns: list[str] = []

    def confirms_ready(self) -> None:
        pass

    def rejected(self, seq: int, before) -> None:
        pass

    def returned(self, exchange: str, message: Message) -> None:
        self.returns.append(message.routing_key)


def publisher(core: BrokerCore) -> Publisher:
    vhost = core.vhosts["/"]
    return Publisher(Session(vhost, Access(USERS, USERS.users["guest"], "/"), "c-1"), Events())


def message(key: str, body: bytes = b"x", **properties) -> Message:
    return Message.build("", key, body, Properties(**properties))


def test_size_bucket_is_the_smallest_bound_not_below_the_size():
    for size in [*range(0, 5000), *(2**k + d for k in range(5, 32) for d in (-1, 0, 1))]:
        assert size_bucket(size) == bisect.bisect_left(MESSAGE_SIZE_BUCKETS, size), size


def test_publishing_counts_received_routed_returned_dropped_confirmed_and_sizes():
    core = BrokerCore(clock=ManualClock())
    vhost = core.vhosts["/"]
    work = vhost.declare_queue("work", None)
    events = Events()
    out = Publisher(Session(vhost, Access(USERS, USERS.users["guest"], "/"), "c-1"), events)
    default = vhost.exchanges[""]
    out.publish(default, message("work", b"a" * 100))
    out.select_confirms()
    out.publish(default, message("work"))
    out.publish(default, message("nowhere"), mandatory=True)
    out.publish(default, message("nowhere"))
    assert out.take_confirms() == (3, True)
    assert events.returns == ["nowhere"]
    m = core.metrics
    assert (m.received, m.received_confirm, m.routed) == (4, 3, 2)
    assert (m.unroutable_returned, m.unroutable_dropped, m.confirmed) == (1, 1, 3)
    assert m.message_sizes[:3] == [3, 1, 0] and sum(m.message_sizes) == 4
    assert m.message_size_sum == 103
    assert m.publishers == 1
    assert work.counters.published == 2
    out.close()
    out.close()
    assert m.publishers == 0


def test_dead_letters_count_per_queue_and_reason_and_survive_the_queue():
    clock = ManualClock()
    core = BrokerCore(clock=clock)
    vhost = core.vhosts["/"]
    vhost.declare_queue("dlq", None)
    short = vhost.declare_queue(
        "short",
        None,
        arguments={
            "x-max-length": 1,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": "dlq",
            "x-message-ttl": 1000,
        },
    )
    out = publisher(core)
    for _ in range(3):
        out.publish(vhost.exchanges[""], message("short"))
    assert short.counters.dead_lettered["maxlen"] == 2
    clock.advance(2)
    assert short.counters.dead_lettered["expired"] == 1
    assert vhost.queues["dlq"].message_count == 3
    assert vhost.queues["dlq"].counters.published == 0  # dead letters are not publishes
    vhost.delete_queue("short")
    totals = core.metrics.queue_totals(list(vhost.queues.values()))
    dead = totals[("classic", "at_most_once")].dead_lettered
    assert (dead["maxlen"], dead["expired"], dead["rejected"]) == (2, 1, 0)
    assert totals[("classic", "at_most_once")].published == 3
    assert (core.metrics.queues_created, core.metrics.queues_deleted) == (2, 1)
    # a deleted queue's counts stay in the totals, once
    assert core.metrics.queue_totals([])[("classic", "at_most_once")].published == 3
