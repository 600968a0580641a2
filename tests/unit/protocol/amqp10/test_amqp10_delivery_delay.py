"""delivery_delay's shortcut: a message without an ``x-opt-delivery-*`` annotation is not
decoded for it, and one with it (or with the same bytes in its body) still is, and
answers as before (messages encoded by proton's C codec)."""

from __future__ import annotations

import proton

from leveret.protocol.amqp10.message import decode_transfer, delivery_delay

NOW_MS = 1_700_000_000_000


def _payload(body: bytes, annotations: dict | None = None) -> bytes:
    return bytes(proton.Message(body=body, annotations=annotations).encode())


def test_no_annotation_is_no_delay() -> None:
    for body in (b"", b"x" * 4096, b"opt-delivery-" * 3, b"x-opt-delivery-delay"):
        assert delivery_delay(decode_transfer(_payload(body), "", ""), NOW_MS) == 0


def test_annotations_still_read() -> None:
    delay = {proton.symbol("x-opt-delivery-delay"): 5000}
    assert delivery_delay(decode_transfer(_payload(b"x" * 4096, delay), "", ""), NOW_MS) == 5000
    due = {proton.symbol("x-opt-delivery-time"): NOW_MS + 1234}
    assert delivery_delay(decode_transfer(_payload(b"m", due), "", ""), NOW_MS) == 1234
    past = {proton.symbol("x-opt-delivery-time"): NOW_MS - 1}
    assert delivery_delay(decode_transfer(_payload(b"m", past), "", ""), NOW_MS) == 0
