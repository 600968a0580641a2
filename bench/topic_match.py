"""Micro-benchmark of topic matching (TopicTrie.match), the publish hot path of topic
exchanges. Every match uses a fresh routing key so the per-key cache never answers.

    PYTHONPATH=src python bench/topic_match.py

Prints microseconds per match for common binding sets and the pathological ``#.#.…``
keys against 20-word routing keys.
"""

from __future__ import annotations

import sys
import timeit

from leveret.core.topic import TopicTrie


def per_match_us(bindings: list[str], keys: list[str], repeat: int = 5) -> float:
    """Best of ``repeat`` runs, in microseconds per uncached match of each key."""
    trie = TopicTrie()
    for n, binding in enumerate(bindings):
        trie.add(binding, f"q{n}")

    def run() -> None:
        for key in keys:
            trie._cache.clear()  # measure the walk, not the cache
            trie.match(key)

    best = min(timeit.repeat(run, number=1, repeat=repeat))
    return best / len(keys) * 1e6


def main() -> None:
    words = ["stock", "usd", "nyse", "ibm", "quote", "trade", "eu", "de"]
    keys4 = [".".join(words[(i + j) % 8] for j in range(4)) + f".{i}" for i in range(2000)]
    keys20 = [".".join(f"w{(i + j) % 7}" for j in range(19)) + f".{i}" for i in range(200)]
    cases = [
        ("100 literal keys, no # (5 words)", [".".join(words[(i + j) % 8] for j in range(4)) + f".{i}"
                                              for i in range(100)], keys4),
        ("*.usd.*.*.* and a.b.c (no #)", ["*.usd.*.*.*", "a.b.c", "stock.*.nyse.*.*"], keys4),
        ("one #: stock.#", ["stock.#"], keys4),
        ("one #: #.quote.*", ["#.quote.*"], keys4),
        ("mix: stock.#, *.usd.#, #.ibm.#, a.b", ["stock.#", "*.usd.#", "#.ibm.#", "a.b"], keys4),
        ("# alone", ["#"], keys4),
        ("#.#.#.#.#.# vs 20 words", ["#.#.#.#.#.#"], keys20[:20]),
        ("#.#.#.#.#.#.#.# vs 20 words", ["#.#.#.#.#.#.#.#"], keys20[:3 if "--quick" in sys.argv else 200]),
    ]
    for name, bindings, keys in cases:
        print(f"{name:40s} {per_match_us(bindings, keys, repeat=1 if '#.#.#' in name else 5):12.2f} µs/match")


if __name__ == "__main__":
    main()
