"""Two in-process brokers wired as two nodes of a cluster by hand, for the message path
between nodes (leveret.cluster.peers) before the node runtime: node "b" holds the real
queues, node "a" a RemoteQueue of each with a link to "b"; both get the same exchanges
and bindings. Each broker has a data directory (a SQLite store: persistent messages are
confirmed once on disk)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from leveret.cluster.confirms import ClusterConfirms
from leveret.cluster.owner import accept_peers
from leveret.cluster.peers import FlowGate, Peers
from leveret.core.queues.remote import RemoteQueue
from leveret.server.broker import BlockingBroker

SECRET = "s3cret-token"


class HandWiredNode:
    """What a broker shows of being node ``node`` of cluster "pair" (a ClusterNode's
    names), with its ``peers``."""

    cluster = "pair"

    def __init__(self, node: str, peers: Peers) -> None:
        self.node = node
        self.peers = peers


class Pair:
    """Brokers ``a`` and ``b`` (and ``c`` when ``three``), each an active node whose
    links reach the others by name."""

    def __init__(self, tmp_path: Path, names: tuple[str, ...] = ("a", "b")) -> None:
        self.brokers: dict[str, BlockingBroker] = {}
        self.peers: dict[str, Peers] = {}
        for name in names:
            broker = BlockingBroker(data_dir=str(tmp_path / name), amqp_port=0, stomp_port=0)
            broker.start()
            self.brokers[name] = broker
        for name, broker in self.brokers.items():
            broker.call(self._make_node, name, broker)

    def _make_node(self, name: str, broker: BlockingBroker) -> None:
        core = broker.core
        peers = Peers(SECRET, self.address_of)
        core.cluster = HandWiredNode(name, peers)  # the node runtime sets a ClusterNode here
        accept_peers(core, SECRET)
        self.peers[name] = peers
        gate = FlowGate(core.flow.set)  # publishers held by the store's backlog or the links'
        store = broker.broker.store
        if store is not None:
            store.on_flow = gate.store
        peers.on_flow = gate.links
        for vhost in core.vhosts.values():
            if not isinstance(vhost.store, ClusterConfirms):
                vhost.store = ClusterConfirms(vhost.store, peers.vhost_links(vhost.name))

    def address_of(self, node: str) -> tuple[str, int] | None:
        broker = self.brokers.get(node)
        if broker is None or broker.broker.core is None:
            return None
        return ("127.0.0.1", broker.amqp_port)

    def url(self, name: str) -> str:
        return self.brokers[name].amqp_url

    def declare(self, queue: str, owner: str, exchange: str = "", keys: tuple[str, ...] = (),
                durable: bool = True, arguments: dict | None = None, exchange_type: str = "direct") -> None:
        """``queue`` real on ``owner``, remote elsewhere; ``exchange`` (declared on every
        node when named) bound to it with ``keys``."""
        for name, broker in self.brokers.items():
            broker.call(self._declare, name, broker, queue, owner, exchange, keys, durable,
                        arguments or {}, exchange_type)

    def _declare(self, name, broker, queue, owner, exchange, keys, durable, arguments, exchange_type) -> None:
        vhost = broker.core.vhosts["/"]
        if exchange:
            vhost.declare_exchange(exchange, exchange_type, durable=True)
        if name == owner:
            target = vhost.declare_queue(queue, None, durable=durable, arguments=arguments)
        else:
            target = RemoteQueue(vhost, queue, durable, False, arguments, owner,
                                 self.peers[name].link(owner, "/"))
            vhost.queues[queue] = target
        for key in keys:
            vhost.bind(exchange, target, key)

    def stop(self, name: str) -> None:
        """Stop node ``name`` (its links first)."""
        broker = self.brokers[name]
        if broker._loop is not None:
            asyncio.run_coroutine_threadsafe(self.peers[name].close(), broker._loop).result(10)
            broker.stop()

    def close(self) -> None:
        for name in self.brokers:
            self.stop(name)
