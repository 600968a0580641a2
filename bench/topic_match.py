"""Micro-benchmark of topic matching (TopicTrie.match), the publish hot path of topic
exchanges. Every match uses a fresh routing key so the per-key cache never answers.

    PYTHONPATH=src python bench/topic_match.py

Prints microseconds per match for common binding sets and the pathological ``#.#.…``
keys against 20-word routing keys; then kombu's native delayed delivery (celery >= 5.5,
issue 30): the bindings of one ``celery_delayed_N`` exchange and of the delivery exchange
against its 30-word keys (28 bits, then the task's routing key), and the same with 2x and
4x the bits, to show the cost grows with the key's length, not faster.
"""

from __future__ import annotations

import sys
import time
import timeit

from leveret.core.topic import TopicTrie


def per_match_us(bindings: list[str], keys: list[str], repeat: int = 9) -> float:
    """Best of ``repeat`` runs, in microseconds of this process's CPU time (not wall
    time: the machine may be busy) per uncached match of each key."""
    trie = TopicTrie()
    for n, binding in enumerate(bindings):
        trie.add(binding, f"q{n}")

    def run() -> None:
        for key in keys:
            trie._cache.clear()  # measure the walk, not the cache
            trie.match(key)

    best = min(timeit.repeat(run, number=1, repeat=repeat, timer=time.process_time))
    return best / len(keys) * 1e6


def main() -> None:
    words = ["stock", "usd", "nyse", "ibm", "quote", "trade", "eu", "de"]
    keys4 = [".".join(words[(i + j) % 8] for j in range(4)) + f".{i}" for i in range(2000)]
    keys20 = [".".join(f"w{(i + j) % 7}" for j in range(19)) + f".{i}" for i in range(200)]
    cases = [
        (
            "100 literal keys, no # (5 words)",
            [".".join(words[(i + j) % 8] for j in range(4)) + f".{i}" for i in range(100)],
            keys4,
        ),
        ("*.usd.*.*.* and a.b.c (no #)", ["*.usd.*.*.*", "a.b.c", "stock.*.nyse.*.*"], keys4),
        ("one #: stock.#", ["stock.#"], keys4),
        ("one #: #.quote.*", ["#.quote.*"], keys4),
        ("mix: stock.#, *.usd.#, #.ibm.#, a.b", ["stock.#", "*.usd.#", "#.ibm.#", "a.b"], keys4),
        ("# alone", ["#"], keys4),
        ("#.#.#.#.#.# vs 20 words", ["#.#.#.#.#.#"], keys20[:20]),
        ("#.#.#.#.#.#.#.# vs 20 words", ["#.#.#.#.#.#.#.#"], keys20[: 3 if "--quick" in sys.argv else 200]),
    ]
    for name, bindings, keys in cases:
        print(f"{name:40s} {per_match_us(bindings, keys, repeat=1 if '#.#.#' in name else 9):12.2f} µs/match")
    for bits in (28, 56, 112):
        for name, bindings, keys in delayed_delivery_cases(bits):
            print(f"{name:40s} {per_match_us(bindings, keys):12.2f} µs/match")


def delayed_delivery_cases(bits: int) -> list[tuple[str, list[str], list[str]]]:
    """kombu's delayed topology with ``bits`` levels (kombu uses 28): level 13's exchange
    (``*.``×(bits-1-13) then ``1.#`` to its queue, ``0.#`` to the next level) and the
    delivery exchange (``#.task.run``), matched against keys of ``bits`` + 2 words."""
    keys = [".".join(f"{(i * 2654435761) % (1 << bits):0{bits}b}") + ".task.run" for i in range(500)]
    stars = "*." * (bits - 1 - 13)
    return [
        (f"celery_delayed_13, {bits + 2}-word keys", [f"{stars}1.#", f"{stars}0.#"], keys),
        (f"celery_delayed_delivery, {bits + 2}-word keys", ["#.task.run"], keys),
    ]


if __name__ == "__main__":
    main()
