"""Consumer timeouts on a sans-I/O AMQP connection, on the fake loop's clock: the time
a delivery may stay unacknowledged (broker default, queue argument, policy, consume
argument), the 406 of RabbitMQ 3.12's mode, 4.3's graceful mode, and the timers (one
per group of deliveries, armed for the earliest deadline, never early)."""

from __future__ import annotations

import pytest
from pamqp import commands, frame as pamqp_frame, header as pamqp_header
from sans_io import Harness, method_frame

from leveret.amqp.frames import FRAME_BODY, encode_frame
from leveret.core.consumer_timeout import MAX_LATENESS, granularity
from leveret.core.policy import Policy


def start(capabilities: bool = True, consumer_timeout: int | None = None) -> Harness:
    h = Harness()
    if consumer_timeout is not None:
        h.core.limits.consumer_timeout = consumer_timeout
    h.feed(b"AMQP\x00\x00\x09\x01")
    props = {"capabilities": {"consumer_cancel_notify": True}} if capabilities else {}
    h.feed(pamqp_frame.marshal(commands.Connection.StartOk(
        client_properties=props, mechanism="PLAIN", response="\x00guest\x00guest", locale="en_US"), 0))
    h.feed(pamqp_frame.marshal(commands.Connection.TuneOk(channel_max=16, frame_max=4096, heartbeat=0), 0))
    h.feed(pamqp_frame.marshal(commands.Connection.Open(virtual_host="/"), 0))
    h.feed(method_frame(1, commands.Channel.Open()))
    return h


def send(h: Harness, channel: int, method) -> None:
    h.feed(method_frame(channel, method))


def publish(h: Harness, queue: str, body: bytes) -> None:
    header = pamqp_header.ContentHeader(body_size=len(body)).marshal()
    h.feed(method_frame(1, commands.Basic.Publish(exchange="", routing_key=queue))
           + encode_frame(2, 1, header) + encode_frame(FRAME_BODY, 1, body))


def methods(h: Harness) -> list[tuple[int, object]]:
    return [(ch, m) for ch, m in h.frames() if not isinstance(m, tuple)]


def after(h: Harness, mark: int) -> list[tuple[int, object]]:
    return methods(h)[mark:]


def declare(h: Harness, queue: str, arguments: dict | None = None, channel: int = 1) -> None:
    send(h, channel, commands.Queue.Declare(queue=queue, arguments=arguments or {}))


def deliveries(h: Harness, mark: int = 0) -> list[commands.Basic.Deliver]:
    return [m for _, m in after(h, mark) if isinstance(m, commands.Basic.Deliver)]


def test_default_mode_closes_the_channel_with_rabbitmqs_406_and_every_unacked_returns():
    h = start(consumer_timeout=10_000)
    declare(h, "q")
    declare(h, "other")
    for body in (b"a", b"b"):
        publish(h, "q", body)
    publish(h, "other", b"c")
    send(h, 1, commands.Basic.Consume(queue="q", consumer_tag="c1"))
    send(h, 1, commands.Basic.Get(queue="other"))
    h.loop.advance(5)
    send(h, 1, commands.Basic.Ack(delivery_tag=1))  # acked in time: never returns
    h.loop.advance(5 + granularity(10) - 0.001)
    assert not any(isinstance(m, commands.Channel.Close) for _, m in methods(h)), "closed early"
    h.loop.advance(0.002)
    h.flush()
    closes = [m for ch, m in methods(h) if isinstance(m, commands.Channel.Close)]
    assert len(closes) == 1
    close = closes[0]
    assert close.reply_code == 406 and (close.class_id, close.method_id) == (0, 0)
    assert close.reply_text == (
        "PRECONDITION_FAILED - delivery acknowledgement on channel 1 timed out. Timeout value used: "
        "10000 ms. This timeout value can be configured, see consumers doc guide to learn more")
    vhost = h.core.vhosts["/"]
    assert vhost.queues["q"].message_count == 1  # b returned, a acked
    assert vhost.queues["other"].message_count == 1  # the basic.get one returned too


def test_queue_argument_policy_and_consume_argument_precedence():
    h = start(consumer_timeout=60_000)
    h.core.policies.append(Policy("p", "^pol", {"consumer-timeout": 3000}, "queues"))
    declare(h, "arg", {"x-consumer-timeout": 2000})
    declare(h, "pol-lower-arg", {"x-consumer-timeout": 1000})  # the lower of both wins
    declare(h, "pol-higher-arg", {"x-consumer-timeout": 9000})
    declare(h, "plain")
    channel = h.connection.channels[1]
    keys = {}
    for name in ("arg", "pol-lower-arg", "pol-higher-arg", "plain"):
        queue = h.core.vhosts["/"].queues[name]
        keys[name] = channel.ack_timeouts.queue_key(queue)
    assert keys == {"arg": (2000, "close"), "pol-lower-arg": (1000, "close"),
                    "pol-higher-arg": (3000, "close"), "plain": (60_000, "close")}
    send(h, 1, commands.Basic.Consume(queue="arg", consumer_tag="c", arguments={"x-consumer-timeout": 50}))
    assert channel.consumers["c"].deadline_key == (50, "close")  # RabbitMQ 4.3's consume argument wins


@pytest.mark.parametrize("arguments, text", [
    ({"x-consumer-timeout": "5"}, "invalid arg 'x-consumer-timeout' for queue 'bad' in vhost '/': "
                                  "\"expected integer, got longstr\""),
    ({"x-consumer-timeout": -1}, "invalid arg 'x-consumer-timeout' for queue 'bad' in vhost '/': "
                                 "{value_negative,-1}"),
    ({"x-consumer-timeout-mode": "nice"}, "invalid arg 'x-consumer-timeout-mode' for queue 'bad' in "
                                          "vhost '/': 'nice' (expected close or graceful)"),
])
def test_invalid_arguments_are_refused_with_406(arguments, text):
    h = start()
    declare(h, "bad", arguments)
    close = methods(h)[-1][1]
    assert isinstance(close, commands.Channel.Close)
    assert close.reply_code == 406 and close.reply_text == "PRECONDITION_FAILED - " + text


def test_graceful_returns_only_the_timed_out_and_cancels_that_consumer():
    h = start()
    declare(h, "slow", {"x-consumer-timeout": 1000, "x-consumer-timeout-mode": "graceful"})
    declare(h, "fast")
    send(h, 1, commands.Basic.Qos(prefetch_count=1))
    send(h, 1, commands.Basic.Consume(queue="slow", consumer_tag="s"))
    send(h, 1, commands.Basic.Consume(queue="fast", consumer_tag="f"))
    publish(h, "slow", b"held")
    publish(h, "fast", b"f1")
    h.loop.advance(0.5)
    publish(h, "slow", b"queued")  # waits: prefetch 1
    send(h, 1, commands.Basic.Ack(delivery_tag=2))  # f1, in time
    mark = len(methods(h))
    h.loop.advance(0.6 + granularity(1.0))
    h.flush()
    out = after(h, mark)
    assert [type(m) for _, m in out] == [commands.Basic.Cancel]
    assert out[0][1].consumer_tag == "s"
    queue = h.core.vhosts["/"].queues["slow"]
    assert queue.message_count == 2 and not queue.consumers  # held came back, redelivered
    assert h.connection.channels[1].consumers.keys() == {"f"}
    # the late ack of the returned delivery is no error; the channel works on
    send(h, 1, commands.Basic.Ack(delivery_tag=1))
    publish(h, "fast", b"f2")
    got = deliveries(h, mark)
    assert [d.consumer_tag for d in got] == ["f"]
    assert not any(isinstance(m, commands.Channel.Close) for _, m in methods(h))
    send(h, 1, commands.Basic.Consume(queue="slow", consumer_tag="s2"))
    again = deliveries(h, mark)[-1]
    assert again.consumer_tag == "s2" and again.redelivered


def test_graceful_without_cancel_notify_closes_the_channel_as_rabbitmq_4_3():
    h = start(capabilities=False)
    declare(h, "q", {"x-consumer-timeout": 100, "x-consumer-timeout-mode": "graceful"})
    send(h, 1, commands.Basic.Consume(queue="q", consumer_tag="c"))
    publish(h, "q", b"x")
    h.loop.advance(1)
    h.flush()
    close = methods(h)[-1][1]
    assert isinstance(close, commands.Channel.Close) and close.reply_code == 406


def test_graceful_after_the_client_cancelled_just_returns_the_delivery():
    h = start(capabilities=False)
    declare(h, "q", {"x-consumer-timeout": 100, "x-consumer-timeout-mode": "graceful"})
    send(h, 1, commands.Basic.Consume(queue="q", consumer_tag="c"))
    publish(h, "q", b"x")
    send(h, 1, commands.Basic.Cancel(consumer_tag="c"))
    mark = len(methods(h))
    h.loop.advance(1)
    h.flush()
    assert after(h, mark) == []
    assert h.core.vhosts["/"].queues["q"].message_count == 1


def test_policy_selects_graceful_and_the_argument_wins_over_it():
    h = start()
    h.core.policies.append(Policy("p", ".*", {"consumer-timeout-mode": "graceful", "consumer-timeout": 200},
                                  "queues"))
    declare(h, "g")
    declare(h, "c", {"x-consumer-timeout-mode": "close"})
    channel = h.connection.channels[1]
    queues = h.core.vhosts["/"].queues
    assert channel.ack_timeouts.queue_key(queues["g"]) == (200, "graceful")
    assert channel.ack_timeouts.queue_key(queues["c"]) == (200, "close")


def test_no_ack_consumers_and_timeouts_off_arm_no_timer():
    h = start(consumer_timeout=0)
    declare(h, "q")
    send(h, 1, commands.Basic.Consume(queue="q", consumer_tag="c"))
    publish(h, "q", b"x")
    assert h.loop.pending() == []
    h2 = start()
    declare(h2, "q")
    send(h2, 1, commands.Basic.Consume(queue="q", consumer_tag="c", no_ack=True))
    publish(h2, "q", b"x")
    assert h2.loop.pending() == []


def test_one_timer_per_channel_for_many_deliveries_and_marks_stay_few():
    """A busy channel that acks in time keeps one timer and a couple of marks, whatever
    it delivers; an idle one none."""
    h = start(consumer_timeout=60_000)
    declare(h, "q")
    send(h, 1, commands.Basic.Consume(queue="q", consumer_tag="c"))
    group = h.connection.channels[1].consumers["c"].deadline_group
    for i in range(1, 2001):
        publish(h, "q", b"x")
        send(h, 1, commands.Basic.Ack(delivery_tag=i))
        h.loop.advance(0.5)
    assert len(h.loop.pending()) == 1
    assert len(group.marks) <= 60 / granularity(60) + 2  # bounded by the timeout, not the count
    h.loop.advance(120)
    assert h.loop.pending() == [] and len(group.marks) == 0
    assert not any(isinstance(m, commands.Channel.Close) for _, m in methods(h))


def test_a_held_delivery_among_acked_ones_still_times_out_on_time():
    h = start(consumer_timeout=60_000)
    declare(h, "q")
    send(h, 1, commands.Basic.Consume(queue="q", consumer_tag="c"))
    publish(h, "q", b"held")  # tag 1, never acked
    for i in range(2, 200):
        h.loop.advance(0.25)
        publish(h, "q", b"x")
        send(h, 1, commands.Basic.Ack(delivery_tag=i))
    h.loop.advance(60 - 0.25 * 198 + granularity(60) - 0.01)
    assert not any(isinstance(m, commands.Channel.Close) for _, m in methods(h))
    h.loop.advance(0.02)
    h.flush()
    assert isinstance(methods(h)[-1][1], commands.Channel.Close)
    assert granularity(60) <= MAX_LATENESS


def test_tx_rollback_keeps_watching_a_restored_delivery():
    h = start(consumer_timeout=1000)
    declare(h, "q")
    publish(h, "q", b"x")
    send(h, 1, commands.Tx.Select())
    send(h, 1, commands.Basic.Consume(queue="q", consumer_tag="c"))
    assert len(deliveries(h)) == 1
    send(h, 1, commands.Basic.Ack(delivery_tag=1))
    h.loop.advance(2)  # the ack is held by the transaction: no timeout
    assert not any(isinstance(m, commands.Channel.Close) for _, m in methods(h))
    send(h, 1, commands.Tx.Rollback())
    h.loop.advance(2)
    h.flush()
    assert isinstance(methods(h)[-1][1], commands.Channel.Close)


def test_other_channels_are_unaffected():
    h = start()
    send(h, 2, commands.Channel.Open())
    declare(h, "short", {"x-consumer-timeout": 100})
    declare(h, "long", channel=2)
    send(h, 1, commands.Basic.Consume(queue="short", consumer_tag="a"))
    send(h, 2, commands.Basic.Consume(queue="long", consumer_tag="b"))
    publish(h, "short", b"1")
    publish(h, "long", b"2")
    h.loop.advance(1)
    h.flush()
    closes = [ch for ch, m in methods(h) if isinstance(m, commands.Channel.Close)]
    assert closes == [1]
    assert h.connection.channels[2].unacked


def test_graceful_basic_get_just_returns_and_frees_the_channel_window():
    """A basic.get delivery has no consumer to cancel: it returns alone; the room it
    held in the channel's prefetch window goes to the channel's consumer at once."""
    h = start()
    declare(h, "g", {"x-consumer-timeout": 1000, "x-consumer-timeout-mode": "graceful"})
    declare(h, "other")
    publish(h, "g", b"got")
    send(h, 1, commands.Basic.Qos(prefetch_count=1, global_=True))
    send(h, 1, commands.Basic.Get(queue="g"))
    send(h, 1, commands.Basic.Consume(queue="other", consumer_tag="o"))
    publish(h, "other", b"waits")  # the channel's window (1) is full
    mark = len(methods(h))
    assert deliveries(h, mark) == []
    h.loop.advance(2)
    h.flush()
    assert [d.consumer_tag for d in deliveries(h, mark)] == ["o"]
    assert not any(isinstance(m, (commands.Basic.Cancel, commands.Channel.Close)) for _, m in after(h, mark))
    assert h.core.vhosts["/"].queues["g"].message_count == 1
