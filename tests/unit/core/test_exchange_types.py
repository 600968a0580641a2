"""The plugin exchange types (leveret.core.exchange_types) and the Erlang hashes they
route with (leveret.core.erlang_hash), driven through core alone: a BrokerCore's vhost,
messages built in core. The expected hashes were read from ``erl`` (OTP 25, the Erlang
RabbitMQ 3.10.8 runs on); when ``erl`` is installed, random terms are checked against it
too."""

from __future__ import annotations

import collections
import datetime
import json
import random
import shutil
import subprocess
import time

import pytest
from hypothesis import given, settings, strategies as st

from leveret.core import BrokerCore, Message, erlang_hash
from leveret.core.clock import ManualClock
from leveret.core.erlang_hash import Atom, jump_consistent_hash, phash2
from leveret.core.errors import BrokerError, PreconditionFailed
from leveret.core.exchange import exchange_class
from leveret.core.exchange_types import (
    ConsistentHashExchange,
    LocalRandomExchange,
    ModulusHashExchange,
    RandomExchange,
)
from leveret.core.message import Properties


# -- the hashes ---------------------------------------------------------------------------
@pytest.mark.parametrize(("term", "expected"), [
    (b"", 13708901),
    (b"key-1", 5452885),
    (b"hello world!x", 126902301),  # past one 12-byte block
    (Atom("undefined"), 45914356),
    ((Atom("longstr"), b"v1"), 121320320),
    ((Atom("signedint"), 42), 20266392),
    ((Atom("long"), -1099511627776), 32506873),
    ((Atom("bool"), Atom("true")), 32030443),
    ((Atom("double"), 2.5), 126418831),
    ([b"rk", b"cc"], 86820850),
])
def test_phash2_matches_erlang(term, expected):
    assert phash2(term) == expected


@pytest.mark.parametrize(("key", "buckets", "expected"), [
    (0, 10, 4), (1, 10, 3), (98228475, 3, 1), (134217727, 1000, 220), (12345, 6, 0),
])
def test_jump_consistent_hash_matches_the_plugin(key, buckets, expected):
    assert jump_consistent_hash(key, buckets) == expected


def _erl(term) -> str:
    if isinstance(term, Atom):
        return f"'{term}'"
    if isinstance(term, bytes):
        return "<<" + ",".join(map(str, term)) + ">>"
    if isinstance(term, int):
        return str(term)
    if isinstance(term, float):
        return repr(term)
    if isinstance(term, tuple):
        return "{" + ",".join(map(_erl, term)) + "}"
    return "[" + ",".join(map(_erl, term)) + "]"


@pytest.mark.skipif(shutil.which("erl") is None, reason="erl (Erlang) is not installed")
def test_random_terms_and_rings_agree_with_erl():
    rnd = random.Random(7)
    terms: list = []
    for _ in range(150):
        terms.append(bytes(rnd.randrange(256) for _ in range(rnd.randrange(0, 70))))
    for _ in range(50):
        terms.append((Atom(rnd.choice(["longstr", "long", "signedint", "timestamp"])),
                      rnd.choice([rnd.randrange(-2**62, 2**62), b"x" * rnd.randrange(9)])))
        terms.append([rnd.randrange(256) for _ in range(rnd.randrange(6))] + [b"t", rnd.randrange(1000)])
        terms.append(rnd.uniform(-1e9, 1e9))
    pairs = [(rnd.randrange(2**27), rnd.randrange(1, 5000)) for _ in range(200)]
    terms_text = ",".join(map(_erl, terms))
    pairs_text = ",".join(f"{{{k},{n}}}" for k, n in pairs)
    code = (
        f"io:format(\"~w~n\", [[erlang:phash2(T) || T <- [{terms_text}]]]),"
        "J = fun(K, N) -> L = fun Lp(B, Jj, _) when Jj >= N -> B; Lp(_, Jj, S) -> "
        "{R, S2} = rand:uniform_s(S), Lp(Jj, trunc((Jj + 1) / R), S2) end,"
        " L(-1, 0, rand:seed_s(exs1024, {K, K, K})) end,"
        f"io:format(\"~w~n\", [[J(K, N) || {{K, N}} <- [{pairs_text}]]]), halt()."
    )
    out = subprocess.run(["erl", "-noshell", "-eval", code], capture_output=True, text=True, timeout=60)
    hashes, buckets = (json.loads(line) for line in out.stdout.split())  # lists of integers
    assert [phash2(t) for t in terms] == hashes
    assert [jump_consistent_hash(k, n) if n > 1 else 0 for k, n in pairs] == \
        [b if n > 1 else 0 for b, (_, n) in zip(buckets, pairs, strict=True)]


def test_jump_hash_moves_keys_only_to_a_new_bucket():
    """Consistency: growing the ring from n to n+1 buckets moves a key only into the new
    bucket n; and the buckets are filled evenly (within 5 %)."""
    for n in (3, 10, 57):
        moved = 0
        for key in range(0, 2**27, 2**27 // 3000):
            before, after = jump_consistent_hash(key, n), jump_consistent_hash(key, n + 1)
            assert after in (before, n)
            moved += after != before
        assert abs(moved / 3000 - 1 / (n + 1)) < 0.05
    counts = collections.Counter(jump_consistent_hash(phash2(b"k%d" % i), 4) for i in range(20000))
    assert all(abs(c / 5000 - 1) < 0.05 for c in counts.values())


# -- x-consistent-hash ---------------------------------------------------------------------
@pytest.fixture
def vhost():
    vhost = BrokerCore(clock=ManualClock()).vhosts["/"]
    for name in ("q1", "q2", "q3"):
        vhost.declare_queue(name, None)
    return vhost


def msg(routing_key: str = "", **properties) -> Message:
    return Message.build("x", routing_key, b"", Properties(**properties))


def test_consistent_hash_weights_and_ring_order(vhost):
    x = vhost.declare_exchange("chx", "x-consistent-hash")
    vhost.bind("chx", vhost.queues["q1"], "1")
    vhost.bind("chx", vhost.queues["q2"], "2")
    vhost.bind("chx", vhost.queues["q3"], "+3")  # Erlang's list_to_integer reads a sign
    assert [(q.name, w) for q, w in x.ring()] == [("q1", 1), ("q2", 2), ("q3", 3)]
    counts = collections.Counter(x.route(msg(f"key-{i}"))[0].name for i in range(30000))
    for name, weight in (("q1", 1), ("q2", 2), ("q3", 3)):
        assert abs(counts[name] / (30000 * weight / 6) - 1) < 0.05, counts
    # a second binding of q1 with another weight changes nothing (as the plugin)
    vhost.bind("chx", vhost.queues["q1"], "10")
    assert [(q.name, w) for q, w in x.ring()] == [("q1", 1), ("q2", 2), ("q3", 3)]
    # removing it leaves q1 with its first binding's weight; removing q2 shifts q3 down
    vhost.unbind("chx", vhost.queues["q1"], "10")
    vhost.unbind("chx", vhost.queues["q2"], "2")
    assert [(q.name, w) for q, w in x.ring()] == [("q1", 1), ("q3", 3)]
    assert x.buckets == 4


def test_consistent_hash_same_key_same_queue_and_minimal_moves(vhost):
    x = vhost.declare_exchange("chx", "x-consistent-hash")
    vhost.bind("chx", vhost.queues["q1"], "5")
    vhost.bind("chx", vhost.queues["q2"], "5")
    before = {i: x.route(msg(f"k{i}"))[0] for i in range(2000)}
    assert before == {i: x.route(msg(f"k{i}"))[0] for i in range(2000)}
    vhost.bind("chx", vhost.queues["q3"], "5")
    after = {i: x.route(msg(f"k{i}"))[0] for i in range(2000)}
    moved = [i for i in before if before[i] is not after[i]]
    assert all(after[i].name == "q3" for i in moved)
    assert 0.25 < len(moved) / 2000 < 0.42  # about a third moves, all to the new queue


def test_consistent_hash_on_header_and_properties(vhost):
    by_header = vhost.declare_exchange("hx", "x-consistent-hash", arguments={"hash-header": "h"})
    by_id = vhost.declare_exchange("px", "x-consistent-hash", arguments={"hash-property": "message_id"})
    by_ts = vhost.declare_exchange("tx", "x-consistent-hash", arguments={"hash-property": "timestamp"})
    for x in ("hx", "px", "tx"):
        for q in ("q1", "q2", "q3"):
            vhost.bind(x, vhost.queues[q], "1")
    assert by_header.hash_value(msg("rk", headers={"h": "v"})) == (Atom("longstr"), b"v")
    assert by_header.hash_value(msg("rk")) == Atom("undefined")
    assert by_id.hash_value(msg(message_id="m-1")) == b"m-1"
    stamp = datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
    assert by_ts.hash_value(msg(timestamp=stamp)) == str(int(stamp.timestamp())).encode()
    # the routing key plays no part when hashing on a header
    assert {by_header.route(msg(f"rk{i}", headers={"h": "same"}))[0] for i in range(50)} == \
        {by_header.route(msg("", headers={"h": "same"}))[0]}
    spread = collections.Counter(by_id.route(msg(message_id=f"id-{i}"))[0].name for i in range(3000))
    assert set(spread) == {"q1", "q2", "q3"}


@pytest.mark.parametrize(("arguments", "error", "text"), [
    ({"hash-property": "app_id"}, PreconditionFailed, "Unsupported property: app_id"),
    ({"hash-property": "message_id", "hash-header": "h"}, PreconditionFailed,
     "hash-header and hash-property are mutually exclusive"),
    ({"hash-header": 5}, BrokerError, ""),  # RabbitMQ crashes: 541 INTERNAL_ERROR
])
def test_consistent_hash_bad_arguments(vhost, arguments, error, text):
    with pytest.raises(error) as raised:
        vhost.declare_exchange("bad", "x-consistent-hash", arguments=arguments)
    assert (raised.value.condition, raised.value.text) == (error.condition, text)
    assert "bad" not in vhost.exchanges


@pytest.mark.parametrize(("key", "text"), [
    ("abc", 'The binding key must be an integer: <<"abc">>'),
    ("", "The binding key must be an integer: <<>>"),
    (" 5", 'The binding key must be an integer: <<" 5">>'),
    ("1_0", 'The binding key must be an integer: <<"1_0">>'),
    ("a\x01b", "The binding key must be an integer: <<97,1,98>>"),
    ('q"\\', 'The binding key must be an integer: <<"q\\"\\\\">>'),
    ("0", "The binding key must be greater than 0"),
    ("-3", "The binding key must be greater than 0"),
])
def test_consistent_hash_bad_weights(vhost, key, text):
    x = vhost.declare_exchange("chx", "x-consistent-hash")
    with pytest.raises(PreconditionFailed) as raised:
        vhost.bind("chx", vhost.queues["q1"], key)
    assert raised.value.text == text
    assert not x.bindings and x.buckets == 0


def test_consistent_hash_routing_does_not_rebuild(vhost):
    """Routing 20,000 messages over a 30,000-bucket ring costs no ring work: one bind
    of weight 10,000 is O(1) and routing stays well under 100 us a message."""
    x = vhost.declare_exchange("chx", "x-consistent-hash")
    for q in ("q1", "q2", "q3"):
        vhost.bind("chx", vhost.queues[q], "10000")
    messages = [msg(f"key-{i}") for i in range(20000)]
    started = time.process_time()
    for m in messages:
        x.route(m)
    assert (time.process_time() - started) / len(messages) < 100e-6


def test_delayed_exchange_checks_its_inner_types_bindings(vhost):
    vhost.declare_exchange("dx", "x-delayed-message", arguments={"x-delayed-type": "x-consistent-hash"})
    with pytest.raises(PreconditionFailed):
        vhost.bind("dx", vhost.queues["q1"], "one")
    vhost.bind("dx", vhost.queues["q1"], "1")
    assert vhost.exchanges["dx"].route(msg("k"))[0].name == "q1"


# -- x-random, x-local-random, x-modulus-hash -----------------------------------------------
def test_random_picks_one_binding_uniformly(vhost, monkeypatch):
    x = vhost.declare_exchange("rx", "x-random")
    monkeypatch.setattr(RandomExchange, "rng", random.Random(3))
    assert x.route(msg()) == ()
    vhost.bind("rx", vhost.queues["q1"], "ignored")
    assert [q.name for q in x.route(msg("any"))] == ["q1"]
    vhost.bind("rx", vhost.queues["q2"], "")
    vhost.bind("rx", vhost.queues["q2"], "again")  # a second binding: twice the share
    counts = collections.Counter(x.route(msg())[0].name for _ in range(30000))
    assert abs(counts["q1"] / 10000 - 1) < 0.05 and abs(counts["q2"] / 20000 - 1) < 0.05


def test_local_random_binding_rules(vhost):
    x = vhost.declare_exchange("lx", "x-local-random")
    vhost.declare_queue("qq", None, durable=True, arguments={"x-queue-type": "quorum"})
    with pytest.raises(PreconditionFailed, match=r"^Non empty binding 'k' key not permitted$"):
        vhost.bind("lx", vhost.queues["q1"], "k")
    with pytest.raises(PreconditionFailed,
                       match=r"^Queue type rabbit_quorum_queue not valid for this exchange type$"):
        vhost.bind("lx", vhost.queues["qq"], "")
    with pytest.raises(PreconditionFailed, match=r"^Destination not found$"):
        vhost.bind("lx", vhost.exchanges["amq.fanout"], "")
    vhost.bind("lx", vhost.queues["q1"], "")
    vhost.bind("lx", vhost.queues["q2"], "")
    assert {x.route(msg(f"k{i}"))[0].name for i in range(200)} == {"q1", "q2"}
    assert isinstance(x, LocalRandomExchange)


def test_modulus_hash_is_stable_and_counts_bindings(vhost):
    x = vhost.declare_exchange("mx", "x-modulus-hash")
    # bound in another order than their names: routing uses name order
    vhost.bind("mx", vhost.queues["q3"], "a")
    vhost.bind("mx", vhost.queues["q1"], "")
    vhost.bind("mx", vhost.queues["q2"], "b")
    vhost.bind("mx", vhost.queues["q3"], "b")
    targets = [q.name for q in x._targets]
    assert targets == ["q1", "q2", "q3", "q3"]
    m = msg("order-42")
    assert x.route(m)[0].name == targets[phash2([b"order-42"]) % 4]
    with_cc = Message.build("x", "order-42", b"", Properties())
    with_cc.cc = ("cc-1",)
    assert x.route(with_cc)[0].name == targets[phash2([b"order-42", b"cc-1"]) % 4]
    counts = collections.Counter(x.route(msg(str(i)))[0].name for i in range(20000))
    assert counts["q1"] < counts["q3"] and counts["q2"] < counts["q3"]
    assert isinstance(x, ModulusHashExchange)


def test_every_plugin_type_is_registered():
    for name in ("x-consistent-hash", "x-random", "x-local-random", "x-modulus-hash"):
        assert exchange_class(name).type == name
        assert exchange_class(name).description
    assert exchange_class("x-consistent-hash") is ConsistentHashExchange


# -- the compiled twin ----------------------------------------------------------------------
@pytest.mark.skipif(erlang_hash._c is None, reason="leveret.core._cerlang_hash is not built "
                    "(or LEVERET_PURE_PYTHON=1): only the pure twin runs")
@settings(max_examples=500, deadline=None)
@given(data=st.binary(max_size=300), key=st.integers(-2**70, 2**70),
       buckets=st.one_of(st.integers(-3, 70000), st.integers(-2**70, 2**70)),
       keys=st.lists(st.one_of(st.binary(max_size=40), st.integers(0, 300)), max_size=4))
def test_compiled_twin_gives_the_pure_results(data, key, buckets, keys):
    assert erlang_hash.phash2(data) == erlang_hash.py_phash2(data)
    assert erlang_hash.make_hash2(data) == erlang_hash.py_make_hash2(data)
    assert erlang_hash.phash2(data, 7) == erlang_hash.py_phash2(data, 7)
    assert erlang_hash.make_hash2(keys) == erlang_hash.py_make_hash2(keys)
    header = (Atom("longstr"), data)
    assert erlang_hash.make_hash2(header) == erlang_hash.py_make_hash2(header)
    compiled, pure = erlang_hash.jump_consistent_hash, erlang_hash.py_jump_consistent_hash
    assert compiled(key, buckets) == pure(key, buckets)
