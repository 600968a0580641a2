"""Paged-out messages that expire in the store, on a manual clock with a real SQLite
store: what expires dies once, what is behind it still comes, counts stay right, and a
row not yet on disk when its time comes expires once it is."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_priority_queue import Broker, get

from leveret.core import Message
from leveret.core.message import Properties


def message(body: str, expiration: str | None = None) -> Message:
    return Message.build("", "q", body.encode(), Properties(delivery_mode=2, expiration=expiration))


def take_all(queue) -> list[str]:
    got = []
    while (entry := get(queue)) is not None:
        got.append(entry.message.body.decode())
        queue.ack(entry)
    return got


@pytest.mark.parametrize("max_priority", [None, 5])
def test_messages_expiring_on_disk_do_not_hide_the_ones_behind(tmp_path: Path, max_priority):
    broker = Broker(tmp_path)
    try:
        dlq = broker.declare("dlq", max_priority=None, durable=True)
        queue = broker.declare(
            "q",
            max_priority=max_priority,
            durable=True,
            max_in_memory_length=2,
            dead_letter_exchange="",
            dead_letter_routing_key="dlq",
        )
        for i in range(1, 11):  # 1-2 in memory, 3-10 paged out; 3 and 4 expire in 100 ms
            queue.enqueue(message(str(i), "100" if i in (3, 4) else None))
        broker.durable()
        assert (queue.message_count, queue.backlog.paged) == (10, 8)
        broker.clock.advance(0.2)  # they die on disk; their deletions still wait in the batch
        assert (queue.message_count, dlq.message_count) == (8, 2)
        assert take_all(queue) == ["1", "2", "5", "6", "7", "8", "9", "10"]  # read back meanwhile
        broker.durable()
        assert take_all(queue) == [] and queue.message_count == 0 and dlq.message_count == 2
    finally:
        broker.close()


def test_a_row_not_yet_written_when_due_expires_once_it_is(tmp_path: Path):
    broker = Broker(tmp_path)
    try:
        dlq = broker.declare("dlq", max_priority=None, durable=True)
        queue = broker.declare(
            "q",
            max_priority=None,
            durable=True,
            max_in_memory_length=1,
            dead_letter_exchange="",
            dead_letter_routing_key="dlq",
        )
        queue.enqueue(message("kept"))
        queue.enqueue(message("brief", "5"))  # paged out, due before its write is committed
        broker.clock.advance(0.01)
        broker.durable()
        broker.clock.advance(0)
        assert dlq.message_count == 1 and queue.message_count == 1
    finally:
        broker.close()
