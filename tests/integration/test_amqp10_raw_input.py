"""Hostile AMQP 1.0 input over raw sockets (tests/amqp10_raw.py): bad protocol headers,
frames over max-frame-size, garbage performatives, against leveret and RabbitMQ 3.10
(tests/amqp10_brokers.py); a proton client on the same broker carries on meanwhile.

RabbitMQ 4 (leveret's model) answers a protocol header it does not support with its own
and closes (§2.2), closes with ``amqp:connection:framing-error`` for a frame over the
max-frame-size it announced (§2.7.1) and ``amqp:decode-error`` for a body that does not
decode. RabbitMQ 3.10 differs: see each test.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest
from amqp10_brokers import Amqp10Broker
from amqp10_clients import TIMEOUT, blocking
from amqp10_raw import RawAmqp10
from proton import Delivery, Message

from leveret.protocol.amqp10 import performatives as perf
from leveret.protocol.amqp10.frames import AMQP_HEADER
from leveret.protocol.amqp10.types import Described, ULong, encode

pytestmark = pytest.mark.timeout(30)

#: A frame on channel 0 whose body starts like a described value but holds type
#: code 0x99, which does not exist.
GARBAGE_FRAME = b"\x00\x00\x00\x10\x02\x00\x00\x00" + b"\x00\x53\x99\xff\xff\xff\xff\xff"


def frame_of(body: bytes) -> bytes:
    return (8 + len(body)).to_bytes(4, "big") + b"\x02\x00\x00\x00" + body


def read_all(sock: socket.socket, timeout: float) -> tuple[bytes, bool]:
    """What the broker sends within ``timeout`` seconds, and whether it then closed the
    socket (end of stream or reset)."""
    data = b""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return data, False
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            return data, False
        except ConnectionResetError:
            return data, True
        if not chunk:
            return data, True
        data += chunk


@pytest.mark.parametrize(
    "header",
    [b"HTTP/1.1 200\r\n\r\n", b"AMQP\x00\x01\x00\x01", b"AMQP\x04\x01\x00\x00", b"AMQP\x00\x02\x00\x00"],
    ids=["http", "revision-1", "protocol-4", "major-2"],
)
def test_bad_protocol_header_is_answered_and_closed(amqp10_broker: Amqp10Broker, header: bytes) -> None:
    """The broker's own protocol header (8 bytes, ``AMQP`` then a version it speaks) and
    the socket closes. RabbitMQ 3.10 answers the AMQP 0-9-1 header ``AMQP\\x00\\x00\\x09\\x01``,
    or the SASL header for protocol id 4."""
    with socket.create_connection((amqp10_broker.host, amqp10_broker.port), timeout=TIMEOUT) as sock:
        sock.sendall(header)
        data, closed = read_all(sock, TIMEOUT)
    assert closed
    assert len(data) == 8 and data.startswith(b"AMQP") and data != header, data


def test_frame_over_max_frame_size_is_a_framing_error(amqp10_broker: Amqp10Broker) -> None:
    """A frame header announcing one byte more than the broker's max-frame-size:
    close with amqp:connection:framing-error, then the socket closes. RabbitMQ 3.10
    announces 4,294,967,295 (no limit a frame can cross)."""
    with RawAmqp10(amqp10_broker.host, amqp10_broker.port) as raw:
        limit = raw.open().max_frame_size
        if amqp10_broker.name == "rabbitmq":
            assert limit == 2**32 - 1
            return
        assert limit < 2**32 - 1
        raw.send((limit + 1).to_bytes(4, "big") + b"\x02\x00\x00\x00" + b"\x00" * 64)
        seen = raw.wait_closed(TIMEOUT)
    closes = [f.body for f in seen if isinstance(getattr(f, "body", None), perf.Close)]
    assert closes and closes[0].error is not None, seen
    assert closes[0].error.condition == "amqp:connection:framing-error"


def test_frame_over_512_bytes_before_open(amqp10_broker: Amqp10Broker) -> None:
    """Before the open frames are exchanged a peer may send at most 512 bytes a frame
    (§2.7.1): RabbitMQ 4 (leveret) closes with a framing error (or just the socket);
    RabbitMQ 3.10 waits for the rest of the frame."""
    with RawAmqp10(amqp10_broker.host, amqp10_broker.port) as raw:
        assert raw.sasl().code == perf.SASL_OK
        raw.send(AMQP_HEADER)
        raw.send((100_000).to_bytes(4, "big") + b"\x02\x00\x00\x00" + b"\x00" * 100)
        data, closed = read_all(raw.sock, 1.0 if amqp10_broker.name == "rabbitmq" else TIMEOUT)
    assert data.startswith(AMQP_HEADER)
    assert closed == (amqp10_broker.name != "rabbitmq")
    if closed and len(data) > 8:
        assert b"amqp:connection:framing-error" in data


@pytest.mark.parametrize(
    "frame",
    [GARBAGE_FRAME, frame_of(encode(Described(ULong(0x77), [1, 2])))],
    ids=["bad-type-code", "unknown-descriptor"],
)
def test_garbage_performative_is_a_decode_error(amqp10_broker: Amqp10Broker, frame: bytes) -> None:
    """After open, a frame whose body does not decode (a type code that does not exist)
    or is no performative: close with amqp:decode-error and the socket closes.
    RabbitMQ 3.10 closes with amqp:internal-error (its description holds an Erlang stack
    trace, with the raw bytes in a string: not valid UTF-8) and waits for the client to
    close the socket."""
    with RawAmqp10(amqp10_broker.host, amqp10_broker.port) as raw:
        raw.open()
        raw.send(frame)
        data, closed = read_all(raw.sock, 1.0 if amqp10_broker.name == "rabbitmq" else TIMEOUT)
    assert data[8:11] == b"\x00\x53\x18", data[:40]  # a close performative
    if amqp10_broker.name == "rabbitmq":
        assert b"amqp:internal-error" in data and not closed
    else:
        assert b"amqp:decode-error" in data and closed


def test_a_second_open_is_refused(amqp10_broker: Amqp10Broker) -> None:
    """An open after open: RabbitMQ 4 (leveret) closes with an error; RabbitMQ 3.10
    answers with a close without one."""
    with RawAmqp10(amqp10_broker.host, amqp10_broker.port) as raw:
        raw.open()
        raw.send_frame(perf.Open(container_id="again"))
        close = raw.read_body(perf.Close)
    if amqp10_broker.name == "rabbitmq":
        assert close.error is None
    else:
        assert close.error is not None and close.error.condition.startswith("amqp:")


def test_other_clients_carry_on_while_raw_peers_misbehave(amqp10_broker: Amqp10Broker) -> None:
    """A proton sender keeps getting accepted outcomes while raw peers send a bad
    header, garbage and (where the broker has a limit) an oversized frame."""
    queue = amqp10_broker.declare()
    errors: list[BaseException] = []
    stop = threading.Event()
    sent = [0]

    def produce() -> None:
        try:
            with blocking(amqp10_broker) as conn:
                sender = conn.create_sender(amqp10_broker.queue(queue))
                while not stop.is_set():
                    assert sender.send(Message(body=sent[0])).remote_state == Delivery.ACCEPTED
                    sent[0] += 1
        except BaseException as error:
            errors.append(error)

    worker = threading.Thread(target=produce)
    worker.start()
    try:
        for bad in (b"HTTP/1.1 200\r\n\r\n", b"AMQP\x00\x01\x00\x00" + b"\xff" * 64):
            with socket.create_connection((amqp10_broker.host, amqp10_broker.port), timeout=TIMEOUT) as sock:
                sock.sendall(bad)
                read_all(sock, 1.0)
        with RawAmqp10(amqp10_broker.host, amqp10_broker.port) as raw:
            limit = raw.open().max_frame_size
            raw.send(GARBAGE_FRAME)
            if limit < 2**32 - 1:
                raw.send((limit + 1).to_bytes(4, "big") + b"\x02\x00\x00\x00")
            read_all(raw.sock, 1.0)
        before = sent[0]
        deadline = time.monotonic() + TIMEOUT
        while sent[0] < before + 10 and time.monotonic() < deadline and not errors:
            time.sleep(0.01)
    finally:
        stop.set()
        worker.join(TIMEOUT)
    assert not errors, errors
    assert sent[0] >= before + 10
