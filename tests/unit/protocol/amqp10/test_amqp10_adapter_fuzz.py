"""Fuzzing the AMQP 1.0 adapter: whatever bytes a client sends, after any prefix of a
valid session, the connection answers or closes; it never raises."""

from __future__ import annotations

from amqp10_sans_io import Client, message_payload
from hypothesis import HealthCheck, given, settings, strategies as st
from sans_io import FakeLoop

from leveret.core.broker import BrokerCore
from leveret.protocol.amqp10 import performatives as perf
from leveret.protocol.amqp10.frames import AMQP_HEADER, SASL_HEADER, TYPE_SASL, encode_frame


def _script() -> list[bytes]:
    """A valid conversation: login, open, begin, a sender and a receiver, transfers,
    flow, dispositions, detach, end, close."""
    return [
        SASL_HEADER,
        encode_frame(perf.SaslInit("PLAIN", b"\x00guest\x00guest"), type=TYPE_SASL),
        AMQP_HEADER,
        encode_frame(perf.Open("fuzz")),
        encode_frame(perf.Begin(None, 0, 100, 100)),
        encode_frame(
            perf.Attach(
                "s",
                0,
                perf.ROLE_SENDER,
                0,
                0,
                perf.Source(),
                perf.Target("/queues/q"),
                initial_delivery_count=0,
            )
        ),
        encode_frame(perf.Transfer(0, 0, b"t0", 0, False), 0, message_payload(b"a")),
        encode_frame(perf.Transfer(0, 1, b"t1", 0, False, True), 0, message_payload(b"b")[:5]),
        encode_frame(perf.Transfer(0, 1, None, None, None, False), 0, message_payload(b"b")[5:]),
        encode_frame(perf.Attach("r", 1, perf.ROLE_RECEIVER, 0, 0, perf.Source("/queues/q"), perf.Target())),
        encode_frame(perf.Flow(0, 100, 0, 100, 1, 0, 5)),
        encode_frame(perf.Disposition(perf.ROLE_RECEIVER, 0, 1, True, perf.Released())),
        encode_frame(perf.Detach(1, True)),
        encode_frame(perf.End()),
        encode_frame(perf.Close()),
    ]


SCRIPT = _script()


def _run(data: list[bytes]) -> None:
    loop = FakeLoop()
    core = BrokerCore(loop)
    core.vhosts.get("/").declare_queue("q", None, False, True)
    client = Client(core, loop)
    for chunk in data:
        client.write(chunk)
        if client.closed:
            break
    client.received()
    loop.advance(60)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, len(SCRIPT)), st.binary(max_size=300))
def test_garbage_after_a_valid_prefix(cut: int, garbage: bytes) -> None:
    _run([*SCRIPT[:cut], garbage])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, len(SCRIPT) - 1), st.integers(0, 10_000), st.integers(0, 255))
def test_one_byte_changed(index: int, position: int, value: int) -> None:
    data = list(SCRIPT)
    chunk = bytearray(data[index])
    chunk[position % len(chunk)] = value
    data[index] = bytes(chunk)
    _run(data)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.permutations(SCRIPT[5:-1]))
def test_frames_in_any_order(frames: list[bytes]) -> None:
    _run([*SCRIPT[:5], *frames])
