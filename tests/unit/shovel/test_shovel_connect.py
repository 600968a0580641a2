"""A shovel's connection attempt against a server that accepts TCP and never answers the
AMQP handshake: stopping the attempt closes its socket."""

from __future__ import annotations

import asyncio

from leveret.shovel.spec import ShovelSpec
from leveret.shovel.worker import Shovel


def test_a_stop_during_the_handshake_closes_its_socket():
    async def scenario() -> None:
        closed = asyncio.Event()

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                while await reader.read(1024):
                    pass
            finally:
                closed.set()
                writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        uri = f"amqp://u:p@127.0.0.1:{server.sockets[0].getsockname()[1]}/%2F"
        definition = {"src-uri": uri, "src-queue": "a", "dest-uri": uri, "dest-queue": "b"}
        spec = ShovelSpec.from_parameter(definition)
        shovel = Shovel("/", "s", spec, lambda: uri)
        try:
            attempt = asyncio.ensure_future(shovel._connect(uri))
            await asyncio.sleep(0.3)
            attempt.cancel()
            await asyncio.wait([attempt])
            await asyncio.wait_for(closed.wait(), 3)
        finally:
            server.close()

    asyncio.run(scenario())
