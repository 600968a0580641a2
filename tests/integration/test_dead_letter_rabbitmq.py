"""Failed messages as RabbitMQ 3.10 handles them, checked against leveret with real
clients: dead-lettering (``x-death`` exactly as RabbitMQ writes it, wire types
included), TTL, ``x-expires``, length limits and overflow, cycles, invalid arguments and
policies. The expected values were taken from a RabbitMQ 3.10.8 node running the same
scenarios; the one deliberate difference (a message expires when due even if it is not
at the head of its queue) is tested as leveret's behaviour.
"""

from __future__ import annotations

import asyncio
import time

import aio_pika
import pika
import pytest
import wire_types
from eventually import eventually
from pika.exceptions import ChannelClosedByBroker, NackError
from rabbitmq_reference import INVALID_QUEUE_ARGUMENTS

from leveret.config import load
from leveret.server.broker import BlockingBroker

wire_types.install()

DLQ_ARGS = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq"}


# -- helpers ------------------------------------------------------------------------
def count(ch, queue: str) -> int:
    return ch.queue_declare(queue, passive=True).method.message_count


def get(ch, queue: str):
    """(method, properties, body, typed headers) of the next message, auto-acked."""
    method, props, body = ch.basic_get(queue, auto_ack=True)
    if method is None:
        return None
    return method, props, body, wire_types.typed_headers(props)


def wait_get(ch, queue: str, timeout: float = 2.0):
    return eventually(lambda: get(ch, queue), timeout)


def drain(ch, queue: str) -> list[bytes]:
    bodies = []
    while (got := get(ch, queue)) is not None:
        bodies.append(got[2])
    return bodies


def reject(ch, queue: str, requeue: bool = False) -> None:
    method, _, _ = ch.basic_get(queue)
    assert method is not None, f"nothing in {queue}"
    ch.basic_reject(method.delivery_tag, requeue=requeue)


def assert_now(typed_time: tuple, now: float | None = None) -> None:
    tag, value = typed_time
    assert tag == "T"
    assert abs(value - (now or time.time())) <= 2


def death(reason: str, queue: str, routing_keys: list[str], exchange: str = "", count: int = 1,
          original_expiration: str | None = None) -> dict:
    """A first-death x-death entry as RabbitMQ writes it (field order included), with the
    time left out (compared separately)."""
    entry = {"count": ("l", count), "reason": ("S", reason), "queue": ("S", queue),
             "exchange": ("S", exchange), "routing-keys": ("A", [("S", k) for k in routing_keys])}
    if original_expiration is not None:
        entry["original-expiration"] = ("S", original_expiration)
    return entry


def without_time(entry: tuple) -> dict:
    tag, table = entry
    assert tag == "F"
    return {k: v for k, v in table.items() if k != "time"}


FIRST_DEATH_ORDER = ["count", "reason", "queue", "time", "exchange", "routing-keys"]
SORTED_ORDER = ["count", "exchange", "queue", "reason", "routing-keys", "time"]


class OffsetClock:
    """The broker's clock moved forward by ``offset`` seconds (x-death times)."""

    def __init__(self, clock) -> None:
        self.clock, self.offset = clock, 0.0

    def time(self) -> float:
        return self.clock.time() + self.offset

    def call_later(self, delay, callback):
        return self.clock.call_later(delay, callback)


# -- x-death ------------------------------------------------------------------------
def test_rejected_message_x_death_exactly_as_rabbitmq(channel):
    channel.exchange_declare("dlx", "direct")
    channel.queue_declare("src", arguments={"x-dead-letter-exchange": "dlx"})
    channel.queue_declare("dlq")
    channel.queue_bind("dlq", "dlx", "src")
    channel.basic_publish("", "src", b"m1", pika.BasicProperties(
        expiration="60000", message_id="id1", delivery_mode=2,
        headers={"z": 1, "big": 2**40, "bin": b"\x00\xff", "s": "x", "t": True}))
    reject(channel, "src")
    method, props, body, headers = wait_get(channel, "dlq")
    assert (body, method.exchange, method.routing_key) == (b"m1", "dlx", "src")
    assert props.expiration is None  # moved to original-expiration
    assert props.message_id == "id1" and props.delivery_mode == 2
    # the headers table is sorted by key; user headers keep their wire types
    assert list(headers) == ["big", "bin", "s", "t", "x-death", "x-first-death-exchange",
                             "x-first-death-queue", "x-first-death-reason", "z"]
    assert headers["z"] == ("I", 1) and headers["big"] == ("l", 2**40)
    assert headers["bin"] == ("x", b"\x00\xff") and headers["t"] == ("t", True)
    assert headers["x-first-death-reason"] == ("S", "rejected")
    assert headers["x-first-death-queue"] == ("S", "src")
    assert headers["x-first-death-exchange"] == ("S", "")
    tag, deaths = headers["x-death"]
    assert tag == "A" and len(deaths) == 1
    assert list(deaths[0][1]) == [*FIRST_DEATH_ORDER, "original-expiration"]
    assert without_time(deaths[0]) == death("rejected", "src", ["src"], original_expiration="60000")
    assert_now(deaths[0][1]["time"])
    # as pika users see it
    assert props.headers["x-death"][0]["count"] == 1
    assert props.headers["x-death"][0]["routing-keys"] == ["src"]


def test_repeated_deaths_increment_count_keep_time_and_reorder(leveret_broker, channel):
    clock = OffsetClock(leveret_broker.core.vhosts["/"].clock)
    leveret_broker.core.vhosts["/"].clock = clock
    channel.queue_declare("a", arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "b"})
    channel.queue_declare("b", arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "a"})
    channel.basic_publish("", "a", b"m", pika.BasicProperties(expiration="60000"))
    for queue in ["a", "b", "a", "b"]:
        assert eventually(lambda queue=queue: count(channel, queue) == 1)
        reject(channel, queue)
        count(channel, queue)  # a round trip: the rejection has been handled
        clock.offset += 100  # each death 100 s later
    _, props, _, headers = wait_get(channel, "a")
    deaths = headers["x-death"][1]
    # a died twice, b twice: b's entry (most recent) first, then a's
    assert [without_time(d) for d in deaths] == [
        {"count": ("l", 2), "exchange": ("S", ""), "queue": ("S", "b"), "reason": ("S", "rejected"),
         "routing-keys": ("A", [("S", "b")])},
        {"count": ("l", 2), "exchange": ("S", ""), "original-expiration": ("S", "60000"),
         "queue": ("S", "a"), "reason": ("S", "rejected"), "routing-keys": ("A", [("S", "a")])},
    ]
    # incremented entries have sorted keys and keep the time of their first death
    assert [list(d[1]) for d in deaths] == [SORTED_ORDER,
                                            [*SORTED_ORDER[:2], "original-expiration", *SORTED_ORDER[2:]]]
    first = deaths[1][1]["time"][1]
    assert_now(deaths[1][1]["time"])
    assert deaths[0][1]["time"][1] - first in (100, 101)
    assert headers["x-first-death-queue"] == ("S", "a")
    assert headers["x-first-death-reason"] == ("S", "rejected")
    assert props.headers["x-death"][0]["count"] == 2


def test_second_death_elsewhere_is_prepended_with_sorted_keys(channel):
    channel.queue_declare("a", arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "b"})
    channel.queue_declare("b", arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "c"})
    channel.queue_declare("c")
    channel.basic_publish("", "a", b"m")
    reject(channel, "a")
    assert eventually(lambda: count(channel, "b") == 1)
    reject(channel, "b")
    _, _, _, headers = wait_get(channel, "c")
    deaths = headers["x-death"][1]
    assert list(deaths[0][1]) == SORTED_ORDER  # new entry on an existing x-death: sorted
    assert list(deaths[1][1]) == FIRST_DEATH_ORDER  # the first one as it was written
    assert without_time(deaths[0]) == death("rejected", "b", ["b"])
    assert without_time(deaths[1]) == death("rejected", "a", ["a"])


def test_dead_letter_routing_key_and_cc(channel):
    channel.exchange_declare("dlx", "topic")
    channel.queue_declare("src", arguments={"x-dead-letter-exchange": "dlx",
                                            "x-dead-letter-routing-key": "dead.src"})
    channel.queue_declare("dlq")
    channel.queue_bind("dlq", "dlx", "dead.#")
    channel.basic_publish("", "src", b"m", pika.BasicProperties(headers={"CC": ["other"]}))
    reject(channel, "src")
    method, _, _, headers = wait_get(channel, "dlq")
    assert (method.exchange, method.routing_key) == ("dlx", "dead.src")
    assert "CC" not in headers  # removed when the dead-letter routing key replaces the keys
    # routing-keys: the publish key then the CC keys
    assert without_time(headers["x-death"][1][0]) == death("rejected", "src", ["src", "other"])


def test_headers_dead_letter_exchange_routes_on_the_death(channel):
    """A headers DLX sees the dead message as RabbitMQ 3.10.8 routes it: with
    ``x-first-death-*`` (matched with ``all-with-x``) and without the ``CC`` the dead-letter
    routing key dropped."""
    channel.exchange_declare("dlx-h", "headers")
    channel.queue_declare("by-reason")
    channel.queue_declare("by-cc")
    channel.queue_bind("by-reason", "dlx-h", arguments={
        "x-match": "all-with-x", "x-first-death-reason": "rejected"})
    channel.queue_bind("by-cc", "dlx-h", arguments={"x-match": "any", "CC": None})
    channel.queue_declare("work", arguments={"x-dead-letter-exchange": "dlx-h",
                                             "x-dead-letter-routing-key": "k"})
    channel.basic_publish("", "work", b"m", pika.BasicProperties(
        headers={"CC": ["other"], "region": "emea"}))
    method = eventually(lambda: channel.basic_get("work")[0])
    channel.basic_reject(method.delivery_tag, requeue=False)
    assert eventually(lambda: count(channel, "by-reason") == 1)
    assert count(channel, "by-cc") == 0
    _, properties, _ = channel.basic_get("by-reason", auto_ack=True)
    assert sorted(properties.headers) == ["region", "x-death", "x-first-death-exchange",
                                          "x-first-death-queue", "x-first-death-reason"]


def test_cc_kept_without_dead_letter_routing_key(channel):
    channel.queue_declare("src", arguments={"x-dead-letter-exchange": "dlx"})
    channel.exchange_declare("dlx", "fanout")
    channel.queue_declare("dlq")
    channel.queue_bind("dlq", "dlx")
    channel.basic_publish("", "src", b"m", pika.BasicProperties(headers={"CC": ["other"]}))
    reject(channel, "src")
    method, _, _, headers = wait_get(channel, "dlq")
    assert method.routing_key == "src"
    assert headers["CC"] == ("A", [("S", "other")])
    assert headers["x-death"][1][0][1]["routing-keys"] == ("A", [("S", "src"), ("S", "other")])


# -- TTL ------------------------------------------------------------------------------
def test_queue_ttl_expired_death(channel):
    channel.queue_declare("dlq")
    channel.queue_declare("src", arguments={"x-message-ttl": 100, **DLQ_ARGS})
    channel.basic_publish("", "src", b"m")
    channel.basic_publish("", "src", b"m2", pika.BasicProperties(expiration="5000"))
    method, props, body, headers = wait_get(channel, "dlq")
    assert (body, method.routing_key, props.expiration) == (b"m", "dlq", None)
    assert without_time(headers["x-death"][1][0]) == death("expired", "src", ["src"])
    assert headers["x-first-death-reason"] == ("S", "expired")
    _, props, body, headers = wait_get(channel, "dlq")
    assert body == b"m2" and props.expiration is None
    assert without_time(headers["x-death"][1][0]) == death("expired", "src", ["src"],
                                                           original_expiration="5000")
    assert count(channel, "src") == 0


def test_lower_of_queue_and_message_ttl_wins(channel):
    channel.queue_declare("dlq")
    channel.queue_declare("long", arguments={"x-message-ttl": 5000, **DLQ_ARGS})
    channel.queue_declare("short", arguments={"x-message-ttl": 100, **DLQ_ARGS})
    started = time.monotonic()
    channel.basic_publish("", "long", b"own-100", pika.BasicProperties(expiration="100"))
    channel.basic_publish("", "short", b"own-5000", pika.BasicProperties(expiration="5000"))
    assert eventually(lambda: count(channel, "dlq") == 2)
    assert time.monotonic() - started < 1.5
    assert sorted(drain(channel, "dlq")) == [b"own-100", b"own-5000"]


def test_ttl_zero_expires_at_once_without_consumer(channel):
    channel.queue_declare("dlq")
    channel.queue_declare("src", arguments={"x-message-ttl": 0, **DLQ_ARGS})
    channel.basic_publish("", "src", b"m")
    _, _, body, headers = wait_get(channel, "dlq")
    assert body == b"m" and headers["x-death"][1][0][1]["reason"] == ("S", "expired")
    assert count(channel, "src") == 0


def test_expiration_zero_is_valid(channel):
    channel.queue_declare("q")
    channel.basic_publish("", "q", b"m", pika.BasicProperties(expiration="0"))
    time.sleep(0.05)
    assert count(channel, "q") == 0 and channel.is_open


def test_leveret_expires_messages_behind_the_head(channel):
    """Deliberate difference: RabbitMQ expires only at the head, so there 'short'
    would wait behind 'long' (both dead-lettered after 3 s); leveret expires it when due."""
    channel.queue_declare("dlq")
    channel.queue_declare("q", arguments=DLQ_ARGS)
    channel.basic_publish("", "q", b"long", pika.BasicProperties(expiration="3000"))
    channel.basic_publish("", "q", b"short", pika.BasicProperties(expiration="100"))
    _, _, body, headers = wait_get(channel, "dlq", timeout=1.0)
    assert body == b"short"
    assert without_time(headers["x-death"][1][0]) == death("expired", "q", ["q"],
                                                           original_expiration="100")
    assert count(channel, "q") == 1
    assert get(channel, "q")[2] == b"long"


def test_requeued_message_keeps_its_expiry(channel):
    channel.queue_declare("dlq")
    channel.queue_declare("q", arguments={"x-message-ttl": 300, **DLQ_ARGS})
    channel.basic_publish("", "q", b"m")
    time.sleep(0.15)
    reject(channel, "q", requeue=True)
    method, _, body, headers = wait_get(channel, "dlq", timeout=1.0)
    assert body == b"m" and not method.redelivered
    assert headers["x-death"][1][0][1]["reason"] == ("S", "expired")


# -- cycles -----------------------------------------------------------------------------
def test_expired_cycle_to_itself_is_dropped(channel):
    channel.queue_declare("self", arguments={"x-message-ttl": 50, "x-dead-letter-exchange": ""})
    channel.basic_publish("", "self", b"m")
    time.sleep(0.3)
    assert count(channel, "self") == 0


def test_expired_cycle_between_two_queues_is_dropped(channel):
    channel.queue_declare("a", arguments={"x-message-ttl": 50, "x-dead-letter-exchange": "",
                                          "x-dead-letter-routing-key": "b"})
    channel.queue_declare("b", arguments={"x-message-ttl": 50, "x-dead-letter-exchange": "",
                                          "x-dead-letter-routing-key": "a"})
    channel.basic_publish("", "a", b"m")
    time.sleep(0.4)
    assert count(channel, "a") == 0 and count(channel, "b") == 0


def test_rejected_to_itself_is_not_a_cycle(channel):
    channel.queue_declare("self", arguments={"x-dead-letter-exchange": ""})
    channel.basic_publish("", "self", b"m")
    for _ in range(3):
        assert eventually(lambda: count(channel, "self") == 1)
        reject(channel, "self")
    method, _, _, headers = wait_get(channel, "self")
    assert method.routing_key == "self"
    deaths = headers["x-death"][1]
    assert len(deaths) == 1
    assert without_time(deaths[0]) == {"count": ("l", 3), "exchange": ("S", ""), "queue": ("S", "self"),
                                       "reason": ("S", "rejected"), "routing-keys": ("A", [("S", "self")])}


def test_rejection_on_the_way_breaks_the_cycle(channel):
    channel.queue_declare("m1", arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "m2"})
    channel.queue_declare("m2", arguments={"x-message-ttl": 50, "x-dead-letter-exchange": "",
                                           "x-dead-letter-routing-key": "m1"})
    channel.basic_publish("", "m1", b"m")
    reject(channel, "m1")
    _, _, _body, headers = wait_get(channel, "m1")  # back after expiring in m2
    deaths = headers["x-death"][1]
    assert [without_time(d) for d in deaths] == [
        {"count": ("l", 1), "exchange": ("S", ""), "queue": ("S", "m2"), "reason": ("S", "expired"),
         "routing-keys": ("A", [("S", "m2")])},
        death("rejected", "m1", ["m1"]),
    ]


def test_missing_dead_letter_exchange_drops(channel):
    channel.queue_declare("q", arguments={"x-dead-letter-exchange": "nope"})
    channel.basic_publish("", "q", b"m")
    reject(channel, "q")
    time.sleep(0.05)
    assert count(channel, "q") == 0 and channel.is_open


# -- length limits ----------------------------------------------------------------------
def test_drop_head_dead_letters_oldest_first(channel):
    channel.queue_declare("dlq")
    channel.queue_declare("n", arguments={"x-max-length": 2, **DLQ_ARGS})
    for i in range(4):
        channel.basic_publish("", "n", f"m{i}".encode())
    assert drain(channel, "n") == [b"m2", b"m3"]
    dead = [wait_get(channel, "dlq") for _ in range(2)]
    assert [d[2] for d in dead] == [b"m0", b"m1"]
    for d in dead:
        assert without_time(d[3]["x-death"][1][0]) == death("maxlen", "n", ["n"])
        assert d[3]["x-first-death-reason"] == ("S", "maxlen")


def test_max_length_bytes_drop_head(channel):
    channel.queue_declare("dlq")
    channel.queue_declare("b", arguments={"x-max-length-bytes": 10, **DLQ_ARGS})
    for i in range(4):
        channel.basic_publish("", "b", f"bb{i}-".encode())  # 4 bytes each
    assert drain(channel, "b") == [b"bb2-", b"bb3-"]
    assert eventually(lambda: count(channel, "dlq") == 2)
    assert drain(channel, "dlq") == [b"bb0-", b"bb1-"]


def test_reject_publish_nacks_and_does_not_dead_letter(connection):
    ch = connection.channel()
    ch.confirm_delivery()
    ch.queue_declare("dlq")
    ch.queue_declare("q", arguments={"x-max-length": 1, "x-overflow": "reject-publish", **DLQ_ARGS})
    ch.basic_publish("", "q", b"first")
    with pytest.raises(NackError):
        ch.basic_publish("", "q", b"second")
    connection.channel().basic_publish("", "q", b"unconfirmed")  # dropped silently
    time.sleep(0.05)
    assert drain(ch, "q") == [b"first"]
    assert count(ch, "dlq") == 0


def test_reject_publish_dlx_nacks_and_dead_letters(connection):
    ch = connection.channel()
    ch.confirm_delivery()
    ch.queue_declare("dlq")
    ch.queue_declare("q", arguments={"x-max-length": 1, "x-overflow": "reject-publish-dlx", **DLQ_ARGS})
    ch.basic_publish("", "q", b"first")
    with pytest.raises(NackError):
        ch.basic_publish("", "q", b"second")
    assert drain(ch, "q") == [b"first"]
    _, props, body, headers = wait_get(ch, "dlq")
    assert body == b"second" and props.expiration is None
    assert without_time(headers["x-death"][1][0]) == death("maxlen", "q", ["q"])
    assert headers["x-first-death-reason"] == ("S", "maxlen")


# -- x-expires --------------------------------------------------------------------------
def test_x_expires_deletes_unused_queue_without_dead_lettering(channel):
    channel.queue_declare("dlq")
    channel.queue_declare("gone", arguments={"x-expires": 150, **DLQ_ARGS})
    channel.basic_publish("", "gone", b"m")
    time.sleep(0.5)
    assert count(channel, "dlq") == 0
    with pytest.raises(ChannelClosedByBroker) as info:
        channel.queue_declare("gone", passive=True)
    assert (info.value.reply_code, info.value.reply_text) == (404, "NOT_FOUND - no queue 'gone' in vhost '/'")


def test_x_expires_spares_a_queue_with_a_consumer(channel):
    channel.queue_declare("used", arguments={"x-expires": 100})
    channel.basic_consume("used", lambda *a: None)
    time.sleep(0.35)
    assert channel.queue_declare("used", passive=True).method.consumer_count == 1


# -- invalid values ---------------------------------------------------------------------
INVALID = INVALID_QUEUE_ARGUMENTS


@pytest.mark.parametrize("arguments,text", INVALID)
def test_invalid_queue_argument(connection, arguments, text):
    ch = connection.channel()
    with pytest.raises(ChannelClosedByBroker) as info:
        ch.queue_declare("q", arguments=arguments)
    assert (info.value.reply_code, info.value.reply_text) == (406, "PRECONDITION_FAILED - " + text)


@pytest.mark.parametrize("expiration,detail", [
    ("abc", "no_integer"), ("-1", "{value_negative,-1}"), ("1.5", '{leftover_string,".5"}')])
def test_invalid_expiration_closes_the_channel(connection, expiration, detail):
    ch = connection.channel()
    ch.queue_declare("q")
    ch.basic_publish("", "q", b"m", pika.BasicProperties(expiration=expiration))
    with pytest.raises(ChannelClosedByBroker) as info:
        ch.queue_declare("q", passive=True)
    assert (info.value.reply_code, info.value.reply_text) == (
        406, f"PRECONDITION_FAILED - invalid expiration '{expiration}': {detail}")
    assert count(connection.channel(), "q") == 0


def test_inequivalent_ttl_redeclare(connection):
    ch = connection.channel()
    ch.queue_declare("q", arguments={"x-message-ttl": 100})
    with pytest.raises(ChannelClosedByBroker) as info:
        ch.queue_declare("q", arguments={"x-message-ttl": 200})
    assert info.value.reply_text == ("PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue "
                                     "'q' in vhost '/': received '200' but current is '100'")
    ch = connection.channel()
    with pytest.raises(ChannelClosedByBroker) as info:
        ch.queue_declare("q")
    assert info.value.reply_text == ("PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue "
                                     "'q' in vhost '/': received none but current is the value '100' "
                                     "of type 'signedint'")


# -- policies ---------------------------------------------------------------------------
POLICY_TOML = r'''
[[policies]]
name = "pol"
pattern = "^pol\\."
apply_to = "queues"

[policies.definition]
message-ttl = 100
max-length = 5
dead-letter-exchange = ""
dead-letter-routing-key = "poldlq"
'''


def test_policy_from_toml_config_and_precedence(tmp_path):
    """As ``rabbitmqctl set_policy pol '^pol\\.' '{...}' --apply-to queues``: numeric
    limits take the lower of argument and policy; the DLX argument wins over the policy's."""
    config = tmp_path / "leveret.toml"
    config.write_text(POLICY_TOML)
    with BlockingBroker(load(config), amqp_port=0) as broker:
        conn = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
        ch = conn.channel()
        for name in ("poldlq", "poldlq2"):
            ch.queue_declare(name)
        ch.queue_declare("pol.a", arguments={"x-message-ttl": 5000})  # policy's 100 wins
        ch.queue_declare("pol.b", arguments={"x-max-length": 2})  # argument's 2 wins
        ch.queue_declare("pol.c", arguments={"x-dead-letter-exchange": "",
                                             "x-dead-letter-routing-key": "poldlq2"})
        ch.basic_publish("", "pol.a", b"a")
        for i in range(4):
            ch.basic_publish("", "pol.b", f"b{i}".encode())
        ch.basic_publish("", "pol.c", b"c")
        assert eventually(lambda: count(ch, "poldlq") == 5)
        reasons = {}
        while (got := get(ch, "poldlq")) is not None:
            reasons[got[2]] = got[3]["x-death"][1][0][1]["reason"][1]
        assert reasons == {b"b0": "maxlen", b"b1": "maxlen", b"a": "expired", b"b2": "expired",
                           b"b3": "expired"}
        assert eventually(lambda: count(ch, "poldlq2") == 1)
        assert get(ch, "poldlq2")[2] == b"c"
        conn.close()


# -- aio-pika ---------------------------------------------------------------------------
def test_aio_pika_consumer_reads_x_death(leveret_broker):
    async def scenario() -> None:
        connection = await aio_pika.connect(leveret_broker.amqp_url)
        async with connection:
            ch = await connection.channel()
            dlx = await ch.declare_exchange("dlx", aio_pika.ExchangeType.FANOUT)
            dlq = await ch.declare_queue("dlq")
            await dlq.bind(dlx)
            src = await ch.declare_queue("src", arguments={"x-dead-letter-exchange": "dlx",
                                                           "x-message-ttl": 100})
            await ch.default_exchange.publish(
                aio_pika.Message(b"hello", expiration=5, headers={"k": "v"}), routing_key="src")
            async with dlq.iterator(timeout=3) as messages:
                async for message in messages:
                    async with message.process():
                        assert message.body == b"hello"
                        assert message.expiration is None
                        assert message.routing_key == "src" and message.exchange == "dlx"
                        (entry,) = message.headers["x-death"]
                        assert entry["count"] == 1 and entry["reason"] == "expired"
                        assert entry["queue"] == "src" and entry["routing-keys"] == ["src"]
                        # the queue's TTL (100 ms) was lower, but the property is kept here
                        assert entry["original-expiration"] == "5000"
                        assert message.headers["k"] == "v"
                        assert message.headers["x-first-death-queue"] == "src"
                        break
            assert src.name == "src"

    asyncio.run(asyncio.wait_for(scenario(), 10))
