"""The transfer fast path of :func:`leveret.protocol.amqp10.frames.decode_frame` reads
exactly what the generic decoder reads, and gives way to it for anything else."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from leveret.protocol.amqp10 import frames, performatives as perf
from leveret.protocol.amqp10.session import transfer_body
from leveret.protocol.amqp10.types import DecodeError

_UINT = st.integers(0, 2**32 - 1)
transfers = st.builds(
    perf.Transfer,
    handle=_UINT,
    delivery_id=st.none() | _UINT,
    delivery_tag=st.none() | st.binary(max_size=32),
    message_format=st.none() | _UINT,
    settled=st.none() | st.booleans(),
    more=st.booleans(),
    rcv_settle_mode=st.none() | st.integers(0, 1),
    aborted=st.booleans(),
)


def _generic(frame: bytes) -> frames.Frame | Exception:
    original = frames._fast_transfer
    frames._fast_transfer = lambda *args: None  # type: ignore[assignment]
    try:
        return frames.decode_frame(frame)
    except DecodeError as exc:
        return exc
    finally:
        frames._fast_transfer = original


def _fast(frame: bytes) -> frames.Frame | Exception:
    try:
        return frames.decode_frame(frame)
    except DecodeError as exc:
        return exc


@settings(max_examples=500, deadline=None)
@given(transfers, st.binary(max_size=64))
def test_same_as_the_generic_decoder(transfer: perf.Transfer, payload: bytes) -> None:
    frame = frames.encode_frame(transfer, 3, payload)
    assert _fast(frame) == _generic(frame) == frames.Frame(3, transfer, payload)


@settings(max_examples=300, deadline=None)
@given(_UINT, _UINT, st.binary(max_size=20), st.booleans(), st.booleans(), st.binary(max_size=40))
def test_hand_encoded_transfers(
    handle: int, delivery_id: int, tag: bytes, settled: bool, more: bool, payload: bytes
) -> None:
    body = transfer_body(handle, delivery_id, tag, settled, more)
    frame = (8 + len(body) + len(payload)).to_bytes(4, "big") + b"\x02\x00\x00\x00" + body + payload
    expected = perf.Transfer(handle, delivery_id, tag, 0, settled, more)
    assert _fast(frame) == _generic(frame) == frames.Frame(0, expected, payload)


@settings(max_examples=500, deadline=None)
@given(transfers, st.integers(0, 200), st.integers(0, 255))
def test_mangled_transfers_decode_alike(transfer: perf.Transfer, position: int, value: int) -> None:
    frame = bytearray(frames.encode_frame(transfer, 0, b"payload"))
    frame[8 + position % (len(frame) - 8)] = value
    fast, generic = _fast(bytes(frame)), _generic(bytes(frame))
    if isinstance(generic, Exception):
        assert isinstance(fast, Exception) and type(fast) is type(generic)
    else:
        assert fast == generic


@settings(max_examples=300, deadline=None)
@given(
    st.integers(0, 0xFFFF),
    _UINT,
    _UINT,
    st.sampled_from([perf.Accepted(), perf.Released(), perf.Rejected(), perf.Modified(True)]),
)
def test_settled_dispositions_are_the_generic_encoders_bytes(channel, first, last, state) -> None:
    """The hand-encoded disposition of the publish path (session.settled_disposition)
    is byte for byte what the generic encoder writes, or left to it."""
    from leveret.protocol.amqp10.session import settled_disposition

    frame = settled_disposition(channel, first, last, state)
    generic = frames.encode_frame(perf.Disposition(perf.ROLE_RECEIVER, first, last, True, state), channel)
    if isinstance(state, (perf.Accepted, perf.Released)):
        assert frame == generic
    else:
        assert frame is None
