"""The hand-written codecs of the hot path, both twins (tests/twins.py), give exactly what
pamqp gives."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st
from pamqp import commands, frame
from twins import TWINS

from leveret.amqp.errors import AMQPConnectionError

short = st.text(max_size=40).filter(lambda t: len(t.encode()) <= 255)
exchange_name = st.from_regex(r"\A[a-zA-Z0-9_.:-]{0,40}\Z")  # what pamqp accepts


def payload(method, channel: int = 1) -> bytes:
    return frame.marshal(method, channel)[7:-1]


@settings(max_examples=200, deadline=None)
@pytest.mark.parametrize("twin", TWINS)
@given(exchange=exchange_name, routing_key=short, mandatory=st.booleans(), immediate=st.booleans())
def test_publish_decodes_like_pamqp(twin, exchange, routing_key, mandatory, immediate):
    method = commands.Basic.Publish(exchange=exchange, routing_key=routing_key,
                                    mandatory=mandatory, immediate=immediate)
    decoded = twin.frames.decode_method(payload(method))
    assert isinstance(decoded, commands.Basic.Publish) and dict(decoded) == dict(method)


@settings(max_examples=100, deadline=None)
@pytest.mark.parametrize("twin", TWINS)
@given(tag=st.integers(0, 2**63 - 1), multiple=st.booleans())
def test_ack_decodes_like_pamqp(twin, tag, multiple):
    method = commands.Basic.Ack(delivery_tag=tag, multiple=multiple)
    assert dict(twin.frames.decode_method(payload(method))) == dict(method)


@settings(max_examples=100, deadline=None)
@pytest.mark.parametrize("twin", TWINS)
@given(tag=st.integers(0, 2**63 - 1), multiple=st.booleans(), requeue=st.booleans())
def test_nack_and_reject_decode_like_pamqp(twin, tag, multiple, requeue):
    for method in (commands.Basic.Nack(delivery_tag=tag, multiple=multiple, requeue=requeue),
                   commands.Basic.Reject(delivery_tag=tag, requeue=requeue)):
        decoded = twin.frames.decode_method(payload(method))
        assert type(decoded) is type(method) and dict(decoded) == dict(method)


@settings(max_examples=200, deadline=None)
@pytest.mark.parametrize("twin", TWINS)
@given(channel=st.integers(1, 65535), consumer_tag=short, tag=st.integers(1, 2**63 - 1),
       redelivered=st.booleans(), exchange=exchange_name, routing_key=short)
def test_deliver_encodes_like_pamqp(twin, channel, consumer_tag, tag, redelivered, exchange, routing_key):
    expected = frame.marshal(commands.Basic.Deliver(consumer_tag, tag, redelivered, exchange,
                                                    routing_key), channel)
    assert twin.frames.encode_deliver(channel, consumer_tag.encode(), tag, redelivered, exchange,
                          routing_key) == expected


@pytest.mark.parametrize("raw", [
    payload(commands.Basic.Publish(exchange="ex"))[:-3],          # truncated
    payload(commands.Basic.Publish(exchange="ex")) + b"\x00",     # trailing byte
    payload(commands.Basic.Publish(exchange="ex")).replace(b"ex", b"\xff\xfe"),  # not UTF-8
    payload(commands.Basic.Ack(delivery_tag=1))[:-2],
])
@pytest.mark.parametrize("twin", TWINS)
def test_malformed_fast_path_methods_are_502(twin, raw):
    with pytest.raises(AMQPConnectionError) as info:
        twin.frames.decode_method(raw)
    assert info.value.reply_code == 502
