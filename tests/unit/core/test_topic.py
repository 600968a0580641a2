"""Topic matching (leveret.core.topic), driven directly: no broker, no sockets.

The trie is checked against a reference matcher that translates a binding key into a
regular expression over the routing key's words, for random keys with several ``#``,
and under binding churn; the pathological ``#.#.#…`` keys must stay cheap.
"""

from __future__ import annotations

import re
import sys
import time

from hypothesis import given, settings, strategies as st

from leveret.core.topic import TopicTrie, split_key


# -- the reference: one regex per binding key ----------------------------------------------
def reference_match(binding_key: str, routing_key: str) -> bool:
    """RabbitMQ's semantics, spelled out: each word becomes ``<word>``; ``*`` is one
    word, ``#`` zero or more; the empty key has no words."""
    pattern = "".join(
        "<[^<>]*>" if word == "*" else "(?:<[^<>]*>)*" if word == "#"
        else re.escape(f"<{word}>") for word in split_key(binding_key))
    subject = "".join(f"<{word}>" for word in split_key(routing_key))
    return re.fullmatch(pattern, subject) is not None


# Few distinct words so that random keys and bindings meet often; "" gives empty words
# (``a..b``, leading and trailing dots), and routing keys may hold ``*``/``#`` literally.
WORDS = st.sampled_from(["a", "b", "c", ""])
binding_keys = st.lists(st.one_of(WORDS, st.sampled_from(["*", "#", "#", "*"])),
                        max_size=7).map(".".join)
routing_keys = st.lists(st.one_of(WORDS, st.sampled_from(["*", "#"])), max_size=9).map(".".join)


def expected(bindings: dict[str, set], routing_key: str) -> set:
    return {dest for key, dests in bindings.items() if reference_match(key, routing_key)
            for dest in dests}


# -- the reference itself, on RabbitMQ's documented examples ------------------------------
def test_reference_and_trie_agree_on_known_cases():
    cases = [
        ("#", "", True), ("#", "a", True), ("#", "a.b.c", True), ("#", ".", True),
        ("*", "", False), ("*", "a", True), ("*", ".", False), ("*", "a.b", False),
        ("", "", True), ("", "a", False), ("a.#", "a", True), ("a.#", "a.b.c", True),
        ("#.a", "a", True), ("#.a", "b.a", True), ("#.a", "a.b", False),
        ("a.*.b", "a..b", True), ("a..b", "a..b", True), ("a..b", "a.b", False),
        ("*.", "a.", True), (".*", ".a", True), ("*.*", ".", True), ("#.#", "", True),
        ("a.#.b", "a.b", True), ("a.#.b", "a.x.y.b", True), ("a.#.#.b", "a.b", True),
        ("#.*", "", False), ("#.*", "a", True), ("*.#.*", "a", False), ("*.#.*", "a.b", True),
        ("stock.usd.*", "stock.usd.nyse", True), ("stock.usd.*", "stock.eur.nyse", False),
        ("*.orange.*", "quick.orange.rabbit", True), ("*.*.rabbit", "lazy.orange.elephant", False),
        ("lazy.#", "lazy.orange.male.rabbit", True), ("lazy.#", "lazy", True),
    ]
    for binding_key, routing_key, matches in cases:
        assert reference_match(binding_key, routing_key) is matches, (binding_key, routing_key)
        trie = TopicTrie()
        trie.add(binding_key, "q")
        assert trie.match(routing_key) == (("q",) if matches else ()), (binding_key, routing_key)


@settings(max_examples=400, deadline=None)
@given(st.lists(binding_keys, max_size=8), st.lists(routing_keys, min_size=1, max_size=8))
def test_trie_matches_reference(keys, routing):
    trie = TopicTrie()
    bindings: dict[str, set] = {}
    for n, key in enumerate(keys):
        trie.add(key, n)
        bindings.setdefault(key, set()).add(n)
    for routing_key in routing:
        found = trie.match(routing_key)
        assert len(found) == len(set(found)), "duplicates"
        assert set(found) == expected(bindings, routing_key), routing_key
        assert trie.match(routing_key) == found  # the cached answer is the same


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), binding_keys, st.integers(0, 3)), max_size=25),
       st.lists(routing_keys, min_size=1, max_size=5))
def test_trie_follows_binding_churn(operations, routing):
    """Adds and removes (including removing what was never added) keep the trie equal
    to the reference, and removing everything leaves an empty trie."""
    trie = TopicTrie()
    bindings: dict[str, set] = {}
    for add, key, dest in operations:
        if add:
            trie.add(key, dest)
            bindings.setdefault(key, set()).add(dest)
        else:
            trie.remove(key, dest)
            bindings.get(key, set()).discard(dest)
        for routing_key in routing:
            assert set(trie.match(routing_key)) == expected(bindings, routing_key)
    for key, dests in bindings.items():
        for dest in dests:
            trie.remove(key, dest)
    assert trie._root.is_empty()  # pruned: no node outlives its last binding
    assert all(trie.match(routing_key) == () for routing_key in routing)


def test_destinations_come_once_in_a_stable_order():
    trie = TopicTrie()
    for dest, key in enumerate(["#", "a.#", "#.b", "a.*", "*.b", "a.b", "#.#", "#"]):
        trie.add(key, dest)
    # Depth first, '#' before literal words before '*' at every node: the order the
    # walk had before it was bounded (checked against it on 100,000 random matches).
    assert trie.match("a.b") == (6, 2, 0, 7, 1, 5, 3, 4)


# -- guard rail: cost bounded by trie nodes x words ----------------------------------------
def test_many_hashes_against_long_keys_are_fast():
    """Before, one '#.#.#.#.#.#.#.#' match of a 20-word key took ~0.8 s (exponential in
    the number of '#'); 1,000 of them must now take well under 2 s in all (CPU seconds:
    other processes on a busy machine do not count)."""
    trie = TopicTrie()
    trie.add("#.#.#.#.#.#.#.#", "all")
    trie.add("#.#.#.#.#.#.x", "ends-in-x")
    trie.add("*.#.*.#.*.#.*.#", "stars")
    keys = [".".join(f"w{(i + j) % 7}" for j in range(19)) + f".{i}" for i in range(1000)]
    start = time.process_time()
    for key in keys:  # distinct keys: the cache never answers
        assert trie.match(key) == ("all", "stars")
    elapsed = time.process_time() - start
    assert elapsed < 2.0, f"1,000 pathological matches took {elapsed:.2f} s"
    assert trie.match("a." * 19 + "x") == ("all", "ends-in-x", "stars")


def test_wildcard_words_in_the_routing_key_are_fast():
    """A routing key of 40 '*' words against 40 '*' in the binding once cost 2^40 steps:
    the literal '*' edge and the wildcard each walked the same node."""
    trie = TopicTrie()
    trie.add(".".join(["*"] * 40), "q")
    trie.add(".".join(["#"] * 40), "h")
    start = time.process_time()
    assert trie.match(".".join(["*"] * 40)) == ("h", "q")
    assert trie.match(".".join(["#"] * 40)) == ("h", "q")
    assert time.process_time() - start < 1.0


def current_depth() -> int:
    frame, depth = sys._getframe(), 0
    while frame is not None:
        frame, depth = frame.f_back, depth + 1
    return depth


def test_kombu_delayed_delivery_keys_walk_without_nesting():
    """kombu's native delayed delivery (celery >= 5.5): a level's exchange binds its queue
    with ``*.``×k ``1.#`` and the next level with ``*.``×k ``0.#``, and routes keys of
    the delay's 28 bits and the task's key. The words of a key are walked in a loop, not
    one nested call each: with 30 frames to spare, a 124-word key (near the longest a 255-byte
    AMQP routing key holds) still matches; a walk that recursed per word would raise
    RecursionError."""
    trie = TopicTrie()
    stars = "*." * (LONG - 1 - 13)
    trie.add(f"{stars}1.#", "queue")
    trie.add(f"{stars}0.#", "next level")
    trie.add("#.task.run", "delivery")
    one = ["0"] * LONG
    one[LONG - 14] = "1"  # the bit of level 13 (the 14th word from the end)
    key_one = ".".join(one)
    key_zero = ".".join(["1"] * (LONG - 14) + ["0"] * 14)
    keys = [key_one, key_zero, key_one + ".task.run"]
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(current_depth() + 30)
    try:
        found = [trie.match(key) for key in keys]
    finally:
        sys.setrecursionlimit(limit)
    assert found == [("queue",), ("next level",), ("delivery", "queue")]  # the root's # first
    assert len(keys[-1]) <= 255


LONG = 122  # bits in the test's keys: with ".task.run", 124 words in 252 bytes
