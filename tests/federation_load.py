"""Load for federation fault tests: a publisher thread that keeps publishing confirmed
messages through faults (reconnecting when its broker is gone) and knows which were
confirmed; a collector that consumes a queue until every wanted body has arrived; a
watcher of a link's status rows."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pika
import pika.exceptions

#: exceptions pika raises when its broker goes away or refuses it
LOST = (pika.exceptions.AMQPError, OSError)


class Publisher:
    """Publishes ``prefix0``, ``prefix1``, ... (persistent, publisher confirms) to
    ``exchange`` with ``routing_key`` on ``url`` from a thread, until :meth:`stop` or
    ``limit`` messages; ``pace`` seconds between publishes. A body counts as confirmed
    once pika's ``basic_publish`` returned (the broker's basic.ack); after a lost
    connection the same body is published again on a new one (its fate unknown: it is
    not counted unless a later publish of it is confirmed)."""

    def __init__(self, url: str, exchange: str, routing_key: str, prefix: str = "m",
                 limit: int = 100_000, pace: float = 0.0) -> None:
        self.url, self.exchange, self.routing_key, self.prefix = url, exchange, routing_key, prefix
        self.limit, self.pace = limit, pace
        self.confirmed: list[str] = []
        self.failures = 0  # publishes or connection attempts that failed
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"publisher:{prefix}", daemon=True)

    def __enter__(self) -> Publisher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wait_for(self, count: int, timeout: float = 10.0) -> None:
        """Until ``count`` messages were confirmed (AssertionError after ``timeout`` s)."""
        deadline = time.monotonic() + timeout
        while len(self.confirmed) < count:
            assert time.monotonic() < deadline, f"only {len(self.confirmed)} confirmed"
            time.sleep(0.01)

    def stop(self) -> set[str]:
        """Stop publishing; the set of confirmed bodies."""
        self._stopping.set()
        self._thread.join(30)
        return set(self.confirmed)

    def _run(self) -> None:
        connection = channel = None
        number = 0
        while number < self.limit and not self._stopping.is_set():
            try:
                if channel is None:
                    connection = pika.BlockingConnection(pika.URLParameters(self.url))
                    channel = connection.channel()
                    channel.confirm_delivery()
                body = f"{self.prefix}{number}"
                channel.basic_publish(self.exchange, self.routing_key, body.encode(),
                                      pika.BasicProperties(delivery_mode=2))
                self.confirmed.append(body)
                number += 1
                if self.pace:
                    time.sleep(self.pace)
            except LOST:
                self.failures += 1
                connection = channel = None
                time.sleep(0.05)
        if connection is not None and connection.is_open:
            try:
                connection.close()
            except LOST:
                pass


def collect(url: str, queue: str, wanted: set[str], timeout: float) -> list[str]:
    """Consume ``queue`` (auto-ack) until every body of ``wanted`` has arrived or
    ``timeout`` seconds passed, then 0.3 s more for stragglers (duplicates); every body
    received, in order. Reconnects if the broker is not there yet."""
    deadline = time.monotonic() + timeout
    received: list[str] = []
    missing = set(wanted)
    while True:
        try:
            connection = pika.BlockingConnection(pika.URLParameters(url))
            break
        except LOST:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    channel = connection.channel()
    channel.basic_qos(prefetch_count=1000)

    def on_message(_channel, _method, _properties, body: bytes) -> None:
        received.append(body.decode())
        missing.discard(received[-1])

    channel.basic_consume(queue, on_message, auto_ack=True)
    while missing and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.05)
    connection.process_data_events(time_limit=0.3)
    connection.close()
    return received


def report(received: list[str], confirmed: set[str]) -> tuple[int, int]:
    """(confirmed messages missing, duplicates received): what the tests assert and print."""
    return len(confirmed - set(received)), len(received) - len(set(received))


def ranges(bodies: set[str]) -> str:
    """``m3-m7, m12``: bodies ``PREFIX<number>`` as runs of consecutive numbers."""
    numbered = []
    for body in bodies:
        prefix = body.rstrip("0123456789")
        numbered.append((prefix, int(body[len(prefix) :])))
    numbered.sort()
    runs: list[list] = []
    for prefix, number in numbered:
        if runs and runs[-1][0] == prefix and runs[-1][2] == number - 1:
            runs[-1][2] = number
        else:
            runs.append([prefix, number, number])
    return ", ".join(f"{p}{a}" if a == b else f"{p}{a}-{p}{b}" for p, a, b in runs)


class Watcher:
    """Polls ``read()`` (a link's ``(status, error)``) every ``interval`` seconds from a
    thread and keeps each change with its ``time.monotonic()``: the states a link went
    through, even ones shorter than a test's own polling."""

    def __init__(self, read: Callable[[], tuple[str | None, str | None]], interval: float = 0.02) -> None:
        self.read, self.interval = read, interval
        self.changes: list[tuple[float, str | None, str | None]] = []
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Watcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopping.set()
        self._thread.join(5)

    def states(self) -> list[str | None]:
        return [status for _, status, _ in self.changes]

    def errors(self) -> list[str]:
        return [error for _, _, error in self.changes if error]

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                seen = self.read()
            except OSError:
                seen = (None, None)
            if not self.changes or self.changes[-1][1:] != seen:
                self.changes.append((time.monotonic(), *seen))
            time.sleep(self.interval)


class Consumer:
    """Consumes ``queue`` on ``url`` (manual acks, ``prefetch`` unacked at most) from a
    thread, reconnecting when its broker goes away; ``received`` is every body acked.
    :meth:`wait_for` waits until a set of bodies has all arrived."""

    def __init__(self, url: str, queue: str, prefetch: int = 100) -> None:
        self.url, self.queue, self.prefetch = url, queue, prefetch
        self.received: list[str] = []
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"consumer:{queue}", daemon=True)

    def __enter__(self) -> Consumer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopping.set()
        self._thread.join(10)

    def wait_for(self, wanted: set[str], timeout: float) -> list[str]:
        """Until every body of ``wanted`` has arrived or ``timeout`` seconds passed (then
        0.3 s more for duplicates); the bodies received so far."""
        deadline = time.monotonic() + timeout
        while not wanted <= set(self.received) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        return list(self.received)

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                connection = pika.BlockingConnection(pika.URLParameters(self.url))
                channel = connection.channel()
                channel.basic_qos(prefetch_count=self.prefetch)

                def on_message(channel, method, _properties, body: bytes) -> None:
                    self.received.append(body.decode())
                    channel.basic_ack(method.delivery_tag)

                channel.basic_consume(self.queue, on_message)
                while not self._stopping.is_set():
                    connection.process_data_events(time_limit=0.05)
                connection.close()
            except LOST:
                time.sleep(0.1)
