"""Another node's changes applied to a real BrokerCore (cluster/replication.py), and
where a new queue lives (cluster/placement.py). No database here: the changes are the
rows a node's store logs (see tests/integration/test_cluster_replication.py for two
nodes on a real PostgreSQL)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from leveret.cluster.placement import BALANCED, CLIENT_LOCAL, leader_locator, least_loaded, stays_local
from leveret.cluster.replicating_store import ReplicatingStore
from leveret.cluster.replication import REMOTE_EXCLUSIVE, Replication
from leveret.core.auth import User
from leveret.core.broker import BrokerCore
from leveret.core.clock import ManualClock
from leveret.core.definitions import binding_definition, binding_name
from leveret.core.errors import ResourceLocked
from leveret.core.queues import ClassicQueue
from leveret.core.queues.remote import RemoteQueue
from leveret.store.sqlite import SQLiteStore


@pytest.fixture
def node(tmp_path: Path):
    """Node "b": a core on a SQLite store wrapped as a cluster node's, replicating."""
    core = BrokerCore(ManualClock())
    inner = SQLiteStore(tmp_path)
    store = ReplicatingStore(inner, "b")
    store.replaying = True  # (the SQLite store logs no changes: seed nothing)
    core.attach_store(store)
    store.replaying = False
    # the node runtime's part (cluster/node.py) without its catalog
    replication = Replication(SimpleNamespace(core=core, store=store, catalog=None, node="b"))
    replication.install()
    yield core, inner, replication
    inner.close()


def queue_data(node: str, **extra) -> dict:
    data = {"queue_id": 7, "auto_delete": False, "arguments": {}, "node": node, "durable": True}
    return data | {"exclusive": False} | extra


BINDING = "ex\x00queue\x00q\x00k.#\x00()"
BINDING_DATA = {
    "source": "ex", "destination_type": "queue", "destination": "q", "routing_key": "k.#", "arguments": {}
}
EXCHANGE = {"type": "topic", "durable": True, "auto_delete": False, "internal": False, "arguments": {}}


def test_definitions_of_another_node_are_applied_without_writing_them(node) -> None:
    core, inner, replication = node
    written = inner.definition_changes
    alice = User.with_password("alice", "secret", ["management"])
    replication.apply(
        [
            (1, "a", "vhost", "v1", "", {}),
            (2, "a", "user", "", "alice", alice.definition()),
            (3, "a", "permission", "v1", "alice", {"configure": "^x", "write": ".*", "read": ".*"}),
            (4, "a", "exchange", "v1", "ex", EXCHANGE),
            (5, "a", "queue", "v1", "q", queue_data("a")),
            (6, "a", "binding", "v1", BINDING, BINDING_DATA),
            (7, "a", "policy", "v1", "p", {
                "pattern": "^q", "definition": {"max-length": 5}, "apply_to": "queues", "priority": 1
            }),
            (8, "a", "global_parameter", "", "cluster_name", {"value": "rabbits"}),
            (9, "a", "parameter", "v1", "shovel\x00s1", {"json": '{"src-uri": "amqp://"}'}),
        ]
    )
    host = core.vhosts["v1"]
    assert core.users.users["alice"].password_hash == alice.password_hash
    assert core.users.permissions[("v1", "alice")].configure == "^x"
    assert host.exchanges["ex"].type == "topic"
    queue = host.queues["q"]
    assert isinstance(queue, RemoteQueue) and queue.owner == "a"
    assert [b.destination for b in host.exchanges["ex"].bindings.values()] == [queue]
    assert [p.name for p in core.policies] == ["p"]
    assert core.cluster_name() == "rabbits"
    assert core.parameters[("shovel", "v1", "s1")] == {"src-uri": "amqp://"}
    assert inner.definition_changes == written  # nothing written again
    assert replication.applied == 9

    replication.apply(
        [
            (10, "a", "binding", "v1", BINDING, None),
            (11, "a", "queue", "v1", "q", None),
            (12, "a", "user", "", "alice", None),
            (13, "a", "policy", "v1", "p", None),
        ]
    )
    assert host.exchanges["ex"].bindings == {}
    assert "q" not in host.queues and queue.deleted
    assert "alice" not in core.users.users and ("v1", "alice") not in core.users.permissions
    assert core.policies == []
    replication.apply([(14, "a", "vhost", "v1", "", None)])
    assert "v1" not in core.vhosts
    assert inner.definition_changes == written


def test_own_and_old_changes_are_skipped(node) -> None:
    core, _, replication = node
    replication.apply([(5, "b", "exchange", "/", "mine", EXCHANGE)])
    replication.apply([(6, "a", "exchange", "/", "theirs", EXCHANGE)])
    assert "mine" not in core.vhosts["/"].exchanges and "theirs" in core.vhosts["/"].exchanges
    replication.apply([(6, "a", "exchange", "/", "theirs", None), (4, "a", "exchange", "/", "old", EXCHANGE)])
    assert "theirs" in core.vhosts["/"].exchanges and "old" not in core.vhosts["/"].exchanges
    assert replication.applied == 6


def test_a_queue_placed_on_this_node_becomes_a_real_queue_with_its_id(node) -> None:
    core, _, replication = node
    replication.apply([(1, "a", "queue", "/", "mine", queue_data("b", queue_id=42))])
    queue = core.vhosts["/"].queues["mine"]
    assert isinstance(queue, ClassicQueue) and queue.queue_id == 42 and queue.store is not None


def test_a_remote_exclusive_queue_is_locked_here(node) -> None:
    core, _, replication = node
    replication.apply([(1, "a", "queue", "/", "rpc", queue_data("a", durable=False, exclusive=True))])
    host = core.vhosts["/"]
    assert host.queues["rpc"].exclusive_owner is REMOTE_EXCLUSIVE
    with pytest.raises(ResourceLocked):
        host.declare_queue("rpc", object(), passive=True)


def test_owner_changes_retarget_or_hand_the_queue_over(node) -> None:
    core, _, replication = node
    acquired: list[tuple] = []
    replication.on_acquired = lambda vhost, name, queue_id: acquired.append((vhost, name, queue_id))
    replication.link_for = lambda owner, vhost: f"link-{owner}-{vhost}"
    host = core.vhosts["/"]
    replication.apply([(1, "a", "exchange", "/", "ex", EXCHANGE)])
    replication.apply([(2, "a", "queue", "/", "q", queue_data("a"))])
    replication.apply([(3, "a", "binding", "/", BINDING, BINDING_DATA)])
    remote = host.queues["q"]
    assert isinstance(remote, RemoteQueue) and remote.link == "link-a-/"
    replication.apply([(4, "c", "owner", "/", "q", {"node": "c", "queue_id": 7})])
    assert remote.owner == "c" and remote.link == "link-c-/"
    replication.apply([(5, "c", "owner", "/", "q", {"node": "b", "queue_id": 7})])
    assert acquired == [("/", "q", 7)]
    # a real queue of this node moved away: a RemoteQueue takes its place and bindings
    here = dict(BINDING_DATA, destination="here", routing_key="h")
    replication.apply([(6, "a", "queue", "/", "here", queue_data("b", queue_id=9))])
    replication.apply([(7, "a", "binding", "/", "ex\x00queue\x00here\x00h\x00()", here)])
    real = host.queues["here"]
    assert isinstance(real, ClassicQueue) and len(real.bindings) == 1
    replication.apply([(8, "a", "owner", "/", "here", {"node": "a", "queue_id": 9})])
    moved = host.queues["here"]
    assert isinstance(moved, RemoteQueue) and moved.owner == "a" and real.deleted
    assert [b.destination for b in host.exchanges["ex"].bindings.values() if b.routing_key == "h"] == [moved]


def test_a_bad_change_is_logged_and_the_rest_applied(node, caplog) -> None:
    core, _, replication = node
    replication.apply([(1, "a", "user", "", "x", {"tags": []}), (2, "a", "exchange", "/", "ok", EXCHANGE)])
    assert "ok" in core.vhosts["/"].exchanges and "cannot apply user" in caplog.text
    assert replication.applied == 2


def test_binding_key_is_the_store_key() -> None:
    core = BrokerCore(ManualClock())
    host = core.vhosts["/"]
    host.declare_exchange("ex", "topic", durable=True)
    host.declare_queue("q", object(), durable=True)
    host.bind("ex", host.queues["q"], "k.#")
    (binding,) = host.exchanges["ex"].bindings.values()
    assert binding_name(binding) == BINDING and binding_definition(binding) == BINDING_DATA


def test_leader_locator_as_rabbitmq_3_10() -> None:
    assert leader_locator({}, None) == CLIENT_LOCAL
    assert leader_locator({}, None, BALANCED) == BALANCED
    assert leader_locator({"x-queue-leader-locator": "balanced"}, None) == BALANCED
    assert leader_locator({"x-queue-leader-locator": b"balanced"}, None) == BALANCED
    # the policy wins over the argument; old names mean balanced; anything else local
    policy = {"queue-leader-locator": "client-local"}
    assert leader_locator({"x-queue-leader-locator": "balanced"}, policy) == CLIENT_LOCAL
    assert leader_locator({"x-queue-leader-locator": "min-masters"}, None) == BALANCED
    assert leader_locator({"x-queue-leader-locator": "nonsense"}, None, BALANCED) == CLIENT_LOCAL
    assert stays_local(True, False) and stays_local(False, True) and not stays_local(False, False)


def test_balanced_picks_the_live_node_with_fewest_queues() -> None:
    assert least_loaded("a", {"a", "b"}, ["a", "a", "b"]) == "b"
    assert least_loaded("a", {"a", "b"}, ["a", "b"]) == "a"  # a tie: stay local
    assert least_loaded("a", {"a", "b", "c"}, ["a", "b", "dead", "dead"]) == "c"
