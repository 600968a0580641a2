"""RabbitMQ's tutorial patterns, run with pika's BlockingConnection against leveret."""

from __future__ import annotations

import uuid

import pika
import pytest
from eventually import eventually_equal
from servers import TEST_WORKERS


def drain(channel, queue: str, count: int, timeout: float = 5.0) -> list[bytes]:
    bodies = []
    for method, _props, body in channel.consume(queue, inactivity_timeout=timeout):
        assert method is not None, f"timed out after {len(bodies)} of {count}"
        bodies.append(body)
        channel.basic_ack(method.delivery_tag)
        if len(bodies) == count:
            break
    channel.cancel()
    return bodies


def test_hello_world(channel):
    channel.queue_declare("hello")
    channel.basic_publish("", "hello", b"Hello World!")
    assert drain(channel, "hello", 1) == [b"Hello World!"]


def test_work_queue_fair_dispatch(amqp_url):
    """Two workers with prefetch 1: a busy worker gets no new task (tutorial 2)."""
    conns = [pika.BlockingConnection(pika.URLParameters(amqp_url)) for _ in range(3)]
    producer, w1, w2 = (c.channel() for c in conns)
    producer.queue_declare("tasks", durable=True)
    for ch in (w1, w2):
        ch.basic_qos(prefetch_count=1)
    for i in range(4):
        producer.basic_publish("", "tasks", b"task %d" % i,
                               pika.BasicProperties(delivery_mode=2))
    got1 = next(w1.consume("tasks", inactivity_timeout=5))
    got2 = next(w2.consume("tasks", inactivity_timeout=5))
    assert got1[0] is not None and got2[0] is not None
    # w1 holds its unacked task; nothing more reaches it until it acks.
    assert next(w1.consume("tasks", inactivity_timeout=0.3)) == (None, None, None)
    w1.basic_ack(got1[0].delivery_tag)
    nxt = next(w1.consume("tasks", inactivity_timeout=5))
    assert nxt[2] in (b"task 2", b"task 3")
    assert {got1[2], got2[2]} == {b"task 0", b"task 1"}
    for c in conns:
        c.close()


def test_publish_subscribe_fanout(channel):
    channel.exchange_declare("logs", "fanout")
    queues = [channel.queue_declare("", exclusive=True).method.queue for _ in range(3)]
    for q in queues:
        assert q.startswith("amq.gen-")
        channel.queue_bind(q, "logs")
    channel.basic_publish("logs", "ignored", b"info: hello")
    for q in queues:
        assert drain(channel, q, 1) == [b"info: hello"]


def test_routing_direct(channel):
    channel.exchange_declare("direct_logs", "direct")
    q_err = channel.queue_declare("", exclusive=True).method.queue
    q_all = channel.queue_declare("", exclusive=True).method.queue
    channel.queue_bind(q_err, "direct_logs", "error")
    for severity in ("info", "warning", "error"):
        channel.queue_bind(q_all, "direct_logs", severity)
    for severity in ("info", "warning", "error", "debug"):
        channel.basic_publish("direct_logs", severity, severity.encode())
    assert drain(channel, q_err, 1) == [b"error"]
    assert drain(channel, q_all, 3) == [b"info", b"warning", b"error"]


@pytest.mark.parametrize("binding,matches,misses", [
    ("*.orange.*", ["quick.orange.rabbit", "a.orange.b"], ["orange", "quick.orange", "a.b.orange.c"]),
    ("*.*.rabbit", ["quick.orange.rabbit", "lazy.pink.rabbit"], ["quick.rabbit", "a.b.c.rabbit"]),
    ("lazy.#", ["lazy", "lazy.orange", "lazy.orange.male.rabbit"], ["quick.lazy", "lazyx"]),
    ("#", ["", "a", "a.b.c"], []),
    ("a.#.b", ["a.b", "a.x.b", "a.x.y.b"], ["a", "b", "a.b.c"]),
    ("#.#", ["", "x", "x.y"], []),
    ("*", ["x"], ["", "x.y"]),
    ("a.*.#", ["a.b", "a.b.c"], ["a"]),
    ("", [""], ["a"]),
])
def test_topic_matching(channel, binding, matches, misses):
    channel.exchange_declare("topic_logs", "topic")
    q = channel.queue_declare("", exclusive=True).method.queue
    channel.queue_bind(q, "topic_logs", binding)
    for key in matches + misses:
        channel.basic_publish("topic_logs", key, key.encode() or b"<empty>")
    expected = [k.encode() or b"<empty>" for k in matches]
    assert drain(channel, q, len(expected)) == expected
    assert channel.queue_declare(q, passive=True).method.message_count == 0


def test_rpc_with_callback_queue(amqp_url):
    server_conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    server = server_conn.channel()
    server.queue_declare("rpc_queue")

    client_conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    client = client_conn.channel()
    callback_queue = client.queue_declare("", exclusive=True).method.queue
    corr = str(uuid.uuid4())
    client.basic_publish("", "rpc_queue", b"30",
                         pika.BasicProperties(reply_to=callback_queue, correlation_id=corr))

    method, props, body = next(server.consume("rpc_queue", inactivity_timeout=5))
    server.basic_publish("", props.reply_to, str(int(body) * 2).encode(),
                         pika.BasicProperties(correlation_id=props.correlation_id))
    server.basic_ack(method.delivery_tag)

    method, props, body = next(client.consume(callback_queue, inactivity_timeout=5))
    assert (props.correlation_id, body) == (corr, b"60")
    server_conn.close()
    client_conn.close()


def test_rpc_with_direct_reply_to(amqp_url):
    server_conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    server = server_conn.channel()
    server.queue_declare("rpc_direct")

    client_conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    client = client_conn.channel()
    replies = []
    client.basic_consume("amq.rabbitmq.reply-to", lambda ch, m, p, b: replies.append((p, b)),
                         auto_ack=True)
    client.basic_publish("", "rpc_direct", b"ping",
                         pika.BasicProperties(reply_to="amq.rabbitmq.reply-to", correlation_id="c1"))
    method, props, _body = next(server.consume("rpc_direct", inactivity_timeout=5))
    assert props.reply_to.startswith("amq.rabbitmq.reply-to.")
    server.basic_publish("", props.reply_to, b"pong", pika.BasicProperties(correlation_id="c1"))
    server.basic_ack(method.delivery_tag)
    client_conn.process_data_events(time_limit=2)
    while not replies:
        client_conn.process_data_events(time_limit=1)
    assert replies[0][1] == b"pong" and replies[0][0].correlation_id == "c1"
    server_conn.close()
    client_conn.close()


def test_direct_reply_to_without_consumer_is_406(channel):
    channel.queue_declare("q")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        channel.basic_publish("", "q", b"x", pika.BasicProperties(reply_to="amq.rabbitmq.reply-to"))
        channel.queue_declare("q", passive=True)
    assert info.value.reply_code == 406


def test_publisher_confirms_and_mandatory_return(channel):
    channel.confirm_delivery()
    channel.queue_declare("confirmed")
    for i in range(100):
        channel.basic_publish("", "confirmed", b"%d" % i)  # raises if nacked
    with pytest.raises(pika.exceptions.UnroutableError):
        channel.basic_publish("", "no-such-queue", b"lost", mandatory=True)
    assert channel.queue_declare("confirmed", passive=True).method.message_count == 100


def test_many_connections_and_channels(amqp_url):
    conns = [pika.BlockingConnection(pika.URLParameters(amqp_url)) for _ in range(10)]
    channels = [c.channel() for c in conns for _ in range(10)]
    channels[0].queue_declare("shared")
    for i, ch in enumerate(channels):
        ch.basic_publish("", "shared", b"%d" % i)
    count = channels[-1].queue_declare("shared", passive=True).method.message_count
    # One process reads every socket in order, so the last channel sees every earlier
    # publish. Connection workers keep no order across connections (nor does RabbitMQ):
    # there, the count only gets there.
    if TEST_WORKERS:
        last = channels[-1]
        count = eventually_equal(lambda: last.queue_declare("shared", passive=True).method.message_count,
                                 100, 5, 0.01)
    assert count == 100
    for c in conns:
        c.close()
