"""The federation Link base (src/leveret/federation/links.py) under faults, with a
minimal link of its own against a real leveret: a consumer the upstream cancels
(``basic.cancel``: its queue deleted) ends the session with RabbitMQ's ``basic_cancel``
error and a new attempt follows after ``reconnect-delay``; an upstream vhost the user may
not open shows as ``NOT_ALLOWED`` (RabbitMQ: ``not_allowed``), a wrong password as
``ACCESS_REFUSED``."""

from __future__ import annotations

import asyncio
from typing import Any

import pika
from eventually import eventually
from targets import Target

from leveret import BlockingBroker
from leveret.federation.links import Link
from leveret.federation.upstream import Upstream


class Consuming(Link):
    """Declares ``name`` upstream, consumes it and runs until something fails."""

    kind = "queue"

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.sessions = 0

    async def _session(self) -> None:
        connection = await self._connect(self.upstream_uri())
        channel = await connection.channel()
        await channel.queue_declare(self.name)
        await channel.basic_consume(self.name, lambda message: None, no_ack=True)
        self.sessions += 1
        self._set("running")
        await connection.closing


def run_link(url: str, queue: str, check: Any, delay: float = 0.2) -> Consuming:
    """Run a :class:`Consuming` link to ``url`` on a loop of its own while ``check(link)``
    (in a thread) runs; then stop it."""
    upstream = Upstream.from_parameter("/", "up", {"uri": url, "reconnect-delay": delay})

    async def main() -> Consuming:
        link = Consuming("/", queue, upstream, lambda: url, "test-node")
        link.start()
        try:
            await asyncio.get_running_loop().run_in_executor(None, check, link)
        finally:
            await link.stop()
        return link

    return asyncio.run(main())


def test_a_deleted_upstream_queue_ends_the_session_with_basic_cancel():
    with BlockingBroker(amqp_port=0) as broker:
        url = f"amqp://guest:guest@127.0.0.1:{broker.amqp_port}/%2F"
        seen: list[tuple[str, str | None]] = []

        def check(link: Consuming) -> None:
            assert eventually(lambda: link.state == "running", 10)
            connection = pika.BlockingConnection(pika.URLParameters(url))
            connection.channel().queue_delete("watched")
            connection.close()
            assert eventually(lambda: link.state == "error", 5), link.state
            seen.append((link.state, link.error))
            again = eventually(lambda: link.sessions == 2 and link.state == "running", 10)
            assert again, (link.state, link.error)

        run_link(url, "watched", check)
        [(state, error)] = seen
        assert state == "error" and error is not None and "basic_cancel" in error


def test_a_refused_vhost_and_a_wrong_password_are_named_in_the_error():
    with BlockingBroker(amqp_port=0, http_port=0) as broker:
        target = Target.of(broker)
        assert target.http("PUT", "/api/vhosts/closed")[0] == 201
        assert target.http("DELETE", "/api/permissions/closed/guest")[0] == 204
        errors: list[str | None] = []

        def check(link: Consuming) -> None:
            assert eventually(lambda: link.state == "error", 10)
            errors.append(link.error)

        run_link(f"amqp://guest:guest@127.0.0.1:{broker.amqp_port}/closed", "q", check)
        run_link(f"amqp://guest:wrong@127.0.0.1:{broker.amqp_port}/%2F", "q", check)
        refused, wrong_password = errors
        assert refused is not None and "NOT_ALLOWED" in refused and "'closed'" in refused, refused
        assert wrong_password is not None and "ACCESS_REFUSED" in wrong_password, wrong_password
