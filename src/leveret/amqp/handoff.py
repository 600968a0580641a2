"""Frames as a connection worker hands them to the core (``leveret server --workers N``,
docs/multicore.md §6).

A worker splits a client's bytes into frames (:class:`~.frames.FrameReader`) and, where
a basic.publish arrives whole in one read (method, content header, at most one body
frame), reads its fields once, so the core only checks the channel and routes it. Such
a publish becomes one item ``(PARSED_PUBLISH, channel, fields)``, ``fields`` being
:data:`Fields`; every other frame stays ``(type, channel, payload)``, which the core
handles as it handles a socket's frames. Plain tuples: they cross the process boundary
marshalled (server/workers/link.py), which takes built-in types only.

The worker checks only the wire format here. Whatever depends on the channel's state
(open, not awaiting content) or the broker's limits (``max_message_size``) is checked by
the core, which falls back to the frames (:func:`as_frames`) when the publish is not
ordinary, so every error is reported exactly as without workers.
"""

from __future__ import annotations

from typing import Any

from ..compiled import twin
from . import properties as wire
from .errors import AMQPConnectionError
from .frames import FRAME_BODY, FRAME_HEADER, FRAME_METHOD, PUBLISH_ID, publish_fields

#: The item type of a pre-parsed publish: not a frame type on the wire (1, 2, 3, 8).
PARSED_PUBLISH = 0

#: ``(exchange, routing_key, mandatory, header, body, facts, method_payload)``:
#: ``header`` the content header payload (checked: class 60, 14 bytes or more, its
#: declared body size is ``len(body)``), ``facts`` what :func:`wire.scan` read from it,
#: ``method_payload`` the basic.publish frame's payload (for :func:`as_frames`).
Fields = tuple[str, str, bool, bytes, bytes, Any, bytes]

_BASIC_CLASS = (60).to_bytes(2, "big")  # class id of a basic content header


def parse_publishes(frames: list[tuple[int, int, bytes]]) -> list[tuple[int, int, Any]]:
    """``frames`` with every whole, well-formed, non-immediate basic.publish replaced by
    one :data:`PARSED_PUBLISH` item; the order is kept."""
    items: list[tuple[int, int, Any]] = []
    i, count = 0, len(frames)
    while i < count:
        frame = frames[i]
        if frame[0] == FRAME_METHOD and i + 1 < count and frame[2][:4] == PUBLISH_ID:
            taken = whole_publish(frames, i)
            if taken:
                items.append((PARSED_PUBLISH, frame[1], taken[0]))
                i += taken[1]
                continue
        items.append(frame)
        i += 1
    return items


def whole_publish(frames: list[tuple[int, int, Any]], i: int) -> tuple[Fields, int] | None:
    """``frames[i]`` is a basic.publish method frame: its :data:`Fields` and how many
    frames it takes (2 or 3) if its content header and single body frame follow on the
    same channel, well-formed, and it is not ``immediate``; else None (the frame path
    then reports whatever is wrong)."""
    if i + 1 >= len(frames):
        return None
    _, number, payload = frames[i]
    header_type, header_number, header = frames[i + 1]
    if (
        header_type != FRAME_HEADER
        or header_number != number
        or len(header) < 14
        or header[:2] != _BASIC_CLASS
    ):
        return None
    size = wire.declared_body_size(header)
    if size:
        if i + 2 >= len(frames):
            return None
        body_type, body_number, body = frames[i + 2]
        if body_type != FRAME_BODY or body_number != number or len(body) != size:
            return None
    else:
        body = b""
    try:
        exchange, routing_key, mandatory, immediate = publish_fields(payload)
        facts = wire.scan(header)
    except (ValueError, IndexError, AMQPConnectionError):  # the core's frame path reports it
        return None
    if immediate:
        return None
    return (exchange, routing_key, mandatory, header, body, facts, payload), 3 if size else 2


def as_frames(number: int, fields: Fields) -> list[tuple[int, int, bytes]]:
    """The frames a :data:`PARSED_PUBLISH` item stands for (the core's fallback)."""
    header, body, payload = fields[3], fields[4], fields[6]
    frames = [(FRAME_METHOD, number, payload), (FRAME_HEADER, number, header)]
    if body:
        frames.append((FRAME_BODY, number, body))
    return frames


_c = twin("leveret.amqp._cframes")  # the compiled twin (leveret/amqp/_cframes.pyx)
if _c is not None:
    parse_publishes = _c.parse_publishes
    whole_publish = _c.whole_publish
