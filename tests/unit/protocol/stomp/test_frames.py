"""The STOMP parser's memory of header blocks: a repeated head reads as a new one would
(the pure parser and the compiled one)."""

from __future__ import annotations

import pytest
from stomp_twins import TWINS

from leveret.protocol.stomp.frames import HEAD_CACHE_ENTRIES, FrameError

SEND = b"SEND\ndestination:/queue/q\ncontent-length:2\nreceipt:r1\n\nhi\0"


@pytest.mark.parametrize("twin", TWINS)
def test_a_repeated_head_gives_a_fresh_headers_dict_each_time(twin):
    parser = twin.FrameParser()
    first, second = parser.feed(SEND * 2)
    assert first is not None and second is not None
    assert (
        first.headers == second.headers == {"destination": "/queue/q", "content-length": "2", "receipt": "r1"}
    )
    first.headers.pop("receipt")  # a handler takes a header out: the next frame keeps it
    (third,) = parser.feed(SEND)
    assert third is not None and third.headers["receipt"] == "r1" and third.body == b"hi"


@pytest.mark.parametrize("twin", TWINS)
def test_a_version_change_reads_known_heads_anew(twin):
    frame = b"SEND\ndestination: /queue/q \n\n\0"
    parser = twin.FrameParser()
    parser.version = "1.2"
    (as_12,) = parser.feed(frame)
    parser.version = "1.0"  # 1.0 trims values, 1.2 keeps the spaces
    (as_10,) = parser.feed(frame)
    assert as_12 is not None and as_10 is not None
    assert as_12.headers["destination"] == " /queue/q "
    assert as_10.headers["destination"] == "/queue/q"


@pytest.mark.parametrize("twin", TWINS)
@pytest.mark.parametrize(
    "head",
    [b"SEND\ncontent-length:x", b"SEND\nno colon", b"SEND\nbad:\\t"],
)
def test_a_bad_head_is_refused_every_time_it_comes(twin, head):
    for _ in range(2):
        with pytest.raises(FrameError):
            twin.FrameParser().feed(head + b"\n\n\0")


@pytest.mark.parametrize("twin", TWINS)
def test_the_memory_of_heads_stays_bounded(twin):
    parser = twin.FrameParser()
    frames = parser.feed(
        b"".join(b"SEND\ndestination:/queue/q%d\n\n\0" % i for i in range(3 * HEAD_CACHE_ENTRIES))
    )
    assert [f.headers["destination"] for f in frames if f is not None] == [
        f"/queue/q{i}" for i in range(3 * HEAD_CACHE_ENTRIES)
    ]
    assert len(parser._heads) <= HEAD_CACHE_ENTRIES
