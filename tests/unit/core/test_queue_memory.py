"""The broker-wide count of bytes queues hold messages in (:mod:`leveret.core.queue_memory`):
kept exact by every way a message enters or leaves a queue's memory, and the budget's
hysteresis, which the memory monitor turns into memory pressure (OR-ed with resident
memory's paging threshold)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_priority_queue import Consumer
from test_reads_by_callback import Broker, settle

from leveret.core import BrokerCore, Message
from leveret.core.clock import ManualClock
from leveret.core.message import Properties
from leveret.core.queue_memory import DEFAULT_BUDGET, ENTRY_OVERHEAD, QueueMemory, default_budget
from leveret.core.queues.backlog import PAGE_IN_BATCH
from leveret.server.memory_monitor import MemoryMonitor


@pytest.fixture
def broker(tmp_path: Path):
    handle = Broker(tmp_path)
    yield handle
    handle.close()


def transient(queue: Any, body: bytes, priority: int | None = None) -> None:
    properties = Properties(delivery_mode=1, priority=priority)
    queue.enqueue(Message.build("", queue.name, body, properties))


def cost(count: int, size: int) -> int:
    return count * (size + ENTRY_OVERHEAD)


def test_the_budget_is_exceeded_past_the_high_mark_and_until_under_the_low_mark():
    memory = QueueMemory(budget=1000, low_ratio=0.5)
    memory.held = 1000
    assert not memory.check()  # at the budget: not over it
    memory.held = 1001
    assert memory.check()
    memory.held = 600  # under the budget, above the low mark: still over (no flapping)
    assert memory.check()
    memory.held = 499
    assert not memory.check()
    memory.held = 900  # between the marks again: stays off
    assert not memory.check()
    memory.budget = 0  # no budget: never over
    memory.held = 10**12
    assert not memory.check()


def test_the_default_budget_is_128_mib_or_a_quarter_of_the_watermark():
    assert default_budget(0) == DEFAULT_BUDGET == 128 * 1024 * 1024  # RAM unknown
    assert default_budget(10 * 1024**3) == DEFAULT_BUDGET
    assert default_budget(256 * 1024 * 1024) == 64 * 1024 * 1024  # a container's watermark


def test_the_count_follows_publishing_delivery_paging_and_purging(broker):
    held = broker.core.queue_memory
    queue = broker.declare()
    count = 3 * PAGE_IN_BATCH
    for i in range(count):
        transient(queue, b"x%05d" % i)
    assert held.held == cost(count, 6)
    broker.core.set_memory_pressure(True)  # what is in memory moves to the store, but a batch
    broker.clock.advance(0)
    assert (queue.backlog.live, queue.backlog.paged) == (PAGE_IN_BATCH, count - PAGE_IN_BATCH)
    assert held.held == cost(PAGE_IN_BATCH, 6)
    broker.core.set_memory_pressure(False)
    broker.durable()
    consumer = Consumer(prefetch=0)
    queue.add_consumer(consumer)
    got = settle(queue, consumer)
    while len(got) < count:  # read back, counted again, and delivered
        queue.drain()
        broker.release()
        got += settle(queue, consumer)
    assert got == [f"x{i:05d}" for i in range(count)]
    assert held.held == 0
    queue.remove_consumer(consumer)
    for _ in range(10):
        transient(queue, b"y" * 100)
    consumer = Consumer(prefetch=0)
    queue.add_consumer(consumer)
    assert held.held == 0  # delivered
    queue.remove_consumer(consumer)
    queue.requeue(list(consumer.held))  # requeued: back in memory
    assert held.held == cost(10, 100)
    queue.purge()
    assert held.held == 0


def test_priority_queues_and_deleted_queues_give_their_bytes_back(broker):
    held = broker.core.queue_memory
    queue = broker.declare("prio", max_priority=5)
    for i in range(50):
        transient(queue, b"p" * 10, priority=i % 6)
    assert held.held == cost(50, 10)
    consumer = Consumer(prefetch=20)
    queue.add_consumer(consumer)
    assert held.held == cost(30, 10)  # 20 delivered
    settle(queue, consumer)
    other = broker.declare("other")
    for _ in range(7):
        transient(other, b"o" * 1000)
    assert held.held == cost(30, 10) + cost(7, 1000)  # one count for every queue, every vhost
    broker.vhost.delete_queue("other")
    queue.purge()
    assert held.held == 0


def test_over_budget_the_monitor_sets_memory_pressure_whatever_the_resident_size():
    core = BrokerCore(ManualClock())
    budget = [1000]
    used = [100]
    monitor = MemoryMonitor(core, lambda: 10_000, resident=lambda: used[0], budget=lambda: budget[0])
    monitor.check()
    assert not core.memory_pressure
    core.queue_memory.held = 1500  # resident memory is low: the budget alone pages
    monitor.check()
    assert core.memory_pressure and all(v.memory_pressure for v in core.vhosts.values())
    core.queue_memory.held = 700  # above the low mark: still paging
    monitor.check()
    assert core.memory_pressure
    core.queue_memory.held = 400
    monitor.check()
    assert not core.memory_pressure
    used[0] = 6000  # resident memory past the paging ratio pages with the budget unused
    monitor.check()
    assert core.memory_pressure
    used[0] = 100
    budget[0] = 0  # no budget (queue_memory_budget = 0)
    core.queue_memory.held = 10**9
    monitor.check()
    assert not core.memory_pressure
    monitor = MemoryMonitor(core, lambda: 10_000, resident=lambda: None, budget=lambda: 1000)
    monitor.check()  # no /proc: the budget still applies
    assert core.memory_pressure
