"""The same test against leveret and against a RabbitMQ 3.10 node, through the same AMQP
and HTTP calls: :class:`Target` is either broker, seen as a client sees it.

RabbitMQ runs when ``rabbitmq-server`` is installed (``apt-get install
rabbitmq-server``): one private node with the management plugin per test session,
started by the benchmarks' launcher (bench/brokers.py: its own ports, epmd and
directory; a system RabbitMQ is never touched). Without it those cases are skipped, and
the expected answers written in the tests (read from RabbitMQ 3.10.8) still check
leveret.
"""

from __future__ import annotations

import base64
import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pika

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from brokers import RabbitMQ, rabbitmq_installed


class Target:
    """A broker as its clients see it: AMQP and the management HTTP API."""

    def __init__(self, name: str, host: str, amqp_port: int, http_port: int) -> None:
        self.name, self.host, self.amqp_port, self.http_port = name, host, amqp_port, http_port
        self.broker: Any = None  # leveret's BlockingBroker when in-process (its settings)

    @classmethod
    def of(cls, broker: Any) -> Target:
        """An in-process BlockingBroker (leveret, with its HTTP port on)."""
        http_port = int(str(broker.http_url).rsplit(":", 1)[1].rstrip("/"))
        return cls("leveret", "127.0.0.1", broker.amqp_port, http_port)

    def url(self, user: str = "guest", password: str = "guest", vhost: str = "/") -> str:
        quoted = urllib.parse.quote(vhost, safe="")
        return f"amqp://{user}:{password}@{self.host}:{self.amqp_port}/{quoted}"

    def amqp(self, user: str = "guest", password: str = "guest", vhost: str = "/") -> pika.BlockingConnection:
        return pika.BlockingConnection(pika.URLParameters(self.url(user, password, vhost)))

    def http(self, method: str, path: str, body: Any = None, user: str = "guest",
             password: str = "guest", headers: dict | None = None) -> tuple[int, Any]:
        """(status, decoded JSON body or None)."""
        status, payload, _ = self.http_raw(method, path, body, user, password, headers)
        return status, payload

    def http_raw(self, method: str, path: str, body: Any = None, user: str = "guest",
                 password: str = "guest", headers: dict | None = None) -> tuple[int, Any, dict]:
        """(status, decoded JSON body or None, response headers lower-cased)."""
        sent = {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode(),
                "Content-Type": "application/json", **(headers or {})}
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"http://{self.host}:{self.http_port}{path}", data=data,
                                         method=method, headers=sent)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                status, raw, got = response.status, response.read(), response.headers
        except urllib.error.HTTPError as error:
            status, raw, got = error.code, error.read(), error.headers
        try:
            payload = json.loads(raw) if raw else None
        except ValueError:
            payload = raw.decode(errors="replace")
        return status, payload, {k.lower(): v for k, v in got.items()}


def leveret_target(broker: Any) -> Target:
    """An in-process BlockingBroker with its management API on, as a :class:`Target`
    whose ``broker`` is that BlockingBroker."""
    management = broker.broker.management
    assert management is not None
    target = Target("leveret", broker.broker.host, broker.amqp_port, management.port)
    target.broker = broker
    return target


def unique(prefix: str) -> str:
    """A name no other test uses (the RabbitMQ node is shared by the session)."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


#: every permission: configure, write and read on every name (the regular expression ``.*``)
FULL = {"configure": ".*", "write": ".*", "read": ".*"}


@contextmanager
def new_account(target: Target, vhost_prefix: str, user_prefix: str) -> Iterator[tuple[str, str]]:
    """A fresh vhost (guest has full permissions there, as its creator) and a tagless user
    with password ``pw`` and no permissions yet, as (vhost, user); both deleted after."""
    vhost, user = unique(vhost_prefix), unique(user_prefix)
    assert target.http("PUT", f"/api/vhosts/{vhost}")[0] == 201
    assert target.http("PUT", f"/api/users/{user}", {"password": "pw", "tags": ""})[0] == 201
    try:
        yield vhost, user
    finally:
        target.http("DELETE", f"/api/vhosts/{vhost}")
        target.http("DELETE", f"/api/users/{user}")


def grant(target: Target, vhost: str, user: str, **permission: str) -> None:
    """Give ``user`` full permissions in ``vhost`` but for the ones named (``write="^x$"``:
    regular expressions, as RabbitMQ's); the API answers 201 (created) or 204 (updated)."""
    status, _ = target.http("PUT", f"/api/permissions/{vhost}/{user}", {**FULL, **permission})
    assert status in (201, 204)


def put(target: Target, path: str, body: Any) -> None:
    """``PUT path`` with a JSON ``body``; the API answers 201 (created) or 204 (updated)."""
    status, answer = target.http("PUT", path, body)
    assert status in (201, 204), (path, answer)


def wait_http(target: Target, path: str = "/api/overview", timeout: float = 90.0,
              interval: float = 0.5) -> None:
    """Return once ``GET path`` answers 200; RuntimeError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if target.http("GET", path)[0] == 200:
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{target.name}'s {path} did not answer in {timeout} s")
        time.sleep(interval)


def start_rabbitmq(path: str = "/api/overview", **options: Any) -> tuple[RabbitMQ, Target]:
    """A private RabbitMQ node with management (``options``: more of bench/brokers.py
    :class:`RabbitMQ`'s, ``federation=True`` ...), ready for HTTP on ``path`` (90 s at most)."""
    node = RabbitMQ(**{"management": True, **options})
    node.start()
    target = Target("rabbitmq", "127.0.0.1", node.port, node.http_port)
    try:
        wait_http(target, path)
    except RuntimeError:
        node.stop()
        raise
    return node, target


__all__ = ["Target", "leveret_target", "put", "rabbitmq_installed", "start_rabbitmq", "unique", "wait_http"]
