"""A stream's chunk index: which filter values each chunk of its log holds, so that a
filtered consumer (:class:`~leveret.core.stream_filter.StreamFilter`) skips whole
chunks without reading, let alone decoding, their messages.

A *chunk* is :data:`CHUNK_SIZE` consecutive offsets (chunk ``n`` holds offsets
``n * CHUNK_SIZE`` up to the next chunk's first). Its :class:`ChunkSummary` keeps

- while the chunk holds at most :data:`MAX_EXACT_VALUES` distinct filter values: each
  value with the bitmask of its positions in the chunk, so a consumer finds the very
  offsets it wants (exact: no message of another value is even read);
- past that: a Bloom filter of the values (``x-stream-filter-size-bytes`` bytes, 16
  by default and 16..255 as RabbitMQ allows; 3 hash functions, stable across
  restarts) and the mask of the positions that have a value; a chunk that may hold a
  wanted value is read message by message and each one tested exactly;
- always: the mask of the unfiltered positions (for ``x-stream-match-unfiltered``).

RabbitMQ keeps one Bloom filter per chunk of its on-disk log (chunks follow the
publishing rate) and lets the client drop the false positives; leveret's chunks are
fixed ranges of offsets and its broker drops them. A chunk with no summary (one that
was sealed but whose summary was lost in a crash) is *unknown*: read in full.

The summaries are plain data (:meth:`ChunkSummary.to_json`), which the stream queue
saves in its store when a chunk is sealed and reads back at recovery.
"""

from __future__ import annotations

import json
import zlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..stream_filter import StreamFilter

CHUNK_BITS = 10
#: Offsets per chunk.
CHUNK_SIZE = 1 << CHUNK_BITS
_IN_CHUNK = CHUNK_SIZE - 1
#: Distinct filter values a chunk indexes exactly (with their positions); past this
#: it turns to a Bloom filter.
MAX_EXACT_VALUES = 16
#: A chunk's Bloom filter size when the stream does not set one (bytes), RabbitMQ's.
DEFAULT_FILTER_SIZE = 16
MIN_FILTER_SIZE, MAX_FILTER_SIZE = 16, 255
_HASHES = 3


def bloom_bits(value: str, size: int) -> int:
    """The Bloom filter bits (an int's bits, of ``size`` bytes) that ``value`` sets:
    :data:`_HASHES` of them, by double hashing of two CRCs (stable across processes)."""
    data = value.encode("utf-8", "surrogatepass")
    h1 = zlib.crc32(data)
    h2 = zlib.adler32(data) | 1
    m = size * 8
    bits = 0
    for i in range(_HASHES):
        bits |= 1 << ((h1 + i * h2) % m)
    return bits


class ChunkSummary:
    """What one chunk holds (see the module doc): ``by_value`` (value -> positions
    mask) while exact, else None with ``bloom`` and ``filtered`` (positions with a
    value); ``unfiltered``: positions without one. Positions are bits 0..CHUNK_SIZE-1."""

    __slots__ = ("bloom", "by_value", "filtered", "unfiltered")

    def __init__(self) -> None:
        self.by_value: dict[str, int] | None = {}
        self.unfiltered = 0
        self.filtered = 0
        self.bloom = 0

    def add(self, position: int, value: str | None, size: int) -> None:
        """Record the message at ``position`` with filter ``value`` (None: unfiltered);
        ``size``: the Bloom filter's bytes."""
        bit = 1 << position
        if value is None:
            self.unfiltered |= bit
            return
        self.filtered |= bit
        by_value = self.by_value
        if by_value is not None:
            if value in by_value:
                by_value[value] |= bit
                return
            if len(by_value) < MAX_EXACT_VALUES:
                by_value[value] = bit
                return
            for known in by_value:
                self.bloom |= bloom_bits(known, size)
            self.by_value = None
        self.bloom |= bloom_bits(value, size)

    def candidates(self, wanted: StreamFilter, size: int) -> int:
        """The mask of the positions whose message may pass ``wanted``: exact while the
        chunk is, else every filtered position when the Bloom filter may hold one of
        the wanted values."""
        mask = self.unfiltered if wanted.match_unfiltered else 0
        by_value = self.by_value
        if by_value is not None:
            if len(wanted.values) <= len(by_value):
                for value in wanted.values:
                    mask |= by_value.get(value, 0)
            else:
                for value, positions in by_value.items():
                    if value in wanted.values:
                        mask |= positions
        elif self.filtered and any(
            (bits := bloom_bits(value, size)) & self.bloom == bits for value in wanted.values
        ):
            mask |= self.filtered
        return mask

    def to_json(self) -> str:
        """The summary as JSON text (masks in hexadecimal), for the store."""
        data: dict[str, object] = {"u": f"{self.unfiltered:x}", "f": f"{self.filtered:x}"}
        if self.by_value is not None:
            data["v"] = {value: f"{mask:x}" for value, mask in self.by_value.items()}
        else:
            data["b"] = f"{self.bloom:x}"
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> ChunkSummary:
        """A summary written by :meth:`to_json`; ValueError (or KeyError, TypeError)
        when ``text`` is not one."""
        data = json.loads(text)
        summary = cls()
        summary.unfiltered = int(data["u"], 16)
        summary.filtered = int(data["f"], 16)
        if "v" in data:
            summary.by_value = {str(value): int(mask, 16) for value, mask in data["v"].items()}
        else:
            summary.by_value = None
            summary.bloom = int(data["b"], 16)
        return summary


class ChunkIndex:
    """The summaries of a stream's chunks, by chunk number; ``filter_size``: the Bloom
    filters' size (bytes)."""

    __slots__ = ("chunks", "filter_size")

    def __init__(self, filter_size: int = DEFAULT_FILTER_SIZE) -> None:
        self.chunks: dict[int, ChunkSummary] = {}
        self.filter_size = filter_size

    @staticmethod
    def chunk_of(offset: int) -> int:
        """The number of the chunk that holds ``offset``."""
        return offset >> CHUNK_BITS

    @staticmethod
    def seals(offset: int) -> bool:
        """Whether the message at ``offset`` is the last of its chunk."""
        return offset & _IN_CHUNK == _IN_CHUNK

    def add(self, offset: int, value: str | None) -> None:
        """Index the message appended at ``offset`` with filter ``value``."""
        chunk = offset >> CHUNK_BITS
        summary = self.chunks.get(chunk)
        if summary is None:
            summary = self.chunks[chunk] = ChunkSummary()
        summary.add(offset & _IN_CHUNK, value, self.filter_size)

    def next_candidate(self, offset: int, limit: int, wanted: StreamFilter, max_chunks: int = 4096) -> int:
        """The first offset from ``offset`` on, below ``limit``, whose message may pass
        ``wanted`` (the first of an unknown chunk counts), else ``limit``; after
        ``max_chunks`` chunks without one, the first offset of the next chunk (the
        caller goes on from there later). Costs one summary look-up per chunk skipped,
        nothing per message."""
        chunks = self.chunks
        size = self.filter_size
        while offset < limit:
            max_chunks -= 1
            if max_chunks < 0:
                return offset
            chunk = offset >> CHUNK_BITS
            summary = chunks.get(chunk)
            if summary is None:
                return offset
            mask = summary.candidates(wanted, size) >> (offset & _IN_CHUNK)
            if mask:
                return min(offset + (mask & -mask).bit_length() - 1, limit)
            offset = (chunk + 1) << CHUNK_BITS
        return limit

    def span(self, offset: int, limit: int, wanted: StreamFilter, most: int = 64) -> int:
        """Where a read for ``wanted`` from ``offset`` (a candidate) may stop: the
        offset after the last candidate below ``limit``, or ``limit`` when there are
        more than ``most`` candidates (a dense filter reads a whole batch anyway). So
        that a filter matching one message in a million reads that one message."""
        last = offset
        for _ in range(most):
            following = self.next_candidate(last + 1, limit, wanted)
            if following >= limit:
                return last + 1
            last = following
        return limit

    def drop_below(self, first_offset: int) -> list[int]:
        """Forget the chunks wholly below ``first_offset`` (retention); returns their
        numbers."""
        below = first_offset >> CHUNK_BITS
        gone = [chunk for chunk in self.chunks if chunk < below]
        for chunk in gone:
            del self.chunks[chunk]
        return gone
