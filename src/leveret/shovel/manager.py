"""One running :class:`~.worker.Shovel` per shovel definition: the ``shovel`` runtime
parameters of the broker (dynamic: set over HTTP, ``leveret ctl set_parameter``,
definitions import; persisted) and the config file's ``[[shovels]]`` (static: from the
file at each start), as RabbitMQ reports them.

On a node of a cluster (``core.cluster``) the dynamic shovels run on one node only, as
RabbitMQ runs each dynamic shovel on one node of its cluster: the one whose
``runs_singletons`` is true (the live node with the lowest number); the others keep the
definitions (shared parameters) and start no worker, and take over when that node goes
(``runner_listeners``). Static shovels are the node's own configuration: they run on
every node whose config file has them, as in RabbitMQ."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable, Sequence
from typing import Any

from ..core.broker import BrokerCore
from .spec import ShovelError, ShovelSpec
from .worker import Shovel

log = logging.getLogger("leveret.shovel")

COMPONENT = "shovel"


class Shovels:
    """Starts, replaces and stops shovels as ``core``'s shovel parameters change.
    ``local_uri()`` is the broker's own AMQP URI (``amqp://`` in a definition)."""

    def __init__(self, core: BrokerCore, local_uri: Callable[[], str]) -> None:
        self.core = core
        self.local_uri = local_uri
        self.running: dict[tuple[str, str], Shovel] = {}
        self._stopping: set[asyncio.Future] = set()
        #: whether the dynamic shovels run here (False on a cluster node that is not
        #: the cluster's runner)
        self.active = True

    def node(self) -> str:
        """The node name ``/api/shovels`` rows give: the cluster node's, else this
        broker's (as ``/api/overview`` names it)."""
        name = getattr(self.core.cluster, "node", None)
        if isinstance(name, str):
            return name
        return f"leveret@{socket.gethostname().split('.')[0] or 'localhost'}"

    def start(self, static: Sequence[tuple[str, str, dict[str, Any]]] = ()) -> None:
        """Run the static shovels (``(vhost, name, definition)``; a bad one is logged
        and skipped) and every shovel parameter, and follow changes from now on."""
        for vhost, name, value in static:
            try:
                self._launch(vhost, name, ShovelSpec.from_parameter(value), "static")
            except ShovelError as exc:
                log.error("shovel %s in vhost %s (config file): %s", name, vhost, exc)
        cluster = self.core.cluster
        if cluster is not None and hasattr(cluster, "runner_listeners"):
            self.active = bool(cluster.runs_singletons)
            cluster.runner_listeners.append(self.set_active)
        for (component, vhost, name), value in list(self.core.parameters.items()):
            self._changed(component, vhost, name, value)
        self.core.parameter_listeners.append(self._changed)

    def set_active(self, active: bool) -> None:
        """Run the dynamic shovels here (True), or stop them (False: another node of
        the cluster runs them)."""
        if active == self.active:
            return
        self.active = active
        if active:
            for (component, vhost, name), value in list(self.core.parameters.items()):
                self._changed(component, vhost, name, value)
            return
        for key, shovel in list(self.running.items()):
            if shovel.kind == "dynamic":
                del self.running[key]
                self._stop_later(shovel)

    def _changed(self, component: str, vhost: str, name: str, value: Any) -> None:
        if component != COMPONENT:
            return
        old = self.running.pop((vhost, name), None)
        if old is not None:
            self._stop_later(old)
        if value is None or not self.active:
            return
        try:
            spec = ShovelSpec.from_parameter(value)
        except ShovelError as exc:  # stored by an older release, or imported
            log.error("shovel %s in vhost %s: %s", name, vhost, exc)
            return
        self._launch(vhost, name, spec, "dynamic")

    def _launch(self, vhost: str, name: str, spec: ShovelSpec, kind: str) -> None:
        shovel = Shovel(vhost, name, spec, self.local_uri, self._finished, kind)
        self.running[(vhost, name)] = shovel
        shovel.start()

    def _stop_later(self, shovel: Shovel) -> None:
        future = asyncio.ensure_future(shovel.stop())
        self._stopping.add(future)
        future.add_done_callback(self._stopping.discard)

    def _finished(self, shovel: Shovel) -> None:
        """``src-delete-after`` reached: RabbitMQ deletes the shovel (its parameter)."""
        log.info("shovel %s in vhost %s: moved %d messages, deleting itself", shovel.name, shovel.vhost,
                 shovel.forwarded)  # fmt: skip
        if shovel.kind == "dynamic":
            self.core.clear_parameter(COMPONENT, shovel.vhost, shovel.name)
        elif self.running.get((shovel.vhost, shovel.name)) is shovel:
            del self.running[(shovel.vhost, shovel.name)]

    def status(self, vhost: str | None = None) -> list[dict]:
        """``/api/shovels`` rows, by vhost and name."""
        node = self.node()
        return [
            dict(shovel.status(), node=node)
            for (v, _), shovel in sorted(self.running.items())
            if vhost is None or v == vhost
        ]

    async def stop(self) -> None:
        """Stop every shovel (at broker shutdown)."""
        if self._changed in self.core.parameter_listeners:
            self.core.parameter_listeners.remove(self._changed)
        listeners = getattr(self.core.cluster, "runner_listeners", None)
        if listeners is not None and self.set_active in listeners:
            listeners.remove(self.set_active)
        shovels, self.running = list(self.running.values()), {}
        await asyncio.gather(*(s.stop() for s in shovels), *self._stopping, return_exceptions=True)
