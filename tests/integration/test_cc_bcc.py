"""Sender-selected distribution (the ``CC`` and ``BCC`` headers) as RabbitMQ 3.10 does
it, over pika and real TCP. Each test runs against leveret and against a RabbitMQ node
(when installed, see targets.py) and expects the same answers, read from RabbitMQ
3.10.8:

- ``CC`` and ``BCC`` (arrays; only their long-string items count) add routing keys on
  direct and topic exchanges and the default exchange, at every exchange on the way
  (exchange-to-exchange bindings, alternate exchanges); fanout and headers exchanges
  ignore them; a queue gets the message once whatever the number of keys reaching it;
- consumers (and basic.return) see ``CC`` but not ``BCC``; an empty table stays;
- a ``CC``/``BCC`` that is not an array closes the channel with 406;
- a dead letter is routed on all the original keys, ``BCC`` ones included, unless the
  queue has a dead-letter routing key (then ``CC`` goes too); ``x-death`` lists the
  routing key and the ``CC`` keys, never the ``BCC`` ones;
- topic permissions are checked on the routing key only.
"""

from __future__ import annotations

import pika
import pytest
import wire_types
from eventually import eventually
from pika.exceptions import ChannelClosedByBroker
from targets import Target, unique

wire_types.install()


def props(**headers) -> pika.BasicProperties:
    return pika.BasicProperties(headers=headers)


def got(channel, queues: list[str], timeout: float = 2.0, expected: int = 0) -> dict[str, list]:
    """``{queue: [(body, routing key, typed headers), ...]}`` of what waits in each queue,
    auto-acked; waits until ``expected`` messages in all have arrived."""
    found: dict[str, list] = {queue: [] for queue in queues}

    def arrived() -> bool:
        for queue in queues:
            while True:
                method, properties, body = channel.basic_get(queue, auto_ack=True)
                if method is None:
                    break
                found[queue].append((body, method.routing_key, wire_types.typed_headers(properties)))
        return sum(map(len, found.values())) >= expected

    eventually(arrived, timeout)
    return found


@pytest.fixture
def queues(target: Target):
    """Four fresh queues (q[0..3]) and a channel; names unique on the shared node."""
    with target.amqp() as connection:
        channel = connection.channel()
        names = [unique(f"cc{i}") for i in range(4)]
        for name in names:
            channel.queue_declare(name, auto_delete=False)
        yield channel, names
        for name in names:
            channel.queue_delete(name)


def s(text: str) -> tuple[str, str]:
    return ("S", text)


def test_default_and_direct_exchanges_route_on_cc_and_bcc_keys(queues):
    channel, (a, b, c, d) = queues
    channel.basic_publish("", a, b"default", props(CC=[b], BCC=[c]))
    seen = got(channel, [a, b, c, d], expected=3)
    assert {q: [m[0] for m in ms] for q, ms in seen.items()} == \
        {a: [b"default"], b: [b"default"], c: [b"default"], d: []}
    # every copy keeps the publish routing key and CC, loses BCC
    assert seen[c] == [(b"default", a, {"CC": ("A", [s(b)])})]

    exchange = unique("ccd")
    channel.exchange_declare(exchange, "direct", auto_delete=True)
    for q in (a, b, c, d):
        channel.queue_bind(q, exchange, q)
    # duplicates and the routing key repeated in CC: each queue once
    channel.basic_publish(exchange, a, b"direct", props(CC=[b, b, a], BCC=[c], n=7))
    seen = got(channel, [a, b, c, d], expected=3)
    assert {q: len(ms) for q, ms in seen.items()} == {a: 1, b: 1, c: 1, d: 0}
    assert seen[b][0][2] == {"CC": ("A", [s(b), s(b), s(a)]), "n": ("I", 7)}
    # BCC alone: routed by it, and the consumer sees an empty headers table
    channel.basic_publish(exchange, "nowhere", b"bcc", props(BCC=[d]))
    assert got(channel, [a, b, c, d], expected=1)[d] == [(b"bcc", "nowhere", {})]
    # only long strings are keys: a number or a byte array in CC is ignored
    channel.basic_publish(exchange, "nowhere", b"mixed", props(CC=[a, 5, b.encode(), c]))
    seen = got(channel, [a, b, c, d], expected=2)
    assert {q: len(ms) for q, ms in seen.items()} == {a: 1, b: 0, c: 1, d: 0}
    # names are case-sensitive; empty arrays are fine
    channel.basic_publish(exchange, a, b"lower", props(cc=[b], bcc=[c], CC=[], BCC=[]))
    seen = got(channel, [a, b, c, d], expected=1)
    assert {q: len(ms) for q, ms in seen.items()} == {a: 1, b: 0, c: 0, d: 0}
    assert seen[a][0][2] == {"cc": ("A", [s(b)]), "bcc": ("A", [s(c)]), "CC": ("A", [])}


def test_topic_routes_on_every_key_fanout_and_headers_ignore_them(queues):
    channel, (a, b, c, d) = queues
    topic, fanout, headers = unique("cct"), unique("ccf"), unique("cch")
    channel.exchange_declare(topic, "topic", auto_delete=True)
    channel.queue_bind(a, topic, "a.*")
    channel.queue_bind(b, topic, "b.#")
    channel.basic_publish(topic, "x", b"topic", props(CC=["a.1"], BCC=["b.2.3"]))
    seen = got(channel, [a, b, c, d], expected=2)
    assert {q: len(ms) for q, ms in seen.items()} == {a: 1, b: 1, c: 0, d: 0}
    assert seen[b][0][2] == {"CC": ("A", [s("a.1")])}

    channel.exchange_declare(fanout, "fanout", auto_delete=True)
    channel.queue_bind(a, fanout, "")
    channel.basic_publish(fanout, "x", b"fanout", props(CC=[b], BCC=[c]))
    channel.exchange_declare(headers, "headers", auto_delete=True)
    channel.queue_bind(a, headers, "", arguments={"x-match": "any", "k": "v"})
    channel.basic_publish(headers, b, b"headers", props(k="v", CC=[b], BCC=[c]))
    seen = got(channel, [a, b, c, d], expected=2)
    assert {q: [m[0] for m in ms] for q, ms in seen.items()} == \
        {a: [b"fanout", b"headers"], b: [], c: [], d: []}


def test_cc_keys_go_through_exchange_bindings_and_alternate_exchanges(queues):
    channel, (a, b, c, d) = queues
    first, second = unique("cce1"), unique("cce2")
    channel.exchange_declare(first, "direct", auto_delete=True)
    channel.exchange_declare(second, "direct", auto_delete=True)
    channel.exchange_bind(second, first, "k2")
    channel.queue_bind(d, second, "k3")
    # k2 leads to the second exchange, where k3 (the same message's key) reaches d
    channel.basic_publish(first, "k1", b"e2e", props(CC=["k2", "k3"]))
    assert got(channel, [a, b, c, d], expected=1)[d] == [(b"e2e", "k1", {"CC": ("A", [s("k2"), s("k3")])})]

    alternate, main = unique("ccae"), unique("ccx")
    channel.exchange_declare(alternate, "direct", auto_delete=True)
    channel.queue_bind(c, alternate, "alt")
    channel.exchange_declare(main, "direct", auto_delete=True, arguments={"alternate-exchange": alternate})
    channel.queue_bind(a, main, "unused")
    channel.basic_publish(main, "zz", b"ae", props(BCC=["alt"]))
    assert got(channel, [a, b, c, d], expected=1)[c] == [(b"ae", "zz", {})]


def test_a_returned_message_shows_cc_and_not_bcc(queues):
    channel, (a, _, _, _) = queues
    returned = []
    channel.add_on_return_callback(
        lambda _ch, method, properties, body: returned.append(
            (method.reply_code, method.reply_text, method.routing_key, properties.headers, body)))
    channel.basic_publish("", unique("nowhere"), b"r", props(CC=[unique("none")], BCC=["x"]), mandatory=True)
    channel.connection.process_data_events(1)
    assert [(code, text, body) for code, text, _, _, body in returned] == [(312, "NO_ROUTE", b"r")]
    assert list(returned[0][3]) == ["CC"]
    # a BCC key that reaches a queue makes the message routed: not returned
    channel.basic_publish("", unique("nowhere"), b"r2", props(BCC=[a]), mandatory=True)
    channel.connection.process_data_events(0.5)
    assert len(returned) == 1
    assert [m[0] for m in got(channel, [a], expected=1)[a]] == [b"r2"]


@pytest.mark.parametrize(("headers", "text"), [
    ({"CC": "q"}, '"CC",longstr'),
    ({"BCC": "q"}, '"BCC",longstr'),
    ({"CC": 5}, '"CC",signedint'),
    ({"CC": None}, '"CC",void'),
    ({"BCC": {"a": 1}}, '"BCC",table'),
    ({"CC": b"q"}, '"CC",binary'),
    ({"CC": True}, '"CC",bool'),
    ({"BCC": 1, "CC": "q"}, '"CC",longstr'),  # CC is looked at first
])
def test_a_cc_or_bcc_that_is_not_an_array_closes_the_channel_with_406(target: Target, headers, text):
    with target.amqp() as connection:
        channel = connection.channel()
        channel.basic_publish("amq.direct", "k", b"bad", pika.BasicProperties(headers=headers))
        with pytest.raises(ChannelClosedByBroker) as caught:
            channel.queue_declare(unique("after"), auto_delete=True)
    assert (caught.value.reply_code, caught.value.reply_text) == \
        (406, f"PRECONDITION_FAILED - invalid message: {{unacceptable_type_in_header,{text}}}")


def test_a_dead_letter_is_routed_on_all_its_keys_and_x_death_shows_cc_only(queues):
    channel, (on_key, on_cc, on_bcc, _) = queues
    dlx, publish = unique("dlx"), unique("pub")
    source, readdressed = unique("src"), unique("src2")
    channel.exchange_declare(dlx, "direct", auto_delete=True)
    channel.exchange_declare(publish, "direct", auto_delete=True)
    channel.queue_bind(on_key, dlx, "k")
    channel.queue_bind(on_cc, dlx, "cc1")
    channel.queue_bind(on_bcc, dlx, "bcc1")
    channel.queue_declare(source, arguments={"x-dead-letter-exchange": dlx})
    channel.queue_declare(readdressed,
                          arguments={"x-dead-letter-exchange": dlx, "x-dead-letter-routing-key": "k"})
    channel.queue_bind(source, publish, "k")
    channel.queue_bind(readdressed, publish, "k2")
    everyone = [on_key, on_cc, on_bcc]
    try:
        # no dead-letter routing key: routed on k, cc1 and bcc1; x-death names k and cc1
        channel.basic_publish(publish, "k", b"m1", props(CC=["cc1"], BCC=["bcc1"]))
        reject_one(channel, source)
        seen = got(channel, everyone, expected=3)
        assert {q: len(ms) for q, ms in seen.items()} == {on_key: 1, on_cc: 1, on_bcc: 1}
        headers = seen[on_bcc][0][2]
        assert seen[on_bcc][0][1] == "k"
        assert headers["CC"] == ("A", [s("cc1")])
        assert "BCC" not in headers
        assert headers["x-death"][1][0][1]["routing-keys"] == ("A", [s("k"), s("cc1")])

        # a dead-letter routing key replaces every key, and CC goes
        channel.basic_publish(publish, "k2", b"m2", props(CC=["cc1"], BCC=["bcc1"]))
        reject_one(channel, readdressed)
        seen = got(channel, everyone, expected=1)
        assert {q: len(ms) for q, ms in seen.items()} == {on_key: 1, on_cc: 0, on_bcc: 0}
        headers = seen[on_key][0][2]
        assert "CC" not in headers
        assert headers["x-death"][1][0][1]["routing-keys"] == ("A", [s("k2"), s("cc1")])

        # reached through a BCC key: its dead letter is routed by it again, x-death
        # shows only the publish key
        channel.basic_publish(publish, "nothing", b"m3", props(BCC=["k"]))
        reject_one(channel, source)
        seen = got(channel, everyone, expected=1)
        assert [(m[0], m[1]) for m in seen[on_key]] == [(b"m3", "nothing")]
        assert seen[on_key][0][2]["x-death"][1][0][1]["routing-keys"] == ("A", [s("nothing")])
    finally:
        channel.queue_delete(source)
        channel.queue_delete(readdressed)


def reject_one(channel, queue: str, timeout: float = 2.0) -> None:
    method = eventually(lambda: channel.basic_get(queue)[0], timeout)
    assert method is not None, f"nothing in {queue}"
    channel.basic_reject(method.delivery_tag, requeue=False)


def test_topic_permissions_look_at_the_routing_key_only(target: Target, queues):
    channel, (a, _, _, _) = queues
    user = unique("cc-user")
    assert target.http("PUT", f"/api/users/{user}", {"password": "pw", "tags": ""})[0] == 201
    try:
        target.http("PUT", f"/api/permissions/%2F/{user}", {"configure": ".*", "write": ".*", "read": ".*"})
        target.http("PUT", f"/api/topic-permissions/%2F/{user}",
                    {"exchange": "amq.topic", "write": "^a", "read": ".*"})
        channel.queue_bind(a, "amq.topic", f"b.{a}")
        with target.amqp(user, "pw") as connection:
            theirs = connection.channel()
            theirs.basic_publish("amq.topic", "a.x", b"t", props(CC=[f"b.{a}"]))
            theirs.queue_declare(a, passive=True)  # the channel is still open
        assert [m[0] for m in got(channel, [a], expected=1)[a]] == [b"t"]
    finally:
        channel.queue_unbind(a, "amq.topic", f"b.{a}")
        target.http("DELETE", f"/api/users/{user}")
