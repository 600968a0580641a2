"""Fuzzing the sans-I/O FrameReader: garbage in gets a FrameError (501) out, never
another exception; valid frames reassemble however they are cut. Both twins (pure and
compiled, tests/twins.py) are fuzzed."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, strategies as st
from sans_io import FUZZ, split
from twins import TWINS

from leveret.amqp.frames import (
    FRAME_BODY,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    FrameError,
    encode_frame,
)


# -- (a) FrameReader ------------------------------------------------------------------
def feed_all(reader, pieces: list[bytes]) -> tuple[list, FrameError | None]:
    """Frames read and the FrameError that ended reading, if any; any other exception
    propagates (and fails the test)."""
    frames = []
    for piece in pieces:
        try:
            frames += reader.feed(piece)
        except FrameError as exc:
            assert exc.reply_code == 501
            return frames, exc
    return frames, None


@FUZZ
@pytest.mark.parametrize("twin", TWINS)
@given(data=st.binary(max_size=600), cuts=st.lists(st.integers(0, 600), max_size=12),
       max_size=st.sampled_from([4096, 131072, 64]))
def test_frame_reader_gives_frames_or_frame_error(twin, data, cuts, max_size):
    frames, error = feed_all(twin.frames.FrameReader(max_size), split(data, cuts))
    whole, whole_error = feed_all(twin.frames.FrameReader(max_size), [data])
    for frame_type, channel, payload in frames:
        assert frame_type in (FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT)
        assert 0 <= channel <= 0xFFFF
        assert len(payload) + 8 <= max_size
    # however the bytes are split, the stream means the same
    assert (error is None) == (whole_error is None)
    if error is None:
        assert frames == whole


frame_types = st.sampled_from([FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT])
valid_frames = st.lists(st.tuples(frame_types, st.integers(0, 0xFFFF), st.binary(max_size=300)),
                        max_size=8)


@FUZZ
@pytest.mark.parametrize("twin", TWINS)
@given(frames=valid_frames, cuts=st.lists(st.integers(0, 3000), max_size=20))
def test_valid_frames_split_anywhere_reassemble(twin, frames, cuts):
    data = b"".join(encode_frame(*f) for f in frames)
    reader = twin.frames.FrameReader(4096)
    got = []
    for piece in split(data, cuts):
        got += reader.feed(piece)
    assert got == frames


@FUZZ
@pytest.mark.parametrize("twin", TWINS)
@given(frames=valid_frames, garbage=st.binary(min_size=1, max_size=50))
def test_valid_frames_then_garbage_keep_the_valid_frames(twin, frames, garbage):
    reader = twin.frames.FrameReader(4096)
    data = b"".join(encode_frame(*f) for f in frames)
    assert reader.feed(data) == frames
    try:
        extra = reader.feed(garbage)
    except FrameError:
        return
    assert all(t in (FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT) for t, _, _ in extra)


@pytest.mark.parametrize("twin", TWINS)
@pytest.mark.parametrize("bad,what", [
    (encode_frame(FRAME_METHOD, 0, b"abcd")[:-1] + b"\x00", "end marker"),
    (encode_frame(7, 0, b""), "unknown frame type"),
    (struct.pack(">BHI", FRAME_BODY, 1, 1 << 30), "exceeds frame_max"),
])
def test_frame_reader_errors(twin, bad, what):
    reader = twin.frames.FrameReader(4096)
    with pytest.raises(FrameError, match=what):
        for byte in bad:  # byte by byte
            reader.feed(bytes([byte]))


@pytest.mark.parametrize("twin", TWINS)
def test_frame_size_error_needs_only_the_frame_head(twin):
    reader = twin.frames.FrameReader(4096)
    with pytest.raises(FrameError):
        reader.feed(struct.pack(">BHI", FRAME_BODY, 1, 5000))
