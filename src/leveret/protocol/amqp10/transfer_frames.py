"""A delivery's whole transfer frame (AMQP 1.0 §2.7.5, §2.3), the broker as sender:
the frame header, a transfer performative encoded by hand, then the message's payload
(:func:`~.message.py_encode_transfer`), in one bytes object for a delivery that fits
the client's max-frame-size. The compiled twin (``_ctransfer.transfer_frame``) writes
it in one buffer."""

from __future__ import annotations

import struct
from collections.abc import Callable

from ...compiled import twin
from ...core.message import Message
from .message import py_encode_transfer

#: A whole single-frame transfer's head: frame header (size, doff 2, type 0, channel),
#: then transfer's descriptor and list32 (size 23, count 6): handle and delivery-id as
#: uint, a 4-byte delivery tag (the delivery id), message-format uint0, settled, more
#: false. One pack per delivery (the hot path).
TRANSFER_HEAD = struct.Struct(">IBBH3sBIIBIBIBBIBBB")
TRANSFER_HEAD_SIZE = TRANSFER_HEAD.size  # 39 bytes


def py_transfer_frame(
    channel: int,
    handle: int,
    delivery_id: int,
    settled: bool,
    max_frame_size: int,
    message: Message,
    delivery_count: int,
    first_acquirer: bool,
    ttl_left_ms: int | None,
) -> bytes | None:
    """The whole frame of a delivery of ``message`` in one transfer (the head
    :meth:`Amqp10Session.send_transfer` writes, then
    :func:`~.message.py_encode_transfer`'s payload), or None when it would be larger
    than ``max_frame_size`` bytes (the caller then sends it in several frames)."""
    payload = py_encode_transfer(message, delivery_count, first_acquirer, ttl_left_ms)
    size = TRANSFER_HEAD_SIZE + len(payload)
    if size > max_frame_size or channel > 0xFFFF:
        return None
    head = TRANSFER_HEAD.pack(
        size, 2, 0, channel, b"\x00\x53\x14", 0xD0, 23, 6, 0x70, handle, 0x70, delivery_id,
        0xA0, 4, delivery_id, 0x43, 0x41 if settled else 0x42, 0x42,
    )  # fmt: skip
    return head + payload


_compiled = twin("leveret.protocol.amqp10._ctransfer")
#: :func:`py_transfer_frame`, by its compiled twin when built (which also gives None
#: for a message it leaves to the pure encoder: the caller encodes it as usual).
transfer_frame: Callable[[int, int, int, bool, int, Message, int, bool, int | None], bytes | None] = (
    _compiled.transfer_frame if _compiled is not None else py_transfer_frame
)
