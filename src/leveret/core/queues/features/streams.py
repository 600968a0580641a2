"""Stream retention (RabbitMQ's stream queues): ``x-max-age`` (``7D``, ``12h``, ``30m``,
``10s``: Y, M, D, h, m, s) and ``x-stream-max-segment-size-bytes`` (at least 1; 500 MB
by default); with ``x-max-length-bytes`` (:mod:`.limits`) a stream drops whole segments
from its head. Also ``x-stream-filter-size-bytes`` (an integer ≥ 0 here; the stream
queue takes 16..255, as RabbitMQ 3.13: its chunks' Bloom filter size). 406 with
RabbitMQ's texts for invalid values."""

from __future__ import annotations

from typing import Any

from ...queue_config import Arguments, or_default, parse_age

#: The arguments this feature reads (without ``x-``; also policy keys).
KEYS = ("max-age", "stream-max-segment-size-bytes", "stream-filter-size-bytes")

#: A stream segment's size when none is given (bytes), as RabbitMQ's.
DEFAULT_SEGMENT_SIZE = 500_000_000


def configure(args: Arguments) -> dict[str, Any]:
    """The :class:`.QueueConfig` fields of this feature: ``max_age`` (seconds, None:
    none), ``max_segment_size`` and ``filter_size`` (bytes, None: not set)."""
    return {
        "max_age": parse_age(args.get("max-age", str)),
        "max_segment_size": or_default(
            args.get("stream-max-segment-size-bytes", int, 1), DEFAULT_SEGMENT_SIZE
        ),
        "filter_size": args.get("stream-filter-size-bytes", int, 0),
    }
