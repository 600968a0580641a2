"""leveret.cluster.peers.take_raw_delivery: a basic.deliver taken whole from a receive
buffer with its content header payload byte for byte (as pamqp encodes the frames)."""

from __future__ import annotations

from pamqp import commands, frame, header
from pamqp.body import ContentBody

from leveret.cluster.peers import take_raw_delivery


def frames(body: bytes, properties: commands.Basic.Properties, channel: int = 3) -> tuple[bytes, bytes]:
    deliver = commands.Basic.Deliver("ctag", 42, True, "ex", "rk")
    head = header.ContentHeader(0, len(body), properties)
    data = frame.marshal(deliver, channel) + frame.marshal(head, channel)
    if body:
        data += frame.marshal(ContentBody(body), channel)
    payload = frame.marshal(head, channel)[7:-1]
    return data, payload


def test_a_delivery_and_its_header_bytes() -> None:
    properties = commands.Basic.Properties(
        content_type="text/plain", headers={"a": 1, "b": "two"}, delivery_mode=2, priority=4)
    data, payload = frames(b"hello", properties)
    taken = take_raw_delivery(bytearray(data + b"\x01rest"))
    assert taken is not None
    size, delivery = taken
    assert size == len(data)
    assert (delivery.delivery_tag, delivery.redelivered, delivery.exchange, delivery.routing_key) == (
        42, True, "ex", "rk")
    assert (delivery.consumer_tag, delivery.channel, delivery.body) == ("ctag", 3, b"hello")
    assert delivery.header == payload


def test_an_empty_body_and_incomplete_buffers() -> None:
    data, payload = frames(b"", commands.Basic.Properties())
    taken = take_raw_delivery(bytearray(data))
    assert taken is not None and taken[0] == len(data)
    assert taken[1].body == b"" and taken[1].header == payload
    full, _ = frames(b"x" * 100, commands.Basic.Properties(message_id="m"))
    for cut in range(len(full)):
        assert take_raw_delivery(bytearray(full[:cut])) is None
    assert take_raw_delivery(bytearray(frame.marshal(commands.Basic.Ack(1), 1))) is None
