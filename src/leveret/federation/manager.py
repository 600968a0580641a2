"""One running link per upstream of every exchange and queue a policy federates, kept
in step with the broker: policies set and cleared, ``federation-upstream`` and
``federation-upstream-set`` parameters changed, exchanges and queues declared and
deleted, vhosts deleted.

What is federated, as RabbitMQ 3.10: an exchange or queue whose policy has
``federation-upstream`` or ``federation-upstream-set``, except the default exchange,
internal exchanges and the topology links declare on an upstream (exchanges of type
``x-federation-upstream``, queues with ``x-internal-purpose``), so a broker that is
both upstream and downstream does not federate its own federation queues.

On a node of a cluster (``core.cluster``) each link runs on one node, as in RabbitMQ:
an exchange's links on the node whose ``runs_singletons`` is true (the live node with
the lowest number; the others start none, and take over when it goes:
``runner_listeners``), a queue's links on the queue's owner node, where its consumers'
demand is (a :class:`~leveret.core.queues.remote.RemoteQueue` elsewhere: no link).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from ..core.broker import BrokerCore
from ..core.queues.remote import RemoteQueue
from .exchange_link import ExchangeLink
from .links import Link
from .queue_link import QueueLink
from .upstream import UPSTREAM, UPSTREAM_SET, Upstream, policy_upstreams

log = logging.getLogger("leveret.federation")

COMPONENTS = (UPSTREAM, UPSTREAM_SET)
#: The exchange type a downstream declares on its upstream (exchange federation).
UPSTREAM_EXCHANGE_TYPE = "x-federation-upstream"

LINK_CLASSES: dict[str, type[Link]] = {"exchange": ExchangeLink, "queue": QueueLink}
LinkKey = tuple[str, str, str, str]  # (vhost, kind "exchange"/"queue", name, upstream name)


class Federation:
    """Starts, replaces and stops links as ``core`` changes. ``local_uri()`` is the
    broker's own AMQP URI; ``node()`` the name it federates under."""

    def __init__(self, core: BrokerCore, local_uri: Callable[[], str], node: Callable[[], str]) -> None:
        self.core = core
        self.local_uri = local_uri
        self.node = node
        self.running: dict[LinkKey, Link] = {}
        self._upstreams: dict[LinkKey, Upstream] = {}
        self._stopping: set[asyncio.Future] = set()
        self._started = False
        #: vhosts with a ``federation-upstream`` parameter: only there can an exchange or
        #: queue be federated, so a declare or delete elsewhere costs one set look-up
        self._configured: set[str] = set()
        #: whether exchange links run here (False on a cluster node that is not the
        #: cluster's runner)
        self.active = True

    def start(self) -> None:
        """Start the links of every federated exchange and queue, and follow changes."""
        self._started = True
        cluster = self.core.cluster
        if cluster is not None and hasattr(cluster, "runner_listeners"):
            self.active = bool(cluster.runs_singletons)
            cluster.runner_listeners.append(self.set_active)
        self._configured = {vhost for (component, vhost, _) in self.core.parameters if component == UPSTREAM}
        self.core.parameter_listeners.append(self._parameter_changed)
        self.core.policy_listeners.append(self._policy_changed)
        self.core.entity_listeners.append(self._entity_changed)
        self.core.vhost_deleted_listeners.append(self._vhost_deleted)
        for vhost in list(self.core.vhosts):
            self.reconcile(vhost)

    async def stop(self) -> None:
        """Stop every link (at broker shutdown)."""
        if not self._started:
            return
        self._started = False
        _forget(self.core.parameter_listeners, self._parameter_changed)
        _forget(self.core.policy_listeners, self._policy_changed)
        _forget(self.core.entity_listeners, self._entity_changed)
        _forget(self.core.vhost_deleted_listeners, self._vhost_deleted)
        _forget(getattr(self.core.cluster, "runner_listeners", []), self.set_active)
        links, self.running = list(self.running.values()), {}
        self._upstreams.clear()
        await asyncio.gather(*(link.stop() for link in links), *self._stopping, return_exceptions=True)

    def set_active(self, active: bool) -> None:
        """Run the exchange links here (True), or stop them (False: another node of
        the cluster runs them)."""
        if active != self.active:
            self.active = active
            for vhost in list(self.core.vhosts):
                self.reconcile(vhost)

    # -- what is running ---------------------------------------------------------------
    def links(self, vhost: str | None = None) -> list[Link]:
        """The running links (any state), by vhost, kind, name and upstream."""
        return [link for key, link in sorted(self.running.items()) if vhost is None or key[0] == vhost]

    def status(self, vhost: str | None = None) -> list[dict[str, Any]]:
        """``/api/federation-links`` rows."""
        return [link.status() for link in self.links(vhost)]

    def restart(self, vhost: str | None, link_id: str) -> bool:
        """``restart_federation_link``: False if no link has that id (in ``vhost``)."""
        for link in self.links(vhost):
            if link.id == link_id:
                link.restart()
                return True
        return False

    # -- keeping in step -----------------------------------------------------------------
    def reconcile(self, vhost_name: str, kind: str | None = None, name: str | None = None) -> None:
        """Make the running links of ``vhost_name`` (only ``kind``/``name`` when given)
        what its policies and parameters ask for."""
        vhost = self.core.vhosts.get(vhost_name)
        wanted: dict[LinkKey, Upstream] = {}
        if vhost is not None:
            if kind in (None, "exchange") and self.active:
                for exchange in (
                    list(vhost.exchanges.values()) if name is None else [vhost.exchanges.get(name)]
                ):
                    if exchange is not None and _federates_exchange(exchange):
                        self._want(
                            wanted,
                            vhost_name,
                            "exchange",
                            exchange.name,
                            vhost.policy_for(exchange.name, "exchanges"),
                        )
            if kind in (None, "queue"):
                for queue in list(vhost.queues.values()) if name is None else [vhost.queues.get(name)]:
                    if queue is not None and _federates_queue(queue) and not isinstance(queue, RemoteQueue):
                        self._want(
                            wanted, vhost_name, "queue", queue.name, vhost.policy_for(queue.name, "queues")
                        )
        for key in [
            k for k in self.running if k[0] == vhost_name and kind in (None, k[1]) and name in (None, k[2])
        ]:
            if self._upstreams.get(key) != wanted.get(key):
                self._stop_later(self.running.pop(key))
                self._upstreams.pop(key, None)
        for key, upstream in wanted.items():
            if key not in self.running:
                self._launch(key, upstream)

    def _want(
        self, wanted: dict[LinkKey, Upstream], vhost: str, kind: str, name: str, policy: dict | None
    ) -> None:
        for upstream in policy_upstreams(self.core.parameters, vhost, policy):
            wanted[(vhost, kind, name, upstream.name)] = upstream

    def _launch(self, key: LinkKey, upstream: Upstream) -> None:
        vhost, kind, name, _ = key
        link = LINK_CLASSES[kind](vhost, name, upstream, self.local_uri, self.node())
        link.core = self.core
        self.running[key] = link
        self._upstreams[key] = upstream
        link.start()

    def _stop_later(self, link: Link) -> None:
        future = asyncio.ensure_future(link.stop())
        self._stopping.add(future)
        future.add_done_callback(self._stopping.discard)

    def _parameter_changed(self, component: str, vhost: str, name: str, value: Any) -> None:
        if component == UPSTREAM:
            if value is not None:
                self._configured.add(vhost)
            elif not any(c == UPSTREAM and v == vhost for (c, v, _) in self.core.parameters):
                self._configured.discard(vhost)
        if component in COMPONENTS:
            self.reconcile(vhost)

    def _policy_changed(self, vhost: str) -> None:
        # (every exchange and queue of the vhost is matched again: not where no
        # upstream exists and no link runs)
        if vhost in self._configured or self.running:
            self.reconcile(vhost)

    def _entity_changed(self, vhost: str, kind: str, name: str) -> None:
        # on every queue and exchange declared or deleted: nothing to do (not even a
        # policy match) in a vhost without upstreams, unless a link still runs
        if vhost in self._configured or self.running:
            self.reconcile(vhost, kind, name)

    def _vhost_deleted(self, vhost: str) -> None:
        for key in [k for k in self.running if k[0] == vhost]:
            self._stop_later(self.running.pop(key))
            self._upstreams.pop(key, None)


def _federates_exchange(exchange: Any) -> bool:
    return bool(exchange.name) and not exchange.internal and exchange.type != UPSTREAM_EXCHANGE_TYPE


def _federates_queue(queue: Any) -> bool:
    return "x-internal-purpose" not in (queue.arguments or {})


def _forget(listeners: list[Any], listener: Any) -> None:
    if listener in listeners:
        listeners.remove(listener)
