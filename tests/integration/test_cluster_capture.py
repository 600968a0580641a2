"""A cluster node's definition changes captured in its store batches (the ``changes``
table of a real PostgreSQL, cluster/replicating_store.py) and applied to another node's
core (cluster/replication.py), the store of neither writing them twice."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from targets import unique

from leveret.cluster.replication import Replication, decode
from leveret.core.auth import Permission, User
from leveret.core.broker import BrokerCore
from leveret.core.clock import ManualClock

pytest.importorskip("psycopg")


def node_core(url: str, cluster: str, name: str):
    """A core on node ``name``'s PostgreSQL store (node mode), wrapped to replicate."""
    from leveret.store.postgresql import PostgreSQLStore

    inner = PostgreSQLStore(url, cluster, node=name)
    assert inner.try_master()
    core = BrokerCore(ManualClock())
    core.attach_store(inner)
    replication = Replication(SimpleNamespace(core=core, store=inner, catalog=None, node=name))
    replication.install()
    return core, inner, replication


def changes(postgres, cluster: str) -> list[tuple]:
    rows = postgres.sql(
        f'SELECT epoch, node, kind, vhost, name, data FROM "{cluster}".changes ORDER BY epoch'
    )
    from leveret.store.postgresql import unescape_text  # (NUL is kept escaped in text)

    return [
        (epoch, node, kind, unescape_text(vhost), unescape_text(name), decode(data))
        for epoch, node, kind, vhost, name, data in rows
    ]


def test_changes_are_logged_with_their_batch_and_applied_elsewhere(postgres) -> None:
    cluster = unique("capture").replace("-", "_")

    async def run() -> None:
        loop = asyncio.get_running_loop()
        a, a_store, _ = node_core(postgres.url, cluster, "a")
        b, b_store, b_replication = node_core(postgres.url, cluster, "b")
        for store in (a_store, b_store):
            store.start(loop)
        before = await asyncio.to_thread(changes, postgres, cluster)
        first = before[-1][0] if before else 0

        host = a.add_vhost("shop")
        a.add_user(User.with_password("clerk", "counter", ["management"]))
        a.set_permission("clerk", "shop", Permission("^c", ".*", ".*"))
        host.declare_exchange("orders", "topic", durable=True)
        host.declare_exchange("events", "fanout")  # transient: the store never sees it
        host.bind("orders", host.exchanges["events"], "eu.#")
        done = asyncio.Event()
        a.store.when_durable(lambda ok: done.set())
        await asyncio.wait_for(done.wait(), 5)

        logged = [row for row in await asyncio.to_thread(changes, postgres, cluster) if row[0] > first]
        assert [(node, kind, name) for _, node, kind, _, name, _ in logged] == [
            ("a", "vhost", ""),
            ("a", "user", "clerk"),
            ("a", "permission", "clerk"),
            ("a", "exchange", "orders"),
            ("a", "exchange", "events"),
            ("a", "binding", "orders\x00exchange\x00events\x00eu.#\x00()"),
        ]
        assert logged[4][5]["durable"] is False and logged[4][5]["transient"] is True
        assert a_store.last_epoch == logged[-1][0]
        transient = postgres.sql(
            f'SELECT kind, name, node FROM "{cluster}".transient_definitions ORDER BY kind'
        )
        assert transient == [
            ("binding", "orders\\0exchange\\0events\\0eu.#\\0()", "a"),
            ("exchange", "events", "a"),
        ]

        written = b_store.definition_changes
        b_replication.apply(logged)
        shop = b.vhosts["shop"]
        assert b.users.permissions[("shop", "clerk")].configure == "^c"
        assert b.users.users["clerk"].password_hash == a.users.users["clerk"].password_hash
        assert shop.exchanges["events"].durable is False
        bound = shop.exchanges["orders"].bindings.values()
        assert [binding.destination.name for binding in bound] == ["events"]
        assert b_store.definition_changes == written and b.store.definition_changes == 0

        a.delete_vhost("shop")
        done = asyncio.Event()
        a.store.when_durable(lambda ok: done.set())
        await asyncio.wait_for(done.wait(), 5)
        after = await asyncio.to_thread(changes, postgres, cluster)
        deleted = [row for row in after if row[0] > logged[-1][0]]
        assert all(row[5] is None for row in deleted)
        b_replication.apply(deleted)
        assert "shop" not in b.vhosts and ("shop", "clerk") not in b.users.permissions
        assert postgres.sql(f'SELECT count(*) FROM "{cluster}".transient_definitions') == [(0,)]
        for store in (a_store, b_store):
            await asyncio.to_thread(store.close)

    asyncio.run(run())
