"""Waiting for something another thread or process does: one polling helper for the
whole suite.

Unit tests do not need it for time (they step the fake loop of tests/sans_io.py); it is
for what runs beside the test: a real broker, a store's writer thread, a client's I/O.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def eventually(
    predicate: Callable[[], T],
    timeout: float = 5.0,
    interval: float = 0.02,
    wait: Callable[[float], object] = time.sleep,
) -> T:
    """Call ``predicate()`` until it returns something truthy, and return that; after
    ``timeout`` seconds return its last (falsy) answer, so the caller's ``assert``
    shows what was seen. Between calls ``wait(interval)`` (seconds): ``time.sleep``,
    or a client's own loop so its callbacks run meanwhile (pika's
    ``lambda s: connection.process_data_events(time_limit=s)``)."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result or time.monotonic() > deadline:
            return result
        wait(interval)


def pumping(connection) -> Callable[[float], object]:
    """``wait`` for :func:`eventually` that runs a pika BlockingConnection's I/O and
    callbacks for the interval instead of sleeping."""
    return lambda seconds: connection.process_data_events(time_limit=seconds)


def poll(
    read: Callable[[], T],
    until: Callable[[T], object],
    timeout: float = 5.0,
    interval: float = 0.02,
    wait: Callable[[float], object] = time.sleep,
) -> T:
    """:func:`eventually` for a value: call ``read()`` until ``until(value)`` is true;
    returns the last value read (the one that passed, or what there was at the timeout,
    for the caller's ``assert`` to show)."""
    seen: list[T] = []

    def reached() -> bool:
        seen.append(read())
        return bool(until(seen[-1]))

    eventually(reached, timeout, interval, wait)
    return seen[-1]


def eventually_equal(
    read: Callable[[], T],
    expected: T,
    timeout: float = 5.0,
    interval: float = 0.02,
    wait: Callable[[float], object] = time.sleep,
) -> T:
    """:func:`poll` until ``read()`` returns ``expected``; returns the last value read."""
    return poll(read, lambda value: value == expected, timeout, interval, wait)
