"""Topic routing: RabbitMQ's `*` and `#` matching over a trie of binding keys.

Routing and binding keys are split on ``.`` into words; ``*`` matches exactly one word,
``#`` zero or more. The empty key has no words, so ``#`` matches it and ``*`` does not,
as in RabbitMQ's rabbit_exchange_type_topic. Matches are cached per routing key until the
bindings change.
"""

from __future__ import annotations

from collections.abc import Hashable


def split_key(key: str) -> list[str]:
    return key.split(".") if key else []


class _Node:
    __slots__ = ("children", "destinations")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.destinations: dict[Hashable, None] = {}


class TopicTrie:
    """Binding keys with their destinations; :meth:`match` returns destinations in
    binding order without duplicates."""

    _CACHE_LIMIT = 4096

    def __init__(self) -> None:
        self._root = _Node()
        self._cache: dict[str, tuple] = {}

    def add(self, binding_key: str, destination: Hashable) -> None:
        node = self._root
        for word in split_key(binding_key):
            node = node.children.setdefault(word, _Node())
        node.destinations[destination] = None
        self._cache.clear()

    def remove(self, binding_key: str, destination: Hashable) -> None:
        path = [self._root]
        words = split_key(binding_key)
        for word in words:
            child = path[-1].children.get(word)
            if child is None:
                return
            path.append(child)
        path[-1].destinations.pop(destination, None)
        # Prune empty nodes bottom-up so the trie does not grow without bound.
        for depth in range(len(words), 0, -1):
            node = path[depth]
            if node.children or node.destinations:
                break
            del path[depth - 1].children[words[depth - 1]]
        self._cache.clear()

    def match(self, routing_key: str) -> tuple:
        found = self._cache.get(routing_key)
        if found is None:
            result: dict[Hashable, None] = {}
            self._walk(self._root, split_key(routing_key), 0, result)
            found = tuple(result)
            if len(self._cache) >= self._CACHE_LIMIT:
                self._cache.clear()
            self._cache[routing_key] = found
        return found

    def _walk(self, node: _Node, words: list[str], i: int, out: dict) -> None:
        children = node.children
        hash_node = children.get("#")
        if hash_node is not None:
            # '#' swallows zero or more words: try every remaining suffix.
            for j in range(i, len(words) + 1):
                self._walk(hash_node, words, j, out)
        if i == len(words):
            out.update(node.destinations)
            return
        child = children.get(words[i])
        if child is not None:
            self._walk(child, words, i + 1, out)
        star = children.get("*")
        if star is not None:
            self._walk(star, words, i + 1, out)
