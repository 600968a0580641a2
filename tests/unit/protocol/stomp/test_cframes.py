"""The compiled STOMP codec (``_cframes.pyx``) against the pure one (``frames.py``): the
same frames, heart-beats and buffered bytes after every read, and the same FrameError
text (an ERROR frame's message) at the same read, on arbitrary bytes cut anywhere, on
valid frames, past every limit, and across version changes; the same bytes from
encode, escape and message_head."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st
from sans_io import FUZZ, split
from stomp_twins import COMPILED, NOT_BUILT, PURE, TWINS

from leveret.protocol.stomp.frames import HEAD_CACHE_ENTRIES, MAX_HEADERS, Frame, FrameError

pytestmark = pytest.mark.skipif(COMPILED is None, reason=NOT_BUILT)

VERSIONS = ["1.0", "1.1", "1.2"]

#: Pieces that make the parser take every branch: commands, separators, escapes,
#: content-length (good and bad), CR, NUL, non-UTF-8, and lines past the limits.
PIECES = [
    b"SEND\n",
    b"ACK\n",
    b"CONNECT\n",
    b"MESSAGE\n",
    b"destination:/queue/a\n",
    b"id:1\n",
    b"content-length:3\n",
    b"content-length:0\n",
    b"content-length: 2 \n",
    b"content-length:x\n",
    b"content-length:99999999999999999999\n",
    b"content-length:\xd9\xa3\n",  # an Arabic-Indic digit: isdigit, not ASCII
    b"a:b\\c\\n\\r\\\\\n",
    b"bad:\\t\n",
    b"end:\\",
    b"no colon\n",
    b" k : v \n",
    b"\n",
    b"\r\n",
    b"\r",
    b"\n\n",
    b"\r\n\r\n",
    b"\x00",
    b"abc",
    b"\xc3\xa9:\xc3\xa9\n",
    b"\xff\xfe",
    b"x" * 1100,
    b"h:" + b"v" * (10 * 1024 + 10) + b"\n",
    b"h:v\n" * (MAX_HEADERS + 1),
]
COMMANDS = [b"SEND", b"ACK", b"CONNECT", b"STOMP", b"MESSAGE", b"BOGUS", b"SEND\r", b"\xc3\xa9"]
HEADERS = [piece for piece in PIECES if piece.endswith(b"\n") and b":" in piece]
#: Mostly frames (a command, header lines, an empty line, a body, a NUL), with any
#: piece of PIECES or random bytes in between or in their place.
frame_like = st.builds(
    lambda command, end, lines, blank, body, nul: command + end + b"".join(lines) + blank + body + nul,
    st.sampled_from(COMMANDS),
    st.sampled_from([b"\n", b"\r\n"]),
    st.lists(
        st.one_of(
            st.sampled_from(HEADERS),
            st.sampled_from(HEADERS),
            st.sampled_from(PIECES),
            st.tuples(st.text(max_size=4), st.text(max_size=4)).map(lambda kv: f"{kv[0]}:{kv[1]}\n".encode()),
            st.binary(max_size=6),
        ),
        max_size=5,
    ),
    st.sampled_from([b"\n", b"\r\n", b""]),
    st.binary(max_size=8),
    st.sampled_from([b"\x00", b"\x00\n", b""]),
)
clean_frame = st.builds(
    lambda command, lines, body: command + b"\n" + b"".join(lines) + b"\n" + body + b"\x00",
    st.sampled_from([b"SEND", b"ACK", b"MESSAGE"]),
    st.lists(
        st.sampled_from(
            [
                b"destination:/queue/a\n",
                b"destination:/topic/b\n",
                b"id:1\n",
                b"id:2\n",
                b"a:b\\c\n",
                b"x:\xc3\xa9\n",
            ]
        ),
        max_size=4,
    ),
    st.binary(max_size=8).map(lambda body: body.replace(b"\x00", b"")),
)
streams = st.lists(
    st.one_of(clean_frame, frame_like, frame_like, st.sampled_from(PIECES), st.binary(max_size=12)),
    max_size=10,
).map(b"".join)


def outcome(parser, chunks: list[bytes], versions: list[str]):
    """What each read gives (frames and heart-beats, then the bytes still buffered),
    up to the first FrameError's text; the version changes before each read as given."""
    seen = []
    for i, chunk in enumerate(chunks):
        parser.version = versions[i % len(versions)]
        try:
            seen.append((parser.feed(chunk), parser.buffered))
        except FrameError as exc:
            seen.append(("FrameError", str(exc)))
            break
    return seen


def both(max_body: int = 256):
    return PURE["FrameParser"](max_body=max_body), COMPILED.FrameParser(max_body=max_body)


@FUZZ
@given(
    streams,
    st.lists(st.integers(0, 30000), max_size=6),
    st.lists(st.sampled_from(VERSIONS), min_size=1, max_size=3),
)
def test_the_twins_read_any_bytes_alike_however_cut(data, cuts, versions):
    pure, compiled = both()
    chunks = split(data, cuts)
    assert outcome(compiled, chunks, versions) == outcome(pure, chunks, versions)


@FUZZ
@given(st.binary(max_size=300), st.lists(st.integers(0, 300), max_size=6), st.sampled_from(VERSIONS))
def test_the_twins_read_random_bytes_alike(data, cuts, version):
    pure, compiled = both(max_body=64)
    chunks = split(data, cuts)
    assert outcome(compiled, chunks, [version]) == outcome(pure, chunks, [version])


@FUZZ
@given(st.lists(st.sampled_from(PIECES), max_size=10).map(b"".join), st.sampled_from(VERSIONS))
def test_the_twins_read_a_byte_at_a_time_alike(data, version):
    pure, compiled = both()
    chunks = [data[i : i + 1] for i in range(len(data))]
    assert outcome(compiled, chunks, [version]) == outcome(pure, chunks, [version])


header_text = st.one_of(
    st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=10),
    st.text("ab:/ 0\\", max_size=5),
)
names = st.one_of(
    st.sampled_from(["destination", "receipt", "content-type", "persistent", "x"]), header_text.filter(bool)
)


@FUZZ
@given(
    st.sampled_from(["SEND", "SUBSCRIBE", "ACK", "CONNECT", "MESSAGE", "ERROR", "CONNECTED"]),
    st.lists(st.tuples(names, header_text), max_size=6),
    st.binary(max_size=40),
    st.booleans(),
    st.sampled_from(VERSIONS),
    st.integers(1, 4),
    st.lists(st.integers(0, 2000), max_size=5),
)
def test_the_twins_encode_and_read_valid_frames_alike(command, pairs, body, sized, version, repeat, cuts):
    """Frames as a client writes them (escaped for the version, a content-length or a body
    without NUL), repeated (the head cache) and cut anywhere."""
    if sized:
        pairs = [("content-length", str(len(body))), *pairs]
    else:
        body = body.replace(b"\0", b"")
    data = PURE["encode"](command, pairs, body, version)
    assert COMPILED.encode(command, pairs, body, version) == data
    assert COMPILED.encode(command, dict(pairs), body, version) == PURE["encode"](
        command, dict(pairs), body, version
    )
    pure, compiled = both(max_body=1000)
    chunks = split(data * repeat, cuts)
    seen = outcome(compiled, chunks, [version])
    assert seen == outcome(pure, chunks, [version])
    frames = [frame for read, _ in seen if read != "FrameError" for frame in read]
    assert all(type(frame) is Frame for frame in frames if frame is not None)


@FUZZ
@given(st.text(max_size=20), st.sampled_from([*VERSIONS, "2.0"]))
def test_the_twins_escape_and_unescape_alike(text, version):
    assert COMPILED.escape(text, version) == PURE["escape"](text, version)
    try:
        expected = PURE["unescape"](text, version)
    except FrameError as exc:
        with pytest.raises(FrameError) as raised:
            COMPILED.unescape(text, version)
        assert str(raised.value) == str(exc)
    else:
        assert COMPILED.unescape(text, version) == expected


numbers = st.one_of(st.none(), st.integers(0, 2**70), st.integers(-5, -1), st.booleans())


@FUZZ
@given(
    st.text(st.characters(codec="utf-8"), max_size=30),
    numbers,
    st.booleans(),
    st.lists(
        st.tuples(st.sampled_from(["x-delivery-count", "x-stream-offset"]), st.integers(-1, 2**64)),
        max_size=2,
    ).map(tuple),
    numbers,
    st.binary(max_size=30),
)
def test_the_twins_write_message_heads_alike(start, ack, redelivered, counts, length, block):
    expected = PURE["message_head"](start, ack, redelivered, counts, length, block)
    assert COMPILED.message_head(start, ack, redelivered, counts, length, block) == expected


def test_the_twins_forget_heads_alike_when_the_cache_is_full():
    data = b"".join(b"SEND\ndestination:/queue/q%d\n\nx\0" % (i % 200) for i in range(3 * HEAD_CACHE_ENTRIES))
    pure, compiled = both()
    assert outcome(compiled, [data, data], ["1.2"]) == outcome(pure, [data, data], ["1.2"])
    assert len(compiled._heads) == len(pure._heads) <= HEAD_CACHE_ENTRIES


@pytest.mark.parametrize("twin", TWINS)
@pytest.mark.parametrize("digits", ["0" * 5000 + "5", "9" * 5000, "0" * 20])
def test_a_content_length_of_thousands_of_digits_is_a_frame_error_or_its_value(twin, digits):
    # int() refuses more than 4300 digits (ValueError): the parser must answer with its
    # own FrameError (an ERROR frame), or read the value the digits give.
    parser = twin.FrameParser()
    data = f"SEND\ndestination:/queue/a\ncontent-length:{digits}\n\nhello\x00".encode()
    if digits.strip("0") == "5":
        assert [(f.command, f.body) for f in parser.feed(data)] == [("SEND", b"hello")]
    elif not digits.strip("0"):
        with pytest.raises(FrameError, match="NUL"):  # a body of 0 bytes, then "hello"
            parser.feed(data)
    else:
        with pytest.raises(FrameError, match="the body is longer than"):
            parser.feed(data)
