"""Fuzzing the STOMP adapter without sockets: the frame parser takes any bytes, cut
anywhere, and either returns frames or raises FrameError; a whole StompConnection fed
random and malformed frames answers with frames (an ERROR at worst, then closes), never
an exception, and leaves the broker consistent (every message is in a queue or held
unacknowledged by a live subscription). Each runs with the pure codec and with the
compiled one (``_cframes.pyx``)."""

from __future__ import annotations

import contextlib
from unittest.mock import patch

import pytest
from hypothesis import given, strategies as st
from sans_io import FUZZ, FakeLoop, FakeTransport, split
from stomp_twins import TWINS

from leveret.core.broker import BrokerCore
from leveret.protocol import prelogin
from leveret.protocol.stomp import StompConnection, connection as stomp_connection
from leveret.protocol.stomp.frames import Frame, FrameError, encode


def frames_of(parser, chunks: list[bytes]) -> list[Frame | None]:
    out: list[Frame | None] = []
    for chunk in chunks:
        out += parser.feed(chunk)
    return out


@pytest.mark.parametrize("twin", TWINS)
@FUZZ
@given(st.binary(max_size=600), st.lists(st.integers(0, 600), max_size=6))
def test_the_parser_takes_any_bytes(twin, data, cuts):
    parser = twin.FrameParser(max_body=256)
    try:
        frames = frames_of(parser, split(data, cuts))
    except FrameError as exc:
        assert str(exc)
        return
    for frame in frames:
        assert frame is None or isinstance(frame.command, str)


headers = st.dictionaries(
    st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=8),
    st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12),
    max_size=4,
)


@pytest.mark.parametrize("twin", TWINS)
@FUZZ
@given(st.sampled_from(["SEND", "MESSAGE", "ACK"]), headers, st.binary(max_size=64),
       st.sampled_from(["1.1", "1.2"]), st.lists(st.integers(0, 300), max_size=5))
def test_encoded_frames_parse_back_the_same_however_cut(twin, command, values, body, version, cuts):
    """Escaping round-trips every header (1.1 and 1.2), and a body with NULs comes back
    whole with its content-length, whatever the read boundaries."""
    values = {k: v for k, v in values.items() if not (version == "1.1" and ("\r" in k or "\r" in v))}
    values["content-length"] = str(len(body))
    parser = twin.FrameParser()
    parser.version = version
    frames = frames_of(parser, split(twin.encode(command, values, body, version) * 2, cuts))
    assert [f for f in frames if f is not None] == [Frame(command, values, body)] * 2


@contextlib.contextmanager
def codec(twin):
    """StompConnections made inside read and write frames with ``twin``'s codec."""
    with contextlib.ExitStack() as stack:
        for name in ("FrameParser", "encode", "escape", "message_head"):
            stack.enter_context(patch.object(stomp_connection, name, getattr(twin, name)))
        yield


class Stomp:
    """A StompConnection on a real core whose clock is the fake loop, fed bytes; output
    collected."""

    def __init__(self, core: BrokerCore) -> None:
        self.transport = FakeTransport()
        self.connection = StompConnection(core, self.transport, core.clock, lambda c: None,
                                          "127.0.0.1:5000")

    def feed(self, data: bytes) -> None:
        if self.connection.state != "closed":
            self.connection.data_received(data)
        self.connection.flush()


commands_ = st.sampled_from(["SEND", "SUBSCRIBE", "UNSUBSCRIBE", "ACK", "NACK", "BEGIN", "COMMIT", "ABORT",
                             "DISCONNECT", "CONNECT", "BOGUS"])
header_names = st.sampled_from(["destination", "id", "ack", "receipt", "transaction", "persistent",
                                "priority", "expires", "expiration", "message-id", "subscription",
                                "activemq.prefetchSize", "activemq.exclusive", "content-length", "requeue",
                                "reply-to", "selector", "x"])
header_values = st.sampled_from(["/queue/a", "/queue/b", "/topic/t.*", "/topic/t.>", "/topic/t.x", "/x/y",
                                 "/queue/a,/topic/t.x", "", "1", "2", "0", "-1", "9", "10", "auto", "client",
                                 "client-individual", "true", "false", "tx", "ID:x", "abc", "/amq/queue/a",
                                 "/exchange/amq.direct/k", "99999999999999999999"])
frames = st.builds(
    lambda command, pairs, body: encode(command, pairs, body, "1.2"),
    commands_,
    st.lists(st.tuples(header_names, header_values), max_size=5),
    st.binary(max_size=20),
)


@pytest.mark.parametrize("twin", TWINS)
@FUZZ
@given(st.sampled_from(["1.0", "1.1", "1.2"]),
       st.lists(st.one_of(frames, st.binary(max_size=30)), max_size=12),
       st.lists(st.integers(0, 400), max_size=4))
def test_a_connection_fed_random_frames_never_raises(twin, version, sequence, cuts):
    core = BrokerCore(FakeLoop())
    with codec(twin):
        consumer = Stomp(core)
        consumer.feed(f"CONNECT\naccept-version:{version}\nlogin:guest\npasscode:guest\n\n\x00".encode())
        assert consumer.transport.output.startswith(b"CONNECTED\n")
        for chunk in split(b"".join(sequence), cuts):
            consumer.feed(chunk)
        out = bytes(consumer.transport.output)
        assert out.count(b"ERROR\n") <= 1
        if b"ERROR\n" in out:
            assert consumer.connection.state == "closed" and consumer.transport.closed
        # whatever happened, closing gives every message back to its queue
        consumer.connection.connection_lost()
        for queue in core.vhosts["/"].queues.values():
            assert queue.unacked_count == 0 and not queue.consumers


prelogin_chunks = st.lists(
    st.one_of(
        st.binary(max_size=2000),
        st.builds(lambda n, b: b * n, st.integers(1, 40_000),
                  st.sampled_from([b"x", b"\n", b"h:v\n", b"\0"])),
        st.sampled_from([b"CONNECT\n", b"CONNECT\ncontent-length:104857600\n\n", b"STOMP\nlogin:guest\n",
                         b"CONNECT\nlogin:guest\npasscode:guest\n\n\0"]),
    ),
    max_size=12,
)


@pytest.mark.parametrize("twin", TWINS)
@FUZZ
@given(prelogin_chunks)
def test_before_login_no_more_than_the_limit_is_held(twin, chunks):
    """Whatever comes before CONNECT, cut however: the connection either logs in,
    answers ERROR and closes, or holds at most prelogin.MAX_BYTES (after a read)."""
    with codec(twin):
        stomp = Stomp(BrokerCore(FakeLoop()))
    connection = stomp.connection
    for chunk in chunks:
        stomp.feed(chunk)
        if stomp.transport.output.startswith(b"CONNECTED\n"):
            break  # logged in: the normal limits apply
        if connection.state == "connecting":
            assert connection.parser.buffered <= prelogin.MAX_BYTES
        if connection.state == "closed":
            assert connection.parser.buffered == 0  # given back at once
            assert stomp.transport.output.startswith(b"ERROR\n")
            break
