"""Stream filtering (RabbitMQ 3.13's): publishers tag a message with a *filter value*,
consumers ask for the values they want.

- A message's filter value is its application header ``x-stream-filter-value`` (an AMQP
  0-9-1 header; for AMQP 1.0 the message-annotation of that name first, as the AMQP 1.0
  format's :meth:`~leveret.core.message.Message.header` reads ``x-`` names), when it is a
  string (binary: its UTF-8 text); any other type, as no value at all, makes the
  message *unfiltered*. :func:`filter_value` reads it without decoding the message's
  properties, and not at all when the encoded form does not hold the header's name.
- A consumer's :class:`StreamFilter` comes from the consume arguments
  ``x-stream-filter`` (a string or an array of strings) and
  ``x-stream-match-unfiltered`` (a boolean, false by default): it takes the messages
  whose value is one of the strings, and the unfiltered ones when match-unfiltered is
  true. :func:`from_arguments` reads them as RabbitMQ's ``rabbit_stream_queue`` does:
  leniently, with no error (an argument of another type means no filter, array items
  that are not strings are dropped, a match-unfiltered that is not a boolean is false).

RabbitMQ filters per chunk with a Bloom filter and leaves the exact test to the client;
leveret applies the exact test on the broker (:meth:`StreamFilter.matches`), and stream
queues skip whole chunks with their chunk index (:mod:`.queues.stream_index`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .message import Message

FILTER_VALUE_HEADER = "x-stream-filter-value"
_NAME = FILTER_VALUE_HEADER.encode()
FILTER_ARGUMENT = "x-stream-filter"
MATCH_UNFILTERED_ARGUMENT = "x-stream-match-unfiltered"


def as_filter_value(value: Any) -> str | None:
    """A header value as a filter value: a string, binary as UTF-8 text (invalid bytes
    replaced), anything else None (unfiltered)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    return None


def filter_value(message: Message) -> str | None:
    """``message``'s filter value (see the module doc), None when unfiltered. When the
    properties are not decoded yet and the encoded form does not contain the header's
    name, nothing is decoded (one substring search of the encoded properties)."""
    if message._properties is None and _NAME not in message.encoded:
        return None
    return as_filter_value(message.header(FILTER_VALUE_HEADER))


@dataclass(frozen=True, slots=True)
class StreamFilter:
    """What one consumer asks for: the filter ``values`` it wants and whether it takes
    unfiltered messages too (``match_unfiltered``)."""

    values: frozenset[str]
    match_unfiltered: bool = False

    @classmethod
    def of(cls, values: Iterable[str], match_unfiltered: bool = False) -> StreamFilter:
        return cls(frozenset(values), match_unfiltered)

    def matches(self, value: str | None) -> bool:
        """Whether a message with filter value ``value`` (None: unfiltered) passes."""
        if value is None:
            return self.match_unfiltered
        return value in self.values

    def matches_message(self, message: Message) -> bool:
        """:meth:`matches` for ``message``'s filter value."""
        return self.matches(filter_value(message))


def from_arguments(arguments: dict[str, Any]) -> StreamFilter | None:
    """The consumer's filter from basic.consume's ``x-stream-filter`` and
    ``x-stream-match-unfiltered`` arguments, None when it has none; never an error
    (RabbitMQ 3.13's lenient reading, see the module doc)."""
    spec = arguments.get(FILTER_ARGUMENT)
    if isinstance(spec, str | bytes | bytearray):
        values = [as_filter_value(spec)]
    elif isinstance(spec, list | tuple):
        values = [as_filter_value(item) for item in spec if isinstance(item, str | bytes | bytearray)]
    else:
        return None
    match_unfiltered = arguments.get(MATCH_UNFILTERED_ARGUMENT)
    return StreamFilter.of(
        (v for v in values if v is not None),
        match_unfiltered if isinstance(match_unfiltered, bool) else False,
    )
