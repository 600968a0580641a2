"""Filters on AMQP 1.0 sources over real TCP: python-qpid-proton's Selector (the JMS
selector filter) and Filter (RabbitMQ 4's property, application-property and SQL filter
expressions) on a classic queue, and rabbitmq-amqp-python-client's StreamConsumerOptions
(offset specification, filter values, match-unfiltered, SQL, property filters) on a
stream. Each test ends with a sentinel that matches, so "nothing else was delivered" is
checked without waiting for a timeout."""

from __future__ import annotations

import datetime
import itertools
from collections.abc import Iterator
from typing import Any

import pika
import pytest
from proton import Described, Message, symbol
from proton.reactor import Filter, Selector
from proton.utils import BlockingConnection, LinkDetached
from rabbitmq_amqp_python_client import (
    AMQPMessagingHandler,
    Converter,
    Environment,
    Message as RMessage,
    MessageProperties,
    OffsetSpecification,
    StreamConsumerOptions,
    StreamFilterOptions,
)

from leveret import BlockingBroker
from leveret.core.queues.stream import SCAN_BUDGET

pytestmark = pytest.mark.timeout(30)
_names = itertools.count()


@pytest.fixture(scope="module")
def broker() -> Iterator[BlockingBroker]:
    with BlockingBroker(amqp_port=0) as b:
        yield b


@pytest.fixture
def channel(broker: BlockingBroker) -> Iterator[Any]:
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.amqp_port))
    yield connection.channel()
    connection.close()


@pytest.fixture
def amqp10(broker: BlockingBroker) -> Iterator[BlockingConnection]:
    connection = BlockingConnection(f"amqp://guest:guest@127.0.0.1:{broker.amqp_port}")
    yield connection
    connection.close()


def queue(channel: Any, stream: bool = False) -> str:
    name = f"filters-{next(_names)}"
    channel.queue_declare(name, durable=True, arguments={"x-queue-type": "stream"} if stream else None)
    return name


def echoed(receiver: Any) -> dict:
    data = receiver.link.remote_source.filter
    data.rewind()
    return data.get_object() if data.next() else {}


def described(name: str, value: Any) -> Described:
    return Described(symbol(name), value)


def bodies(receiver: Any, until: str = "last") -> list[str]:
    """Bodies received (each accepted) up to the sentinel ``until``."""
    got = []
    while True:
        message = receiver.receive(timeout=5)
        receiver.accept()
        body = message.body
        body = bytes(body).decode() if isinstance(body, bytes | memoryview) else body
        got.append(body)
        if body == until:
            return got


def waiting(channel: Any, name: str) -> int:
    return channel.queue_declare(name, passive=True).method.message_count


# -- classic queues, python-qpid-proton ---------------------------------------------------
def test_jms_selector_delivers_matching_messages_and_leaves_the_others(amqp10, channel):
    name = queue(channel)
    sender = amqp10.create_sender(f"/queues/{name}")
    for i in range(6):
        sender.send(Message(body=f"m{i}", subject="red" if i % 2 else "blue", properties={"n": i}))
    receiver = amqp10.create_receiver(
        f"/queues/{name}", credit=10, options=Selector("n > 1 AND JMSType = 'red'")
    )
    assert echoed(receiver) == {
        symbol("selector"): described("apache.org:selector-filter:string", "n > 1 AND JMSType = 'red'")
    }
    sender.send(Message(body="last", subject="red", properties={"n": 99}))
    assert bodies(receiver) == ["m3", "m5", "last"]
    receiver.close()
    assert waiting(channel, name) == 4  # m0, m1, m2, m4 stay in the queue


def test_jms_selector_on_headers_of_an_amqp_091_message(amqp10, channel):
    name = queue(channel)
    for colour in ("green", "red", "red"):
        channel.basic_publish("", name, colour.encode(), pika.BasicProperties(headers={"colour": colour}))
    channel.basic_publish("", name, b"last", pika.BasicProperties(headers={"colour": "red"}, priority=8))
    receiver = amqp10.create_receiver(f"/queues/{name}", credit=10, options=Selector("colour = 'red'"))
    assert bodies(receiver) == ["red", "red", "last"]
    receiver.close()


def test_invalid_jms_selector_refuses_the_link(amqp10, channel):
    name = queue(channel)
    with pytest.raises(LinkDetached) as info:
        amqp10.create_receiver(f"/queues/{name}", credit=10, options=Selector("n >"))
    assert "amqp:invalid-field" in str(info.value)


def test_properties_filter_with_prefix_and_suffix(amqp10, channel):
    name = queue(channel)
    sender = amqp10.create_sender(f"/queues/{name}")
    for subject in ("order.created", "order.paid", "invoice.created", "order.created.last"):
        sender.send(Message(body=subject, subject=subject))
    props = described("amqp:properties-filter", {symbol("subject"): "&p:order."})
    receiver = amqp10.create_receiver(f"/queues/{name}", credit=10, options=Filter({symbol("props"): props}))
    assert echoed(receiver) == {symbol("props"): props}
    assert bodies(receiver, "order.created.last") == ["order.created", "order.paid", "order.created.last"]
    receiver.close()
    suffix = described("amqp:properties-filter", {symbol("subject"): "&s:.created"})
    receiver = amqp10.create_receiver(f"/queues/{name}", credit=10, options=Filter({symbol("f"): suffix}))
    sender.send(Message(body="last", subject="x.created"))
    assert bodies(receiver) == ["invoice.created", "last"]
    receiver.close()


def test_application_properties_and_sql_filters(amqp10, channel):
    name = queue(channel)
    sender = amqp10.create_sender(f"/queues/{name}")
    for i in range(6):
        sender.send(
            Message(body=f"m{i}", subject="s", properties={"region": "eu" if i < 3 else "us", "n": i})
        )
    app = described("amqp:application-properties-filter", {"region": "us"})
    receiver = amqp10.create_receiver(f"/queues/{name}", credit=10, options=Filter({symbol("a"): app}))
    sender.send(Message(body="last", properties={"region": "us"}))
    assert bodies(receiver) == ["m3", "m4", "m5", "last"]
    receiver.close()
    sql = described("amqp:sql-filter", "region = 'eu' AND (n = 0 OR p.subject != 's')")
    receiver = amqp10.create_receiver(
        f"/queues/{name}", credit=10, options=Filter({symbol("sql-filter"): sql})
    )
    assert echoed(receiver) == {symbol("sql-filter"): sql}
    sender.send(Message(body="last", subject="t", properties={"region": "eu", "n": 7}))
    assert bodies(receiver) == ["m0", "last"]
    receiver.close()


def test_a_filter_on_a_quorum_queue_leaves_the_others_for_other_consumers(amqp10, channel):
    name = f"filters-{next(_names)}"
    channel.queue_declare(name, durable=True, arguments={"x-queue-type": "quorum"})
    sender = amqp10.create_sender(f"/queues/{name}")
    for i in range(4):
        sender.send(Message(body=f"m{i}", properties={"k": i % 2}))
    odd = described("amqp:application-properties-filter", {"k": 1})
    receiver = amqp10.create_receiver(f"/queues/{name}", credit=10, options=Filter({symbol("odd"): odd}))
    sender.send(Message(body="last", properties={"k": 1}))
    assert bodies(receiver) == ["m1", "m3", "last"]
    receiver.close()
    everything = amqp10.create_receiver(f"/queues/{name}", credit=10)
    sender.send(Message(body="last", properties={"k": 0}))
    assert bodies(everything) == ["m0", "m2", "last"]
    everything.close()


def test_unsupported_filters_are_not_echoed_nor_applied(amqp10, channel):
    name = queue(channel)
    sender = amqp10.create_sender(f"/queues/{name}")
    sender.send(Message(body="first", properties={"n": 1}))
    sender.send(Message(body="last", properties={"n": 2}))
    unknown = described("example.com:colour-filter", "red")
    modulo = described("amqp:sql-filter", "n % 2 = 0")  # valid SQL, beyond core's grammar
    receiver = amqp10.create_receiver(
        f"/queues/{name}", credit=10, options=Filter({symbol("colour"): unknown, symbol("sql"): modulo})
    )
    assert echoed(receiver) == {}
    assert bodies(receiver) == ["first", "last"]
    receiver.close()


# -- streams, rabbitmq-amqp-python-client ------------------------------------------------
class _Done(Exception):
    pass


class _Collect(AMQPMessagingHandler):
    def __init__(self) -> None:
        super().__init__()
        self.got: list[str] = []

    def on_amqp_message(self, event: Any) -> None:
        body = Converter.bytes_to_string(event.message.body)
        self.got.append(body)
        self.delivery_context.accept(event)
        if body.endswith("last"):
            raise _Done


@pytest.fixture
def rabbit(broker: BlockingBroker) -> Iterator[Any]:
    connection = Environment(f"amqp://guest:guest@127.0.0.1:{broker.amqp_port}/").connection()
    connection.dial()
    yield connection
    connection.close()


def consume(
    rabbit: Any, name: str, offset: Any = None, filters: StreamFilterOptions | None = None
) -> list[str]:
    handler = _Collect()
    consumer = rabbit.consumer(
        f"/queues/{name}",
        message_handler=handler,
        consumer_options=StreamConsumerOptions(offset_specification=offset, filter_options=filters),
    )
    try:
        consumer.run()
    except _Done:
        pass
    consumer.close()
    return handler.got


def stream_message(body: str, value: str | None, subject: str, k: int) -> RMessage:
    """A message with the stream filter value ``value`` (none when None), ``subject`` and
    the application property ``k``."""
    return RMessage(
        body=Converter.string_to_bytes(body),
        annotations={"x-stream-filter-value": value} if value else {},
        subject=subject,
        application_properties={"k": k},
    )


def fill(rabbit: Any, name: str) -> None:
    """m0 … m3: filter values red, blue, none, red; subjects a … d; property k = i."""
    publisher = rabbit.publisher(f"/queues/{name}")
    for i, value in enumerate(["red", "blue", None, "red"]):
        publisher.publish(stream_message(f"m{i}", value, "abcd"[i], i))
    publisher.close()


def test_stream_offset_specifications(rabbit, channel):
    name = queue(channel, stream=True)
    fill(rabbit, name)
    publisher = rabbit.publisher(f"/queues/{name}")
    publisher.publish(RMessage(body=Converter.string_to_bytes("m4-last")))
    assert consume(rabbit, name, OffsetSpecification.first) == ["m0", "m1", "m2", "m3", "m4-last"]
    assert consume(rabbit, name, OffsetSpecification.last) == ["m4-last"]
    assert consume(rabbit, name, 2) == ["m2", "m3", "m4-last"]
    assert consume(rabbit, name, datetime.datetime(2000, 1, 1, tzinfo=datetime.UTC))[0] == "m0"
    publisher.close()


def test_stream_offset_next_and_a_future_timestamp_start_after_the_log(rabbit, channel, amqp10):
    name = queue(channel, stream=True)
    fill(rabbit, name)
    sender = amqp10.create_sender(f"/queues/{name}")
    for spec in ("next", datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)):
        value = spec if isinstance(spec, str) else _timestamp(spec)
        offset = described("rabbitmq:stream-offset-spec", value)
        receiver = amqp10.create_receiver(
            f"/queues/{name}", credit=10, options=Filter({symbol("rabbitmq:stream-offset-spec"): offset})
        )
        assert echoed(receiver) == {symbol("rabbitmq:stream-offset-spec"): offset}
        sender.send(Message(body=f"new-{spec}-last"))
        assert bodies(receiver, f"new-{spec}-last") == [f"new-{spec}-last"]
        receiver.close()


def _timestamp(when: datetime.datetime) -> Any:
    from proton import timestamp

    return timestamp(int(when.timestamp() * 1000))


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        (StreamFilterOptions(values=["red"]), ["m0", "m3", "m5-last"]),
        (
            StreamFilterOptions(values=["blue", "red"], match_unfiltered=True),
            ["m0", "m1", "m2", "m3", "m5-last"],
        ),
        (StreamFilterOptions(sql="p.subject IN ('b', 'c') OR k > 4"), ["m1", "m2", "m5-last"]),
        (StreamFilterOptions(application_properties={"k": 5}), ["m5-last"]),
        (StreamFilterOptions(message_properties=MessageProperties(subject="&p:e")), ["m5-last"]),
    ],
)
def test_stream_filters(rabbit, channel, filters, expected):
    name = queue(channel, stream=True)
    fill(rabbit, name)
    publisher = rabbit.publisher(f"/queues/{name}")
    publisher.publish(stream_message("m4", "green", "x", 4))
    publisher.publish(stream_message("m5-last", "red", "e", 5))
    publisher.close()
    assert consume(rabbit, name, OffsetSpecification.first, filters) == expected


def test_a_stream_filter_reads_past_more_than_one_scan_budget(channel, amqp10):
    name = queue(channel, stream=True)
    for i in range(SCAN_BUDGET * 2 + 10):
        channel.basic_publish("", name, b"x", pika.BasicProperties(headers={"i": i}))
    channel.basic_publish(
        "", name, b"last", pika.BasicProperties(headers={"x-stream-filter-value": "wanted"})
    )
    receiver = amqp10.create_receiver(
        f"/queues/{name}",
        credit=5,
        options=Filter(
            {
                symbol("o"): described("rabbitmq:stream-offset-spec", "first"),
                symbol("f"): described("rabbitmq:stream-filter", "wanted"),
            }
        ),
    )
    assert bodies(receiver) == ["last"]
    receiver.close()


def test_an_amqp_091_selector_on_a_stream_reads_past_what_it_turns_down(channel):
    name = queue(channel, stream=True)
    for i in range(6):
        channel.basic_publish("", name, b"%d" % i, pika.BasicProperties(headers={"n": i}))
    channel.basic_publish("", name, b"last", pika.BasicProperties(headers={"n": 99}))
    channel.basic_qos(prefetch_count=10)
    got = []
    arguments = {"x-stream-offset": "first", "x-selector": "n > 3"}
    for method, _, body in channel.consume(name, arguments=arguments, inactivity_timeout=5):
        assert method is not None, got
        got.append(body)
        channel.basic_ack(method.delivery_tag)
        if body == b"last":
            break
    channel.cancel()
    assert got == [b"4", b"5", b"last"]
