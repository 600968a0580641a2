"""leveret.amqp.client against a real broker: the asyncio client (confirm window, nacks,
channel errors, server-sent cancel, basic.get, the amq.leveret.api RPC) and its blocking
façade."""

from __future__ import annotations

import asyncio

import pytest

from leveret.amqp import errors
from leveret.amqp.client import (
    AMQPConnectionError,
    BlockingClient,
    Channel,
    ChannelError,
    ClientError,
    Connection,
    ConnectionLost,
    PublishError,
    RPCError,
    Timeout,
    parse_url,
    safe_url,
)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_url_parsing():
    p = parse_url("amqp://u%40x:p%2Fw@host:5673/v%2Fh")
    assert (p.host, p.port, p.user, p.password, p.vhost) == ("host", 5673, "u@x", "p/w", "v/h")
    assert parse_url("amqp://h").vhost == "/" and parse_url("amqp://h").user == "guest"
    assert safe_url("amqp://u:secret@h/") == "amqp://u:***@h/"
    with pytest.raises(ClientError, match="scheme"):
        parse_url("http://h/")


def test_publish_consume_get_roundtrip(amqp_url):
    async def main():
        conn = await Connection.connect(amqp_url)
        ch = await conn.channel()
        await ch.queue_declare("q")
        ch.publish("", "q", b"one", {"message_id": "m1", "headers": {"a": 1},
                                    "delivery_mode": 2})
        ch.publish_many("", "q", [b"x" * n for n in (0, 1, 200_000)],
                        {"content_type": "text/plain"})
        got = await ch.get("q")
        assert got.body == b"one" and got.props["message_id"] == "m1"
        assert got.headers == {"a": 1} and got.consumer_tag == ""
        ch.ack(got.delivery_tag)
        await ch.qos(10)
        consumer = await ch.consume("q")
        bodies = []
        while len(bodies) < 3:
            for d in await consumer.batch(5):
                assert d.props == {"content_type": "text/plain"}
                bodies.append(d.body)
                ch.ack(d.delivery_tag)
        assert [len(b) for b in bodies] == [0, 1, 200_000]  # the big one in several frames
        await consumer.cancel()
        assert await ch.get("q") is None
        await conn.close()
    run(main())


def test_confirm_window_and_tracking(amqp_url):
    async def main():
        conn = await Connection.connect(amqp_url)
        ch = await conn.channel()
        await ch.queue_declare("q", durable=True)
        await ch.confirm_select(track=True)
        window, highest = 100, 0
        for i in range(2000):
            seq = ch.publish("", "q", b"%d" % i, {"delivery_mode": 2})
            assert seq == i + 1
            if ch.unconfirmed >= window:
                await ch.wait_confirms(window // 2)
            highest = max(highest, ch.unconfirmed)
        await ch.wait_confirms(0)
        assert highest <= window and ch.unconfirmed == 0
        assert ch.acked() == list(range(1, 2001))
        assert (await ch.queue_declare("q", passive=True)).message_count == 2000
        await conn.close()
    run(main())


def test_nacks_raise_or_are_recorded(amqp_url):
    args = {"x-max-length": 1, "x-overflow": "reject-publish"}

    async def main():
        conn = await Connection.connect(amqp_url)
        ch = await conn.channel()
        await ch.queue_declare("full", arguments=args)
        await ch.confirm_select(on_nack="record")
        ch.publish_many("", "full", [b"a", b"b", b"c"])
        await ch.wait_confirms(0)
        assert ch.nacked == [2, 3]
        ch2 = await conn.channel()
        await ch2.confirm_select()  # on_nack="raise"
        ch2.publish("", "full", b"d")
        with pytest.raises(PublishError, match="nacked"):
            await ch2.wait_confirms(0)
        ch2.publish("", "full", b"e")  # the error is raised once; the channel goes on
        await conn.close()
    run(main())


def test_channel_error_then_fresh_channel(amqp_url):
    async def main():
        conn = await Connection.connect(amqp_url)
        ch = await conn.default_channel()
        with pytest.raises(ChannelError) as info:
            await ch.queue_declare("missing", passive=True)
        assert info.value.reply_code == errors.NOT_FOUND
        assert info.value.reply_text.startswith("NOT_FOUND - ")
        assert not ch.is_open
        with pytest.raises(ChannelError):  # the closed channel keeps failing
            ch.publish("", "q", b"x")
        fresh = await conn.default_channel()
        assert fresh is not ch and fresh.is_open
        await fresh.queue_declare("present")
        await conn.close()
    run(main())

    with BlockingClient(amqp_url) as client:
        assert client.queue_exists("missing") is None
        assert not client.exchange_exists("nope")
        client.queue_declare("q2")
        assert client.queue_exists("q2").message_count == 0


def test_server_sent_cancel_ends_consumers(amqp_url):
    async def main():
        conn = await Connection.connect(amqp_url)
        ch = await conn.channel()
        await ch.queue_declare("doomed")
        consumer = await ch.consume("doomed")
        other = await conn.channel()
        other.publish_many("", "doomed", [b"a", b"b"])
        await asyncio.sleep(0.2)
        await other.queue_delete("doomed")
        assert [d.body async for d in consumer] == [b"a", b"b"]  # ends at basic.cancel
        assert consumer.cancelled and not await consumer.batch(5)
        assert ch.is_open
        await conn.close()
    run(main())

    with BlockingClient(amqp_url) as client:
        client.queue_declare("doomed2")
        for i in range(3):
            client.publish("", "doomed2", b"%d" % i)
        got = []
        for d in client.consume("doomed2", no_ack=True):
            got.append(d.body)
            if len(got) == 3:
                BlockingClient(amqp_url).queue_delete("doomed2")
        assert got == [b"0", b"1", b"2"]  # and the generator ended at basic.cancel


def test_blocking_consume_batches_and_idle_timeout(amqp_url):
    with BlockingClient(amqp_url) as client:
        client.queue_declare("many")
        client.confirm_select()
        for i in range(5000):
            client.publish("", "many", b"%d" % i, {"headers": {"i": i}})
        client.wait_confirms(0)
        client.qos(1000)
        seen = 0
        for d in client.consume("many", idle_timeout=0.5):
            assert d.headers["i"] == seen
            seen += 1
            if seen % 100 == 0:
                client.ack(d.delivery_tag, multiple=True)
        assert seen == 5000
        sizes = [10, 300_000, 0, 10, 140_000, 7]  # multi-frame bodies take the slow path
        for i, size in enumerate(sizes):
            client.publish("", "many", bytes([i]) * size, {"message_id": str(i)})
        client.wait_confirms(0)
        got = [(d.props["message_id"], len(d.body))
               for d in client.consume("many", no_ack=True, idle_timeout=0.5)]
        assert got == [(str(i), size) for i, size in enumerate(sizes)]
        with pytest.raises(Timeout):
            client.timeout = 0.3
            next(iter(client.consume("many")))


def test_rpc_over_direct_reply_to(amqp_url):
    with BlockingClient(amqp_url) as client:
        client.queue_declare("jobs")
        assert client.rpc("lease.info", {"queue": "jobs", "group": "g"})["held"] == 0
        with pytest.raises(RPCError, match="must be"):
            client.rpc("lease.info", {"queue": 5, "group": "g"})
        with pytest.raises(ChannelError) as info:  # a missing queue closes the channel
            client.queue_declare("nope", passive=True)
        assert info.value.reply_code == 404
        # the reply consumer comes back on the fresh channel
        assert client.rpc("lease.info", {"queue": "jobs", "group": "g"})["held"] == 0


def test_connection_errors(amqp_url):
    with pytest.raises(AMQPConnectionError) as info:
        BlockingClient(amqp_url.rstrip("/") + "/no-such-vhost")
    assert info.value.reply_code in (errors.NOT_ALLOWED, errors.ACCESS_REFUSED)
    bad = amqp_url.replace("guest:guest", "guest:wrong")
    if bad != amqp_url:
        with pytest.raises(AMQPConnectionError):
            BlockingClient(bad)
    with pytest.raises(ConnectionLost, match="cannot connect"):
        BlockingClient("amqp://127.0.0.1:1/", timeout=2)

    async def main():  # a hard error from the broker fails everything on the connection
        conn = await Connection.connect(amqp_url)
        ch = await conn.channel()
        conn._send_method(ch.number, __import__("pamqp").commands.Channel.Open())
        conn._flush()  # channel.open on an open channel: connection.close 504
        with pytest.raises(AMQPConnectionError) as info:
            await ch.queue_declare("x")
        assert info.value.reply_code == errors.CHANNEL_ERROR
        assert not conn.is_open
        await conn.close()
    run(main())


def test_leaf_package():
    import subprocess
    import sys
    code = ("import leveret.amqp.client, sys; "
            "print(sorted(m for m in sys.modules if m.startswith('leveret')))")
    out = subprocess.run([sys.executable, "-c", code],
                         capture_output=True, text=True, check=True).stdout
    assert not any(part in out for part in ("core", "protocol", "server", "store", "spark"))


def test_confirm_bookkeeping_without_a_broker():
    """Acks in any order, single or multiple, nacks recorded or raised; the state of
    untracked channels is trimmed."""
    loop = asyncio.new_event_loop()
    try:
        conn = Connection("amqp://h/", 10, loop)
        ch = Channel(conn, 1)
        ch.confirming, ch.on_nack, ch._track = True, "record", True
        assert ch._sequence(10) == 1 and ch.unconfirmed == 10
        ch._settle(3, False, 1)      # single, out of order
        ch._settle(3, False, 1)      # twice: counted once
        ch._settle(2, True, 1)       # multiple: 1, 2
        ch._settle(5, False, 2)      # a nack
        ch._settle(7, True, 1)       # multiple over settled 3 and 5: 4, 6, 7
        assert ch.unconfirmed == 3 and ch.acked() == [1, 2, 3, 4, 6, 7]
        assert ch.nacked == [5] and ch._low == 8
        ch._settle(10, True, 2)
        assert ch.unconfirmed == 0 and ch.nacked == [5, 8, 9, 10]

        raising = Channel(conn, 2)
        raising.confirming = True
        raising._sequence(70_000)
        raising._settle(69_999, True, 1)
        assert raising.unconfirmed == 1 and len(raising._state) < 70_000  # trimmed
        raising._settle(70_000, False, 2)
        with pytest.raises(PublishError, match="nacked"):
            raising.publish("", "q", b"x")
    finally:
        loop.close()
