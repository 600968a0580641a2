"""What a WebSocket upgrade gets from the broker's HTTP port, seen by a WebSocket client
(aiohttp), for the Web MQTT and Web AMQP transports' tests alike."""

from __future__ import annotations

import asyncio

import aiohttp


def upgrade_status(url: str, protocols: list[str], held: int = 0) -> int:
    """The HTTP status of an upgrade to ``url`` (``ws://host:port/path``) asking for the
    subprotocols ``protocols``, while ``held`` other such WebSockets are open: 101 when it
    is let in, else the refusal's status (400: no subprotocol the port speaks, 503: past
    the HTTP port's connection cap)."""

    async def run() -> int:
        async with aiohttp.ClientSession() as session:
            open_ = [await session.ws_connect(url, protocols=protocols) for _ in range(held)]
            try:
                async with session.ws_connect(url, protocols=protocols):
                    return 101
            except aiohttp.WSServerHandshakeError as exc:
                return exc.status
            finally:
                for ws in open_:
                    await ws.close()

    return asyncio.run(run())
