"""MQTT users, vhosts, permissions and management: RabbitMQ 3.10's MQTT plugin beside
leveret, answer for answer (MQTT 3.1.1 only: RabbitMQ 3.10 has no MQTT 5).

Each case is one login, publish or subscribe with paho-mqtt; the table printed is the
CONNACK code, the PUBACK / SUBACK codes, or how the connection ended, per broker. The
RabbitMQ node is private (bench/brokers.py's launcher, with ``rabbitmq_mqtt`` and
``rabbitmq_management`` enabled) and stopped after; without ``rabbitmq-server`` only
leveret's column is printed. ``--leveret-only`` skips RabbitMQ. Run from the
repository root: ``PYTHONPATH=src python3 bench/mqtt_access_rabbitmq.py``.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import queue
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from brokers import RabbitMQ, free_port, rabbitmq_installed
from mqtt_ops_clients import V311, Client, connack


class RabbitMQWithMqtt(RabbitMQ):
    """A private node with management and the MQTT plugin on a free port."""

    def __init__(self) -> None:
        super().__init__(management=True)
        self.mqtt_port = 0

    def prepare(self) -> None:
        super().prepare()
        self.mqtt_port = free_port()

    def _env(self) -> dict:
        env = super()._env()
        Path(self.workdir, "enabled_plugins").write_text("[rabbitmq_management,rabbitmq_mqtt].\n")
        with open(Path(self.workdir, "rabbitmq.conf"), "a") as conf:
            conf.write(f"mqtt.listeners.tcp.1 = 127.0.0.1:{self.mqtt_port}\n")
        self.env = env
        return env

    def cookie(self) -> str:
        """The node's Erlang cookie (rabbitmqctl runs as the rabbitmq user, whose home
        has another)."""
        return Path(self.workdir, ".erlang.cookie").read_text().strip()

    def ctl(self, *args: str) -> str:
        done = subprocess.run(
            ["rabbitmqctl", "-n", self.extra["nodename"], "--erlang-cookie", self.cookie(), *args],
            env=self.env, capture_output=True, text=True, timeout=60, check=False,
        )
        print(f"rabbitmqctl {' '.join(args)}: {done.returncode} {done.stdout}{done.stderr}", file=sys.stderr)
        return done.stdout


class Side:
    """One broker as the cases see it: MQTT port, HTTP API, allow_anonymous switch."""

    def __init__(self, name: str, mqtt_port: int, http_url: str, anonymous: Any) -> None:
        self.name, self.port, self.http_url, self.set_anonymous = name, mqtt_port, http_url, anonymous

    def http(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        request = urllib.request.Request(
            self.http_url + path, method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode(),
                     "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                raw = response.read()
                return response.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode(errors="replace")


def wait_for(check: Any, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    return None


def cases(side: Side) -> dict[str, Any]:
    """Every case's answer on ``side``."""
    out: dict[str, Any] = {}
    full = {"configure": ".*", "write": ".*", "read": ".*"}
    side.http("PUT", "/api/vhosts/mq1")
    side.http("PUT", "/api/users/bob", {"password": "pw", "tags": ""})
    port = side.port
    out["anonymous (allow_anonymous default)"] = connack(port, V311)
    out["guest/guest"] = connack(port, V311, username="guest", password="guest")
    out["wrong password"] = connack(port, V311, username="guest", password="nope")
    out["unknown user"] = connack(port, V311, username="nobody", password="pw")
    out["mq1:bob, no permission"] = connack(port, V311, username="mq1:bob", password="pw")
    side.http("PUT", "/api/permissions/mq1/bob", full)
    out["mq1:bob, permission"] = connack(port, V311, username="mq1:bob", password="pw")
    out["bob (default vhost /, no permission)"] = connack(port, V311, username="bob", password="pw")
    out["nosuch:bob (unknown vhost)"] = connack(port, V311, username="nosuch:bob", password="pw")
    side.http("PUT", "/api/global-parameters/mqtt_port_to_vhost_mapping", {"value": {str(port): "mq1"}})
    out["bob, port mapped to mq1"] = connack(port, V311, username="bob", password="pw")
    out["/:guest, port mapped to mq1"] = connack(port, V311, username="/:guest", password="guest")
    side.http("DELETE", "/api/global-parameters/mqtt_port_to_vhost_mapping")
    side.set_anonymous(False)
    out["anonymous, allow_anonymous false"] = connack(port, V311)
    side.set_anonymous(True)

    # vhost limit
    side.http("PUT", "/api/vhost-limits/mq1/max-connections", {"value": 1})
    first = Client(port, "lim1", V311, "mq1:bob", "pw")
    out["max-connections 1: first"] = first.connect()
    out["max-connections 1: second"] = connack(
        port, V311, username="mq1:bob", password="pw", client_id="lim2")
    first.close()
    side.http("DELETE", "/api/vhost-limits/mq1/max-connections")

    # topic permissions with variables
    side.http("PUT", "/api/topic-permissions/mq1/bob",
              {"exchange": "amq.topic", "write": "^dev\\.{client_id}\\.", "read": "^cmd\\.{username}\\."})
    def publish(topic: str) -> str:
        client = Client(port, "dev1", V311, "mq1:bob", "pw")
        client.connect()
        code = client.publish(topic, b"x", 1, timeout=3)
        closed = wait_for(lambda: not client.paho.is_connected(), 1)
        client.close()
        return f"PUBACK {code}" + (", then closed" if closed else "") if code is not None else "closed"

    def subscribe(topic_filter: str) -> str:
        client = Client(port, "dev1", V311, "mq1:bob", "pw")
        client.connect()
        try:
            return f"SUBACK {client.subscribe(topic_filter, 1, timeout=3)}"
        except queue.Empty:
            return "closed"
        finally:
            client.close()

    out["publish dev/dev1/t (write ^dev\\.{client_id}\\.)"] = publish("dev/dev1/t")
    out["publish dev/dev2/t"] = publish("dev/dev2/t")
    out["subscribe cmd/bob/# (read ^cmd\\.{username}\\.)"] = subscribe("cmd/bob/#")
    out["subscribe cmd/alice/#"] = subscribe("cmd/alice/#")
    out["subscribe cmd/+/x"] = subscribe("cmd/+/x")
    side.http("DELETE", "/api/topic-permissions/mq1/bob")

    # management
    client = Client(port, "seen-by-api", V311, "mq1:bob", "pw")
    client.connect(keepalive=30)
    rows = wait_for(lambda: [c for c in (side.http("GET", "/api/connections")[1] or [])
                             if c.get("vhost") == "mq1"])
    row = rows[0] if rows else {}
    out["/api/connections protocol"] = row.get("protocol")
    out["/api/connections client_properties"] = row.get("client_properties")
    out["/api/connections timeout"] = row.get("timeout")
    name = row.get("name", "")
    status, _ = side.http("DELETE", "/api/connections/" + urllib.request.quote(name, safe=""))
    out["DELETE /api/connections/{name}"] = status
    out["  ... after DELETE, the connection"] = (
        "closed" if wait_for(lambda: not client.paho.is_connected(), 5) else "open")
    client.close()
    client = Client(port, "vhost-goes", V311, "mq1:bob", "pw")
    client.connect()
    out["DELETE /api/vhosts/mq1"] = side.http("DELETE", "/api/vhosts/mq1")[0]
    out["  ... then the MQTT connection"] = (
        "closed" if wait_for(lambda: not client.paho.is_connected(), 5) else "open")
    client.close()
    side.http("DELETE", "/api/users/bob")
    return out


def leveret_side() -> tuple[Side, Any]:
    from leveret import BlockingBroker
    from leveret.protocol.mqtt.settings import settings_of

    broker = BlockingBroker(amqp_port=0, mqtt_port=0, http_port=0).start()
    settings = settings_of(broker.core)

    def anonymous(on: bool) -> None:
        broker.call(setattr, settings, "allow_anonymous", on)

    return Side("leveret", broker.mqtt_port, broker.http_url.rstrip("/"), anonymous), broker


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--leveret-only", action="store_true")
    args = parser.parse_args()
    results: dict[str, dict[str, Any]] = {}
    if not args.leveret_only and rabbitmq_installed():
        node = RabbitMQWithMqtt()
        node.start()
        try:
            http_url = f"http://127.0.0.1:{node.http_port}"
            side = Side("rabbitmq", node.mqtt_port, http_url, lambda on: node.ctl(
                "eval", f"application:set_env(rabbitmq_mqtt, allow_anonymous, {str(on).lower()})."))
            wait_for(lambda: side.http("GET", "/api/overview")[0] == 200, 90)
            results["rabbitmq 3.10"] = cases(side)
        finally:
            node.stop()
    side, broker = leveret_side()
    try:
        results["leveret"] = cases(side)
    finally:
        broker.stop()
    names = list(results)
    keys = list(next(iter(results.values())))
    for key in keys:
        print(f"{key:55} " + " | ".join(f"{n}: {results[n].get(key)!r}" for n in names))
    if os.environ.get("JSON_OUT"):
        Path(os.environ["JSON_OUT"]).write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
