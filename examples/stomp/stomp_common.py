"""What every STOMP example shares, so each one shows only its scenario.

- :func:`connect`: a stomp.py 1.2 connection (the version ActiveMQ 5.17 and leveret
  speak best) and an :class:`Inbox`, the listener that keeps what the broker sends, so
  the examples wait for a MESSAGE or a RECEIPT instead of sleeping;
- :func:`target`: where the example runs, an embedded leveret (the default) or the
  broker that ``--url stomp://[user:password@]host:port`` names: a ``leveret server``,
  or an ActiveMQ, as the same code runs on both.

Nothing here is specific to leveret but the embedded broker.
"""

from __future__ import annotations

import argparse
import queue
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import stomp
from stomp.utils import Frame


class Inbox(stomp.ConnectionListener):
    """What the broker sent one connection: MESSAGE frames in order of arrival, the
    receipt ids, the ERROR frames."""

    def __init__(self) -> None:
        self.messages: queue.Queue[Frame] = queue.Queue()
        self.errors: list[Frame] = []
        self._receipts: set[str] = set()
        self._changed = threading.Condition()

    # called by stomp.py's receiver thread
    def on_message(self, frame: Frame) -> None:
        self.messages.put(frame)

    def on_receipt(self, frame: Frame) -> None:
        with self._changed:
            self._receipts.add(frame.headers["receipt-id"])
            self._changed.notify_all()

    def on_error(self, frame: Frame) -> None:
        with self._changed:
            self.errors.append(frame)
            self._changed.notify_all()

    # called by the example
    def receipt(self, receipt_id: str, timeout: float = 10.0) -> None:
        """Wait for the RECEIPT of the frame sent with ``receipt=receipt_id``."""
        with self._changed:
            if not self._changed.wait_for(lambda: receipt_id in self._receipts or self.errors, timeout):
                raise TimeoutError(f"no RECEIPT {receipt_id} within {timeout} s")
            if receipt_id not in self._receipts:
                error = self.errors[0]
                raise RuntimeError(f"ERROR {error.headers.get('message')}: {error.body}")

    def message(self, timeout: float = 10.0) -> Frame:
        """The next MESSAGE (TimeoutError if none comes within ``timeout`` seconds)."""
        try:
            return self.messages.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no MESSAGE within {timeout} s") from None

    def take(self, count: int, timeout: float = 10.0) -> list[Frame]:
        """The next ``count`` MESSAGE frames."""
        deadline = time.monotonic() + timeout
        return [self.message(max(0.0, deadline - time.monotonic())) for _ in range(count)]

    def rest(self, quiet: float = 0.3) -> list[Frame]:
        """Every MESSAGE that comes until none has come for ``quiet`` seconds."""
        frames = []
        while True:
            try:
                frames.append(self.messages.get(timeout=quiet))
            except queue.Empty:
                return frames


def connect(host: str, port: int, login: str = "guest", passcode: str = "guest",
            **headers: str) -> tuple[stomp.Connection12, Inbox]:
    """A connected stomp.py connection (extra CONNECT ``headers``, such as ``client-id``)
    and its inbox."""
    conn = stomp.Connection12([(host, port)])
    inbox = Inbox()
    conn.set_listener("inbox", inbox)
    conn.connect(login, passcode, wait=True, headers=headers)
    return conn, inbox


@dataclass
class Target:
    """The broker an example talks to."""

    host: str
    port: int
    login: str = "guest"
    passcode: str = "guest"
    embedded: bool = False


def arguments(doc: str, **extra: dict[str, Any]) -> argparse.Namespace:
    """The command line: ``--url`` and the example's own options (name: add_argument's
    keywords)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--url", help="stomp://[user:password@]host:port of a running leveret server or "
                                      "ActiveMQ (default: an embedded leveret)")
    for name, options in extra.items():
        parser.add_argument("--" + name.replace("_", "-"), **options)
    return parser.parse_args()


@contextmanager
def target(url: str | None, stomp_queue_arguments: dict[str, Any] | None = None) -> Iterator[Target]:
    """The broker of ``url``, or a fresh embedded leveret (STOMP on a free port, its data
    in a temporary directory) whose STOMP queues get ``stomp_queue_arguments`` (None:
    ActiveMQ's redelivery and dead-letter policy)."""
    if url:
        parts = urlsplit(url)
        if parts.scheme != "stomp" or not parts.hostname:
            raise SystemExit(f"--url: expected stomp://host:port, got {url!r}")
        login, passcode = parts.username or "guest", parts.password or "guest"
        yield Target(parts.hostname, parts.port or 61613, login, passcode)
        return
    from leveret import BlockingBroker

    with tempfile.TemporaryDirectory(prefix="leveret-example-") as data_dir, BlockingBroker(
        amqp_port=0, stomp_port=0, data_dir=data_dir, stomp_queue_arguments=stomp_queue_arguments
    ) as broker:
        print(f"embedded leveret on {broker.stomp_url}")
        yield Target("127.0.0.1", broker.broker.stomp_port, embedded=True)
