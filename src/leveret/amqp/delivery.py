"""Deliveries decoded by hand, straight out of a client's receive buffer.

basic.deliver, content headers and content bodies are decoded here without pamqp:
pamqp's generic unmarshalling costs most of a reader's time. The values are those pamqp
would give (a whole delivery's properties as a dict by pamqp attribute name; single
frames as pamqp's classes). Anything unusual (a malformed frame, more than one property
flag word) is left to pamqp, so errors are pamqp's too. tests/unit/amqp/
test_codec_fastpaths.py checks all of this against pamqp with property tests.
"""

from __future__ import annotations

import datetime
import functools
import struct
from dataclasses import dataclass
from typing import Any

from pamqp import commands, decode, frame, header
from pamqp.body import ContentBody

from ..compiled import twin
from .frames import FRAME_END
from .properties import PROPERTY_LAYOUT, PROPERTY_NAMES

__all__ = [
    "Delivery",
    "decode_content_header",
    "decode_deliver",
    "decode_frame",
    "decode_properties",
    "take_delivery",
]

_U32 = struct.Struct(">I").unpack_from
_I64 = struct.Struct(">q").unpack_from
_U64 = struct.Struct(">Q").unpack_from
_FRAME_HEAD = struct.Struct(">BHI").unpack_from
_CONTENT_HEAD = struct.Struct(">HHQH").unpack_from
_DELIVER_INDEX = commands.Basic.Deliver.index  # 0x003C003C
_Deliver = commands.Basic.Deliver
_Properties = commands.Basic.Properties
_ContentHeader = header.ContentHeader
_new = object.__new__
_UTC = datetime.UTC
_fromtimestamp = datetime.datetime.fromtimestamp
_field_table = decode.field_table


@dataclass
class Delivery:
    """One message received with basic.deliver, basic.get-ok or basic.return.

    ``props`` holds the properties present, by pamqp attribute name (``message_type``
    for ``type``); ``headers`` as pamqp decodes them. ``consumer_tag`` is "" for
    basic.get; ``channel`` is the channel number it arrived on (ack it there)."""

    delivery_tag: int
    redelivered: bool
    exchange: str
    routing_key: str
    props: dict[str, Any]
    body: bytes
    consumer_tag: str = ""
    channel: int = 0

    @property
    def headers(self) -> dict[str, Any]:
        """The ``headers`` property ({} when absent)."""
        return self.props.get("headers") or {}


class _Malformed(ValueError):
    """The fast decoder cannot decode this frame (pamqp then decides)."""


def decode_deliver(buf: bytes | bytearray, pos: int, end: int) -> commands.Basic.Deliver:
    """basic.deliver's arguments in ``buf[pos:end]`` (after the class and method ids).

    Raises ValueError (or IndexError/UnicodeDecodeError) if they do not decode."""
    n = buf[pos]
    pos += 1
    consumer_tag = str(buf[pos : pos + n], "utf-8")
    pos += n
    delivery_tag = _I64(buf, pos)[0]
    redelivered = (buf[pos + 8] & 1) != 0
    n = buf[pos + 9]
    pos += 10
    exchange = str(buf[pos : pos + n], "utf-8")
    pos += n
    n = buf[pos]
    pos += 1
    routing_key = str(buf[pos : pos + n], "utf-8")
    if pos + n > end:
        raise _Malformed("basic.deliver is truncated")
    d = _new(_Deliver)
    d.consumer_tag = consumer_tag
    d.delivery_tag = delivery_tag
    d.redelivered = redelivered
    d.exchange = exchange
    d.routing_key = routing_key
    return d


@functools.cache
def _present(flags: int) -> tuple[tuple[str, str], ...]:
    """(attribute, wire type) of the properties a flag word says are present."""
    return tuple((name, kind) for flag, name, kind in PROPERTY_LAYOUT if flags & flag)


def decode_properties(buf: bytes | bytearray, pos: int, end: int, flags: int) -> dict[str, Any]:
    """The properties present in ``buf[pos:end]`` by pamqp attribute name, with pamqp's
    values (text as str, timestamps as aware datetimes, headers as pamqp decodes them).

    Raises ValueError (and others: the caller falls back to pamqp) if malformed."""
    props: dict[str, Any] = {}
    for name, kind in _present(flags):
        if kind == "s":  # short string
            n = buf[pos]
            value: Any = str(buf[pos + 1 : pos + 1 + n], "utf-8")
            pos += 1 + n
        elif kind == "o":  # octet
            value = buf[pos]
            pos += 1
        elif kind == "T":  # field table (pamqp)
            if pos + 4 > end:
                raise _Malformed("headers are truncated")
            n, value = _field_table(bytes(buf[pos:end]))
            pos += n
        else:  # timestamp
            if pos + 8 > end:
                raise _Malformed("timestamp is truncated")
            ts = _U64(buf, pos)[0]
            if ts > 0xFFFFFFFF:  # as pamqp: above the year 2106 it is milliseconds
                ts /= 1000.0
            value = _fromtimestamp(ts, tz=_UTC)
            pos += 8
        props[name] = value
    if pos > end:
        raise _Malformed("content header is truncated")
    return props


def decode_content_header(buf: bytes | bytearray, pos: int, end: int) -> header.ContentHeader:
    """A content header frame's payload ``buf[pos:end]`` as pamqp's ContentHeader.

    Raises ValueError (and others) if malformed."""
    if pos + 14 > end:
        raise _Malformed("content header is truncated")
    class_id, weight, body_size, flags = _CONTENT_HEAD(buf, pos)
    if flags & 1:
        raise _Malformed("more than one property flag word")
    props = decode_properties(buf, pos + 14, end, flags)
    p = _new(_Properties)
    for name in PROPERTY_NAMES:
        setattr(p, name, props.get(name))
    p.cluster_id = props.get("cluster_id", "")
    h = _new(_ContentHeader)
    h.class_id = class_id
    h.weight = weight
    h.body_size = body_size
    h.properties = p
    return h


def delivery_frames(buf: bytearray) -> tuple[int, int, int, int, bytes] | None:
    """The frames of a basic.deliver, its content header and a one-frame (or empty)
    body, complete at the start of ``buf``: (bytes they take, the deliver frame's end
    (its frame-end octet), the content header frame's start, its end, the body). None
    when ``buf`` starts with anything else or they are incomplete. Never raises."""
    size = len(buf)
    if size < 12 or buf[0] != 1 or _U32(buf, 7)[0] != _DELIVER_INDEX:
        return None
    channel = buf[1:3]
    end = 7 + _U32(buf, 3)[0]
    pos = end + 1  # the content header frame
    if size < pos + 21 or buf[end] != FRAME_END or buf[pos] != 2 or buf[pos + 1 : pos + 3] != channel:
        return None
    head_end = pos + 7 + _U32(buf, pos + 3)[0]
    if size <= head_end or buf[head_end] != FRAME_END:
        return None
    body_size = _U64(buf, pos + 11)[0]
    taken = head_end + 1
    if body_size:
        body_end = taken + 7 + body_size
        if (
            size <= body_end
            or buf[taken] != 3
            or buf[taken + 1 : taken + 3] != channel
            or _U32(buf, taken + 3)[0] != body_size
            or buf[body_end] != FRAME_END
        ):
            return None
        return body_end + 1, end, pos, head_end, bytes(buf[taken + 7 : body_end])
    return taken, end, pos, head_end, b""


def take_delivery(buf: bytearray) -> tuple[int, Delivery] | None:
    """A basic.deliver with its content header and a one-frame body, complete at the
    start of ``buf``: (bytes it takes, the delivery). None when ``buf`` starts with
    anything else, an incomplete delivery or one :func:`decode_frame` should judge
    (a larger body, a malformed frame): the caller then reads frame by frame. Never
    raises."""
    frames = delivery_frames(buf)
    if frames is None:
        return None
    taken, end, pos, head_end, body = frames
    flags = _CONTENT_HEAD(buf, pos + 7)[3]
    try:
        if flags & 1:
            raise _Malformed("more than one property flag word")
        d: Any = decode_deliver(buf, 11, end)
        props = decode_properties(buf, pos + 21, head_end, flags)
    except Exception:
        return None
    return taken, Delivery(
        d.delivery_tag,
        d.redelivered,
        d.exchange,
        d.routing_key,
        props,
        body,
        d.consumer_tag,
        buf[1] << 8 | buf[2],
    )


def decode_frame(buf: bytes | bytearray) -> tuple[int, Any]:
    """(channel, value) of the complete frame at the start of ``buf``, as
    ``pamqp.frame.unmarshal`` would give them (and raising what it raises:
    ``pamqp.exceptions.UnmarshalingException`` and others for a malformed frame)."""
    ftype, channel, size = _FRAME_HEAD(buf, 0)
    end = size + 7
    if size and buf[end] == FRAME_END and buf[0:4] != b"AMQP":
        try:
            if ftype == 3:
                return channel, ContentBody(bytes(buf[7:end]))
            if ftype == 2:
                return channel, decode_content_header(buf, 7, end)
            if ftype == 1 and size >= 4 and _U32(buf, 7)[0] == _DELIVER_INDEX:
                return channel, decode_deliver(buf, 11, end)
        except Exception:
            pass
    _, channel, value = frame.unmarshal(bytes(buf[: end + 1]))
    return channel, value


_c = twin("leveret.amqp._cdelivery")  # the compiled twin (leveret/amqp/_cdelivery.pyx)
if _c is not None:
    take_delivery = _c.take_delivery
