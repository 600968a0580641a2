"""Opening a link's connection (federation/connect.py) against a hostile upstream: a
server that accepts TCP and never answers the AMQP handshake (a black-holing proxy)."""

from __future__ import annotations

import asyncio

from leveret.federation.connect import open_connection


async def _silent_upstream(closed: asyncio.Event) -> tuple[asyncio.Server, int]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await reader.read(1024):
                pass
        finally:
            closed.set()
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def test_a_timed_out_handshake_closes_its_socket():
    """Each attempt that times out must not leave its socket open (a link retries every
    reconnect-delay: one leaked socket and task a retry otherwise)."""

    async def scenario() -> None:
        closed = asyncio.Event()
        server, port = await _silent_upstream(closed)
        try:
            try:
                await open_connection(f"amqp://u:p@127.0.0.1:{port}/%2F", {}, 0.3)
            except TimeoutError:
                pass
            else:
                raise AssertionError("a silent upstream answered")
            await asyncio.wait_for(closed.wait(), 3)
        finally:
            server.close()

    asyncio.run(scenario())


def test_a_stop_during_the_handshake_closes_its_socket():
    async def scenario() -> None:
        closed = asyncio.Event()
        server, port = await _silent_upstream(closed)
        try:
            attempt = asyncio.ensure_future(open_connection(f"amqp://u:p@127.0.0.1:{port}/%2F", {}, 30))
            await asyncio.sleep(0.3)
            attempt.cancel()
            await asyncio.wait([attempt])
            await asyncio.wait_for(closed.wait(), 3)
        finally:
            server.close()

    asyncio.run(scenario())
