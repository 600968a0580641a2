"""The compiled twins of the AMQP 1.0 publish path (``_ctransfer.pyx``) against their
pure references: the transfer fast path gives the same transfer (or gives way) and the
section scan the same sections, or gives way to the pure scan, on valid, arbitrary and
mangled input."""

from __future__ import annotations

import pytest
from compiled_twins import compiled
from hypothesis import given, settings, strategies as st
from test_amqp10_fast_transfer import transfers
from test_amqp10_message_fuzz import message_ish, messages

from leveret.protocol.amqp10 import frames, sections
from leveret.protocol.amqp10.types import DecodeError

COMPILED, NOT_BUILT = compiled("leveret.protocol.amqp10._ctransfer")
pytestmark = pytest.mark.skipif(COMPILED is None, reason=NOT_BUILT)
if COMPILED is not None:  # what message.py hands the twin when it uses it (not under pure Python)
    from leveret.protocol.amqp10 import message as _message

    COMPILED.init_message(_message.Message, _message.AMQP10)
    COMPILED.init_delivery(_message._Rendered, _message._routing_annotations, _message.py_encode_transfer)


def _pure_scan(payload: bytes) -> sections.Scan | type[DecodeError]:
    try:
        return sections.py_scan(payload)
    except DecodeError:
        return DecodeError


def _check_scan(payload: bytes) -> None:
    found = COMPILED.scan(payload)
    if found is not None:  # the common case: the same sections as the pure scan
        assert found == _pure_scan(payload)
    assert (sections.scan(payload) if _pure_scan(payload) is not DecodeError else DecodeError) == _pure_scan(
        payload
    )


@settings(max_examples=400, deadline=None)
@given(messages())
def test_scan_of_valid_messages(payload: bytes) -> None:
    assert COMPILED.scan(payload) in (None, sections.py_scan(payload))
    _check_scan(payload)


@settings(max_examples=400, deadline=None)
@given(message_ish)
def test_scan_of_message_like_bytes(payload: bytes) -> None:
    _check_scan(payload)


@settings(max_examples=400, deadline=None)
@given(messages(), st.integers(0, 10_000), st.integers(0, 255), st.integers(0, 10_000))
def test_scan_of_mangled_and_cut_messages(payload: bytes, where: int, byte: int, cut: int) -> None:
    mangled = bytearray(payload)
    mangled[where % len(mangled)] = byte
    _check_scan(bytes(mangled))
    _check_scan(payload[: cut % (len(payload) + 1)])


@settings(max_examples=400, deadline=None)
@given(transfers, st.binary(max_size=40), st.integers(0, 200), st.integers(0, 255), st.booleans())
def test_fast_transfer_as_the_pure_one(transfer, payload: bytes, where: int, byte: int, mangle: bool) -> None:
    frame = bytearray(frames.encode_frame(transfer, 0, payload))
    if mangle:
        frame[8 + where % (len(frame) - 8)] = byte
    frame_bytes = bytes(frame)
    assert COMPILED.fast_transfer(frame_bytes, 8, len(frame_bytes)) == frames.py_fast_transfer(
        frame_bytes, 8, len(frame_bytes)
    )


def test_common_messages_are_taken_by_the_twin() -> None:
    from amqp10_sans_io import message_payload

    payload = message_payload(b"x" * 100, durable=True, to="/queues/q", annotations={"x-opt-a": 1}, k="v")
    assert COMPILED.scan(payload) == sections.py_scan(payload)
    frame = frames.encode_frame(frames.perf.Transfer(0, 5, b"tag", 0, False), 0, payload)
    assert COMPILED.fast_transfer(frame, 8, len(frame)) is not None


_OTHER_FRAMES = st.sampled_from(
    [
        frames.encode_frame(frames.perf.Flow(0, 100, 0, 100, 0, 0, 10), 1),
        frames.encode_frame(frames.perf.Disposition(True, 0, 5, True, frames.perf.Accepted()), 2),
        frames.encode_frame(None, 0),  # a heartbeat
        frames.AMQP_HEADER,  # a protocol header: the splitter stops there
        b"\x00\x00\x00\x09\x02\x00\x00\x00\x40",  # a body that is no performative
        b"\x00\x00\x00\x0c\x05\x00\x00\x00\x00\x53\x14\x45",  # doff 5
    ]
)


@st.composite
def frame_streams(draw: st.DrawFn) -> bytes:
    """Frames as a client sends them: transfers (any fields, channels, payloads),
    other frames, a protocol header; some mangled or cut."""
    parts = []
    for _ in range(draw(st.integers(0, 6))):
        if draw(st.booleans()):
            channel = draw(st.integers(0, 0xFFFF))
            parts.append(frames.encode_frame(draw(transfers), channel, draw(st.binary(max_size=40))))
        else:
            parts.append(draw(_OTHER_FRAMES))
    data = bytearray(b"".join(parts))
    if data and draw(st.booleans()):
        data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    return bytes(data[: draw(st.integers(0, len(data)))] if draw(st.booleans()) else data)


def _split(split, data: bytes, pos: int, max_size: int):
    try:
        return split(data, pos, max_size, frames.decode_frame)
    except DecodeError as exc:
        return type(exc), str(exc), exc.condition


@settings(max_examples=600, deadline=None)
@given(frame_streams(), st.integers(0, 30), st.sampled_from([8, 20, 64, 512, 1 << 20]))
def test_split_frames_as_the_pure_one(data: bytes, pos: int, max_size: int) -> None:
    """The compiled splitter gives the same items (FastTransfer tuples, decoded frames),
    stops at the same place and raises the same DecodeError as the pure one."""
    assert _split(COMPILED.split_frames, data, pos, max_size) == _split(
        frames.py_split_frames, data, pos, max_size
    )


@settings(max_examples=300, deadline=None)
@given(frame_streams(), st.lists(st.integers(0, 400), max_size=4))
def test_frame_reader_with_either_splitter(data: bytes, cuts: list[int]) -> None:
    """FrameReader.feed, fed the same bytes in the same reads, gives the same frames
    (or the same error) with either twin of the splitter."""
    from sans_io import split

    def run(splitter) -> list:
        original = frames._split_frames
        frames._split_frames = splitter
        reader = frames.FrameReader(1 << 20)
        out: list = []
        try:
            for piece in split(frames.AMQP_HEADER + data, cuts):
                out += reader.feed(piece)
        except DecodeError as exc:
            out.append((str(exc), exc.condition))
        finally:
            frames._split_frames = original
        return out

    assert run(COMPILED.split_frames) == run(frames.py_split_frames)


def test_a_common_transfer_is_a_fast_transfer_tuple() -> None:
    transfer = frames.perf.Transfer(7, 9, b"t", 0, True, False)
    data = frames.encode_frame(transfer, 3, b"payload") * 2
    for split in (COMPILED.split_frames, frames.py_split_frames):
        items, pos = split(data, 0, 512, frames.decode_frame)
        assert pos == len(data)
        assert items == [(3, 7, 9, b"t", 0, True, False, b"payload")] * 2
        assert frames.as_frame(items[0]) == frames.decode_frame(data[: len(data) // 2])


def _facts(found) -> object:
    """A decoded message's fields, or the error that refused it."""
    from leveret.core.message import Message

    if isinstance(found, tuple):  # py_decode's (message, annotations)
        message, annotations = found
        if annotations is not None:
            return "annotations", annotations
        found = message
    if isinstance(found, Message):
        return tuple(
            getattr(found, name)
            for name in (
                "exchange", "routing_key", "body", "format", "encoded", "persistent", "ttl", "priority", "cc",
                "deaths",
            )
        )
    return found


def _decode_both(payload: bytes) -> None:
    from leveret.protocol.amqp10 import message

    try:
        compiled = _facts(COMPILED.decode_message(payload, "ex", "rk"))
    except DecodeError as exc:
        compiled = (type(exc), str(exc), exc.condition)
    try:
        pure = _facts(message.py_decode(payload, "ex", "rk"))
    except DecodeError as exc:
        pure = (type(exc), str(exc), exc.condition)
    if compiled is not None:  # it took the payload: the same message, or the same error
        assert compiled == pure


@settings(max_examples=500, deadline=None)
@given(messages())
def test_decode_message_as_the_pure_one(payload: bytes) -> None:
    _decode_both(payload)


@settings(max_examples=400, deadline=None)
@given(messages(), st.integers(0, 10_000), st.integers(0, 255))
def test_decode_message_of_mangled_messages(payload: bytes, where: int, byte: int) -> None:
    mangled = bytearray(payload)
    mangled[where % len(mangled)] = byte
    _decode_both(bytes(mangled))


@settings(max_examples=300, deadline=None)
@given(message_ish)
def test_decode_message_of_message_like_bytes(payload: bytes) -> None:
    _decode_both(payload)


def test_common_messages_are_decoded_by_the_twin() -> None:
    from amqp10_sans_io import message_payload
    from proton import Message as ProtonMessage

    from leveret.protocol.amqp10 import message

    for payload in (
        message_payload(b"x" * 100, durable=True, to="/queues/q", k="v"),
        bytes(ProtonMessage(body=b"x" * 100, durable=False).encode()),
        bytes(ProtonMessage(body="text", priority=7, ttl=2.5, id=5).encode()),
    ):
        found = COMPILED.decode_message(payload, "e", "k")
        assert found is not None
        assert _facts(found) == _facts(message.py_decode(payload, "e", "k"))


def _deliveries(payload: bytes, exchange: str, key: str):
    """Two copies of the message ``payload`` decodes to (None if it does not): each
    twin renders (and caches on) its own."""
    from leveret.protocol.amqp10 import message

    try:
        return [message.py_decode(payload, exchange, key)[0] for _ in range(2)]
    except DecodeError:
        return None


@settings(max_examples=500, deadline=None)
@given(
    messages(),
    st.sampled_from(["", "amq.topic", "ex"]),
    st.sampled_from(["", "q", "a.b.c", "k" * 300]),
    st.integers(-5, 2**32 + 5),
    st.booleans(),
    st.none() | st.integers(-5, 2**33),
    st.none() | st.integers(-3, 300),
    st.booleans(),
    st.integers(1, 3),
)
def test_encode_transfer_as_the_pure_one(
    payload, exchange, key, count, first, ttl_left, priority, dead, times
) -> None:
    """The compiled encoder gives the same payload as the pure one (or the same error:
    it hands what it does not take to the pure one), delivery after delivery, and
    leaves the same rendering cached on the message."""
    from leveret.core.message import Death
    from leveret.protocol.amqp10 import message

    pair = _deliveries(payload, exchange, key)
    if pair is None:
        return
    if dead:
        pair = [m.dead(Death("q", "rejected", 1, exchange, (key,)), "dlx", "k") for m in pair]
    for m in pair:
        m.priority = priority
    compiled_message, pure_message = pair

    def encode(twin, m):
        try:
            return twin(m, count, first, ttl_left)
        except ValueError as exc:
            return str(exc)

    for _ in range(times):
        pure = encode(message.py_encode_transfer, pure_message)
        assert encode(COMPILED.encode_transfer, compiled_message) == pure
        assert type(compiled_message.rendered) is type(pure_message.rendered)
        if pure_message.rendered is not None:
            assert compiled_message.rendered == pure_message.rendered


def test_common_deliveries_are_encoded_by_the_twin() -> None:
    from proton import Message as ProtonMessage

    from leveret.protocol.amqp10 import message

    payload = bytes(ProtonMessage(body=b"x" * 100, durable=True).encode())
    first, second = (message.py_decode(payload, "", "q")[0] for _ in range(2))
    assert COMPILED.encode_transfer(first, 0, True, None) == message.py_encode_transfer(second, 0, True, None)
    assert first.rendered == second.rendered and first.rendered is not None
    assert COMPILED.encode_transfer(first, 3, False, 500) == message.py_encode_transfer(second, 3, False, 500)


@settings(max_examples=400, deadline=None)
@given(
    messages(),
    st.sampled_from(["", "ex"]),
    st.sampled_from(["", "q"]),
    st.integers(0, 0x10000),
    st.integers(0, 2**32 - 1),
    st.integers(0, 2**32 - 1),
    st.booleans(),
    st.sampled_from([512, 700, 1 << 20]),
    st.integers(0, 300),
    st.booleans(),
    st.none() | st.integers(0, 2**32),
)
def test_transfer_frame_as_the_pure_one(
    payload, exchange, key, channel, handle, delivery_id, settled, max_frame, count, first, ttl_left
) -> None:
    """The compiled delivery frame is the pure one's bytes; where either gives None the
    caller encodes the delivery the usual way, and both end with the same rendering
    cached on the message."""
    from leveret.protocol.amqp10 import message, transfer_frames

    pair = _deliveries(payload, exchange, key)
    if pair is None:
        return
    compiled_message, pure_message = pair
    args = (channel, handle, delivery_id, settled, max_frame)
    facts = (count, first, ttl_left)
    pure = transfer_frames.py_transfer_frame(*args, pure_message, *facts)
    found = COMPILED.transfer_frame(*args, compiled_message, *facts)
    if found is not None:
        assert found == pure
    elif pure is not None:  # the compiled twin left it to the pure encoder
        payload_bytes = message.py_encode_transfer(compiled_message, *facts)
        assert pure.endswith(payload_bytes)
    assert type(compiled_message.rendered) is type(pure_message.rendered) or found is None
    if found is not None:
        assert compiled_message.rendered == pure_message.rendered
