"""Backlog.wanted: how many paged-out messages a queue asks the store for at a dispatch
(the read-ahead of docs/architecture.md's delivery flow), on a backlog whose counts are
set directly."""

from __future__ import annotations

from leveret.core.queue_config import BOUNDED_IN_MEMORY, DEFAULT_IN_MEMORY, DEFAULT_IN_MEMORY_BYTES
from leveret.core.queues.backlog import PAGE_IN_BATCH, Backlog


def backlog(
    live: int, paged: int, size: int = 10, max_in_memory: int = 100, max_bytes: int = 10**9
) -> Backlog:
    """A backlog of ``live`` messages in memory and ``paged`` in the store, each of
    ``size`` body bytes."""
    made = Backlog("q", max_in_memory, max_bytes)
    made.live, made.paged = live, paged
    made.bytes, made.memory_bytes = (live + paged) * size, live * size
    return made


def test_nothing_is_asked_while_a_read_is_on_its_way_or_nothing_is_paged_out():
    on_its_way = backlog(0, 50)
    on_its_way.reading = True
    assert on_its_way.wanted(0, 0) == 0
    assert backlog(0, 0).wanted(0, 0) == 0


def test_an_empty_memory_asks_for_at_least_one_message_even_without_room():
    assert backlog(0, 500).wanted(0, 0) == 100  # a batch that fits the limit
    assert backlog(0, 500).wanted(150, 0) == 1  # over the limit (e.g. other priority levels)


def test_reading_ahead_starts_once_half_a_batch_fits():
    assert backlog(51, 500).wanted(51, 510) == 0  # 49 fit: less than half of 100
    assert backlog(50, 500).wanted(50, 500) == 50
    assert backlog(50, 500).wanted(50, 500, ahead=False) == 0  # memory is short
    assert backlog(100, 500).wanted(100, 1000) == 0  # full


def test_twice_the_limits_for_selectors_looking_past_memory():
    assert backlog(100, 500).wanted(100, 1000, scale=2) == 100


def test_the_byte_budget_shrinks_the_batch_at_the_average_size():
    big = backlog(0, 500, size=1000, max_bytes=20_000)  # 20 messages of 1000 bytes fit
    assert big.wanted(0, 0) == 20
    assert backlog(0, 5000, max_in_memory=5000).wanted(0, 0) == PAGE_IN_BATCH


def test_a_default_queue_reads_back_no_further_ahead_than_a_bounded_one():
    """Unlimited in memory (paged out under memory pressure, or recovered with a long
    backlog): read back a batch at a time up to the bounded queue's 50,000, not all."""
    default = backlog(0, 10**6, size=1024, max_in_memory=DEFAULT_IN_MEMORY, max_bytes=DEFAULT_IN_MEMORY_BYTES)
    assert default.wanted(0, 0) == PAGE_IN_BATCH
    default.live = BOUNDED_IN_MEMORY - PAGE_IN_BATCH
    assert default.wanted(default.live, 0) == PAGE_IN_BATCH
    default.live = BOUNDED_IN_MEMORY - 10
    assert default.wanted(default.live, 0) == 0


def test_page_out_stays_above_a_row_read_back_into_its_redelivery_delay():
    # A nacked message's back-off outlived a restart: read back, it waits outside the
    # ready messages. Memory pressure must not move ready messages from before it back
    # to the store, or the next read would bring it (and its place in ``paged``) twice.
    from leveret.store.base import StoredMessage

    made = Backlog("q", DEFAULT_IN_MEMORY, DEFAULT_IN_MEMORY_BYTES)
    made.restore(3000, 3000)
    made.reading = True
    rows = [
        StoredMessage(seq, 1, seq, 0, "", "q", bytes(14), b"x", available_at=1e12 if seq == 2500 else 0.0)
        for seq in range(1, 3001)
    ]
    made.take_page(made.generation, rows, now=1.0)
    assert [entry.seq for _, entry in made.waiting] == [2500]
    moved = made.page_out(1000, 10_000)
    assert [entry.seq for entry in moved] == list(range(2501, 3001))  # only what comes after it
    assert made.paged_after == 2500 and made.paged == 500
