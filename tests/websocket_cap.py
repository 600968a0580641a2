"""The HTTP port's connection cap seen by a WebSocket client (aiohttp), for the Web
MQTT and Web AMQP transports' tests alike."""

from __future__ import annotations

import asyncio

import aiohttp


def status_past_cap(url: str, subprotocol: str, held: int) -> int:
    """With ``held`` WebSockets open to ``url`` (``ws://host:port/path``, asking for
    ``subprotocol``), the HTTP status one more upgrade gets: 101 when it is let in, the
    refusal's status (503 past the cap) otherwise."""

    async def run() -> int:
        async with aiohttp.ClientSession() as session:
            open_ = [await session.ws_connect(url, protocols=[subprotocol]) for _ in range(held)]
            try:
                async with session.ws_connect(url, protocols=[subprotocol]):
                    return 101
            except aiohttp.WSServerHandshakeError as exc:
                return exc.status
            finally:
                for ws in open_:
                    await ws.close()

    return asyncio.run(run())
