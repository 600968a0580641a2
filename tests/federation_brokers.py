"""Brokers for the federation matrix (tests/integration/test_federation_matrix.py): an
upstream and a downstream of either kind, so every federation case runs four ways —
leveret → leveret, RabbitMQ → leveret, leveret → RabbitMQ and RabbitMQ → RabbitMQ (the
last proves the test right).

- leveret: an in-process :class:`~leveret.BlockingBroker` with its management API, one
  per role and test (``workers`` as the suite's LEVERET_TEST_WORKERS);
- RabbitMQ: one private 3.10 node per session with ``rabbitmq_management``,
  ``rabbitmq_federation`` and ``rabbitmq_federation_management`` (bench/brokers.py:
  its own ports, epmd and directory). Tests keep apart by vhosts of their own; when
  both sides are RabbitMQ they are two vhosts of that node (RabbitMQ federates between
  vhosts of one node; its cycle detection keys on cluster name *and* vhost). Cases
  with a RabbitMQ side skip when rabbitmq-server is not installed.

A :class:`Site` is one vhost of one broker; federation is configured with the same HTTP
calls on both kinds of broker: ``PUT /api/parameters/federation-upstream/{vhost}/{name}``,
``PUT /api/policies/{vhost}/{name}`` and ``GET /api/federation-links/{vhost}``.

A test module binds the fixtures by assignment (``pairing = federation_brokers.pairing``,
the same for ``federation_rabbitmq``); each module doing so gets a node of its own.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable, Iterator
from typing import Any

import pika
import pytest
from eventually import eventually
from servers import TEST_WORKERS
from targets import Target, leveret_target, rabbitmq_installed, start_rabbitmq, unique

from leveret import BlockingBroker

#: the four pairings, as (upstream kind, downstream kind); test ids ``up_to_down``
PAIRINGS = [
    ("leveret", "leveret"), ("rabbitmq", "leveret"), ("leveret", "rabbitmq"), ("rabbitmq", "rabbitmq"),
]
PAIRING_IDS = [f"{up}_to_{down}" for up, down in PAIRINGS]

#: seconds a link gets to come up or to move a message (RabbitMQ's start in ~0.1 s)
LINK_TIMEOUT = 8.0


def q(name: str) -> str:
    return urllib.parse.quote(name, safe="")


class Site:
    """One vhost of one broker (a fresh one, deleted with the :class:`Pairing`)."""

    def __init__(self, target: Target, vhost: str) -> None:
        self.target, self.vhost = target, vhost

    @property
    def kind(self) -> str:
        """``"leveret"`` or ``"rabbitmq"``."""
        return self.target.name

    def __repr__(self) -> str:
        return f"Site({self.kind}, {self.vhost!r})"

    # -- clients --------------------------------------------------------------------
    def uri(self) -> str:
        """The AMQP URI of this vhost as guest: what an upstream definition names."""
        return self.target.url(vhost=self.vhost)

    def redacted_uri(self) -> str:
        """:meth:`uri` without its credentials, as ``/api/federation-links`` shows it."""
        return f"amqp://{self.target.host}:{self.target.amqp_port}/{q(self.vhost)}"

    def amqp(self) -> pika.BlockingConnection:
        return self.target.amqp(vhost=self.vhost)

    def http(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """An API call; ``{v}`` in ``path`` is this site's vhost, quoted."""
        return self.target.http(method, path.replace("{v}", q(self.vhost)), body)

    # -- federation over HTTP (the same calls on both brokers) -----------------------
    def put_upstream(self, name: str, uri: str | list[str], **keys: Any) -> None:
        """``federation-upstream`` parameter ``name`` (``max_hops=2`` → ``max-hops``)."""
        value = {"uri": uri, **{k.replace("_", "-"): v for k, v in keys.items()}}
        path = f"/api/parameters/federation-upstream/{{v}}/{q(name)}"
        status, body = self.http("PUT", path, {"value": value})
        assert status in (201, 204), (self, status, body)

    def put_upstream_set(self, name: str, members: list[dict]) -> None:
        status, body = self.http("PUT", f"/api/parameters/federation-upstream-set/{{v}}/{q(name)}",
                                 {"value": members})
        assert status in (201, 204), (self, status, body)

    def put_policy(self, name: str, pattern: str, definition: dict, apply_to: str = "exchanges",
                   priority: int = 0) -> None:
        body = {"pattern": pattern, "definition": definition, "apply-to": apply_to, "priority": priority}
        status, answer = self.http("PUT", f"/api/policies/{{v}}/{q(name)}", body)
        assert status in (201, 204), (self, status, answer)

    def federate(self, upstream: Site, pattern: str, apply_to: str = "exchanges", name: str = "up",
                 **keys: Any) -> None:
        """Upstream ``name`` = ``upstream`` (with ``keys``) and a policy applying it to the
        names matching ``pattern``."""
        self.put_upstream(name, upstream.uri(), **keys)
        self.put_policy(f"federate-{name}-{apply_to}", pattern, {"federation-upstream": name}, apply_to)

    def links(self) -> list[dict]:
        """``GET /api/federation-links/{vhost}`` (asserting 200)."""
        status, body = self.http("GET", "/api/federation-links/{v}")
        assert status == 200, (self, status, body)
        return body

    def wait_links(self, count: int, status: str = "running", timeout: float = LINK_TIMEOUT) -> list[dict]:
        """The links once ``count`` of them have ``status`` (the last answer at the timeout)."""
        seen: list[list[dict]] = [[]]

        def ready() -> bool:
            seen[0] = self.links()
            return sum(row.get("status") == status for row in seen[0]) >= count

        eventually(ready, timeout, 0.1)
        return seen[0]

    # -- queues ---------------------------------------------------------------------
    def depth(self, queue: str) -> tuple[int, int]:
        """(ready, unacknowledged) of ``queue``, from AMQP (ready) and the API."""
        connection = self.amqp()
        try:
            ready = connection.channel().queue_declare(queue, passive=True).method.message_count
        finally:
            connection.close()
        return ready, self.unacked(queue)

    def unacked(self, queue: str) -> int:
        status, body = self.http("GET", f"/api/queues/{{v}}/{q(queue)}")
        assert status == 200, (self, queue, status, body)
        return int(body.get("messages_unacknowledged") or 0)


class Pairing:
    """One matrix cell: :meth:`upstream` and :meth:`downstream` give fresh sites (vhosts)
    on the broker of that role's kind; everything is deleted at the end of the test."""

    def __init__(self, up_kind: str, down_kind: str, target_of: Callable[[str, str], Target]) -> None:
        self.up_kind, self.down_kind = up_kind, down_kind
        self._target_of = target_of
        self._sites: list[Site] = []

    @property
    def id(self) -> str:
        """The cell's test id, ``up_to_down``."""
        return f"{self.up_kind}_to_{self.down_kind}"

    def site(self, kind: str, role: str) -> Site:
        target = self._target_of(kind, role)
        vhost = unique(f"fed-{role}")
        status, body = target.http("PUT", f"/api/vhosts/{q(vhost)}")
        assert status == 201, (target.name, status, body)
        site = Site(target, vhost)
        self._sites.append(site)
        return site

    def upstream(self) -> Site:
        return self.site(self.up_kind, "up")

    def downstream(self) -> Site:
        return self.site(self.down_kind, "down")

    def close(self) -> None:
        # downstreams first: their links stop before the upstream vhosts go
        for site in sorted(self._sites, key=lambda s: not s.vhost.startswith("fed-down")):
            site.http("DELETE", "/api/vhosts/{v}")


@pytest.fixture(scope="session")
def federation_rabbitmq() -> Iterator[Target]:
    """The session's RabbitMQ node with federation (skipped when not installed)."""
    if not rabbitmq_installed():
        pytest.skip("rabbitmq-server is not installed: only leveret → leveret is checked")
    node, target = start_rabbitmq("/api/federation-links", federation=True)
    yield target
    node.stop()


@pytest.fixture(params=PAIRINGS, ids=PAIRING_IDS)
def pairing(request) -> Iterator[Pairing]:
    """A matrix cell (see :class:`Pairing`): leveret brokers of the test's own (one per
    role, started when first asked for), RabbitMQ the session's node."""
    brokers: dict[str, BlockingBroker] = {}

    def target_of(kind: str, role: str) -> Target:
        if kind == "rabbitmq":
            return request.getfixturevalue("federation_rabbitmq")
        if role not in brokers:
            broker = BlockingBroker(amqp_port=0, http_port=0, workers=TEST_WORKERS)
            broker.start()
            brokers[role] = broker
        return leveret_target(brokers[role])

    up_kind, down_kind = request.param
    if "rabbitmq" in request.param:
        request.getfixturevalue("federation_rabbitmq")  # skips here when not installed
    cell = Pairing(up_kind, down_kind, target_of)
    try:
        yield cell
    finally:
        try:
            cell.close()
        finally:
            for broker in brokers.values():
                broker.stop()


__all__ = ["LINK_TIMEOUT", "PAIRINGS", "PAIRING_IDS", "Pairing", "Site", "federation_rabbitmq", "pairing",
           "q"]
