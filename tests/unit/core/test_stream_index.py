"""The stream chunk index (core.queues.stream_index) and the stream filter's reading of
consume arguments (core.stream_filter), without a broker."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings, strategies as st

from leveret.core.queues.stream_index import (
    CHUNK_SIZE,
    MAX_EXACT_VALUES,
    ChunkIndex,
    ChunkSummary,
    bloom_bits,
)
from leveret.core.stream_filter import StreamFilter, from_arguments


def brute_candidates(values: list[str | None], start: int, limit: int, wanted: StreamFilter) -> int:
    """The first offset at or after ``start`` whose value passes ``wanted``, else limit."""
    for offset in range(start, limit):
        if wanted.matches(values[offset]):
            return offset
    return limit


def index_of(values: list[str | None], filter_size: int = 16) -> ChunkIndex:
    index = ChunkIndex(filter_size)
    for offset, value in enumerate(values):
        index.add(offset, value)
    return index


def walk(index: ChunkIndex, start: int, limit: int, wanted: StreamFilter) -> list[int]:
    """The offsets a consumer would read: every candidate the index gives."""
    got, offset = [], start
    while offset < limit:
        offset = index.next_candidate(offset, limit, wanted)
        if offset < limit:
            got.append(offset)
            offset += 1
    return got


def test_one_value_in_many_chunks_is_found_exactly():
    values: list[str | None] = [None] * (50 * CHUNK_SIZE)
    values[7] = values[31 * CHUNK_SIZE + 5] = "rare"
    for i in range(100, len(values), 3):
        values[i] = "common"
    index = index_of(values)
    assert walk(index, 0, len(values), StreamFilter.of(["rare"])) == [7, 31 * CHUNK_SIZE + 5]
    assert walk(index, 8, len(values), StreamFilter.of(["rare"])) == [31 * CHUNK_SIZE + 5]
    assert walk(index, 0, len(values), StreamFilter.of(["none"])) == []


def test_match_unfiltered_takes_the_positions_without_a_value():
    values = ["a", None, "b", None, "a"]
    index = index_of(values)
    assert walk(index, 0, 5, StreamFilter.of(["a"], True)) == [0, 1, 3, 4]
    assert walk(index, 0, 5, StreamFilter.of(["b"])) == [2]
    assert walk(index, 0, 5, StreamFilter.of([], True)) == [1, 3]


def test_a_chunk_with_many_values_turns_bloom_without_false_negatives():
    values = [f"v{i % 40}" for i in range(CHUNK_SIZE)]  # 40 values: past the exact limit
    index = index_of(values, filter_size=255)
    summary = index.chunks[0]
    assert summary.by_value is None and summary.bloom
    for probe in ("v3", "v39", "v17"):
        found = walk(index, 0, CHUNK_SIZE, StreamFilter.of([probe]))
        assert int(probe[1:]) in found  # never missed; the others are false positives to test
    # a value the Bloom filter rules out skips the chunk
    absent = next(f"x{i}" for i in range(10_000) if bloom_bits(f"x{i}", 255) & ~summary.bloom)
    assert walk(index, 0, CHUNK_SIZE, StreamFilter.of([absent])) == []


def test_exact_up_to_the_limit_of_values():
    values = [f"v{i % MAX_EXACT_VALUES}" for i in range(CHUNK_SIZE)]
    index = index_of(values)
    assert index.chunks[0].by_value is not None
    assert walk(index, 0, CHUNK_SIZE, StreamFilter.of(["v3"])) == list(range(3, CHUNK_SIZE, MAX_EXACT_VALUES))


def test_unknown_chunks_are_read_in_full():
    values: list[str | None] = [None] * (3 * CHUNK_SIZE)
    index = index_of(values)
    del index.chunks[1]  # its summary was lost
    wanted = StreamFilter.of(["x"])
    assert index.next_candidate(0, len(values), wanted) == CHUNK_SIZE
    assert index.next_candidate(CHUNK_SIZE + 9, len(values), wanted) == CHUNK_SIZE + 9
    assert index.next_candidate(2 * CHUNK_SIZE, len(values), wanted) == len(values)


def test_max_chunks_bounds_one_call():
    index = index_of([None] * (10 * CHUNK_SIZE))
    wanted = StreamFilter.of(["x"])
    assert index.next_candidate(0, 10 * CHUNK_SIZE, wanted, max_chunks=3) == 3 * CHUNK_SIZE
    assert index.next_candidate(0, 10 * CHUNK_SIZE, wanted) == 10 * CHUNK_SIZE


def test_summaries_round_trip_through_json():
    values: list[str | None] = ["a", None, "é", "a"] * 300
    exact = index_of(values).chunks[0]
    bloom = index_of([f"v{i}" for i in range(CHUNK_SIZE)]).chunks[0]
    for summary in (exact, bloom):
        back = ChunkSummary.from_json(summary.to_json())
        assert (back.by_value, back.unfiltered, back.filtered, back.bloom) == (
            summary.by_value, summary.unfiltered, summary.filtered, summary.bloom)
    with pytest.raises((ValueError, KeyError, TypeError)):
        ChunkSummary.from_json('{"u": 1}')


def test_bloom_bits_are_stable_across_processes():
    # crc32/adler32, not hash(): the saved Bloom filters stay valid after a restart
    assert bloom_bits("apple", 16) == bloom_bits("apple", 16)
    assert bloom_bits("apple", 16).bit_count() <= 3
    assert bloom_bits("apple", 16) < 1 << 128 and bloom_bits("apple", 255) < 1 << 2040


def test_drop_below_forgets_whole_chunks_only():
    index = index_of([None] * (4 * CHUNK_SIZE))
    assert index.drop_below(2 * CHUNK_SIZE + 5) == [0, 1]
    assert sorted(index.chunks) == [2, 3]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.one_of(st.none(), st.sampled_from(["a", "b", "c"]), st.text(max_size=3)),
             min_size=1, max_size=3 * CHUNK_SIZE),
    st.lists(st.sampled_from(["a", "b", "c", "zz", ""]), max_size=3),
    st.booleans(),
    st.integers(0, 3 * CHUNK_SIZE),
    st.sampled_from([16, 64]),
)
def test_the_index_never_skips_a_match(values, wanted_values, unfiltered, start, size):
    index = index_of(values, size)
    wanted = StreamFilter.of(wanted_values, unfiltered)
    start = min(start, len(values))
    found = walk(index, start, len(values), wanted)
    expected = [o for o in range(start, len(values)) if wanted.matches(values[o])]
    assert set(expected) <= set(found)
    # exact chunks give exactly the matches
    for offset in found:
        if index.chunks[offset // CHUNK_SIZE].by_value is not None:
            assert wanted.matches(values[offset])


def test_random_streams_agree_with_a_scan():
    rng = random.Random(30)
    values = [rng.choice([None, "a", "b", *(f"n{i}" for i in range(40))]) for _ in range(5 * CHUNK_SIZE)]
    index = index_of(values)
    wanted = StreamFilter.of(["a"], False)
    found = walk(index, 0, len(values), wanted)
    assert [o for o in found if values[o] == "a"] == [o for o, v in enumerate(values) if v == "a"]
    assert found[0] <= brute_candidates(values, 0, len(values), wanted)  # Bloom chunks: false positives


@pytest.mark.parametrize(("arguments", "expected"), [
    ({}, None),
    ({"x-stream-filter": "a"}, StreamFilter.of(["a"])),
    ({"x-stream-filter": b"a"}, StreamFilter.of(["a"])),
    ({"x-stream-filter": ["a", "b"], "x-stream-match-unfiltered": True}, StreamFilter.of(["a", "b"], True)),
    # RabbitMQ's rabbit_stream_queue:filter_spec: no errors, the ill-typed parts are dropped
    ({"x-stream-filter": ["a", 1, True]}, StreamFilter.of(["a"])),
    ({"x-stream-filter": 42}, None),
    ({"x-stream-filter": "a", "x-stream-match-unfiltered": "yes"}, StreamFilter.of(["a"], False)),
    ({"x-stream-match-unfiltered": True}, None),
])
def test_consume_arguments_are_read_as_rabbitmq_reads_them(arguments, expected):
    assert from_arguments(arguments) == expected


def test_span_ends_after_the_last_candidate_unless_dense():
    values: list[str | None] = [None] * (3 * CHUNK_SIZE)
    values[5] = values[700] = values[2000] = "rare"
    index = index_of(values)
    wanted = StreamFilter.of(["rare"])
    assert index.span(5, 1005, wanted) == 701  # reads offsets 5..700, not the whole batch
    assert index.span(700, 1700, wanted) == 701
    dense = index_of(["a"] * CHUNK_SIZE)
    assert dense.span(0, 1000, StreamFilter.of(["a"]), most=64) == 1000
