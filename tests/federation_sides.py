"""Brokers for federation fault tests, as processes a test may kill -9 and restart on the
same ports and the same data (a durable store on disk), and the calls the tests make on
either kind: :class:`LeveretSide` (``leveret server``) and :class:`RabbitSide` (a private
RabbitMQ 3.10 node with ``rabbitmq_federation`` and ``rabbitmq_federation_management``).

Both have ``name``, ``url`` (AMQP, guest), ``target`` (a :class:`targets.Target` for HTTP),
``kill()`` (SIGKILL: a crash), ``restart()`` (same ports and data; returns once the AMQP
port and the management API answer), ``stop()``.
"""

from __future__ import annotations

import urllib.parse
from pathlib import Path

from servers import ServerProcess
from targets import Target, wait_http  # puts bench/ on sys.path: brokers after it

from brokers import RabbitMQ, free_port  # isort: skip

#: what a fault test waits for at the most (seconds) before it fails
TIMEOUT = 20.0


class LeveretSide:
    """``leveret server`` with ``--data-dir`` under ``directory`` and fixed AMQP and HTTP
    ports, so a restart after kill -9 recovers its durable queues and definitions."""

    def __init__(self, directory: Path, name: str = "leveret") -> None:
        self.name, self.directory = name, directory
        self.amqp_port, self.http_port = free_port(), free_port()
        self.target = Target("leveret", "127.0.0.1", self.amqp_port, self.http_port)
        self.url = self.target.url()
        self.process: ServerProcess | None = None

    def start(self) -> LeveretSide:
        self.process = ServerProcess(
            self.directory / "data", "--amqp-port", str(self.amqp_port), "--http-port", str(self.http_port)
        )
        wait_http(self.target, interval=0.1)
        return self

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()

    def restart(self) -> None:
        self.kill()
        self.start()

    def stop(self) -> None:
        if self.process is not None and self.process.proc.poll() is None:
            try:
                self.process.terminate(10)
            except Exception:  # a hung shutdown: kill it
                self.process.kill()

    def log(self) -> str:
        return self.process.log_path.read_text()[-4000:] if self.process else ""


class RabbitSide:
    """A private RabbitMQ node (federation plugins on); kill -9 is SIGKILL to beam.smp."""

    def __init__(self, name: str = "rabbitmq") -> None:
        self.name = name
        self.node = RabbitMQ(federation=True)
        self.node.start()
        self.amqp_port, self.http_port = self.node.port, self.node.http_port
        self.target = Target("rabbitmq", "127.0.0.1", self.amqp_port, self.http_port)
        self.url = self.target.url()
        wait_http(self.target, interval=0.1)

    def start(self) -> RabbitSide:
        return self

    def kill(self) -> None:
        self.node.shutdown(kill=True, timeout=30)

    def restart(self) -> None:
        self.kill()
        self.node.launch(90)
        wait_http(self.target, interval=0.1)

    def stop(self) -> None:
        self.node.stop()

    def log(self) -> str:
        return self.node.log_tail(40)


def quoted(vhost: str) -> str:
    return urllib.parse.quote(vhost, safe="")


def federate(downstream: Target, upstream_uri: str, pattern: str, apply_to: str = "exchanges",
             upstream: str = "up", vhost: str = "/", **settings: object) -> None:
    """Define upstream ``upstream`` (``uri`` and ``settings``: ``reconnect-delay``,
    ``ack-mode``, ...) on ``downstream`` and a policy federating the ``apply_to`` whose
    names match ``pattern`` from it (RabbitMQ's HTTP calls)."""
    value = {"uri": upstream_uri, **settings}
    path = f"/api/parameters/federation-upstream/{quoted(vhost)}/{upstream}"
    status, body = downstream.http("PUT", path, {"value": value})
    assert status in (201, 204), (status, body)
    policy = {"pattern": pattern, "apply-to": apply_to, "definition": {"federation-upstream": upstream}}
    status, body = downstream.http("PUT", f"/api/policies/{quoted(vhost)}/fed-{upstream}", policy)
    assert status in (201, 204), (status, body)


def links(downstream: Target) -> list[dict]:
    """The rows of ``GET /api/federation-links`` ([] when the API is not answering)."""
    try:
        status, rows = downstream.http("GET", "/api/federation-links")
    except OSError:
        return []
    return rows if status == 200 and isinstance(rows, list) else []


__all__ = ["TIMEOUT", "LeveretSide", "RabbitSide", "federate", "links"]
