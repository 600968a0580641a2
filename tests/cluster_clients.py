"""Clients for the cluster tests, written as a real application writes them: a pika
publisher with confirms and a pika consumer acking, each in a thread, each reconnecting
when its connection drops and subscribing again when the broker cancels its consumer
(RabbitMQ's consumer cancel notification, sent when a queue's owner node is lost).

Both record what happened with ``time.monotonic()`` stamps, so a test can say when the
last delivery before a failure and the first after it came: the publisher keeps the
bodies the broker confirmed (``confirmed``), the consumer every delivery
(:class:`Delivery`: time, body, redelivered flag, the subscription it came on).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import pika
import pika.exceptions

CLIENT_ERRORS = (pika.exceptions.AMQPError, OSError)
PERSISTENT = pika.BasicProperties(delivery_mode=2)

Connect = Callable[[], pika.BlockingConnection]


def connector(*ports: int, timeout: float = 5.0) -> Connect:
    """A function opening a BlockingConnection to the first of ``ports`` that accepts
    (pika's list of parameters; one attempt each, ``timeout`` s socket timeout)."""
    parameters = [
        pika.ConnectionParameters(
            "127.0.0.1", port, connection_attempts=1, socket_timeout=timeout, blocked_connection_timeout=30
        )
        for port in ports
    ]
    return lambda: pika.BlockingConnection(parameters)


def connect_retrying(connect: Connect, timeout: float = 20.0) -> pika.BlockingConnection:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return connect()
        except CLIENT_ERRORS:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


class Publisher(threading.Thread):
    """Publishes ``prefix0``, ``prefix1``… persistent, mandatory, one at a time with
    confirms, to the default exchange with routing key ``queue``, until :meth:`stop` or
    ``limit`` confirmed. A nack or a return (no queue there for now) is retried with the
    same body; a lost connection is reopened and the unconfirmed body sent again.
    Each attempt has its own ``message_id`` (``body/attempt``), so a consumer can tell a
    redelivery from a second copy of a body sent again after a nack. ``pause`` seconds
    between two publishes keeps the load bounded."""

    def __init__(
        self,
        connect: Connect,
        queue: str,
        prefix: str,
        limit: int | None = None,
        pause: float = 0.0,
        declare: bool = True,
    ) -> None:
        super().__init__(daemon=True, name=f"publisher-{prefix}")
        self.connect, self.queue, self.prefix = connect, queue, prefix
        self.limit, self.pause, self.declare = limit, pause, declare
        self.confirmed: list[str] = []
        self.nacks = self.returns = self.reconnects = self.attempts = 0
        self.error: BaseException | None = None
        self._halt = threading.Event()

    def stop(self, timeout: float = 30.0) -> None:
        self._halt.set()
        self.join(timeout)
        assert not self.is_alive(), f"{self.name} still publishing ({len(self.confirmed)} confirmed)"
        assert self.error is None, repr(self.error)

    def _more(self, number: int) -> bool:
        return not self._halt.is_set() and (self.limit is None or number < self.limit)

    def run(self) -> None:
        number = 0
        try:
            while self._more(number):
                try:
                    connection = self.connect()
                except CLIENT_ERRORS:
                    self.reconnects += 1
                    time.sleep(0.1)
                    continue
                try:
                    channel = connection.channel()
                    channel.confirm_delivery()
                    if self.declare:
                        channel.queue_declare(self.queue, durable=True)
                    while self._more(number):
                        body = f"{self.prefix}{number}"
                        self.attempts += 1
                        message_id = f"{body}/{self.attempts}"
                        properties = pika.BasicProperties(delivery_mode=2, message_id=message_id)
                        try:
                            channel.basic_publish("", self.queue, body.encode(), properties, mandatory=True)
                        except pika.exceptions.NackError:
                            self.nacks += 1
                            time.sleep(0.05)
                            continue
                        except pika.exceptions.UnroutableError:
                            self.returns += 1
                            time.sleep(0.05)
                            continue
                        self.confirmed.append(body)
                        number += 1
                        if self.pause:
                            time.sleep(self.pause)
                    connection.close()
                except CLIENT_ERRORS:
                    self.reconnects += 1
                    try:
                        connection.close()
                    except CLIENT_ERRORS:
                        pass
                    time.sleep(0.1)
        except BaseException as exc:  # reported by stop()
            self.error = exc


@dataclass(frozen=True)
class Delivery:
    time: float  # time.monotonic() when the client got it
    body: str
    redelivered: bool
    subscription: int  # 1 for the first basic.consume, 2 after a cancel or reconnect…
    message_id: str | None = None


class Consumer(threading.Thread):
    """Consumes ``queue`` with manual acks and ``prefetch``; every delivery goes to
    ``deliveries`` (then acked). A broker cancel (the owner was lost) or a closed
    channel makes it subscribe again; a lost connection, reconnect. ``subscribed``
    holds the time each subscription's consume-ok came. ``work`` seconds spent on each
    message before its ack (a slow application: a backlog builds up in the queue)."""

    def __init__(
        self, connect: Connect, queue: str, prefetch: int = 50, label: str = "consumer", work: float = 0.0
    ) -> None:
        super().__init__(daemon=True, name=label)
        self.connect, self.queue, self.prefetch, self.label = connect, queue, prefetch, label
        self.work = work
        self.deliveries: list[Delivery] = []
        self.subscribed: list[float] = []
        self.cancels = self.reconnects = self.channel_errors = 0
        self.error: BaseException | None = None
        self._halt = threading.Event()
        self._cancelled = False

    def bodies(self) -> set[str]:
        return {delivery.body for delivery in self.deliveries}

    def stop(self, timeout: float = 30.0) -> None:
        self._halt.set()
        self.join(timeout)
        assert not self.is_alive(), f"{self.name} did not stop"
        assert self.error is None, repr(self.error)

    def run(self) -> None:
        try:
            while not self._halt.is_set():
                try:
                    connection = self.connect()
                except CLIENT_ERRORS:
                    self.reconnects += 1
                    time.sleep(0.1)
                    continue
                try:
                    self._serve(connection)
                except CLIENT_ERRORS:
                    self.reconnects += 1
                    time.sleep(0.1)
                finally:
                    try:
                        if connection.is_open:
                            connection.close()
                    except CLIENT_ERRORS:
                        pass
        except BaseException as exc:  # reported by stop()
            self.error = exc

    def _serve(self, connection: pika.BlockingConnection) -> None:
        while not self._halt.is_set():
            channel = connection.channel()
            channel.basic_qos(prefetch_count=self.prefetch)
            channel.add_on_cancel_callback(self._on_cancel)
            try:
                while not self._halt.is_set():
                    self._subscribe(connection, channel)
            except pika.exceptions.ChannelClosed:
                self.channel_errors += 1
                time.sleep(0.1)

    def _subscribe(self, connection: pika.BlockingConnection, channel) -> None:
        generation = len(self.subscribed) + 1
        self._cancelled = False

        def on_message(channel, method, properties, body: bytes) -> None:
            stamp = time.monotonic()
            self.deliveries.append(
                Delivery(stamp, body.decode(), method.redelivered, generation, properties.message_id)
            )
            if self.work:
                time.sleep(self.work)
            channel.basic_ack(method.delivery_tag)

        channel.basic_consume(self.queue, on_message, consumer_tag=f"{self.label}-{generation}")
        self.subscribed.append(time.monotonic())
        while not self._halt.is_set() and not self._cancelled:
            connection.process_data_events(time_limit=0.05)
        if self._cancelled:
            self.cancels += 1
            time.sleep(0.1)
        else:
            channel.basic_cancel(f"{self.label}-{generation}")

    def _on_cancel(self, frame) -> None:
        self._cancelled = True


def unflagged_redeliveries(deliveries: list[Delivery]) -> list[Delivery]:
    """The deliveries of a message (``message_id``) seen before, without the
    redelivered flag. Reported, not asserted: the new owner of a queue flags what the
    store knew was delivered, and a delivery made just before a kill -9 (or after the
    owner's database session was cut) may not have been recorded — RabbitMQ's classic
    queues have the same window (delivery marks written lazily)."""
    seen: set[str | None] = set()
    unflagged = []
    for delivery in sorted(deliveries, key=lambda d: d.time):
        if delivery.message_id in seen and not delivery.redelivered:
            unflagged.append(delivery)
        seen.add(delivery.message_id)
    return unflagged


def wait_consumed(
    confirmed: set[str],
    consumers: list[Consumer],
    timeout: float,
    what: str = "",
    explain: Callable[[set[str]], str] | None = None,
) -> None:
    """Wait until ``consumers`` together got every body of ``confirmed``; an
    AssertionError saying which are missing and what each consumer saw (and
    ``explain(missing)``), after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        received: set[str] = set().union(*(consumer.bodies() for consumer in consumers))
        missing = confirmed - received
        if not missing:
            return
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    ordered = sorted(missing, key=lambda body: (len(body), body))
    report = [
        f"{what}{len(missing)} of {len(confirmed)} confirmed messages not consumed within {timeout} s: "
        f"{ordered[:5]} … {ordered[-3:]}"
    ]
    for consumer in consumers:
        last = consumer.deliveries[-1] if consumer.deliveries else None
        report.append(
            f"{consumer.label}: {len(consumer.deliveries)} deliveries, "
            f"{len(consumer.subscribed)} subscriptions, {consumer.cancels} cancels, "
            f"{consumer.channel_errors} channel errors, {consumer.reconnects} reconnects, "
            f"alive {consumer.is_alive()}, last {last}"
        )
    if explain is not None:
        report.append(explain(missing))
    raise AssertionError("\n".join(report))


def wait_for(predicate: Callable[[], object], timeout: float, what: str, interval: float = 0.02) -> None:
    """Poll ``predicate`` until it is true; AssertionError naming ``what`` after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(interval)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]
