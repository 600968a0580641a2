"""What a standby answers over HTTP while it waits to become the master.

A standby does not listen for clients (a connection is refused at once, so clients
and load balancers move on), but its management port answers every request with 503
and RabbitMQ's health-check body, so that a load balancer's health check
(``/api/health/checks/is-in-service``) and an operator see ``standby``.
"""

from __future__ import annotations

from aiohttp import web

from .http_guard import ConnectionGuard, GuardedSite
from .http_limits import HttpLimits


class StandbyServer:
    """503 ``{"status": "failed", "reason": "standby: ..."}`` for every path on
    ``host:port`` until :meth:`stop`, behind the HTTP ports' guard (``limits``)."""

    def __init__(self, host: str, port: int, cluster: str, limits: HttpLimits | None = None) -> None:
        self.host, self.port, self.cluster = host, port, cluster
        self.limits = limits or HttpLimits()
        self.guard = ConnectionGuard("standby HTTP port", self.limits, self.limits.port_cap(1))
        self._runner: web.AppRunner | None = None

    async def _answer(self, request: web.Request) -> web.Response:
        reason = f"standby: waiting to become the master of cluster {self.cluster}"
        return web.json_response({"status": "failed", "reason": reason, "role": "standby"}, status=503)

    async def start(self) -> None:
        """Listen (OSError if the port is taken)."""
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._answer)
        self._runner = web.AppRunner(app, access_log=None, keepalive_timeout=self.limits.keepalive_timeout)
        await self._runner.setup()
        site = GuardedSite(self._runner, self.host, self.port, self.guard, reuse_address=True)
        await site.start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
