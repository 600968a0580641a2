"""Topic routing: RabbitMQ's `*` and `#` matching over a trie of binding keys.

Routing and binding keys are split on ``.`` into words; ``*`` matches exactly one word,
``#`` zero or more. The empty key has no words, so ``#`` matches it and ``*`` does not,
as in RabbitMQ's rabbit_exchange_type_topic. Matches are cached per routing key until the
bindings change. A match walks each (trie node, word index) pair at most once, so its
cost is bounded by nodes x words even for keys like ``#.#.#.#`` (``bench/topic_match.py``).
"""

from __future__ import annotations

from collections.abc import Hashable


def split_key(key: str) -> list[str]:
    """The words of a routing or binding key (none for the empty key)."""
    return key.split(".") if key else []


class _Node:
    """One trie node. The wildcards' children are kept apart from the literal words'
    so a routing-key word ``*`` or ``#`` never reaches them by a literal lookup: the
    wildcard branches already walk them, and walking them twice would double the work
    for every such word."""

    __slots__ = ("children", "destinations", "hash", "star")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}  # literal words only
        self.star: _Node | None = None
        self.hash: _Node | None = None
        self.destinations: dict[Hashable, None] = {}

    def child(self, word: str) -> _Node | None:
        if word == "*":
            return self.star
        if word == "#":
            return self.hash
        return self.children.get(word)

    def add_child(self, word: str) -> _Node:
        node = self.child(word)
        if node is None:
            node = _Node()
            if word == "*":
                self.star = node
            elif word == "#":
                self.hash = node
            else:
                self.children[word] = node
        return node

    def drop_child(self, word: str) -> None:
        if word == "*":
            self.star = None
        elif word == "#":
            self.hash = None
        else:
            del self.children[word]

    def is_empty(self) -> bool:
        return not (self.children or self.star or self.hash or self.destinations)


class TopicTrie:
    """Binding keys with their destinations; :meth:`match` returns destinations
    without duplicates, in the order of a depth-first walk of the trie (at each node
    the ``#`` branch, then the literal word, then ``*``)."""

    _CACHE_LIMIT = 4096

    def __init__(self) -> None:
        self._root = _Node()
        self._cache: dict[str, tuple] = {}
        # Per match: the lowest word index each '#' node was walked from (see _walk).
        self._hash_low: dict[_Node, int] = {}

    def add(self, binding_key: str, destination: Hashable) -> None:
        """Bind ``destination`` with ``binding_key`` (adding it twice is one binding)."""
        node = self._root
        for word in split_key(binding_key):
            node = node.add_child(word)
        node.destinations[destination] = None
        self._cache.clear()

    def remove(self, binding_key: str, destination: Hashable) -> None:
        """Unbind ``destination`` from ``binding_key``; nothing happens if it was not
        bound."""
        path = [self._root]
        words = split_key(binding_key)
        for word in words:
            child = path[-1].child(word)
            if child is None:
                return
            path.append(child)
        path[-1].destinations.pop(destination, None)
        # Prune empty nodes bottom-up so the trie does not grow without bound.
        for depth in range(len(words), 0, -1):
            if not path[depth].is_empty():
                break
            path[depth - 1].drop_child(words[depth - 1])
        self._cache.clear()

    def match(self, routing_key: str) -> tuple:
        """Destinations whose binding key matches ``routing_key``, in a stable order
        without duplicates. Costs at most one step per (trie node, word index) pair,
        however many ``#`` the binding keys hold."""
        found = self._cache.get(routing_key)
        if found is None:
            result: dict[Hashable, None] = {}
            try:
                self._walk(self._root, split_key(routing_key), 0, result)
            finally:  # stale marks would hide states from the next match
                if self._hash_low:
                    self._hash_low.clear()
            found = tuple(result)
            if len(self._cache) >= self._CACHE_LIMIT:
                self._cache.clear()
            self._cache[routing_key] = found
        return found

    def _walk(self, node: _Node, words: list[str], i: int, out: dict) -> None:
        # Each (node, i) state is walked at most once, so a match is bounded by trie
        # nodes x words: a naive walk retries every split of the words between the
        # '#'s of '#.#.#...' (exponential in their number; 0.8 s per match for 8 '#'s
        # and 20 words). Revisiting a state would only add destinations already in
        # ``out``, so skipping it changes neither the result nor its order.
        #
        # The last branch of a state ('*', else the literal word) is followed by the
        # loop, not by a call: a chain of single words (kombu's native delayed delivery
        # routes 30-word keys through ``*.*.….*.1.#`` bindings) then costs loop steps,
        # not nested Python calls, whose cost per call grows with the depth
        # (bench/topic_match.py: 3x the CPU for 2x the words at 60-120 words before).
        n = len(words)
        while True:
            hash_node = node.hash
            if hash_node is not None:
                # '#' swallows zero or more words: walk its node at every remaining index.
                # A '#' node is entered only here, always for a whole range i..n, so the
                # lowest start so far tells which indexes are already done.
                hash_low = self._hash_low
                end = hash_low.get(hash_node, n + 1)
                if i < end:
                    hash_low[hash_node] = i
                    for j in range(i, end):
                        self._walk(hash_node, words, j, out)
            if i == n:
                out.update(node.destinations)
                return
            child = node.children.get(words[i])
            star = node.star
            if star is None:
                if child is None:
                    return
                node = child
            else:
                if child is not None:
                    self._walk(child, words, i + 1, out)
                node = star
            i += 1
