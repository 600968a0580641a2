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
