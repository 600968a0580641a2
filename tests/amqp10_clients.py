"""Small helpers around python-qpid-proton for the AMQP 1.0 behaviour tests: a blocking
connection that does not reconnect, a receiver whose credit the test grants by hand, and
a reactor run bounded in time."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from amqp10_brokers import Amqp10Broker
from proton import Delivery, Message, Timeout
from proton.handlers import MessagingHandler
from proton.reactor import Container
from proton.utils import BlockingConnection, BlockingReceiver

#: seconds any single blocking wait may take before the test fails
TIMEOUT = 5.0


@contextmanager
def blocking(broker: Amqp10Broker, url: str | None = None, **kwargs: Any) -> Iterator[BlockingConnection]:
    """A proton BlockingConnection (PLAIN guest by default) that fails instead of
    reconnecting, closed after."""
    conn = BlockingConnection(url or broker.url(), timeout=TIMEOUT, reconnect=False, **kwargs)
    try:
        yield conn
    finally:
        try:
            conn.close()
        except Exception:  # already closed by the broker: the test checks what it wants
            pass


def receiver(conn: BlockingConnection, address: str, credit: int = 0) -> BlockingReceiver:
    """A receiver with no prefetch: the broker gets exactly the credit the test grants
    (``credit`` now, more with :func:`grant`)."""
    rcv = conn.create_receiver(address, credit=0)
    copy_bodies(rcv)
    if credit:
        rcv.link.flow(credit)
    return rcv


def copy_bodies(rcv: BlockingReceiver) -> None:
    """Make each arriving message's body ``bytes``: proton 0.40 gives a data section's
    body as a memoryview into a buffer it reuses for the next message."""
    fetcher = rcv.fetcher
    assert fetcher is not None
    deliver = fetcher.on_message

    def on_message(event: Any) -> None:
        if isinstance(event.message.body, memoryview):
            event.message.body = bytes(event.message.body)
        deliver(event)

    fetcher.on_message = on_message  # type: ignore[method-assign]


def grant(rcv: BlockingReceiver, credit: int) -> None:
    rcv.link.flow(credit)


def wait_messages(
    conn: BlockingConnection, rcv: BlockingReceiver, count: int, timeout: float = TIMEOUT
) -> None:
    """Wait until ``count`` messages have arrived on ``rcv`` (not yet popped)."""
    assert rcv.fetcher is not None
    fetcher = rcv.fetcher
    conn.wait(lambda: fetcher.has_message >= count, timeout=timeout, msg=f"{count} messages")


def pump(conn: BlockingConnection, seconds: float) -> None:
    """Let proton do its I/O (heartbeats, arriving deliveries) for ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            conn.wait(lambda: False, timeout=max(0.01, deadline - time.monotonic()))
        except Timeout:
            pass


def pop(rcv: BlockingReceiver) -> tuple[Message, Delivery]:
    """The next arrived message and its delivery (unsettled unless pre-settled)."""
    assert rcv.fetcher is not None
    message, delivery = rcv.fetcher.incoming.popleft()
    return message, delivery


def settle(delivery: Delivery, state: int, failed: bool = False, undeliverable: bool = False) -> None:
    """Set ``delivery``'s outcome (ACCEPTED, REJECTED, RELEASED, MODIFIED with its
    delivery-failed/undeliverable-here flags) and settle it."""
    if state == Delivery.MODIFIED:
        delivery.local.failed = failed
        delivery.local.undeliverable = undeliverable
    delivery.update(state)
    delivery.settle()


def send(conn: BlockingConnection, address: str, *messages: Message) -> list[int]:
    """Send unsettled and return the broker's outcomes (Delivery.ACCEPTED, ...). The
    link is left open (closing the connection detaches it): RabbitMQ 3.10 answers a
    closing detach with closed=false, which proton's blocking close waits on forever."""
    sender = conn.create_sender(address)
    return [sender.send(m).remote_state for m in messages]


def drain_all(conn: BlockingConnection, rcv: BlockingReceiver) -> None:
    """Settle everything that arrived (accept)."""
    assert rcv.fetcher is not None
    while rcv.fetcher.incoming:
        _, delivery = rcv.fetcher.incoming.popleft()
        settle(delivery, Delivery.ACCEPTED)


class ReactorHandler(MessagingHandler):
    """A MessagingHandler whose container stops once its connection's socket is closed
    (the timer of :func:`run_reactor` would keep it running)."""

    def on_transport_closed(self, event: Any) -> None:
        event.container.stop()


def run_reactor(handler: MessagingHandler, timeout: float = TIMEOUT) -> None:
    """Run ``handler`` in a fresh Container until it stops, failing after ``timeout``
    seconds."""
    container = Container(handler)
    timed_out: list[bool] = []

    class _Timeout:
        def on_timer_task(self, event: Any) -> None:
            timed_out.append(True)
            container.stop()

    task = container.schedule(timeout, _Timeout())
    container.run()
    task.cancel()
    assert not timed_out, f"the reactor test did not finish in {timeout} s"
