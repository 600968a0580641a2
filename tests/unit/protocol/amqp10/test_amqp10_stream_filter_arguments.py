"""AMQP 1.0 stream filters on a stream become the consume arguments the stream's chunk
index reads (x-stream-filter, x-stream-match-unfiltered); on other queues a selector."""

from __future__ import annotations

from test_amqp10_filters import amqp_message

from leveret.core.stream_filter import StreamFilter, filter_value, from_arguments
from leveret.protocol.amqp10.filters import source_filters
from leveret.protocol.amqp10.types import Described, Symbol


def described(name: str, value: object) -> Described:
    return Described(Symbol(name), value)


FILTERS = {
    Symbol("rabbitmq:stream-filter"): described("rabbitmq:stream-filter", ["red", "green"]),
    Symbol("rabbitmq:stream-match-unfiltered"): described("rabbitmq:stream-match-unfiltered", True),
}


def test_on_a_stream_the_filter_becomes_consume_arguments():
    out = source_filters(FILTERS, stream=True)
    assert out.selector is None
    assert out.arguments == {"x-stream-filter": ["red", "green"], "x-stream-match-unfiltered": True}
    assert from_arguments(out.arguments) == StreamFilter.of(["red", "green"], True)
    assert out.echoed == FILTERS


def test_elsewhere_it_stays_a_selector():
    out = source_filters(FILTERS, stream=False)
    assert out.arguments == {} and out.selector is not None


def test_core_reads_the_message_annotation():
    assert filter_value(amqp_message(annotations={"x-stream-filter-value": "red"})) == "red"
    assert filter_value(amqp_message()) is None
    assert filter_value(amqp_message(annotations={"x-stream-filter-value": 3})) is None
