"""One running :class:`~.worker.Shovel` per shovel definition: the ``shovel`` runtime
parameters of the broker (dynamic: set over HTTP, ``leveret ctl set_parameter``,
definitions import; persisted) and the config file's ``[[shovels]]`` (static: from the
file at each start), as RabbitMQ reports them."""

from __future__ import annotations

import asyncio
import logging
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

    def start(self, static: Sequence[tuple[str, str, dict[str, Any]]] = ()) -> None:
        """Run the static shovels (``(vhost, name, definition)``; a bad one is logged
        and skipped) and every shovel parameter, and follow changes from now on."""
        for vhost, name, value in static:
            try:
                self._launch(vhost, name, ShovelSpec.from_parameter(value), "static")
            except ShovelError as exc:
                log.error("shovel %s in vhost %s (config file): %s", name, vhost, exc)
        for (component, vhost, name), value in list(self.core.parameters.items()):
            self._changed(component, vhost, name, value)
        self.core.parameter_listeners.append(self._changed)

    def _changed(self, component: str, vhost: str, name: str, value: Any) -> None:
        if component != COMPONENT:
            return
        old = self.running.pop((vhost, name), None)
        if old is not None:
            self._stop_later(old)
        if value is None:
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
        return [
            shovel.status() for (v, _), shovel in sorted(self.running.items()) if vhost is None or v == vhost
        ]

    async def stop(self) -> None:
        """Stop every shovel (at broker shutdown)."""
        if self._changed in self.core.parameter_listeners:
            self.core.parameter_listeners.remove(self._changed)
        shovels, self.running = list(self.running.values()), {}
        await asyncio.gather(*(s.stop() for s in shovels), *self._stopping, return_exceptions=True)
