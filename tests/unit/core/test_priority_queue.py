"""Priority queues (``x-max-priority``) driven through core, with a real SQLite store in
``tmp_path`` where paging or a restart matters: the order (highest priority first, FIFO
within one), paging by priority, requeues, selectors, TTL, length limits, purge, browse
and recovery. The AMQP behaviour is checked against RabbitMQ in
tests/integration/test_priority_queues.py."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from leveret.core import BrokerCore, Message
from leveret.core.clock import ManualClock
from leveret.core.errors import PreconditionFailed
from leveret.core.message import Properties
from leveret.core.queues import ClassicQueue, Enqueued, Queue, QueuedMessage
from leveret.core.queues.backlog import Backlog
from leveret.core.queues.priority_backlog import SEQ_BITS, PriorityBacklog
from leveret.core.selector import compile_selector
from leveret.store.base import SEQ_BLOCK_BITS
from leveret.store.sqlite import SQLiteStore


class Consumer:
    def __init__(self, tag: str = "c", prefetch: int = 0, selector: str | None = None) -> None:
        self.tag, self.prefetch, self.exclusive, self.no_ack, self.arguments = tag, prefetch, False, False, {}
        self.priority = 0
        self.global_prefetch = 0
        self.selector = compile_selector(selector) if selector else None
        self.examined = 0
        self.held: list[QueuedMessage] = []

    def can_accept(self) -> bool:
        return not self.prefetch or len(self.held) < self.prefetch

    def deliver(self, queue: Queue, entry: QueuedMessage) -> None:
        self.held.append(entry)

    def cancel_by_broker(self) -> None:
        pass

    def bodies(self) -> list[str]:
        return [entry.message.body.decode() for entry in self.held]


class Broker:
    """A core with a started SQLite store in ``path`` (None: no store)."""

    def __init__(self, path: Path | None = None) -> None:
        self.clock = ManualClock()
        self.core = BrokerCore(self.clock)
        self.loop = asyncio.new_event_loop()
        self.store = None
        if path is not None:
            self.store = SQLiteStore(path)
            self.core.attach_store(self.store)
            self.store.start(self.loop)
            LOOPS[id(self.store)] = self.loop
        self.vhost = self.core.vhosts["/"]

    def declare(self, name: str = "q", max_priority: int | None = 10, durable: bool = False,
                **arguments) -> ClassicQueue:
        args = {f"x-{k.replace('_', '-')}": v for k, v in arguments.items()}
        if max_priority is not None:
            args["x-max-priority"] = max_priority
        queue = self.vhost.declare_queue(name, None, durable=durable, arguments=args)
        assert isinstance(queue, ClassicQueue)
        return queue

    def durable(self) -> None:
        assert self.store is not None
        future = self.loop.create_future()
        self.store.when_durable(future.set_result)
        assert self.loop.run_until_complete(asyncio.wait_for(future, 10))

    def settle(self) -> None:
        """Run the loop until the store has answered every read the queues asked for."""
        if self.store is not None:
            wait_for_reads(self.store)

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
        self.loop.close()


#: the loop of each started store (its answers run there)
LOOPS: dict[int, asyncio.AbstractEventLoop] = {}


def wait_for_reads(store: SQLiteStore) -> None:
    """Run the store's loop until every read asked of it is answered (10 s at most)."""

    async def answered() -> None:
        while store.reads_in_flight:
            await asyncio.sleep(0.001)

    LOOPS[id(store)].run_until_complete(asyncio.wait_for(answered(), 10))


def get(queue: Queue) -> QueuedMessage | None:
    """``queue.get()``; None from a queue whose next messages are on their way from the
    store waits for them (a queue reads its store by callback, never inline)."""
    entry = queue.get()
    store = queue.store
    while entry is None and isinstance(store, SQLiteStore) and store.reads_in_flight:
        wait_for_reads(store)
        entry = queue.get()
    return entry


@pytest.fixture
def broker():
    handle = Broker()
    yield handle
    handle.close()


def publish(queue: Queue, body: str, priority: int | None, persistent: bool = False,
            expiration: str | None = None, **headers) -> int:
    properties = Properties(priority=priority, delivery_mode=2 if persistent else None,
                            expiration=expiration, headers=headers or None)
    return queue.enqueue(Message.build("", queue.name, body.encode(), properties))


def drain(queue: Queue) -> list[str]:
    out = []
    while (entry := get(queue)) is not None:
        out.append(entry.message.body.decode())
        queue.ack(entry)
    return out


PRIORITIES = [None, 0, 5, 10, 11, 200, 3, 5, 255, 10, None, 1]


# -- order --------------------------------------------------------------------------------
def test_highest_priority_first_fifo_within_one_none_is_0_above_the_maximum_is_the_maximum(broker):
    queue = broker.declare()
    for i, priority in enumerate(PRIORITIES):
        publish(queue, f"{i}:{priority}", priority)
    # as RabbitMQ 3.10 (tests/integration/test_priority_queues.py)
    assert drain(queue) == ["3:10", "4:11", "5:200", "8:255", "9:10", "2:5", "7:5", "6:3", "11:1",
                            "0:None", "1:0", "10:None"]


def test_max_priority_0_is_a_plain_fifo_queue_and_255_has_256_levels(broker):
    fifo = broker.declare("fifo", max_priority=0)
    assert isinstance(fifo.backlog, Backlog)
    wide = broker.declare("wide", max_priority=255)
    assert isinstance(wide.backlog, PriorityBacklog) and len(wide.backlog.bands) == 256
    for i, priority in enumerate(PRIORITIES):
        publish(fifo, f"{i}", priority)
        publish(wide, f"{i}:{priority}", priority)
    assert drain(fifo) == [str(i) for i in range(len(PRIORITIES))]
    assert drain(wide) == ["8:255", "5:200", "4:11", "3:10", "9:10", "2:5", "7:5", "6:3", "11:1",
                           "0:None", "1:0", "10:None"]


def test_seqs_follow_the_delivery_order_and_stay_below_the_store_bound():
    backlog = PriorityBacklog("q", 10, 1 << 20, 255)
    seqs = [backlog.seq(p, n) for n, p in enumerate([255, 254, 1, 0, None], start=1)]
    assert seqs == sorted(seqs)
    assert backlog.seq(0, (1 << SEQ_BITS) - 1) < 2**62
    assert backlog.seq(300, 7) == 7  # above the maximum: the maximum
    assert SEQ_BITS == SEQ_BLOCK_BITS  # the store counts and clusters rows by these blocks


def test_consumers_get_the_highest_priority_first(broker):
    queue = broker.declare()
    for i, priority in enumerate([1, 9, 5, 9, 1]):
        publish(queue, f"{i}:{priority}", priority)
    consumer = Consumer(prefetch=2)
    queue.add_consumer(consumer)
    assert consumer.bodies() == ["1:9", "3:9"]
    publish(queue, "late:7", 7)  # goes ahead of the waiting 5 and 1s
    for entry in list(consumer.held):
        consumer.held.remove(entry)
        queue.ack(entry)
        queue.drain()
    assert consumer.bodies() == ["late:7", "2:5"]


def test_a_requeued_message_goes_back_to_its_place_within_its_priority(broker):
    queue = broker.declare(max_priority=5)
    for i, priority in enumerate([1, 5, 3, 5, 1, 3, 9]):
        publish(queue, f"{i}:{priority}", priority)
    taken = [get(queue) for _ in range(4)]
    assert [e.message.body for e in taken if e] == [b"1:5", b"3:5", b"6:9", b"2:3"]
    queue.ack(taken[0])
    queue.requeue([taken[3], taken[1]])
    queue.requeue([taken[2]])
    out = []
    while (entry := get(queue)) is not None:
        out.append((entry.message.body.decode(), entry.redelivered))
    assert out == [("3:5", True), ("6:9", True), ("2:3", True), ("5:3", False), ("0:1", False),
                   ("4:1", False)]


def test_drop_head_drops_the_highest_priority_head_as_rabbitmq(broker):
    queue = broker.declare(max_length=3)
    for i, priority in enumerate([1, 5, 3, 9, 0, 5]):
        publish(queue, f"{i}:{priority}", priority)
    assert drain(queue) == ["2:3", "0:1", "4:0"]


def test_reject_publish_refuses_whatever_the_priority(broker):
    queue = broker.declare(max_length=3, overflow="reject-publish")
    results = [publish(queue, f"{i}:{p}", p) for i, p in enumerate([1, 5, 3, 9, 0, 5])]
    assert results[3:] == [Enqueued.REJECTED] * 3
    assert drain(queue) == ["1:5", "2:3", "0:1"]


def test_a_selector_consumer_sees_a_higher_priority_message_behind_what_it_turned_down(broker):
    queue = broker.declare()
    for i in range(5):
        publish(queue, f"low{i}", 1, kind="no")
    consumer = Consumer(selector="kind = 'yes'")
    queue.add_consumer(consumer)
    assert consumer.held == [] and consumer.examined > 0  # it looked at the low ones
    publish(queue, "high-no", 9, kind="no")
    publish(queue, "high-yes", 9, kind="yes")  # its seq is below the bookmark
    publish(queue, "mid-yes", 5, kind="yes")
    assert consumer.bodies() == ["high-yes", "mid-yes"]
    assert queue.message_count == 6


def test_message_groups_keep_their_consumer_in_a_priority_queue(broker):
    queue = broker.declare()
    a, b = Consumer("a", prefetch=10), Consumer("b", prefetch=10)
    queue.add_consumer(a)
    queue.add_consumer(b)
    publish(queue, "g1-low", 1, JMSXGroupID="g1")
    publish(queue, "g2-low", 1, JMSXGroupID="g2")
    publish(queue, "g1-high", 9, JMSXGroupID="g1")
    publish(queue, "g2-high", 9, JMSXGroupID="g2")
    assert a.bodies() == ["g1-low", "g1-high"] and b.bodies() == ["g2-low", "g2-high"]


def test_ttl_expires_a_message_of_any_priority_and_dead_letters_it_with_its_priority(broker):
    dlq = broker.declare("dlq")
    queue = broker.declare(dead_letter_exchange="", dead_letter_routing_key="dlq")
    publish(queue, "high", 9)
    publish(queue, "low-expiring", 1, expiration="100")
    publish(queue, "low", 1)
    broker.clock.advance(0.2)
    assert drain(queue) == ["high", "low"]
    entry = dlq.get()
    assert entry is not None and entry.message.body == b"low-expiring" and entry.message.priority == 1


def test_purge_and_browse(broker):
    queue = broker.declare()
    for i, priority in enumerate([1, 9, 5]):
        publish(queue, f"{i}:{priority}", priority)
    assert [e.message.body for e in queue.browse(10)] == [b"1:9", b"2:5", b"0:1"]
    assert [e.message.body for e in queue.browse(2)] == [b"1:9", b"2:5"]
    assert queue.purge() == 3
    assert queue.message_count == 0 and get(queue) is None
    publish(queue, "after", 3)
    assert drain(queue) == ["after"]


def test_declaring_with_an_invalid_max_priority_is_a_406(broker):
    for value, text in [(256, "{max_value_exceeded,256}"), (-1, "{value_negative,-1}"),
                        ("10", '"expected integer, got longstr"'), (True, '"expected integer, got bool"'),
                        (None, '"expected integer, got void"')]:
        with pytest.raises(PreconditionFailed) as caught:  # AMQP 406
            broker.vhost.declare_queue("bad", None, arguments={"x-max-priority": value})
        assert caught.value.text == f"invalid arg 'x-max-priority' for queue 'bad' in vhost '/': {text}"


# -- paging and recovery (a real store) ------------------------------------------------------
def test_a_paged_out_high_priority_message_comes_before_lower_ones_in_memory(tmp_path):
    broker = Broker(tmp_path)
    try:
        queue = broker.declare(max_in_memory_length=3)
        for i in range(6):
            publish(queue, f"low{i}", 1)
        assert queue.backlog.in_memory == 3 and queue.backlog.paged == 3
        publish(queue, "high", 8)  # memory is full: it goes to the store
        publish(queue, "mid", 4)
        assert queue.backlog.in_memory == 3 and queue.message_count == 8
        assert drain(queue) == ["high", "mid"] + [f"low{i}" for i in range(6)]
        assert queue.message_count == 0 and queue.backlog.in_memory == 0
    finally:
        broker.close()


def test_paging_keeps_fifo_within_each_priority_under_load(tmp_path):
    broker = Broker(tmp_path)
    try:
        queue = broker.declare(max_in_memory_length=50)
        expected: dict[int, list[str]] = {p: [] for p in range(11)}
        for i in range(2000):
            priority = (i * 7) % 11
            publish(queue, f"{i}", priority)
            expected[priority].append(f"{i}")
        consumer = Consumer(prefetch=100)
        queue.add_consumer(consumer)
        broker.settle()  # pages asked for come back on the loop
        got = []
        while consumer.held:
            entry = consumer.held.pop(0)
            got.append(entry.message.body.decode())
            queue.ack(entry)
            queue.drain()
            broker.settle()
            assert queue.backlog.in_memory <= 50 + 1000  # one page-in batch above the limit at most
        assert got == [body for p in range(10, -1, -1) for body in expected[p]]
    finally:
        broker.close()


def test_purge_of_a_paged_priority_queue_leaves_nothing_behind(tmp_path):
    broker = Broker(tmp_path)
    try:
        queue = broker.declare(durable=True, max_in_memory_length=2)
        for i in range(10):
            publish(queue, f"{i}", i % 3, persistent=True)
        assert queue.purge() == 10
        broker.durable()
    finally:
        broker.close()
    again = Broker(tmp_path)
    try:
        queue = again.vhost.queues["q"]
        assert queue.message_count == 0 and drain(queue) == []
    finally:
        again.close()


def test_priorities_and_redeliveries_survive_a_restart_and_the_counter_goes_on(tmp_path):
    broker = Broker(tmp_path)
    try:
        queue = broker.declare(durable=True, max_in_memory_length=4)
        for i, priority in enumerate([1, 9, 5, None, 9, 200, 2, 5, 0, 3]):
            publish(queue, f"{i}:{priority}", priority, persistent=True)
        publish(queue, "transient", 9)  # paged out but not durable: gone after the restart
        entry = get(queue)
        assert entry is not None and entry.message.body == b"5:200"  # 200 counts as 10
        queue.requeue([entry])
        broker.durable()
    finally:
        broker.close()
    again = Broker(tmp_path)
    try:
        queue = again.vhost.queues["q"]
        assert isinstance(queue, ClassicQueue) and isinstance(queue.backlog, PriorityBacklog)
        assert queue.message_count == 10
        publish(queue, "new:9", 9, persistent=True)  # after the recovered 9s, not before
        out = []
        while (entry := get(queue)) is not None:
            out.append((entry.message.body.decode(), entry.redelivered))
            queue.ack(entry)
        assert out == [("5:200", True), ("1:9", False), ("4:9", False), ("new:9", False),
                       ("2:5", False), ("7:5", False), ("9:3", False), ("6:2", False), ("0:1", False),
                       ("3:None", False), ("8:0", False)]
    finally:
        again.close()


def test_a_selector_consumer_gets_a_paged_out_higher_priority_message(tmp_path):
    broker = Broker(tmp_path)
    try:
        queue = broker.declare(max_in_memory_length=3)
        for i in range(5):
            publish(queue, f"low{i}", 1, kind="no")
        consumer = Consumer(selector="kind = 'yes'")
        queue.add_consumer(consumer)  # it looks at all five (reading two back)
        broker.settle()
        assert consumer.held == [] and queue.backlog.in_memory == 5
        publish(queue, "high-yes", 9, kind="yes")  # memory is full: paged out
        broker.settle()
        assert queue.backlog.paged == 0 and consumer.bodies() == ["high-yes"]
        publish(queue, "low-yes", 1, kind="yes")
        broker.settle()
        assert consumer.bodies() == ["high-yes", "low-yes"]
        assert queue.message_count == 5
    finally:
        broker.close()


def test_a_selector_scan_reading_back_a_higher_priority_looks_at_it(tmp_path):
    broker = Broker(tmp_path)
    try:
        queue = broker.declare(max_in_memory_length=3)
        publish(queue, "high-no", 9, kind="no")
        publish(queue, "low-no-1", 1, kind="no")
        publish(queue, "low-no-2", 1, kind="no")
        publish(queue, "high-no-2", 9, kind="no")  # memory is full: these two are paged out
        publish(queue, "high-yes", 9, kind="yes")
        consumer = Consumer(selector="kind = 'yes'")
        queue.add_consumer(consumer)  # looks at the three in memory, then reads more back
        broker.settle()
        assert consumer.bodies() == ["high-yes"]
    finally:
        broker.close()
