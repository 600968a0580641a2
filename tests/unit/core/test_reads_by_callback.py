"""Core reads its store by callback, never on the event loop: page-ins, the scheduler's
window and a stream consumer's start by timestamp, on a manual clock with a real SQLite
store in ``tmp_path`` whose answers reach the loop only when the test releases them
(and which refuses any blocking read on the loop's thread: ``forbid_loop_reads``)."""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_priority_queue import Consumer

from leveret.core import BrokerCore, Message, scheduler as scheduler_module
from leveret.core.clock import ManualClock
from leveret.core.message import Properties
from leveret.core.queues import ClassicQueue, stream as stream_module
from leveret.core.queues.backlog import PAGE_IN_BATCH
from leveret.core.scheduler import Schedule
from leveret.store.sqlite import SQLiteStore


class HeldStore(SQLiteStore):
    """A real SQLite store whose read answers wait, on the loop, for :meth:`release`."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.held: list[tuple[Callable[[Any], None], Any]] = []
        self.asked = 0  # reads asked for so far

    def _ask(self, query: Callable[[Any], Any], finish: Callable[[Any], None]) -> None:
        self.asked += 1
        super()._ask(query, finish)

    def _answered(self, finish: Callable[[Any], None], result: object) -> None:
        self.held.append((finish, result))

    def release(self) -> int:
        """Hand every answer read so far to its asker; how many."""
        held, self.held = self.held, []
        for finish, result in held:
            super()._answered(finish, result)
        return len(held)


class Broker:
    def __init__(self, path: Path, guard: bool = True) -> None:
        self.clock = ManualClock(1_800_000_000.0)
        self.core = BrokerCore(self.clock)
        self.loop = asyncio.new_event_loop()
        self.store = HeldStore(path)
        self.core.attach_store(self.store)
        self.store.start(self.loop)
        self.store.forbid_loop_reads = guard  # a blocking read on the loop raises LoopRead
        self.vhost = self.core.vhosts["/"]

    def run(self, until: Callable[[], bool]) -> None:
        """Run the loop until ``until()`` (10 s at most)."""

        async def wait() -> None:
            while not until():
                await asyncio.sleep(0.001)

        self.loop.run_until_complete(asyncio.wait_for(wait(), 10))

    def read(self) -> None:
        """Let the reader thread answer every read asked for (the answers stay held)."""
        self.run(lambda: len(self.store.held) == self.store.reads_in_flight)

    def release(self) -> None:
        """Every read asked for is answered, on the loop."""
        self.read()
        self.store.release()

    def durable(self) -> None:
        future = self.loop.create_future()
        self.store.when_durable(future.set_result)
        assert self.loop.run_until_complete(asyncio.wait_for(future, 10))

    def declare(self, name: str = "q", **arguments: Any) -> ClassicQueue:
        args = {f"x-{k.replace('_', '-')}": v for k, v in arguments.items()}
        queue = self.vhost.declare_queue(name, None, durable=True, arguments=args)
        assert isinstance(queue, ClassicQueue)
        return queue

    def close(self) -> None:
        self.store.close()
        self.loop.close()


@pytest.fixture
def broker(tmp_path: Path):
    handle = Broker(tmp_path)
    yield handle
    handle.close()


def publish(queue: Any, body: str, priority: int | None = None, expiration: str | None = None) -> None:
    properties = Properties(delivery_mode=2, priority=priority, expiration=expiration)
    queue.enqueue(Message.build("", queue.name, body.encode(), properties))


def settle(queue: ClassicQueue, consumer: Consumer) -> list[str]:
    """Acknowledge what ``consumer`` holds; its bodies."""
    bodies = consumer.bodies()
    held, consumer.held = consumer.held, []
    for entry in held:
        queue.ack(entry)
    return bodies


# -- page-ins -------------------------------------------------------------------------------
def test_a_consumer_gets_paged_out_messages_in_order_once_the_store_answers(broker):
    queue = broker.declare(max_in_memory_length=10)
    for i in range(30):
        publish(queue, str(i))
    assert (queue.backlog.live, queue.backlog.paged) == (10, 20)
    consumer = Consumer(prefetch=100)
    queue.add_consumer(consumer)
    got = settle(queue, consumer)
    assert got == [str(i) for i in range(10)]
    assert queue.backlog.live == 0 and queue.backlog.reading  # nothing in memory: it waits
    assert consumer.held == []  # nothing came from an inline read
    while len(got) < 30:
        broker.release()
        got += settle(queue, consumer)
    assert got == [str(i) for i in range(30)]
    assert queue.message_count == 0 and queue.unacked_count == 0


def test_the_next_page_is_asked_for_before_memory_runs_out(broker):
    queue = broker.declare(max_in_memory_length=100)
    for i in range(300):
        publish(queue, str(i))
    broker.durable()
    consumer = Consumer(prefetch=10)
    queue.add_consumer(consumer)
    asked = broker.store.asked
    got: list[str] = []
    while len(got) < 300:
        got += settle(queue, consumer)  # ack: the window opens, the queue dispatches
        queue.drain()
        if broker.store.asked > asked:  # a read was asked for: memory had not run out
            asked = broker.store.asked
            assert queue.backlog.live >= 40
            assert consumer.held  # and the consumer was served meanwhile
            broker.release()
    assert got == [str(i) for i in range(300)]
    assert asked >= 4  # 200 paged out, read back ahead in batches of at most 100


def test_under_memory_pressure_a_default_queue_pages_out_and_reads_ahead_one_batch(broker):
    """Memory pressure: a default queue's new messages go to the store; read back, the
    next batch is asked for once less than a batch is left in memory (the consumer does
    not wait for the disk), never more than two batches in memory."""
    queue = broker.declare()
    broker.core.set_memory_pressure(True)
    for i in range(3 * PAGE_IN_BATCH):
        publish(queue, str(i))
    assert (queue.backlog.live, queue.backlog.paged) == (0, 3 * PAGE_IN_BATCH)
    broker.durable()
    consumer = Consumer(prefetch=10)
    queue.add_consumer(consumer)
    broker.release()
    assert queue.backlog.live == PAGE_IN_BATCH - 10  # a consumer took its window
    asked = broker.store.asked
    got = settle(queue, consumer)
    queue.drain()  # the window opens: the queue dispatches
    assert broker.store.asked == asked + 1 and queue.backlog.live > 0  # ahead, not when empty
    while len(got) < 3 * PAGE_IN_BATCH:
        broker.release()
        assert queue.backlog.live + len(consumer.held) <= 2 * PAGE_IN_BATCH
        got += settle(queue, consumer)
        queue.drain()
    assert got == [str(i) for i in range(3 * PAGE_IN_BATCH)]


def test_memory_pressure_moves_what_is_in_memory_but_never_a_delivered_message(broker):
    """Memory pressure moves the ready messages above every delivered one to the store
    (a batch stays); the unacknowledged ones, one of them requeued, are neither read
    back twice nor lost: every message comes once, in order."""
    queue = broker.declare()
    count = 3 * PAGE_IN_BATCH
    for i in range(count):
        publish(queue, str(i))
    consumer = Consumer(prefetch=10)
    queue.add_consumer(consumer)
    delivered = list(consumer.held)
    assert [e.message.body for e in delivered] == [str(i).encode() for i in range(10)]
    queue.requeue([delivered[3]])  # back in memory, below delivered ones: it stays there
    consumer.held = [e for e in consumer.held if e is not delivered[3]]
    broker.core.set_memory_pressure(True)
    broker.clock.advance(0)  # the page-out runs on the queue's timer
    assert queue.backlog.paged == count - 9 - PAGE_IN_BATCH  # above the delivered ones
    assert queue.backlog.live == PAGE_IN_BATCH and queue.backlog.ready[0] is delivered[3]
    broker.core.set_memory_pressure(False)
    got = settle(queue, consumer)
    consumer.prefetch = 0  # no window: the rest comes as fast as it is read back
    while len(got) < count:
        queue.drain()
        broker.release()
        got += settle(queue, consumer)
    # the nine held, the requeued one again, then the rest: each once, none lost
    assert got == [str(i) for i in (0, 1, 2, 4, 5, 6, 7, 8, 9, 3)] + [str(i) for i in range(10, count)]
    assert queue.message_count == 0 and queue.unacked_count == 0


def test_a_paged_out_higher_priority_waits_for_the_answer_before_lower_ones_in_memory(broker):
    queue = broker.declare(max_priority=10, max_in_memory_length=3)
    for i in range(3):
        publish(queue, f"low{i}", 1)
    publish(queue, "high", 9)  # memory is full: paged out, ahead of the lower ones
    consumer = Consumer(prefetch=100)
    queue.add_consumer(consumer)
    assert consumer.held == []  # the lower ones wait too: order first
    broker.release()
    assert settle(queue, consumer) == ["high", "low0", "low1", "low2"]


def test_a_purge_while_a_read_is_on_its_way_drops_its_answer(broker):
    queue = broker.declare(max_in_memory_length=5)
    for i in range(20):
        publish(queue, str(i))
    consumer = Consumer(prefetch=100)
    queue.add_consumer(consumer)
    assert settle(queue, consumer) == [str(i) for i in range(5)]
    assert queue.backlog.reading
    assert queue.purge() == 15
    broker.release()  # the answer comes after the purge
    assert consumer.held == [] and queue.message_count == 0
    publish(queue, "after")
    assert settle(queue, consumer) == ["after"]


def test_a_deleted_queue_ignores_the_answer(broker):
    queue = broker.declare(max_in_memory_length=2)
    for i in range(6):
        publish(queue, str(i))
    consumer = Consumer(prefetch=100)
    queue.add_consumer(consumer)
    settle(queue, consumer)
    assert queue.backlog.reading
    broker.vhost.delete_queue("q")
    broker.release()
    assert consumer.held == []


def test_basic_get_waits_for_messages_on_their_way(broker):
    queue = broker.declare(max_in_memory_length=2)
    for i in range(4):
        publish(queue, str(i))
    taken = [queue.get(), queue.get()]
    assert [e.message.body for e in taken if e is not None] == [b"0", b"1"]
    assert queue.get() is None and queue.paging_in()  # on its way: basic.get waits
    woken: list[bool] = []
    queue.when_paged_in(woken.append)
    assert woken == []
    broker.release()
    assert woken == [True]
    entry = queue.get()
    assert entry is not None and entry.message.body == b"2"


def test_a_message_that_expired_on_disk_while_read_back_is_not_delivered(tmp_path: Path):
    # The paged-out expiry sweep still reads the store itself (see the report): no guard.
    broker = Broker(tmp_path, guard=False)
    try:
        dlq = broker.declare("dlq")
        queue = broker.declare(max_in_memory_length=2, dead_letter_exchange="", dead_letter_routing_key="dlq")
        for i in range(6):
            publish(queue, str(i), expiration="100" if i == 3 else None)
        broker.durable()
        consumer = Consumer(prefetch=100)
        queue.add_consumer(consumer)
        assert settle(queue, consumer) == ["0", "1"]
        broker.read()  # the store has read 2..5; the answer waits
        broker.clock.advance(0.2)  # 3 dies on disk meanwhile
        broker.durable()  # and its deletion is written before the answer
        assert dlq.message_count == 1
        broker.store.release()
        got = settle(queue, consumer)
        while queue.message_count:
            broker.release()
            got += settle(queue, consumer)
        assert got == ["2", "4", "5"]
        assert dlq.message_count == 1
    finally:
        broker.close()


# -- the scheduler's window -------------------------------------------------------------------
def test_jobs_beyond_the_window_come_back_by_callback_and_a_cancelled_one_stays_gone(tmp_path, monkeypatch):
    monkeypatch.setattr(scheduler_module, "WINDOW", 4)
    monkeypatch.setattr(scheduler_module, "EVICT_SLACK", 2)
    monkeypatch.setattr(scheduler_module, "READ_BATCH", 3)
    broker = Broker(tmp_path)
    try:
        queue = broker.declare("jobs")
        scheduler = broker.core.scheduler
        for i in range(12):
            message = Message.build("", "jobs", str(i).encode(), Properties(delivery_mode=2))
            scheduler.schedule("/", "", message, Schedule(delay=1000 * (i + 1)), job_id=f"job-{i}")
        assert len(scheduler._memory) == 4  # the rest only in the store
        broker.durable()
        scheduler.cancel("job-0")
        got: list[str] = []
        for _ in range(40):
            broker.clock.advance(1)
            broker.release()
            while (entry := queue.get()) is not None:
                got.append(entry.message.body.decode())
                queue.ack(entry)
            if len(got) == 11:
                break
        assert got == [str(i) for i in range(1, 12)]
        assert broker.store.asked >= 3 and scheduler.pending == 0
    finally:
        broker.close()


def test_a_job_cancelled_while_the_window_is_read_is_not_delivered(tmp_path, monkeypatch):
    monkeypatch.setattr(scheduler_module, "WINDOW", 2)
    monkeypatch.setattr(scheduler_module, "EVICT_SLACK", 1)
    monkeypatch.setattr(scheduler_module, "READ_BATCH", 5)
    broker = Broker(tmp_path, guard=False)  # cancel looks a job up in the store itself
    try:
        queue = broker.declare("jobs")
        scheduler = broker.core.scheduler
        for i in range(6):
            message = Message.build("", "jobs", str(i).encode(), Properties(delivery_mode=2))
            scheduler.schedule("/", "", message, Schedule(delay=1000 * (i + 1)), job_id=f"job-{i}")
        broker.durable()
        broker.clock.advance(2.5)  # 0 and 1 fire; the window is read again
        broker.read()  # read: 2, 3, 4, 5
        assert scheduler.cancel("job-3")  # cancelled before the answer is taken
        broker.store.release()
        broker.clock.advance(10)
        broker.release()
        got = []
        while (entry := queue.get()) is not None:
            got.append(entry.message.body.decode())
        assert got == ["0", "1", "2", "4", "5"]
    finally:
        broker.close()


# -- a stream consumer's start by timestamp -----------------------------------------------------
class StreamConsumer(Consumer):
    def __init__(self, offset: Any) -> None:
        super().__init__(prefetch=100)
        self.arguments = {"x-stream-offset": offset}


def test_a_stream_consumer_older_than_the_tail_starts_when_the_store_answers(broker, monkeypatch):
    monkeypatch.setattr(stream_module, "IN_MEMORY_TAIL", 3)
    stream = broker.vhost.declare_queue("log", None, durable=True, arguments={"x-queue-type": "stream"})
    start = broker.clock.time()
    for i in range(10):
        broker.clock.advance(1)
        publish(stream, str(i))
    broker.durable()
    since = datetime.datetime.fromtimestamp(start + 4.5, datetime.UTC)  # 4 was published at +5
    consumer = StreamConsumer(since)
    stream.prepare_consumer(consumer)
    stream.add_consumer(consumer)
    assert consumer.held == []  # its start is being looked up
    broker.release()  # where it starts
    assert consumer.held == []  # 4..6 are older than the tail: asked of the store too
    broker.release()
    assert consumer.bodies() == [str(i) for i in range(4, 10)]
    assert [entry.seq - 1 for entry in consumer.held] == list(range(4, 10))  # offsets


def test_a_stream_read_from_the_first_offset_comes_in_batches_from_the_store(broker, monkeypatch):
    monkeypatch.setattr(stream_module, "IN_MEMORY_TAIL", 2)
    monkeypatch.setattr(stream_module, "READ_BATCH", 3)
    stream = broker.vhost.declare_queue("log", None, durable=True, arguments={"x-queue-type": "stream"})
    for i in range(10):
        publish(stream, str(i))
    broker.durable()
    consumer = StreamConsumer("first")
    stream.prepare_consumer(consumer)
    stream.add_consumer(consumer)
    bodies: list[str] = []
    for _ in range(5):
        bodies += settle(stream, consumer)
        stream.drain()
        broker.release()
    bodies += settle(stream, consumer)
    assert bodies == [str(i) for i in range(10)]
    assert broker.store.asked == 3  # offsets 0-2, 3-5, 6-7: the tail holds 8 and 9


def test_a_stream_reader_half_way_through_a_batch_has_the_next_one_asked_for(broker, monkeypatch):
    monkeypatch.setattr(stream_module, "IN_MEMORY_TAIL", 2)
    monkeypatch.setattr(stream_module, "READ_BATCH", 4)
    stream = broker.vhost.declare_queue("log", None, durable=True, arguments={"x-queue-type": "stream"})
    for i in range(14):
        publish(stream, str(i))
    broker.durable()
    consumer = StreamConsumer("first")
    consumer.prefetch = 3
    stream.prepare_consumer(consumer)
    stream.add_consumer(consumer)
    broker.release()  # offsets 0-3
    assert consumer.bodies() == ["0", "1", "2"]
    assert broker.store.reads_in_flight == 1  # 4-7 asked for before the reader gets there
    bodies = settle(stream, consumer)
    stream.drain()
    assert consumer.bodies() == ["3"]  # 4 is on its way
    for _ in range(6):
        broker.release()
        bodies += settle(stream, consumer)
        stream.drain()
    bodies += settle(stream, consumer)
    assert bodies == [str(i) for i in range(14)]
    assert broker.store.asked == 3  # 0-3, 4-7, 8-11: the tail holds 12 and 13


def test_two_stream_readers_far_apart_each_keep_their_window(broker, monkeypatch):
    # Spark reads a stream with one consumer per partition: each has its own reads on
    # their way and its own batches, neither waits for nor evicts the other's.
    monkeypatch.setattr(stream_module, "IN_MEMORY_TAIL", 2)
    monkeypatch.setattr(stream_module, "READ_BATCH", 4)
    stream = broker.vhost.declare_queue("log", None, durable=True, arguments={"x-queue-type": "stream"})
    for i in range(30):
        publish(stream, str(i))
    broker.durable()
    early, late = StreamConsumer(0), StreamConsumer(14)
    for consumer in (early, late):
        stream.prepare_consumer(consumer)
        stream.add_consumer(consumer)
    assert broker.store.reads_in_flight == 2  # one for each, at once
    bodies: dict[StreamConsumer, list[str]] = {early: [], late: []}
    for _ in range(12):
        broker.release()
        for consumer in (early, late):
            bodies[consumer] += settle(stream, consumer)
        stream.drain()
        assert len(stream._chunk) <= 4 * 4  # two batches a reader at most
    assert bodies[early] == [str(i) for i in range(30)]
    assert bodies[late] == [str(i) for i in range(14, 30)]
    # 0-27 for the early reader in batches of 4 (7), 14-27 for the late one (4): the
    # tail holds 28 and 29; nothing read twice
    assert broker.store.asked == 11
