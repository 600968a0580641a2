"""The exchange types RabbitMQ users install plugins for, over pika and real TCP.

``x-consistent-hash`` and ``x-random`` run against leveret and against RabbitMQ 3.10.8
with its shipped plugins (``rabbitmq_consistent_hash_exchange``,
``rabbitmq_random_exchange``; a private node, see plugin_exchange_rabbitmq.py, skipped
when rabbitmq-server is not installed) and expect the same answers: the same queue for
the same routing key, header or property (the placements below were read from RabbitMQ
3.10.8), the same reply codes and texts for bad declarations and bindings, weights
respected. ``x-local-random`` (RabbitMQ 4.0) and ``x-modulus-hash`` (4.3) are not in
3.10: leveret alone is checked against their documented behaviour. Then the types in
the management API, definitions, ``leveret ctl`` and across a restart.
"""

from __future__ import annotations

import collections
import json
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker, ConnectionClosedByBroker

from leveret import BlockingBroker

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from plugin_exchange_rabbitmq import PluginExchangeRabbitMQ, rabbitmq_installed


@pytest.fixture(scope="module")
def plugin_rabbitmq() -> Iterator[int]:
    """The AMQP port of a private RabbitMQ 3.10 node with the two plugins."""
    if not rabbitmq_installed():
        pytest.skip("rabbitmq-server is not installed: only leveret is checked")
    node = PluginExchangeRabbitMQ()
    node.start()
    try:
        yield node.port
    finally:
        node.stop()


@pytest.fixture(params=["leveret", "rabbitmq"])
def port(request) -> Iterator[int]:
    """The AMQP port of a fresh leveret, or of the module's RabbitMQ node."""
    if request.param == "rabbitmq":
        yield request.getfixturevalue("plugin_rabbitmq")
        return
    with BlockingBroker(amqp_port=0) as broker:
        yield broker.amqp_port


def connect(port: int) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))


def placement(port: int, name: str, arguments: dict, weights: list[int], messages) -> str:
    """Declare ``name`` (x-consistent-hash) with one fresh queue a weight, publish
    ``messages`` ((routing key, properties) pairs, bodies their index) with confirms,
    and answer which queue (its index) got each, as one digit a message."""
    with connect(port) as connection:
        channel = connection.channel()
        channel.exchange_delete(name)
        channel.exchange_declare(name, "x-consistent-hash", arguments=arguments)
        queues = []
        for i, weight in enumerate(weights):
            queue = f"{name}-q{i}"
            channel.queue_delete(queue)
            channel.queue_declare(queue)
            channel.queue_bind(queue, name, str(weight))
            queues.append(queue)
        channel.confirm_delivery()
        for i, (routing_key, properties) in enumerate(messages):
            channel.basic_publish(name, routing_key, str(i).encode(), properties)
        placed = where_each_went(channel, queues, len(messages))
        for queue in queues:
            channel.queue_delete(queue)
        channel.exchange_delete(name)
    return placed


def where_each_went(channel, queues: list[str], count: int) -> str:
    """Drain ``queues`` (basic.get) of messages whose bodies are their index, and answer
    which queue (its index in ``queues``) held each of the ``count``, one digit a
    message (``-``: none held it)."""
    where = {}
    for index, queue in enumerate(queues):
        while True:
            method, _, body = channel.basic_get(queue, auto_ack=True)
            if method is None:
                break
            where[int(body)] = index
    return "".join(str(where.get(i, "-")) for i in range(count))


WEIGHTS = [1, 2, 3, 4]
#: Which of four queues (weights 1, 2, 3, 4) RabbitMQ 3.10.8 routes each message to.
PLACEMENTS = {
    "routing-key": ({}, [(f"order-{i}", None) for i in range(40)],
                    "1331130231303231011033233223303000121331"),
    "text-header": ({"hash-header": "user"},
                    [("x", pika.BasicProperties(headers={"user": f"u{i}"})) for i in range(40)],
                    "1301203102322122232203322333332133223302"),
    "integer-header": ({"hash-header": "user"},
                       [("x", pika.BasicProperties(headers={"user": i * 1000003})) for i in range(40)],
                       "3212322023321321133332232231230323222213"),
    "correlation-id": ({"hash-property": "correlation_id"},
                       [("x", pika.BasicProperties(correlation_id=f"c{i}")) for i in range(40)],
                       "3122302233333231021333203211131301323323"),
    "timestamp": ({"hash-property": "timestamp"},
                  [("x", pika.BasicProperties(timestamp=1700000000 + 97 * i)) for i in range(40)],
                  "2202133333113320133303232321213332322223"),
    "missing-header": ({"hash-header": "user"}, [(f"k{i}", None) for i in range(5)], "11111"),
}


@pytest.mark.parametrize("case", PLACEMENTS)
def test_consistent_hash_picks_rabbitmqs_queue(port, case):
    """The hash is Erlang's phash2 and the plugin's jump hash, reproduced exactly: every
    message lands in the queue RabbitMQ picks (a missing header hashes as ``undefined``,
    so all such messages share one queue)."""
    arguments, messages, expected = PLACEMENTS[case]
    assert placement(port, f"chx-{case}", arguments, WEIGHTS, messages) == expected


def test_consistent_hash_weights_respected(port):
    messages = [(f"key-{i}", None) for i in range(3000)]
    counts = collections.Counter(placement(port, "chx-weights", {}, [1, 2, 3], messages))
    for index, share in (("0", 1 / 6), ("1", 2 / 6), ("2", 3 / 6)):
        assert abs(counts[index] / 3000 - share) < 0.04, counts


def close_reason(port: int, action) -> tuple[int, str]:
    """(reply code, reply text) of the channel or connection ``action`` gets closed with."""
    with connect(port) as connection:
        channel = connection.channel()
        try:
            action(channel)
        except (ChannelClosedByBroker, ConnectionClosedByBroker) as closed:
            return closed.reply_code, closed.reply_text
    raise AssertionError("not closed")


@pytest.mark.parametrize(("arguments", "code", "text"), [
    ({"hash-property": "app_id"}, 406, "PRECONDITION_FAILED - Unsupported property: app_id"),
    ({"hash-property": "message_id", "hash-header": "h"}, 406,
     "PRECONDITION_FAILED - hash-header and hash-property are mutually exclusive"),
])
def test_consistent_hash_bad_declarations(port, arguments, code, text):
    assert close_reason(port, lambda ch: ch.exchange_declare("chx-bad", "x-consistent-hash",
                                                             arguments=arguments)) == (code, text)
    with connect(port) as connection:  # nothing was made
        with pytest.raises(ChannelClosedByBroker) as missing:
            connection.channel().exchange_declare("chx-bad", "x-consistent-hash", passive=True)
        assert missing.value.reply_code == 404


@pytest.mark.parametrize("value", [5, True, ["h"], {"h": 1}])
@pytest.mark.parametrize("name", ["hash-header", "hash-property"])
def test_consistent_hash_argument_not_a_string_is_a_clean_406(request, port, name, value):
    """RabbitMQ 3.10's plugin crashes on a hash-header/hash-property that is not a string
    (541 INTERNAL_ERROR closing the connection); leveret refuses it with a 406 on the
    channel and the connection lives on."""
    if request.node.callspec.params["port"] == "rabbitmq":
        pytest.skip("RabbitMQ 3.10's plugin answers 541 INTERNAL_ERROR (a crash)")
    with connect(port) as connection:
        with pytest.raises(ChannelClosedByBroker) as closed:
            connection.channel().exchange_declare("chx-bad-arg", "x-consistent-hash",
                                                  arguments={name: value})
        assert closed.value.reply_code == 406
        assert closed.value.reply_text.startswith(f"PRECONDITION_FAILED - invalid arg '{name}'")
        assert connection.is_open
        with pytest.raises(ChannelClosedByBroker) as missing:
            connection.channel().exchange_declare("chx-bad-arg", "x-consistent-hash", passive=True)
        assert missing.value.reply_code == 404


@pytest.mark.parametrize(("key", "text"), [
    ("abc", 'The binding key must be an integer: <<"abc">>'),
    ("", "The binding key must be an integer: <<>>"),
    ("1.5", 'The binding key must be an integer: <<"1.5">>'),
    ("a\x01b", "The binding key must be an integer: <<97,1,98>>"),
    ("0", "The binding key must be greater than 0"),
    ("-3", "The binding key must be greater than 0"),
])
def test_consistent_hash_bad_weights(port, key, text):
    with connect(port) as connection:
        channel = connection.channel()
        channel.exchange_declare("chx-keys", "x-consistent-hash")
        channel.queue_declare("chx-keys-q")

    def bind(channel):
        channel.queue_bind("chx-keys-q", "chx-keys", key)

    def bind_exchange(channel):
        channel.exchange_bind("amq.fanout", "chx-keys", key)

    assert close_reason(port, bind) == (406, f"PRECONDITION_FAILED - {text}")
    assert close_reason(port, bind_exchange) == (406, f"PRECONDITION_FAILED - {text}")
    with connect(port) as connection:
        channel = connection.channel()
        channel.queue_bind("chx-keys-q", "chx-keys", "+7")  # a sign is allowed
        channel.queue_delete("chx-keys-q")
        channel.exchange_delete("chx-keys")


def test_random_exchange(port):
    """One bound queue at random per message, whatever the routing key; every binding
    gets its share; no binding, unroutable."""
    with connect(port) as connection:
        channel = connection.channel()
        channel.exchange_delete("rx")
        channel.exchange_declare("rx", "x-random")
        channel.confirm_delivery()
        with pytest.raises(pika.exceptions.UnroutableError):
            channel.basic_publish("rx", "k", b"", mandatory=True)
        queues = [f"rx-q{i}" for i in range(3)]
        for queue in queues:
            channel.queue_delete(queue)
            channel.queue_declare(queue)
            channel.queue_bind(queue, "rx", "whatever")
        for i in range(600):
            channel.basic_publish("rx", "same" if i % 2 else f"k{i}", b"", mandatory=True)
        counts = [channel.queue_declare(q, passive=True).method.message_count for q in queues]
        assert sum(counts) == 600
        assert all(120 < c < 280 for c in counts), counts
        for queue in queues:
            channel.queue_delete(queue)
        channel.exchange_delete("rx")


# -- RabbitMQ 4.x types: leveret alone ------------------------------------------------------
@pytest.fixture
def leveret() -> Iterator[BlockingBroker]:
    with BlockingBroker(amqp_port=0, http_port=0) as broker:
        yield broker


def test_local_random_exchange(leveret):
    port = leveret.amqp_port
    with connect(port) as connection:
        channel = connection.channel()
        channel.exchange_declare("lx", "x-local-random", durable=True)
        channel.queue_declare("lx-q1")
        channel.queue_declare("lx-q2")
        channel.queue_declare("lx-qq", durable=True, arguments={"x-queue-type": "quorum"})
    assert close_reason(port, lambda ch: ch.queue_bind("lx-q1", "lx", "k")) == \
        (406, "PRECONDITION_FAILED - Non empty binding 'k' key not permitted")
    assert close_reason(port, lambda ch: ch.queue_bind("lx-qq", "lx", "")) == \
        (406, "PRECONDITION_FAILED - Queue type rabbit_quorum_queue not valid for this exchange type")
    assert close_reason(port, lambda ch: ch.exchange_bind("amq.fanout", "lx", "")) == \
        (406, "PRECONDITION_FAILED - Destination not found")
    with connect(port) as connection:
        channel = connection.channel()
        channel.queue_bind("lx-q1", "lx", "")
        channel.queue_bind("lx-q2", "lx", "")
        channel.confirm_delivery()
        for i in range(200):
            channel.basic_publish("lx", f"k{i}", b"", mandatory=True)
        counts = [channel.queue_declare(q, passive=True).method.message_count for q in ("lx-q1", "lx-q2")]
        assert sum(counts) == 200 and min(counts) > 60


def test_modulus_hash_exchange(leveret):
    """phash2 of the routing keys modulo the bindings, over destinations in name order: the
    same key always to the same queue, a queue bound twice gets two shares."""
    with connect(leveret.amqp_port) as connection:
        channel = connection.channel()
        channel.exchange_declare("mx", "x-modulus-hash")
        for name, keys in (("mx-a", ["1"]), ("mx-b", ["1", "2"])):
            channel.queue_declare(name)
            for key in keys:
                channel.queue_bind(name, "mx", key)
        channel.confirm_delivery()
        for i in range(900):
            channel.basic_publish("mx", f"order-{i % 300}", str(i % 300).encode())
        seen: dict[str, set] = {}
        for name in ("mx-a", "mx-b"):
            while True:
                method, _, body = channel.basic_get(name, auto_ack=True)
                if method is None:
                    break
                seen.setdefault(name, set()).add(body)
        assert not seen["mx-a"] & seen["mx-b"]  # one queue per key
        assert len(seen["mx-a"]) + len(seen["mx-b"]) == 300
        assert 60 < len(seen["mx-a"]) < 140  # about a third


def http(broker: BlockingBroker, method: str, path: str, body=None):
    request = urllib.request.Request(
        broker.http_url.rstrip("/") + path, method=method,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q=", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as reply:
        raw = reply.read()
        return reply.status, json.loads(raw) if raw else None


def test_types_in_overview_and_definitions(leveret):
    overview = http(leveret, "GET", "/api/overview")[1]
    names = {t["name"] for t in overview["exchange_types"]}
    assert {"x-consistent-hash", "x-random", "x-local-random", "x-modulus-hash"} <= names
    with connect(leveret.amqp_port) as connection:
        channel = connection.channel()
        channel.exchange_declare("def-chx", "x-consistent-hash", durable=True,
                                 arguments={"hash-header": "user"})
        for name, weight in (("def-q2", 2), ("def-q1", 1)):
            channel.queue_declare(name, durable=True)
            channel.queue_bind(name, "def-chx", str(weight))
    document = http(leveret, "GET", "/api/definitions")[1]
    with BlockingBroker(amqp_port=0, http_port=0) as other:
        assert http(other, "POST", "/api/definitions", document)[0] in (200, 204)
        ring = other.call(lambda: [(q.name, w) for q, w in
                                      other.core.vhosts["/"].exchanges["def-chx"].ring()])
        assert ring == [("def-q2", 2), ("def-q1", 1)]  # binding order, so the ring, is kept
        bad = dict(document, bindings=[dict(b, routing_key="heavy") for b in document["bindings"]
                                       if b["source"] == "def-chx"])
        with pytest.raises(urllib.error.HTTPError) as refused:
            http(other, "POST", "/api/definitions", bad)
        assert refused.value.code == 400


def test_ring_survives_restart(tmp_path):
    """Durable bindings come back in the order they were made, so after a restart every
    key still goes to the same queue (RabbitMQ 3.10 re-adds them sorted, which can move
    keys)."""
    def route_all(port):
        return placement_no_setup(port, "rs-chx", ["rs-b", "rs-a"])

    with BlockingBroker(amqp_port=0, data_dir=str(tmp_path)) as broker:
        with connect(broker.amqp_port) as connection:
            channel = connection.channel()
            channel.exchange_declare("rs-chx", "x-consistent-hash", durable=True)
            for name, weight in (("rs-b", 3), ("rs-a", 1)):
                channel.queue_declare(name, durable=True)
                channel.queue_bind(name, "rs-chx", str(weight))
        before = route_all(broker.amqp_port)
    with BlockingBroker(amqp_port=0, data_dir=str(tmp_path)) as broker:
        assert route_all(broker.amqp_port) == before


def placement_no_setup(port: int, exchange: str, queues: list[str]) -> str:
    with connect(port) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        for i in range(60):
            channel.basic_publish(exchange, f"key-{i}", str(i).encode())
        return where_each_went(channel, queues, 60)


def test_ctl_lists_types_and_shows_the_ring(tmp_path):
    """``leveret ctl list_exchange_types`` and ``consistent_hash_exchange_ring_state`` (one
    row per destination: its first and last bucket)."""
    import subprocess

    from servers import ServerProcess

    def ctl(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "leveret", "ctl", "--data-dir", str(tmp_path / "data"),
                               "-q", *args], capture_output=True, text=True, timeout=60)

    server = ServerProcess(tmp_path / "data")
    try:
        listed = ctl("list_exchange_types")
        assert listed.returncode == 0, listed.stderr
        names = [line.split("\t")[0] for line in listed.stdout.splitlines()[1:]]
        assert {"x-consistent-hash", "x-random", "x-local-random", "x-modulus-hash"} <= set(names)
        url = f"amqp://guest:guest@{server.host}:{server.port}/"
        with pika.BlockingConnection(pika.URLParameters(url)) as c:
            channel = c.channel()
            channel.exchange_declare("ring", "x-consistent-hash")
            for name, weight in (("ring-a", 2), ("ring-b", 3)):
                channel.queue_declare(name)
                channel.queue_bind(name, "ring", str(weight))
        state = ctl("consistent_hash_exchange_ring_state", "ring")
        assert state.returncode == 0, state.stderr
        assert [line.split("\t") for line in state.stdout.splitlines()[1:]] == \
            [["0", "1", "ring-a"], ["2", "4", "ring-b"]]
        missing = ctl("consistent_hash_exchange_ring_state", "amq.direct")
        assert missing.returncode != 0
        assert "Exchange does not exist or is of a different type" in missing.stderr
    finally:
        server.kill()
